"""One lock, two platforms: a multi-platform base (an index over an amd64 and an arm64
manifest, the arm64 one built and run under qemu-user), derived images built for each, and
published straight to the registry as one OCI index, read back by skopeo."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from k3env.engine import registry as api
from k3env.engine.dockerd import DockerEngine
from k3env.errors import CheckFailed, EngineError
from k3env.handoff.publish import publish
from k3env.log import Log
from k3env.state import State

from ..project import BUGGY
from .conftest import REGISTRY, BaseFixture, _make_base, run_json, write_project

pytestmark = [pytest.mark.engine, pytest.mark.registry]

BOTH = "linux/amd64,linux/arm64"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"


@pytest.fixture(scope="session")
def multi_base(engine: DockerEngine, registry: str) -> tuple[str, dict[str, str]]:
    """``(index digest, platform -> manifest digest)`` of k3env-test/multi:1, an index put
    together from two real single-platform bases."""
    amd = _make_base(engine, registry, "multi", BUGGY, "linux/amd64", tag="amd64")
    arm = _make_base(engine, registry, "multi", BUGGY, "linux/arm64", tag="arm64")
    manifests = []
    for platform, base in (("linux/amd64", amd), ("linux/arm64", arm)):
        _digest, _type, body = api.get_manifest(base.repository, base.digest)
        os_name, arch = platform.split("/")
        entry = {"os": os_name, "architecture": arch}
        manifests.append(
            {"mediaType": DOCKER_MANIFEST, "digest": base.digest, "size": len(body),
             "platform": entry}
        )  # fmt: skip
    index = json.dumps({"schemaVersion": 2, "mediaType": api_index(), "manifests": manifests})
    digest = api.put_manifest(amd.repository, "1", index.encode(), api_index())
    return digest, {"linux/amd64": amd.digest, "linux/arm64": arm.digest}


def api_index() -> str:
    return "application/vnd.oci.image.index.v1+json"


@pytest.fixture
def multi_project(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    multi_base: tuple[str, dict[str, str]],
) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("K3ENV_STATE_DIR", str(tmp_path / "state"))
    index, platforms = multi_base
    base = BaseFixture(repository=f"{REGISTRY}/k3env-test/multi", tag="1", digest=index,
                       image_id="")  # fmt: skip
    lock = write_project(tmp_path, base)
    lock.write_text(
        lock.read_text()
        + textwrap.dedent(
            f"""\
            [bases.testbase.platforms]
            "linux/amd64" = "{platforms["linux/amd64"]}"
            "linux/arm64" = "{platforms["linux/arm64"]}"
            """
        )
    )
    return tmp_path


def skopeo(*argv: str) -> str:
    return subprocess.run(
        ["skopeo", *argv], check=True, capture_output=True, text=True, timeout=600
    ).stdout


def test_two_platforms_build_and_publish_as_one_index(
    multi_project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    built = run_json(capsys, "build", "--platform", BOTH)["images"]
    assert [b["platform"] for b in built] == ["linux/amd64", "linux/arm64"]
    assert len({b["image_id"] for b in built}) == 2
    # The patch target was located by the arm64 base's own Python, run under emulation.
    assert all(p["status"] == "applied" for b in built for p in b["patches"])

    pushed = run_json(capsys, "push", "--platform", BOTH)["images"]
    assert [p["platform"] for p in pushed] == ["linux/amd64", "linux/arm64"]
    reference = pushed[0]["reference"]
    assert {p["reference"] for p in pushed} == {reference}

    # The tag names an OCI index listing each platform's manifest, as the records say.
    index = json.loads(skopeo("inspect", "--tls-verify=false", "--raw", f"docker://{reference}"))
    assert index["mediaType"] == "application/vnd.oci.image.index.v1+json"
    listed = {f"{m['platform']['os']}/{m['platform']['architecture']}": m["digest"]
              for m in index["manifests"]}  # fmt: skip
    assert listed == {p["platform"]: p["digest"] for p in pushed}
    repository, tag = reference.rsplit(":", 1)
    assert {p["index"] for p in pushed} == {api.get_manifest(repository, tag)[0]}

    # Each platform by its own digest: the image k3env built (config digest = image ID),
    # every blob read back and checked by skopeo.
    for build, push in zip(built, pushed, strict=True):
        by_digest = f"docker://{push['by_digest']}"
        info = json.loads(skopeo("inspect", "--tls-verify=false", by_digest))
        assert info["Architecture"] == build["platform"].split("/")[1]
        layout = multi_project / f"oci-{info['Architecture']}"
        skopeo("copy", "--src-tls-verify=false", by_digest, f"oci:{layout}:x")
        manifest = json.loads(skopeo("inspect", "--raw", f"oci:{layout}:x"))
        assert manifest["config"]["digest"] == build["image_id"]

    # Publishing again sends nothing and names the same index.
    again = run_json(capsys, "push", "--platform", BOTH)["images"]
    assert [p["digest"] for p in again] == [p["digest"] for p in pushed]
    assert again[0]["layers_sent"] == 0


def test_a_tag_is_never_moved_off_other_bytes(
    multi_project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    built = run_json(capsys, "build", "--platform", BOTH)["images"]
    pushed = run_json(capsys, "push", "--platform", BOTH)["images"]
    repository, tag = pushed[0]["reference"].rsplit(":", 1)
    before = api.get_manifest(repository, tag)[0]
    # The amd64 image alone under the index's tag would move it: refused, nothing written.
    with pytest.raises(CheckFailed, match="already names an index"):
        publish(State(), repository, tag, [built[0]["image_id"]], Log(quiet=True))
    assert api.get_manifest(repository, tag)[0] == before


def test_one_platform_publishes_a_manifest_the_engine_pulls(
    multi_project: Path, capsys: pytest.CaptureFixture[str], engine: DockerEngine
) -> None:
    (build,) = run_json(capsys, "build", "--platform", "linux/arm64")["images"]
    (pushed,) = run_json(capsys, "push", "--platform", "linux/arm64")["images"]
    manifest = json.loads(
        skopeo("inspect", "--tls-verify=false", "--raw", f"docker://{pushed['by_digest']}")
    )
    assert manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert manifest["config"]["digest"] == build["image_id"]
    # The base's layers were mounted from its repository, not sent again.
    assert pushed["layers_skipped"] >= 1


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ("base id", "was built over"),
        ("base layers", "are not the first layers of image"),
    ],
)
def test_an_image_whose_base_layers_are_not_the_pinned_bases_is_not_published(
    multi_project: Path, capsys: pytest.CaptureFixture[str], change: str, said: str
) -> None:
    """The base layers a publish names come from the base's manifest only after the image's
    own config agrees with it: a config that claims another base, or other first layers, is
    refused before anything is sent."""
    from k3env.image.blobs import keep_config, kept_config

    # A push keeps the registry form a publish sends (a build alone is an engine hit).
    run_json(capsys, "push", "--platform", BOTH)
    built, other = run_json(capsys, "build", "--platform", BOTH)["images"]
    state = State()
    kept = kept_config(state, built["image_id"])
    assert kept is not None
    config = json.loads(kept.path.read_bytes())
    if change == "base id":
        config["config"]["Labels"]["io.k3env.base.id"] = other["image_id"]
    else:
        config["rootfs"]["diff_ids"][0] = "sha256:" + "0" * 64
    forged = keep_config(state, json.dumps(config, sort_keys=True).encode())
    repository = f"{REGISTRY}/k3env-test/forged"
    with pytest.raises(CheckFailed, match=said):
        publish(state, repository, "x", [forged.digest], Log(quiet=True))
    with pytest.raises(EngineError, match="HTTP 404"):  # nothing was written there
        api.list_tags(repository)


def test_the_twin_is_pushed_from_its_kept_blobs_as_an_oci_manifest(
    registry: str, tmp_path: Path
) -> None:
    """The twin's push: its layers kept as they were built (stored gzip, level 0), sent
    through the registry API, one OCI manifest whose layers unpack to the config's diff IDs."""
    import gzip
    import hashlib
    import io
    import tarfile

    from k3env.image.blobs import keep_config, keep_layer
    from k3env.image.twin import TWIN_LEVEL, publish_kept

    state = State(tmp_path / "state")
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        data = b"twin layer\n" * 1000
        info = tarfile.TarInfo("etc/k3env-twin-test")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    raw = layer.getvalue()
    diff_id = "sha256:" + hashlib.sha256(raw).hexdigest()
    reference = f"{registry}/k3env-test/twin-api:{diff_id[7:27]}"
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {},
                         "rootfs": {"type": "layers", "diff_ids": [diff_id]}}).encode()  # fmt: skip
    image_id = keep_config(state, config).digest
    # Nothing kept yet: the engine pushes instead (None), and nothing reached the registry.
    assert publish_kept(reference, image_id, State(tmp_path / "empty"), Log(quiet=True)) is None
    kept = keep_layer(state, raw, diff_id, level=TWIN_LEVEL)
    assert len(raw) < kept.size < len(raw) + 1024  # stored blocks, not compressed
    digest = publish_kept(reference, image_id, state, Log(quiet=True))
    assert digest is not None
    repository = reference.rsplit(":", 1)[0]
    got, media_type, body = api.get_manifest(repository, digest)
    manifest = json.loads(body)
    assert (got, media_type) == (digest, "application/vnd.oci.image.manifest.v1+json")
    assert manifest["config"]["digest"] == image_id
    assert api.tagged_config(repository, reference.rsplit(":", 1)[1]) == image_id
    (entry,) = manifest["layers"]
    api.read_blob(repository, entry["digest"], tmp_path / "blob")
    assert (
        hashlib.sha256(gzip.decompress((tmp_path / "blob").read_bytes())).hexdigest()
        == (diff_id[7:])
    )
