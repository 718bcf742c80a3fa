from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

from k3env.engine.protocol import BaseImage
from k3env.image.blobs import LAYER_MEDIA_TYPE, Descriptor
from k3env.image.layer import LayerFile, assemble, epoch_of, layer_tar, load_archive

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
    # Every directory above a file is named (an engine would date one it makes at load time).
    names = ["etc", "etc/k3env", "etc/k3env/provenance.json", "usr", "usr/lib", "usr/lib/x.py"]
    assert [m.name for m in members] == names
    assert {m.mtime for m in members} == {1000}
    x = members[5]
    assert (x.mode, x.uid, x.gid, x.uname) == (0o600, 5, 6, "")
    made = [m for m in members if m.name in ("etc", "usr", "usr/lib")]
    assert {(m.type, m.mode, m.uid, m.gid) for m in made} == {(tarfile.DIRTYPE, 0o755, 0, 0)}


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


def test_the_load_archive_carries_only_the_new_layer() -> None:
    a = assemble(BASE, FILES, env=[], labels={}, created_by="t", comment="")
    own = Descriptor(digest=a.diff_id, size=len(a.layer_tar), media_type=LAYER_MEDIA_TYPE)
    _names, _manifest, parts = load_archive(a.config_json, [*BASE.diff_ids, a.diff_id], own,
                                            a.layer_tar, None)  # fmt: skip
    archive = b"".join(p for p in parts if isinstance(p, bytes))
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        names = tar.getnames()
        manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
    assert len(manifest[0]["Layers"]) == 2
    assert manifest[0]["RepoTags"] is None
    assert manifest[0]["Layers"][0] not in names  # the base's layer is referenced, not carried
    assert manifest[0]["Layers"][1] in names


def test_a_tree_layer_is_a_function_of_the_tree_not_of_when_or_in_what_order_it_was_written(
    tmp_path: Path,
) -> None:
    import os
    import tarfile as tf

    from k3env.image.layer import tree_layer

    def make(root: Path, order: list[str], stamp: int) -> None:
        for name in order:
            path = root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(name)
            os.utime(path, (stamp, stamp))
        os.link(root / "usr/bin/python3", root / "usr/bin/python3.11")
        os.symlink("python3", root / "usr/bin/py")

    names = ["usr/bin/python3", "usr/lib/a.py", "etc/x", "usr/lib/b/c.py"]
    a, b = tmp_path / "a", tmp_path / "b"
    make(a, names, 1_500_000_000)
    make(b, list(reversed(names)), 2_000_000_000)  # another order, a later clock
    clamp = 1_000_000_000
    da = tree_layer(a, tmp_path / "a.tar", mtime=clamp)
    db = tree_layer(b, tmp_path / "b.tar", mtime=clamp)
    assert da == db and (tmp_path / "a.tar").read_bytes() == (tmp_path / "b.tar").read_bytes()
    with tf.open(tmp_path / "a.tar") as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == sorted(m.name for m in members)
    assert {m.mtime for m in members} == {clamp}  # every later mtime clamped
    link = next(m for m in members if m.name == "usr/bin/python3.11")
    assert link.islnk() and link.linkname == "usr/bin/python3"  # hard links kept
    assert next(m for m in members if m.name == "usr/bin/py").linkname == "python3"
    assert {m.uname for m in members} == {""}
    # An earlier mtime stays (clamped, never raised).
    (a / "old").write_text("x")
    os.utime(a / "old", (5, 5))
    tree_layer(a, tmp_path / "c.tar", mtime=clamp)
    with tf.open(tmp_path / "c.tar") as tar:
        assert tar.getmember("old").mtime == 5


def test_the_debian_package_set_names_what_moved(tmp_path: Path) -> None:
    from k3env.image.twindebian import Deb, debs_in, moved

    (tmp_path / "python3.11_3.11.2-6+deb12u6_amd64.deb").write_bytes(b"a")
    (tmp_path / "libc6_2.36-9+deb12u13_amd64.deb").write_bytes(b"b")
    (tmp_path / "tzdata_2025b-0+deb12u2_all.deb").write_bytes(b"c")
    (tmp_path / "perl-base_5.36.0-7%3a1_amd64.deb").write_bytes(b"d")
    fetched = debs_in(tmp_path)
    assert [(d.package, d.version, d.arch) for d in fetched] == [
        ("libc6", "2.36-9+deb12u13", "amd64"),
        ("perl-base", "5.36.0-7:1", "amd64"),
        ("python3.11", "3.11.2-6+deb12u6", "amd64"),
        ("tzdata", "2025b-0+deb12u2", "all"),
    ]
    pinned = {d.package: d for d in fetched}
    assert moved(pinned, fetched) == []
    pinned["python3.11"] = Deb(package="python3.11", version="3.11.2-6+deb12u5", arch="amd64",
                               sha256="0" * 64)  # fmt: skip
    del pinned["tzdata"]
    pinned["gone"] = Deb(package="gone", version="1", arch="all", sha256="1" * 64)
    assert moved(pinned, fetched) == [
        "gone 1: pinned, not fetched",
        f"python3.11: 3.11.2-6+deb12u5 -> 3.11.2-6+deb12u6, sha256 000000000000 -> "
        f"{fetched[2].sha256[:12]}",
        "tzdata 2025b-0+deb12u2: fetched, not pinned",
    ]
