"""The CPU twin is the same image on a second, clean engine: debootstrap and pip run again
there, from the same lock, and give the same image ID.

The second dockerd has its own data root, exec root and socket (started here, stopped at the
end), no bridge and no iptables rules: containers there run with no network, as k3env's do.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator

import pytest

from k3env.config.lock import load_lock
from k3env.engine.dockerd import DockerEngine
from k3env.errors import EngineError
from k3env.image import twin
from k3env.log import Log
from k3env.state import State

from ..conftest import REPO

pytestmark = [pytest.mark.engine]


@pytest.fixture(scope="module")
def second_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DockerEngine]:
    root = tmp_path_factory.mktemp("e2")
    sock = root / "docker.sock"
    log = (root / "dockerd.log").open("wb")
    proc = subprocess.Popen(
        ["dockerd", "--data-root", str(root / "data"), "--exec-root", str(root / "exec"),
         "--pidfile", str(root / "dockerd.pid"), "-H", f"unix://{sock}", "--bridge=none",
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


def test_the_twin_builds_to_the_same_id_on_a_second_clean_engine(
    engine: DockerEngine, twin_image: str, second_engine: DockerEngine
) -> None:
    lock = load_lock(REPO / "pins/k3.lock.toml")
    first = engine.inspect(twin_image)
    assert first is not None
    p = twin.plan(lock)
    assert second_engine.inspect(p.stage1_ref) is None  # clean: nothing of the first engine
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
    engine: DockerEngine, twin_image: str, second_engine: DockerEngine
) -> None:
    result = engine.run(twin_image, ["python3", "-c", "print('up')"], timeout=60)
    assert (result.exit_code, result.stdout.strip()) == (0, "up")
