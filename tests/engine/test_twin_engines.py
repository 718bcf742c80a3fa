"""The CPU twin is the same image on another engine, clean, of today's kind: Docker 28 with the
containerd image store. debootstrap and pip run again there, from the same lock, and give the
config digest Docker 20.10 gives (its image ID there), with the manifest digest k3env computed
as Docker 28's ID; an image built over it has the same names on both.

The second engine (``scripts/engine28.sh``: Debian sid's docker.io 28.5.2 and containerd 2.1.9 in
a debootstrapped root, made once) has its own data root, exec root, socket and bridge (started
here, stopped and purged at the end) and no iptables rules: containers there run with no
network, as k3env's do. Not `--bridge=none`: that dockerd deletes the host's docker0 as it
starts, and the first engine's networked builds (a Dockerfile's RUN) then fail for the rest of
the run.

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
from k3env.config.spec import load_specs
from k3env.engine.dockerd import DockerEngine
from k3env.engine.naming import CLASSIC, CONTAINERD, engine_id
from k3env.errors import EngineError
from k3env.image import twin
from k3env.image.build import make_builder
from k3env.image.identity import identify
from k3env.log import Log
from k3env.state import State

from ..conftest import REPO
from .conftest import _require

pytestmark = [pytest.mark.engine]


DOCKER0 = Path("/sys/class/net/docker0")
ENGINE28 = REPO / "scripts/engine28.sh"


@pytest.fixture(scope="module")
def docker0_before() -> bool:
    """Whether the host had the first engine's bridge before the second engine started."""
    return DOCKER0.exists()


@pytest.fixture(scope="module")
def second_engine(docker0_before: bool) -> Iterator[DockerEngine]:
    name = f"tw{os.getpid()}"[:9]  # its bridge is k3e28-NAME: 15 characters at most
    started = subprocess.run(["bash", str(ENGINE28), CONTAINERD, name], capture_output=True,
                             text=True)  # fmt: skip
    if started.returncode != 0:
        _require(f"Docker 28 ({ENGINE28.name}: {started.stderr.strip()[-1500:]})")
    host = started.stdout.strip().splitlines()[-1].removeprefix("DOCKER_HOST=")
    stop = {**os.environ, "K3ENV_DOCKER28_STOP": "1", "K3ENV_DOCKER28_PURGE": "1"}
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                engine = DockerEngine(host)
                break
            except EngineError:
                if time.monotonic() > deadline:
                    pytest.fail(f"Docker 28 did not answer on {host}")
                time.sleep(0.5)
        assert engine.image_store() == CONTAINERD
        yield engine
    finally:
        subprocess.run(["bash", str(ENGINE28), CONTAINERD, name], env=stop, check=False)


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


def test_the_twin_and_an_image_over_it_have_the_same_names_on_docker_28(
    engine: DockerEngine,
    twin_image: str,
    second_engine: DockerEngine,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lock = load_lock(REPO / "pins/k3.lock.toml")
    state, log = State(), Log()
    first = engine.inspect(twin_image)
    assert first is not None and engine.image_store() == CLASSIC  # 20.10: the config digest
    p = twin.plan(lock)
    assert second_engine.inspect(p.stage1_ref) is None  # clean: nothing of the first engine
    for name, value in HOSTILE_ENV.items():
        monkeypatch.setenv(name, value)
    second = twin.build_twin(lock, second_engine, state, log)
    # On a difference, which layer: stage 1 (debootstrap) or the wheels' (pip, byte-compiling).
    built = second_engine.inspect(second)
    named = identify(CONTAINERD, state, second)
    assert named is not None, f"Docker 28 stored {second}, a manifest k3env did not write"
    names, manifest = named
    stage1 = [e.inspect(p.stage1_ref) for e in (engine, second_engine)]
    assert names.config == first.id, (
        f"layers {first.diff_ids} vs {built.diff_ids if built else None}; stage 1 "
        f"{[s.id if s else None for s in stage1]}"
    )
    # Docker 28 calls it by the manifest k3env computed: the one the twin's push sends.
    assert manifest is not None and manifest == twin.twin_manifest(state, first.id)
    assert second == engine_id(CONTAINERD, names) == manifest.digest
    assert stage1[1] is not None and stage1[1].created == "2026-11-30T00:00:00Z"

    # An image over the twin (its pinned aiperf as a components layer, then its own layer):
    # the same config and manifest digests on both engines, each engine's ID by its rule.
    builds = {}
    for e in (engine, second_engine):
        builder = make_builder(lock, e, state, log, True)
        (spec,) = load_specs(REPO / "images", lock, only=("kimi-k3-direct-d",))
        builds[e.image_store()] = builder.build(spec)
    on_2010, on_28 = builds[CLASSIC], builds[CONTAINERD]
    assert (on_2010.image_id, on_2010.manifest) == (on_28.image_id, on_28.manifest)
    assert on_2010.engine_id == on_2010.image_id and on_28.engine_id == on_28.manifest


def test_the_first_engine_still_runs_containers_beside_the_second_one(
    engine: DockerEngine, twin_image: str, second_engine: DockerEngine, docker0_before: bool
) -> None:
    result = engine.run(twin_image, ["python3", "-c", "print('up')"], timeout=60)
    assert (result.exit_code, result.stdout.strip()) == (0, "up")
    assert DOCKER0.exists() == docker0_before  # the first engine keeps its bridge
