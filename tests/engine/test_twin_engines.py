"""The CPU twin is the same image on a second, clean engine: debootstrap and pip run again
there, from the same lock, and give the same image ID.

The second dockerd has its own data root, exec root, socket and bridge (started here,
stopped at the end) and no iptables rules: containers there run with no network, as k3env's
do. Not `--bridge=none`: that dockerd deletes the host's docker0 as it starts, and the first
engine's networked builds (a Dockerfile's RUN) then fail for the rest of the run.

The second build runs in a hostile environment (a developer shell's PYTHONDONTWRITEBYTECODE,
`nix develop`'s SOURCE_DATE_EPOCH, another locale and zone): none of it reaches debootstrap.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from k3env.config.lock import load_lock
from k3env.engine.dockerd import DockerEngine
from k3env.errors import EngineError
from k3env.image import twin
from k3env.log import Log
from k3env.state import State

from ..conftest import REPO

pytestmark = [pytest.mark.engine]


DOCKER0 = Path("/sys/class/net/docker0")


@pytest.fixture(scope="module")
def docker0_before() -> bool:
    """Whether the host had the first engine's bridge before the second engine started."""
    return DOCKER0.exists()


@pytest.fixture(scope="module")
def second_engine(
    tmp_path_factory: pytest.TempPathFactory, docker0_before: bool
) -> Iterator[DockerEngine]:
    root = tmp_path_factory.mktemp("e2")
    sock = root / "docker.sock"
    bridge = f"k3e2-{os.getpid()}"[:15]  # an interface name has at most 15 characters
    subprocess.run(["ip", "link", "add", bridge, "type", "bridge"], check=True)
    log = (root / "dockerd.log").open("wb")
    proc = subprocess.Popen(
        ["dockerd", "--data-root", str(root / "data"), "--exec-root", str(root / "exec"),
         "--pidfile", str(root / "dockerd.pid"), "-H", f"unix://{sock}", f"--bridge={bridge}",
         "--iptables=false"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                engine = DockerEngine(f"unix://{sock}")
                break
            except EngineError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    pytest.fail(f"the second dockerd did not start: {root / 'dockerd.log'}")
                time.sleep(0.5)
        yield engine
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        subprocess.run(["rm", "-rf", str(root / "data")], check=False)
        subprocess.run(["ip", "link", "del", bridge], check=False)


# What a build host's shell may carry, each of which once changed or broke a build step:
# py3compile's .pyc flavour (debootstrap), mksquashfs refusing -mkfs-time (export).
HOSTILE_ENV = {
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONHASHSEED": "random",
    "SOURCE_DATE_EPOCH": "315532800",
    "LC_ALL": "C",
    "LANG": "de_DE.UTF-8",
    "TZ": "America/New_York",
}


def test_the_twin_builds_to_the_same_id_on_a_second_clean_engine(
    engine: DockerEngine,
    twin_image: str,
    second_engine: DockerEngine,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lock = load_lock(REPO / "pins/k3.lock.toml")
    first = engine.inspect(twin_image)
    assert first is not None
    p = twin.plan(lock)
    assert second_engine.inspect(p.stage1_ref) is None  # clean: nothing of the first engine
    for name, value in HOSTILE_ENV.items():
        monkeypatch.setenv(name, value)
    second = twin.build_twin(lock, second_engine, State(), Log())
    # On a difference, which layer: stage 1 (debootstrap) or the wheels' (pip, byte-compiling).
    built = second_engine.inspect(second)
    stage1_ids = [e.inspect(p.stage1_ref) for e in (engine, second_engine)]
    assert second == first.id, (
        f"layers {first.diff_ids} vs {built.diff_ids if built else None}; stage 1 "
        f"{[s.id if s else None for s in stage1_ids]}"
    )
    stage1 = second_engine.inspect(p.stage1_ref)
    assert stage1 is not None and stage1.created == "2026-11-30T00:00:00Z"


def test_the_first_engine_still_runs_containers_beside_the_second_one(
    engine: DockerEngine, twin_image: str, second_engine: DockerEngine, docker0_before: bool
) -> None:
    result = engine.run(twin_image, ["python3", "-c", "print('up')"], timeout=60)
    assert (result.exit_code, result.stdout.strip()) == (0, "up")
    assert DOCKER0.exists() == docker0_before  # the first engine keeps its bridge
