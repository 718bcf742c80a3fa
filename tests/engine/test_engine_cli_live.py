"""The recorded `vllm serve` parser (schemas/engine-cli/vllm-0.31.0.json) against the live one:
the same record comes out of vLLM 0.31.0 again, and the replay through argparse says what the
live parser says, word for word, for each kind of command line preflight judges.

Runs inside the twin image (the CPU twin of the pinned vLLM release, built by the engine tests'
``twin_image``), or, when K3ENV_TWIN_PYTHON names one, an interpreter of an environment holding
the twin's pinned closure (``python3 -m venv V && V/bin/pip install --no-deps --require-hashes
-r pins/cpu-twin.requirements.txt``).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from k3env.checks.engine_cli import REFUSED, judge_serve, load_cli
from k3env.checks.probe_run import PROBE_ENV

from ..conftest import REPO

pytestmark = pytest.mark.twin
PYTHON = os.environ.get("K3ENV_TWIN_PYTHON", "")
RECORD = REPO / "schemas/engine-cli/vllm-0.31.0.json"
# Each kind of line: exact, abbreviated, ambiguous, unknown (with a value), missing value,
# invalid int, invalid choice, a --no- form, underscores, the served F's whole line.
CASES = [
    ["--enable-prefix-caching"],
    ["--enable-prefix-cachin"],
    ["--enable-prefix"],
    ["--enable"],
    ["--enable-prefix-cachingg"],
    ["--not-a-flag", "x"],
    ["--gpu-memory-utilization"],
    ["--tensor-parallel-size", "eight"],
    ["--dtype", "float99"],
    ["--no-enable-prefix-caching", "--tensor_parallel_size", "2"],
    ["--trust-remote-code", "--gpu-memory-utilization", "0.9", "--load-format", "fastsafetensors",
     "--tensor-parallel-size", "8", "--pipeline-parallel-size", "2", "--enable-auto-tool-choice",
     "--tool-call-parser", "kimi_k3", "--reasoning-parser", "kimi_k3"],
]  # fmt: skip
LIVE = """
import contextlib, importlib, io, json, logging, sys
logging.disable(logging.WARNING)
from vllm.utils.argparse_utils import FlexibleArgumentParser
serve = importlib.import_module("vllm.entrypoints.cli.serve")
top = FlexibleArgumentParser(prog="vllm")
sub = top.add_subparsers(required=False, dest="subparser")
for cmd in serve.cmd_init():
    cmd.subparser_init(sub)
out = []
for args in json.loads(sys.argv[1]):
    buf = io.StringIO()
    with contextlib.redirect_stderr(buf), contextlib.redirect_stdout(buf):
        try:
            top.parse_args(["serve", "/model", *args])
            said = None
        except SystemExit:
            said = [line for line in buf.getvalue().splitlines() if line.strip()][-1]
    out.append(said)
print("@@" + json.dumps(out))
"""


def _python(twin_image: str, *argv: str, env: dict[str, str], cwd: Path | None = None) -> str:
    """``python3 ARGV``'s stdout, in K3ENV_TWIN_PYTHON's environment when given, else inside
    the twin image itself (its vLLM is the release the record is of), with no network and
    k3env's probes mounted read-only."""
    if PYTHON:
        return subprocess.run([PYTHON, *argv], check=True, env={**os.environ, **env},
                              capture_output=True, text=True, cwd=cwd).stdout  # fmt: skip
    probes = REPO / "k3env/probes"
    flags = [f"--env={k}={v}" for k, v in env.items()]
    docker = ["docker", "run", "--rm", "--network=none", f"--volume={probes}:/k3env-probes:ro",
              "--workdir=/k3env-probes", *flags, twin_image, "python3", *argv]  # fmt: skip
    return subprocess.run(docker, check=True, capture_output=True, text=True).stdout


def live(twin_image: str, args: list[list[str]]) -> list[str | None]:
    out = _python(twin_image, "-c", LIVE, json.dumps(args), env=dict(PROBE_ENV))
    said: list[str | None] = json.loads(out.split("@@", 1)[1])
    return said


def test_the_replay_says_what_the_live_parser_says(twin_image: str) -> None:
    cli = load_cli(json.loads(RECORD.read_text())["cli"], "r")
    for args, said in zip(CASES, live(twin_image, CASES), strict=True):
        refused = [v.message for v in judge_serve(cli, ["vllm", "serve", "/model", *args]).verdicts
                   if v.status == REFUSED]  # fmt: skip
        assert refused == ([] if said is None else [said]), args


def test_the_record_is_what_vllm_says_now(twin_image: str) -> None:
    where = str(REPO / "k3env/probes") if PYTHON else "/k3env-probes"
    out = _python(twin_image, "-m", "probe.cli", env={**PROBE_ENV, "PYTHONPATH": where},
                  cwd=REPO / "k3env/probes")  # fmt: skip
    assert json.loads(out) == json.loads(RECORD.read_text())["cli"]
