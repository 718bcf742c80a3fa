"""The text of each patch's target as the image has it; the host judges whether the patch is
present (one definition, shared with the builder and ``export --check``)."""

from __future__ import annotations

import os

from .locate import find_module_file
from .session import Plan, Run


def read_patch_targets(run: Run, plan: Plan) -> None:
    targets = run.report.targets
    for patch in plan.get("patches", []):
        if patch.get("skip"):
            continue
        path = patch.get("path") or find_module_file(patch["module"])
        if path is None or not os.path.isfile(path):
            targets[patch["name"]] = {"path": path, "text": None}
            continue
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            targets[patch["name"]] = {"path": path, "text": f.read()}
