"""A k3env image on Docker 28: on the containerd image store the engine's ID is the manifest
digest k3env computed, on the classic store the config digest, and the config digest is the one
Docker 20.10 gives the same image, from one archive whose bytes both read.

Each store's Docker 28 (Debian sid's docker.io 28.5.2 with containerd 2.1.9) is an engine of
its own, started by ``scripts/engine28.sh`` in a debootstrapped sid root (made once under
/var/lib/k3env-docker28: ~2 min cold, then ~1 s) with its own socket, data root and bridge,
stopped and purged at the end. The host's engine, its socket and docker0 are not touched.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from k3env.config.lock import load_lock
from k3env.engine.dockerd import DockerEngine
from k3env.engine.naming import CLASSIC, CONTAINERD, engine_id
from k3env.image import twin
from k3env.image.blobs import keep_layer, kept_config, kept_layer
from k3env.image.identity import identify
from k3env.image.install import load_checked
from k3env.image.layer import LayerFile, assemble, image_of_config, load_archive
from k3env.log import Log
from k3env.state import State

from ..conftest import REPO
from .conftest import _one_builder, _require

pytestmark = [pytest.mark.engine]

SCRIPT = REPO / "scripts/engine28.sh"
QUIET = Log(quiet=True)


@pytest.fixture(scope="module", params=[CONTAINERD, CLASSIC])
def docker28(request: pytest.FixtureRequest) -> Iterator[DockerEngine]:
    """A fresh Docker 28 on the store ``request.param``, purged at the end."""
    store = str(request.param)
    name = f"{store[:2]}{os.getpid()}"[:9]  # its bridge is k3e28-NAME: 15 characters at most
    started = subprocess.run(["bash", str(SCRIPT), store, name], capture_output=True, text=True)
    if started.returncode != 0:
        _require(f"Docker 28 ({SCRIPT.name} {store}: {started.stderr.strip()[-1500:]})")
    host = started.stdout.strip().splitlines()[-1].removeprefix("DOCKER_HOST=")
    stop = {**os.environ, "K3ENV_DOCKER28_STOP": "1", "K3ENV_DOCKER28_PURGE": "1"}
    try:
        engine = DockerEngine(host)
        assert engine.image_store() == store
        yield engine
    finally:
        subprocess.run(["bash", str(SCRIPT), store, name], env=stop, check=False)


def test_a_k3env_image_is_named_as_each_store_names_it_with_the_config_of_docker_20_10(
    engine: DockerEngine, docker28: DockerEngine, tmp_path: Path
) -> None:
    lock = load_lock(REPO / "pins/k3.lock.toml")
    state, log = State(), QUIET
    store = docker28.image_store()
    with _one_builder():  # the twin's first stage on the first engine (20.10), as k3env built it
        first = twin.ensure_stage1(lock, twin.plan(lock), engine, log, state)
    assert engine.image_store() == CLASSIC  # Docker 20.10: the ID is the config digest
    manifest = twin.twin_manifest(state, first)
    config = kept_config(state, first)
    assert manifest is not None and config is not None and manifest.config == first
    (diff_id,) = json.loads(config.path.read_bytes())["rootfs"]["diff_ids"]
    blob = kept_layer(state, diff_id, twin.TWIN_LEVEL)
    assert blob is not None

    # Stage 1 into Docker 28 from the bytes k3env kept: the same archive 20.10 loads.
    names, again, parts = load_archive(config.path.read_bytes(), [diff_id], blob, blob.path, [])
    assert again == manifest and names.config == first
    tag = uuid.uuid4().hex[:12]
    stage1_ref = f"k3env-test/docker28-stage1:{tag}"
    loaded = load_checked(docker28, parts, names, stage1_ref, log)
    assert loaded == (manifest.digest if store == CONTAINERD else first) == engine_id(store, names)
    seen = docker28.inspect(stage1_ref)
    assert seen is not None and seen.id == loaded and seen.diff_ids == (diff_id,)
    assert identify(store, state, loaded) == (names, manifest)  # named again from what is kept

    # An image over it, assembled from stage 1's config JSON, loaded into both engines.
    base = image_of_config(config.path.read_bytes(), loaded, str(config.path))
    over = assemble(base, [LayerFile(path="/etc/k3env-test", content=tag.encode())],
                    env=[*base.config.get("Env", []), "K3=28"], labels={"io.k3env.test": tag},
                    created_by="k3env test", comment="test")  # fmt: skip
    own = keep_layer(State(tmp_path), over.layer_tar, over.diff_id)
    names, derived, parts = load_archive(over.config_json, [diff_id, over.diff_id], own,
                                         own.path, manifest.layers)  # fmt: skip
    assert derived is not None and names.manifest == derived.digest
    on_2010, on_28 = f"k3env-test/docker28-over:{tag}", f"k3env-test/docker28-over:{tag}"
    try:
        assert load_checked(engine, parts, names, on_2010, log) == names.config
        assert load_checked(docker28, parts, names, on_28, log) == engine_id(store, names)
        for e, ref in ((engine, on_2010), (docker28, on_28)):  # it runs, on each engine
            result = e.run(ref, ["sh", "-c", 'cat /etc/k3env-test; echo " $K3"'], timeout=60)
            assert (result.exit_code, result.stdout.strip()) == (0, f"{tag} 28"), result.stderr
        found = docker28.lookup(on_28)
        assert found is not None and found.labels["io.k3env.test"] == tag
    finally:
        engine.remove(on_2010)
        for ref in (on_28, stage1_ref):
            docker28.remove(ref)


def test_its_own_client_builds_with_buildx_on_it(docker28: DockerEngine, tmp_path: Path) -> None:
    """K3ENV_DOCKER28_CLI=1: the root's docker-cli and buildx plugin, through the wrapper the
    script names, build on that engine as its users' `docker build` does (what bench_build's
    Docker 28 rows run)."""
    store, name = docker28.image_store(), Path(docker28.base_url).parent.name
    again = subprocess.run(["bash", str(SCRIPT), store, name], capture_output=True, text=True,
                           env={**os.environ, "K3ENV_DOCKER28_CLI": "1"}, check=True)  # fmt: skip
    *_, cli_line, host_line = again.stdout.strip().splitlines()  # DOCKER_HOST= stays last
    cli = cli_line.removeprefix("DOCKER_CLI=")
    assert host_line == f"DOCKER_HOST={docker28.base_url}" and Path(cli).is_file()
    env = {**os.environ, "DOCKER_HOST": docker28.base_url}
    asked = [cli, "version", "--format", "{{json .}}"]
    version = json.loads(subprocess.run(asked, env=env, capture_output=True, check=True).stdout)
    assert version["Client"]["Version"].startswith("28.5.")
    assert version["Server"]["Version"].startswith("28.5.")
    (tmp_path / "f").write_text(name)
    (tmp_path / "Dockerfile").write_text("FROM scratch\nCOPY f /f\n")
    ref = f"k3env-test/docker28-buildx:{uuid.uuid4().hex[:12]}"
    built = subprocess.run([cli, "build", "--network=none", "-t", ref, "."], cwd=tmp_path,
                           env=env, capture_output=True, text=True)  # fmt: skip
    try:
        assert built.returncode == 0, built.stderr
        assert "[internal] load build definition from Dockerfile" in built.stderr  # BuildKit's
        assert docker28.lookup(ref) is not None
    finally:
        docker28.remove(ref)
