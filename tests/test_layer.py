from __future__ import annotations

import io
import json
import tarfile

from k3env.engine.protocol import BaseImage
from k3env.image.layer import LayerFile, assemble, docker_archive, epoch_of, layer_tar

BASE = BaseImage(
    id="sha256:" + "1" * 64,
    created="2026-11-01T09:25:03.123456789Z",
    architecture="amd64",
    os="linux",
    variant=None,
    config={"Env": ["PATH=/usr/bin"], "Cmd": ["python3"], "Labels": {"a": "b"}},
    diff_ids=("sha256:" + "2" * 64,),
)
FILES = [
    LayerFile(path="/etc/k3env", is_dir=True, mode=0o755),
    LayerFile(path="/etc/k3env/provenance.json", content=b"{}"),
    LayerFile(path="/usr/lib/x.py", content=b"x = 1\n", mode=0o600, uid=5, gid=6),
]


def _build(env: list[str]) -> bytes:
    return assemble(
        BASE, FILES, env=env, labels={"k": "v"}, created_by="t", comment="c"
    ).config_json


def test_layer_tar_is_deterministic_and_sorted() -> None:
    a = layer_tar(FILES, 1000)
    b = layer_tar(list(reversed(FILES)), 1000)
    assert a == b
    with tarfile.open(fileobj=io.BytesIO(a)) as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == ["etc/k3env", "etc/k3env/provenance.json", "usr/lib/x.py"]
    assert {m.mtime for m in members} == {1000}
    x = members[2]
    assert (x.mode, x.uid, x.gid, x.uname) == (0o600, 5, 6, "")


def test_image_id_is_the_config_digest_and_changes_with_env() -> None:
    a1 = assemble(BASE, FILES, env=["A=1"], labels={}, created_by="t", comment="")
    a2 = assemble(BASE, FILES, env=["A=1"], labels={}, created_by="t", comment="")
    a3 = assemble(BASE, FILES, env=["A=2"], labels={}, created_by="t", comment="")
    assert a1.image_id == a2.image_id != a3.image_id
    assert a1.diff_id == a3.diff_id  # the env lives in the config, not in the layer
    config = json.loads(a1.config_json)
    assert config["rootfs"]["diff_ids"] == [*BASE.diff_ids, a1.diff_id]
    assert config["created"] == BASE.created
    assert config["config"]["Labels"] == {"a": "b"}


def test_labels_merge_over_the_base() -> None:
    config = json.loads(_build(["A=1"]))
    assert config["config"]["Labels"] == {"a": "b", "k": "v"}


def test_epoch_of_handles_nanoseconds() -> None:
    assert epoch_of("1970-01-01T00:00:10.999999999Z") == 10


def test_docker_archive_carries_only_the_new_layer() -> None:
    a = assemble(BASE, FILES, env=[], labels={}, created_by="t", comment="")
    archive = docker_archive(a, BASE.diff_ids)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        names = tar.getnames()
        manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
    assert len(manifest[0]["Layers"]) == 2
    assert manifest[0]["RepoTags"] is None
    assert manifest[0]["Layers"][0] not in names  # the base's layer is referenced, not carried
    assert manifest[0]["Layers"][1] in names
