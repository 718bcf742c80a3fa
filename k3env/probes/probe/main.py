"""The probe's entry: every check of each plan, and the group's restart under the environment
its images share. Writes one JSON document after ``MARK`` on stdout."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable

from .absent import import_past_absent
from .args import check_args
from .cli import record_cli
from .envsearch import check_env
from .group import group_envs, run_group
from .harness import MARK, PACKAGE_DIR
from .imports import check_imports
from .parsers import check_parsers
from .patches import read_patch_targets
from .session import Json, Plan, Report, Run
from .tokenizer import check_tokenizer
from .versions import check_versions

CHECKS: tuple[tuple[str, Callable[[Run, Plan], None]], ...] = (
    ("versions", check_versions),
    ("imports", check_imports),
    ("args", check_args),
    ("parsers", check_parsers),
    ("cli", record_cli),  # a fact (vllm.cli), no verdict row of its own
    ("tokenizer", check_tokenizer),
    ("patches", read_patch_targets),
    ("env", check_env),
)


def run_plan(run: Run, plan: Plan) -> Json:
    """Every check of one image's plan, into a new report."""
    run.report = report = Report()
    start = time.monotonic()
    timings = {}
    for name, fn in CHECKS:
        t = time.monotonic()
        try:
            fn(run, plan)
        except BaseException:
            report.record(name, "(probe)", "fail", "k3env-probe", traceback.format_exc(limit=-6))
        timings[name] = round(time.monotonic() - t, 3)
    report.facts["probe_seconds"] = round(time.monotonic() - start, 3)
    report.facts["probe_timings"] = timings
    return report.as_json()


def _answer(document: object) -> None:
    sys.stdout.write("\n" + MARK + json.dumps(document) + "\n")
    sys.stdout.flush()
    os._exit(0)  # Dynamo's runtime threads must not hold the container open


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--import-past-absent":
        _answer(import_past_absent(sys.argv[2], json.loads(sys.argv[3])))
    ap = argparse.ArgumentParser(prog="k3env-probe")
    ap.add_argument("plan")
    ap.add_argument("--group-state", help="(internal) the group's environments, restarted")
    args = ap.parse_args()
    with open(args.plan) as f:
        payload = json.load(f)
    run = Run(timeout=float(payload.get("timeout", 300)))
    if len(payload["plans"]) == 1:
        _answer({"plans": [run_plan(run, payload["plans"][0])]})
    if args.group_state is None:
        # Start again under the environment the group shares, the environments computed
        # here (from what the engine gave this container) carried over.
        envs, common = group_envs(payload)
        fd, state = tempfile.mkstemp(prefix="k3env-group-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump([envs, common], f)
        argv = [sys.executable, PACKAGE_DIR, args.plan, "--group-state", state]
        os.execve(sys.executable, argv, common)
    _answer({"plans": run_group(run, run_plan, payload, args.group_state)})
