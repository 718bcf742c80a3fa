"""A k3env image on Docker 28: on the containerd image store the engine's ID is the manifest
digest k3env computed, on the classic store the config digest, and the config digest is the one
Docker 20.10 gives the same image, from one archive whose bytes both read. Every step after the
build (verify, push through the engine, export, stage) calls the image by the engine's name for
it and gives what it gives on 20.10.

Each store's Docker 28 (Debian sid's docker.io 28.5.2 with containerd 2.1.9) is an engine of
its own, started by ``scripts/engine28.sh`` in a debootstrapped sid root (made once under
/var/lib/k3env-docker28: ~2 min cold, then ~1 s) with its own socket, data root and bridge,
stopped and purged at the end. The host's engine, its socket and docker0 are not touched.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from k3env.cli import main
from k3env.config.lock import load_lock
from k3env.engine.dockerd import DockerEngine
from k3env.engine.naming import CLASSIC, CONTAINERD, ImageNames, engine_id
from k3env.image import twin
from k3env.image.blobs import keep_layer, kept_config, kept_layer
from k3env.image.identity import identify
from k3env.image.install import load_checked
from k3env.image.layer import LayerFile, assemble, image_of_config, load_archive
from k3env.log import Log
from k3env.state import State

from ..conftest import REPO
from .conftest import TEST_LOCK, BaseFixture, _one_builder, _require, write_project

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


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    """``k3env ARGV --lock ... --json``: its exit code and its one JSON document."""
    code = main([*argv, "--lock", TEST_LOCK, "--json"])
    return code, json.loads(capsys.readouterr().out)


def _handoff(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    on: DockerEngine,
    at: str,
    steps: dict[str, tuple[str, ...]],
    made: list[str],
) -> dict[str, Any]:
    """The project's image through ``steps`` (build, then what follows) on ``on``, in a state
    of its own (``at``: nothing answered from another engine's records): what each step said,
    the .sqsh's own sha256; ``made`` gets the references it tags."""
    monkeypatch.setenv("DOCKER_HOST", on.base_url)
    monkeypatch.setenv("K3ENV_STATE_DIR", str(Path(at, "state").resolve()))
    done, codes = {}, {}
    for step, argv in steps.items():
        codes[step], doc = _cli(capsys, *argv)
        listed = doc.get("images") or doc.get("staged")  # a failure: its error's words
        done[step] = listed[0] if listed else doc["error"]["message"]
        made += [listed[0]["reference"]] if listed and step in ("build", "push") else []
    assert all(code == 0 for step, code in codes.items() if step != "verify"), done
    done["verify"] = (codes["verify"], [(r["check"], r["subject"], r["status"])
                                        for r in done["verify"]["results"]])  # fmt: skip
    done["sqsh"] = hashlib.sha256(Path(done["export"]["path"]).read_bytes()).hexdigest()
    return done


@pytest.mark.registry
def test_a_k3env_image_is_verified_pushed_exported_and_staged_on_docker_28_as_on_20_10(
    engine: DockerEngine,
    docker28: DockerEngine,
    test_base: BaseFixture,
    registry: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every step after the build calls the image by the engine's name for it: on the
    containerd store its manifest digest (``verify``, ``export`` and a push through the engine
    once failed there with "image not found"), while records stay keyed by config digest."""
    if docker28.image_store() != CONTAINERD:
        pytest.skip("the classic store calls an image by its config digest, as 20.10 does")
    # The project of the other engine tests with an env of its own: another image (tag) than
    # theirs, so this test removes only what it made.
    monkeypatch.chdir(tmp_path)
    write_project(tmp_path, test_base, env={"A": "1", "K3ENV_TEST": "docker28-handoff"})
    steps = {"build": ("build",), "verify": ("verify",)}
    made: list[str] = []
    try:  # Docker 20.10: the verdicts and the .sqsh to compare with
        on_2010 = _handoff(capsys, monkeypatch, engine, "on-20.10", {
            **steps, "export": ("export", "--out", "on-20.10")}, made)  # fmt: skip
    finally:
        for ref in made:  # Docker 28's go with it
            engine.remove(ref)
    on_28 = _handoff(capsys, monkeypatch, docker28, "on-28", {
        **steps, "push": ("push", "--via-engine"), "export": ("export", "--out", "on-28"),
        "stage": ("stage", "--cache", "on-28/cache")}, [])  # fmt: skip
    build = on_28["build"]
    assert build["engine_id"] == engine_id(docker28.image_store(), ImageNames(
        config=build["image_id"], manifest=build["manifest"]))  # fmt: skip
    assert on_2010["build"]["engine_id"] == on_2010["build"]["image_id"]
    # The same lock, the same bytes: config and manifest digests (both engines build over the
    # base's config JSON as its registry serves it), verdicts, and the .sqsh (every directory
    # above the layer's files is named in it, so no engine dates one at load time).
    names = ("image_id", "manifest")
    assert [on_28["build"][k] for k in names] == [on_2010["build"][k] for k in names]
    assert on_28["verify"] == on_2010["verify"]
    assert on_28["sqsh"] == on_28["export"]["sha256"] == on_28["stage"]["sha256"]
    assert on_2010["sqsh"] == on_2010["export"]["sha256"] == on_28["sqsh"]
    pushed = on_28["push"]
    assert pushed["image_id"] == build["image_id"]  # recorded by config digest
    assert pushed["digest"] == build["manifest"] == build["engine_id"]  # the one k3env wrote


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
