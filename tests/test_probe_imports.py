"""The probe's import check goes past a module that is not installed to the real cause.

Runs the probe's own code on this host's Python against small packages written here: the
shapes are the twin's (transformers' ``from torchvision.transforms.v2 import functional``
behind Dynamo's worker, then an ``ImportError: cannot import name ...`` from a vLLM that is
not the one the worker was written for).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from k3env.probes.probe.imports import import_in_subprocess

MISSING = "k3env_absent_tv"


@pytest.fixture
def packages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "k3t_worker").mkdir()
    (tmp_path / "k3t_worker/__init__.py").write_text(
        f"from {MISSING}.transforms.v2 import functional as tvF\n"
        f"import {MISSING}\n"
        f"class Proc({MISSING}.Base):\n    size = {MISSING}.resize(3)[0]\n"
        "from json import get_engine_zmq_addresses\n"
    )
    (tmp_path / "k3t_clean.py").write_text(f"from {MISSING}.transforms import v2\nX = v2.thing\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the check's own process
    return tmp_path


def test_the_first_real_incompatibility_behind_an_absent_module_is_reported(
    packages: Path,
) -> None:
    status, out = import_in_subprocess("k3t_worker", [])
    assert status == "fail"
    assert out.startswith(f"not installed in the image: {MISSING} (first symptom below)")
    assert f"No module named '{MISSING}'" in out
    behind = out.split("behind it, the first real incompatibility:", 1)[1]
    assert "cannot import name 'get_engine_zmq_addresses' from 'json'" in behind


def test_only_absent_modules_the_twin_leaves_out_by_design_pass_with_a_note(
    packages: Path,
) -> None:
    status, out = import_in_subprocess("k3t_clean", [MISSING])
    assert status == "pass"
    assert "stand-ins for modules the CPU twin leaves out by design" in out
    # The same absence outside the twin's design is a failure.
    status, out = import_in_subprocess("k3t_clean", [])
    assert status == "fail" and out.endswith("nothing else is missing behind them")


def test_stand_ins_never_reach_the_probe_process(packages: Path) -> None:
    plan = {"imports": ["k3t_worker"], "absent_by_design": []}  # the host's table names it
    code = (
        f"import sys, json; sys.path.insert(0, {str(packages)!r})\n"
        "from k3env.probes.probe import imports, session\n"
        "run = session.Run()\n"
        f"imports.check_imports(run, json.loads({json.dumps(plan)!r}))\n"
        f"print(json.dumps([run.report.results[0]['status'], {MISSING!r} in sys.modules]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        cwd=Path(__file__).resolve().parent.parent,
    ).stdout  # fmt: skip
    assert out.strip().splitlines()[-1] == '["fail", false]'
