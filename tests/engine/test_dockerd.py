"""Every verb of DockerEngine on a real dockerd, over k3env's own socket client.

Two images, neither pulled from the internet: a tiny one imported from a static file tree
(a file, relative and absolute symlinks, a directory) for the filesystem verbs, and the twin's
stage 1 (debootstrap: sh, sleep, python3) for the verbs that run something.
"""

from __future__ import annotations

import io
import subprocess
import tarfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from k3env.config.lock import load_lock
from k3env.engine.dockerd import DockerEngine
from k3env.errors import EngineError
from k3env.image import twin
from k3env.image.blobs import LAYER_MEDIA_TYPE, Descriptor
from k3env.image.layer import LayerFile, assemble, load_archive
from k3env.log import Log
from k3env.state import State

from ..conftest import REPO

pytestmark = [pytest.mark.engine]

HELLO = b"hello from the tiny image\n"


def _ancestors(image_id: str) -> list[str]:
    """Containers (running or not) made from ``image_id``, by the docker CLI."""
    listing = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"ancestor={image_id}"],
        check=True,
        capture_output=True,
        text=True,
    )
    return listing.stdout.split()


def _containers_running(marker: str) -> list[str]:
    """Containers whose command contains ``marker`` (unique per test: other processes may run
    containers from the same image meanwhile)."""
    listing = subprocess.run(
        ["docker", "ps", "-a", "--no-trunc", "--format", "{{.ID}} {{.Command}}"],
        check=True,
        capture_output=True,
        text=True,
    )
    return [line for line in listing.stdout.splitlines() if marker in line]


@pytest.fixture(scope="module")
def tiny(engine: DockerEngine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A few files imported with ``import_rootfs``; yields its ID."""
    tarball = tmp_path_factory.mktemp("tiny") / "rootfs.tar"
    with tarfile.open(tarball, "w") as tar:

        def add(
            name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", link: str = ""
        ) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.size = kind, link, len(data)
            info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o640
            tar.addfile(info, io.BytesIO(data) if data else None)

        add("etc", tarfile.DIRTYPE)
        add("etc/hello", data=HELLO)
        add("etc/relative", tarfile.SYMTYPE, link="hello")
        add("data", tarfile.DIRTYPE)
        add("data/absolute", tarfile.SYMTYPE, link="/etc/relative")
        add("data/loop", tarfile.SYMTYPE, link="loop")
    tag = uuid.uuid4().hex[:12]
    image_id = engine.import_rootfs(tarball, "k3env-test/dockerd-tiny", tag)
    yield image_id
    engine.remove(f"k3env-test/dockerd-tiny:{tag}")


@pytest.fixture(scope="module")
def stage1(engine: DockerEngine) -> str:
    lock = load_lock(REPO / "pins/k3.lock.toml")
    return twin.ensure_stage1(lock, twin.plan(lock), engine, Log(), State())


def test_describe_names_the_daemon(engine: DockerEngine) -> None:
    assert engine.describe().startswith("dockerd ")


def test_run_exit_code_streams_env_mounts_no_network(
    engine: DockerEngine, stage1: str, tmp_path: Path
) -> None:
    marker = f"k3env-test-{uuid.uuid4().hex}"
    (tmp_path / "in.txt").write_text("mounted\n")
    script = (
        f': {marker}; echo out; echo err >&2; echo "$K3_VALUE"; cat /in/in.txt; '
        "touch /in/new 2>/dev/null || echo read-only >&2; ls /sys/class/net; exit 3"
    )
    result = engine.run(
        stage1,
        ["sh", "-c", script],
        timeout=60,
        env={"K3_VALUE": "from env"},
        mounts={str(tmp_path): "/in"},
    )
    assert result.exit_code == 3
    assert result.stdout == "out\nfrom env\nmounted\nlo\n"  # no network but loopback
    assert result.stderr == "err\nread-only\n"
    assert _containers_running(marker) == []


def test_run_timeout_kills_and_removes_the_container(engine: DockerEngine, stage1: str) -> None:
    marker = f"k3env-test-{uuid.uuid4().hex}"
    start = time.monotonic()
    result = engine.run(stage1, ["sh", "-c", f": {marker}; echo started; sleep 30"], timeout=2)
    assert time.monotonic() - start < 20
    assert result.exit_code == -9
    assert result.stdout == "started\n"
    assert result.stderr.endswith("[k3env] killed after 2 s")
    assert _containers_running(marker) == []


def test_run_of_a_missing_image_is_an_engine_error(engine: DockerEngine) -> None:
    with pytest.raises(EngineError, match="image not found"):
        engine.run("k3env-test/absent:none", ["true"], timeout=10)


def test_read_files_follows_symlinks_and_misses_cleanly(engine: DockerEngine, tiny: str) -> None:
    files = engine.read_files(
        tiny, ["/etc/hello", "/etc/relative", "/data/absolute", "/data/loop", "/nope", "/etc"]
    )
    hello = files["/etc/hello"]
    assert hello is not None and hello.content == HELLO and hello.mode & 0o7777 == 0o640
    for linked in ("/etc/relative", "/data/absolute"):  # one hop, and two (absolute, then not)
        found = files[linked]
        assert found is not None and found.content == HELLO
    assert files["/data/loop"] is None  # a cycle stops after 8 hops
    assert files["/nope"] is None
    assert files["/etc"] is None  # a directory is not a file
    assert _ancestors(tiny) == []


def test_load_tag_lookup_remove_round_trip(engine: DockerEngine, tiny: str) -> None:
    base = engine.inspect(tiny)
    assert base is not None and len(base.diff_ids) == 1
    assembled = assemble(
        base,
        [LayerFile(path="/etc/added", content=b"added\n")],
        env=["K3=1"],
        labels={"io.k3env.test": "round-trip"},
        created_by="k3env test",
        comment="test",
    )
    own = Descriptor(digest=assembled.diff_id, size=len(assembled.layer_tar),
                     media_type=LAYER_MEDIA_TYPE)  # fmt: skip
    # An imported base's manifest is not known: a docker-archive only (a classic store).
    _names, _manifest, parts = load_archive(assembled.config_json,
                                            [*base.diff_ids, assembled.diff_id], own,
                                            assembled.layer_tar, None)  # fmt: skip
    loaded = engine.load(parts)
    assert loaded == assembled.image_id
    reference = f"k3env-test/dockerd-loaded:{uuid.uuid4().hex[:12]}"
    engine.tag(loaded, *reference.split(":"))
    try:
        found = engine.lookup(reference)
        assert found is not None and found.id == loaded
        assert found.labels == {"io.k3env.test": "round-trip"}
        derived = engine.inspect(reference)
        assert derived is not None and derived.diff_ids[:-1] == base.diff_ids
        added = engine.read_files(reference, ["/etc/added"])["/etc/added"]
        assert added is not None and added.content == b"added\n"
    finally:
        engine.remove(reference)
    assert engine.lookup(reference) is None
    engine.remove(reference)  # a second removal is not an error


def test_export_yields_the_root_filesystem(engine: DockerEngine, tiny: str) -> None:
    stream = engine.export(tiny)
    data = b"".join(stream)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        names = tar.getnames()
        hello = tar.extractfile("etc/hello")
        assert hello is not None and hello.read() == HELLO
    assert "etc/relative" in names
    assert _ancestors(tiny) == []


def test_export_closed_early_removes_its_container(engine: DockerEngine, tiny: str) -> None:
    stream = engine.export(tiny)
    next(stream)
    assert len(_ancestors(tiny)) == 1
    stream.close()
    assert _ancestors(tiny) == []


@pytest.mark.registry
def test_push_returns_the_manifest_digest_and_pull_gets_it_back(
    engine: DockerEngine, tiny: str, registry: str
) -> None:
    repository, tag = f"{registry}/k3env-test/dockerd-tiny", uuid.uuid4().hex[:12]
    engine.tag(tiny, repository, tag)
    try:
        result = engine.push(repository, tag, lambda _: None)
        assert result.digest.startswith("sha256:") and len(result.digest) == 71
        assert set(result.layers.values()) <= {"Pushed", "Layer already exists"}
        assert result.layers
        lines: list[str] = []
        engine.pull(f"{repository}@{result.digest}", lines.append)
        assert any(result.digest in line for line in lines)
        found = engine.lookup(f"{repository}@{result.digest}")
        assert found is not None and found.id == tiny
        with pytest.raises(EngineError, match="pull failed"):
            engine.pull(f"{repository}@sha256:{'0' * 64}", lambda _: None)
    finally:
        engine.remove(f"{repository}:{tag}")


def test_import_of_a_missing_tarball_is_an_engine_error(
    engine: DockerEngine, tmp_path: Path
) -> None:
    with pytest.raises(EngineError, match="No such file"):
        engine.import_rootfs(tmp_path / "absent.tar", "k3env-test/absent", "1")


def test_unreachable_socket_is_an_engine_error(tmp_path: Path) -> None:
    with pytest.raises(EngineError) as e:
        DockerEngine(f"unix://{tmp_path}/docker.sock")
    assert "cannot reach the Docker engine" in e.value.message
    assert e.value.fix is not None and "dockerd" in e.value.fix
