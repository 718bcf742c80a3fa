"""What several benchmarks start from: their options, a k3env command's JSON, one image spec
built over the CPU twin (cached) with the engine and state it was built in; removing an image
from the engine."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from k3env.config.lock import load_lock  # noqa: E402
from k3env.config.spec import load_specs  # noqa: E402
from k3env.engine.dockerd import DockerEngine  # noqa: E402
from k3env.image.build import BuildResult, make_builder  # noqa: E402
from k3env.log import Log  # noqa: E402
from k3env.state import State  # noqa: E402


def arguments(doc: str, quick: str, repeat: int | None = None) -> argparse.ArgumentParser:
    """--json, --quick (``quick`` says what it does) and, with a default, --repeat."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quick", action="store_true", help=quick)
    if repeat is not None:
        ap.add_argument("--repeat", type=int, default=repeat)
    return ap


def k3env(argv: list[str], cwd: Path, env: dict[str, str]) -> dict[str, Any]:
    """The --json output of one k3env command run in ``cwd`` (exits on a failure)."""
    proc = subprocess.run(["k3env", *argv, "--json", "-q"], cwd=cwd, env=env,
                          capture_output=True, text=True)  # fmt: skip
    if proc.returncode != 0:
        sys.exit(f"benchmark command failed: k3env {' '.join(argv)}\n{proc.stderr}")
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


def twin_build(image: str) -> tuple[DockerEngine, State, BuildResult]:
    engine = DockerEngine()
    state = State()
    lock = load_lock(REPO / "pins/k3.lock.toml")
    (spec,) = load_specs(REPO / "images", lock, (image,))
    # The registry form too: bench_publish sends the kept layers and config.
    builder = make_builder(lock, engine, state, Log(quiet=True), True, registry_form=True)
    return engine, state, builder.build(spec)


def rmi(*refs: str) -> None:
    """Remove images from the engine, by reference or ID (absent ones are no error)."""
    subprocess.run(["docker", "rmi", "-f", *refs], capture_output=True)
