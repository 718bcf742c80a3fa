"""Real-engine fixtures: a running dockerd, the local registry, and a small Python base image.

The base is the twin's first stage (debootstrap + python3, cached by content) plus a module
with a known bug, committed and pushed to the local registry so that test locks pin it by
digest exactly like a real base.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from k3env.config.lock import load_lock
from k3env.engine.dockerd import DEFAULT_HOST, DockerEngine
from k3env.engine.naming import CLASSIC
from k3env.errors import EngineError
from k3env.hashing import record_hash
from k3env.image import twin
from k3env.log import Log
from k3env.state import State

from ..conftest import REPO
from ..project import BUGGY, FIXED
from ..project import write_project as project_files

REGISTRY = "127.0.0.1:5000"
TEST_LOCK = "pins/test.lock.toml"  # where write_project puts the lock (cwd: the project)
# The engine tests' first engine is the build host's Debian 12 dockerd 20.10 (its default
# socket, or K3ENV_TEST_ENGINE), whatever DOCKER_HOST says: a host that points k3env at Docker
# 28 runs the same tests (they assert the classic store's facts, and start the Docker 28
# engines they compare with themselves). The CLI the tests run reads DOCKER_HOST: set for all.
TEST_ENGINE = os.environ.get("K3ENV_TEST_ENGINE", DEFAULT_HOST)
os.environ["DOCKER_HOST"] = TEST_ENGINE


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    """``k3env ARGV --lock pins/test.lock.toml --json`` in the project; it must succeed."""
    from k3env.cli import main

    code = main([*argv, "--lock", TEST_LOCK, "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    out: dict[str, Any] = json.loads(captured.out)
    return out


def _require(what: str) -> None:
    if os.environ.get("CI") or os.environ.get("K3ENV_REQUIRE_ENGINE"):
        pytest.fail(f"{what} is required here (CI): .ci/run starts it")
    pytest.skip(f"{what} not available")


@pytest.fixture(scope="session")
def engine() -> DockerEngine:
    try:
        found = DockerEngine(TEST_ENGINE)
        store = found.image_store()
    except EngineError:
        _require(f"a Docker engine at {TEST_ENGINE}")
        raise
    if store != CLASSIC:
        pytest.fail(
            f"{TEST_ENGINE} names images by manifest digest ({store}): the engine tests' "
            "first engine is one on the classic store (K3ENV_TEST_ENGINE names another)"
        )
    return found


@pytest.fixture(scope="session")
def registry() -> str:
    try:
        urllib.request.urlopen(f"http://{REGISTRY}/v2/", timeout=3).read()
    except OSError:
        _require(f"a docker-registry on {REGISTRY}")
    return REGISTRY


@dataclass(frozen=True)
class BaseFixture:
    repository: str
    tag: str
    digest: str
    image_id: str


@contextmanager
def _one_builder() -> Iterator[None]:
    """Held while a fixture builds a shared image (stage 1, the twin): the engine tests run
    in two processes at once (`-n 2`, below), and a cold host must build each image once,
    not twice at the same time."""
    with open(Path(tempfile.gettempdir()) / "k3env-engine-tests.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`pytest tests/engine -n 2` runs two lanes: the second engine's twin build (minutes of
    debootstrap, pip and a 6 GB load into a dockerd of its own) beside every other engine test,
    which stay on one worker in file order (they share the engine's images and clean some of
    them up)."""
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

    class TwoLanes(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return "second engine" if "test_twin_engines.py::" in nodeid else "engine"

    return TwoLanes(config, log)


def commit_run(
    image: str, argv: list[str], reference: str, *, mounts: dict[str, str], changes: list[str]
) -> str:
    """``docker run`` ARGV in IMAGE (no network), ``docker commit`` it as REFERENCE; the image ID.
    Only the fixtures make images this way: k3env itself never commits a container."""
    name = f"k3env-test-commit-{os.getpid()}-{abs(hash(reference))}"
    binds = [arg for host, inside in mounts.items() for arg in ("-v", f"{host}:{inside}:ro")]
    docker = ["docker", "run", "--name", name, "--network", "none", *binds, image, *argv]
    try:
        subprocess.run(docker, check=True)
        commit = ["docker", "commit", *[f"--change={c}" for c in changes], name, reference]
        return subprocess.run(commit, check=True, capture_output=True, text=True).stdout.strip()
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)


def _make_base(
    engine: DockerEngine,
    registry: str,
    name: str,
    content: str,
    platform: str = "linux/amd64",
    tag: str = "1",
) -> BaseFixture:
    lock = load_lock(REPO / "pins/k3.lock.toml")
    with _one_builder():
        stage1 = twin.ensure_stage1(lock, twin.plan(lock, platform), engine, Log(), State())
    repository = f"{registry}/k3env-test/{name}"
    # k3test is an installed distribution: its RECORD lists each file's sha256, as pip writes.
    site = "/usr/lib/python3/dist-packages"
    files = {"k3test/__init__.py": "", "k3test/mod.py": content}
    record = "".join(
        f"{path},sha256={record_hash(text.encode())},{len(text.encode())}\n"
        for path, text in files.items()
    )
    files["k3test-1.0.dist-info/METADATA"] = "Metadata-Version: 2.1\nName: k3test\nVersion: 1.0\n"
    files["k3test-1.0.dist-info/RECORD"] = record + "k3test-1.0.dist-info/RECORD,,\n"
    writer = (
        "import json, os, sys\n"
        "for path, text in json.loads(sys.argv[2]).items():\n"
        "    full = os.path.join(sys.argv[1], path)\n"
        "    os.makedirs(os.path.dirname(full), exist_ok=True)\n"
        "    open(full, 'w').write(text)\n"
    )
    argv = ["python3", "-c", writer, site, json.dumps(files)]
    cmd = ['CMD ["python3"]']
    image_id = commit_run(stage1, argv, f"{repository}:{tag}", mounts={}, changes=cmd)
    digest = engine.push(repository, tag, lambda _: None).digest
    return BaseFixture(repository=repository, tag=tag, digest=digest, image_id=image_id)


@pytest.fixture(scope="session")
def test_base(engine: DockerEngine, registry: str) -> BaseFixture:
    return _make_base(engine, registry, "base", BUGGY)


@pytest.fixture(scope="session")
def fixed_base(engine: DockerEngine, registry: str) -> BaseFixture:
    """A base whose module already carries the fix (the patch went upstream)."""
    return _make_base(engine, registry, "fixed", FIXED)


def write_project(root: Path, base: BaseFixture, *, env: dict[str, str] | None = None) -> Path:
    """The one project builder (tests/project.py) over ``base``; returns the lock path."""
    return project_files(root, {"testbase": base}, env=env).lock_path


@pytest.fixture
def project(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, test_base: BaseFixture
) -> Iterator[Path]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("K3ENV_STATE_DIR", str(tmp_path / "state"))
    write_project(tmp_path, test_base)
    yield tmp_path
    shutil.rmtree(tmp_path / "state", ignore_errors=True)


@pytest.fixture
def clean_probe_images(engine: DockerEngine) -> Iterator[None]:
    """Remove every k3env-test/probe image before and after the test."""

    def clean() -> None:
        ids = sorted({line.split()[0] for line in _probe_images()})
        if ids:
            subprocess.run(["docker", "rmi", "-f", *ids], check=True, capture_output=True)

    clean()
    yield
    clean()


def _probe_images() -> list[str]:
    """``ID repository:tag`` for every k3env-test/probe image (the docker CLI, not k3env)."""
    listing = subprocess.run(
        ["docker", "images", "--format", "{{.ID}} {{.Repository}}:{{.Tag}}", "k3env-test/probe"],
        check=True,
        capture_output=True,
        text=True,
    )
    return listing.stdout.splitlines()


def probe_tags(engine: DockerEngine) -> list[str]:
    return [line.split()[1] for line in _probe_images() if not line.endswith(":<none>")]


@pytest.fixture(scope="session")
def twin_image(engine: DockerEngine, registry: str) -> str:
    lock = load_lock(REPO / "pins/k3.lock.toml")
    with _one_builder():
        reference, _digest = twin.ensure_twin(lock, engine, State(), Log())
    return reference


def _dynamo_release(engine: DockerEngine, twin_image: str, version: str) -> str:
    """The twin with ai-dynamo / ai-dynamo-runtime ``version`` from PyPI (cached by tag)."""
    repository, tag = f"k3env-test/twin-dynamo-{version}", twin_image.rsplit(":", 1)[1]
    if engine.lookup(f"{repository}:{tag}") is not None:
        return f"{repository}:{tag}"
    with tempfile.TemporaryDirectory() as wheels:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
             "--python-version", "3.11", "-d", wheels,
             f"ai-dynamo=={version}", f"ai-dynamo-runtime=={version}"],
            check=True,
        )  # fmt: skip
        commit_run(
            twin_image,
            ["sh", "-c", "python3 -m pip install -q --no-deps --no-index --break-system-packages "
             "--root-user-action=ignore /w/*.whl"],
            f"{repository}:{tag}",
            mounts={wheels: "/w"},
            changes=[],
        )  # fmt: skip
    return f"{repository}:{tag}"


@pytest.fixture(scope="session")
def old_dynamo_image(engine: DockerEngine, twin_image: str) -> str:
    """The twin with ai-dynamo / ai-dynamo-runtime 1.2.1 (the bring-up's third sweep)."""
    return _dynamo_release(engine, twin_image, "1.2.1")


@pytest.fixture(scope="session")
def dynamo_161_image(engine: DockerEngine, twin_image: str) -> str:
    """The twin with Dynamo 1.6.1 installed into it (a base that carries Dynamo itself, as a
    serving image may; the lock's own images bake it as a component instead)."""
    return _dynamo_release(engine, twin_image, "1.6.1")


@pytest.fixture(scope="session")
def dynamo_142_image(engine: DockerEngine, twin_image: str) -> str:
    """The twin with Dynamo 1.4.2, whose worker parser resolves the model path."""
    return _dynamo_release(engine, twin_image, "1.4.2")
