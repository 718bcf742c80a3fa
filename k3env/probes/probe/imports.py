"""The profiles' entrypoint modules, imported as the processes would import them; past an
absent top-level package in a forked copy (stand-ins must never serve a later check, and torch
cannot be imported twice in one process), else in a new interpreter."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import traceback
from typing import Any

from .absent import absent_top, import_past_absent
from .harness import MARK, PACKAGE_DIR, captured, in_fork
from .session import Plan, Run


def entrypoints(plan: Plan) -> list[str]:
    """The modules the plan's processes import first (the host's table, ``ENTRYPOINTS``)."""
    return [str(m) for m in plan.get("imports", [])]


def absent_by_design(plan: Plan) -> list[str]:
    return [str(n).replace("-", "_") for n in plan.get("absent_by_design", [])]


def import_entrypoint(run: Run, module: str, design: list[str]) -> tuple[str, str]:
    """(status, output) of importing ``module``, once per process."""
    if module in run.imports:
        return run.imports[module]
    error = None
    with captured() as buf:
        try:
            importlib.import_module(module)
        except BaseException as e:
            error = e
            traceback.print_exc(limit=-6)
    if error is None:
        result = ("pass", "")
    elif absent_top(error) is None:
        result = ("fail", buf.getvalue())
    else:
        forked, _ = in_fork(lambda: past_absent_tracked(run, module, design), run.timeout)
        if forked is not None:
            status, output = forked["result"]
            result = (str(status), str(output))
            run.env_lookups.update(forked["lookups"])
            run.opened_k3env.extend(forked["opened"])
        else:
            result = import_in_subprocess(module, design)
            run.untracked.append(f"{module} went on past an absent module in a new interpreter")
    run.imports[module] = result
    return result


def past_absent_tracked(run: Run, module: str, design: list[str]) -> dict[str, Any]:
    """``import_past_absent`` in a forked copy, with what it looked up in the environment."""
    result = import_past_absent(module, design)
    return {"result": result, "lookups": sorted(run.env_lookups), "opened": run.opened_k3env}


def import_in_subprocess(module: str, design: list[str]) -> tuple[str, str]:
    try:
        proc = subprocess.run(
            [sys.executable, PACKAGE_DIR, "--import-past-absent", module, json.dumps(design)],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return "fail", f"importing {module} past its absent modules took over 300 s"
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(MARK):
            status, out = json.loads(line[len(MARK) :])
            return str(status), str(out)
    return "fail", f"importing {module} past its absent modules: exit {proc.returncode}\n" + (
        proc.stdout + proc.stderr
    )[-3000:]


def check_imports(run: Run, plan: Plan) -> None:
    design = absent_by_design(plan)
    for module in entrypoints(plan):
        component = "vllm" if module.startswith("vllm.") else "dynamo"
        status, out = import_entrypoint(run, module, design)
        run.report.record("imports", module, status, component, out)
