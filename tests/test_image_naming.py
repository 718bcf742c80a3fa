"""How each image store names an image, and the one load archive both stores read.

The classic store calls an image by its config digest, the containerd image store by its
manifest digest (``engine.naming``); k3env writes both into one archive (``layer.load_archive``)
whose bytes depend on the image alone, and checks the engine's answer through one rule.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from collections.abc import Sequence
from pathlib import Path

import pytest

from k3env.engine.naming import CLASSIC, CONTAINERD, ImageNames, engine_id, store_of
from k3env.engine.protocol import BaseImage
from k3env.errors import EngineError
from k3env.image.blobs import (
    DOCKER_LAYER_MEDIA_TYPE,
    LAYER_MEDIA_TYPE,
    Descriptor,
    keep_config,
    keep_manifest,
    manifest_of,
    oci_manifest,
    parse_manifest,
)
from k3env.image.identity import identify
from k3env.image.install import load_checked
from k3env.image.layer import LayerFile, assemble, image_config, image_of_config, load_archive
from k3env.log import Log
from k3env.state import State

OVERLAY2 = [["Backing Filesystem", "extfs"], ["Supports d_type", "true"], ["userxattr", "false"]]
SNAPSHOTTER = [["driver-type", "io.containerd.snapshotter.v1"]]
BASE_LAYER = Descriptor(digest="sha256:" + "b" * 64, size=1234, media_type=LAYER_MEDIA_TYPE)
BASE = BaseImage(
    id="sha256:" + "1" * 64,
    created="2026-11-30T00:00:00Z",
    architecture="amd64",
    os="linux",
    variant=None,
    config={"Env": ["PATH=/usr/bin"], "Cmd": ["python3"]},
    diff_ids=("sha256:" + "2" * 64,),
)


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def image(content: bytes = b"x = 1\n") -> tuple[bytes, str, bytes, Descriptor]:
    """(config JSON, diff ID, gzip'd layer blob, its descriptor) of a one-file layer over BASE."""
    a = assemble(BASE, [LayerFile(path="/x.py", content=content)], env=[], labels={},
                 created_by="t", comment="")  # fmt: skip
    blob = gzip.compress(a.layer_tar, mtime=0)
    return a.config_json, a.diff_id, blob, Descriptor(digest=sha(blob), size=len(blob),
                                                      media_type=LAYER_MEDIA_TYPE)  # fmt: skip


def joined(parts: Sequence[bytes | Path]) -> bytes:
    return b"".join(p.read_bytes() if isinstance(p, Path) else p for p in parts)


def members(archive: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]


# --- the rule -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("status", "store"),
    [
        (SNAPSHOTTER, CONTAINERD),
        (OVERLAY2, CLASSIC),
        ([], CLASSIC),
        (None, CLASSIC),
        ([["driver-type", "overlay2"]], CLASSIC),
        ("io.containerd.snapshotter.v1", CLASSIC),  # not the list /info sends: no guess
        ([["driver-type"]], CLASSIC),
    ],
    ids=["containerd", "overlay2", "empty", "absent", "other-driver-type", "a-string", "short"],
)
def test_the_store_is_read_from_the_driver_status_info_sends(status: object, store: str) -> None:
    assert store_of({"Driver": "overlayfs", "DriverStatus": status}) == store


def test_each_store_names_an_image_by_its_own_digest() -> None:
    names = ImageNames(config="sha256:" + "c" * 64, manifest="sha256:" + "m" * 64)
    assert engine_id(CLASSIC, names) == names.config
    assert engine_id(CONTAINERD, names) == names.manifest
    # A classic store needs no manifest; a containerd one cannot do without.
    unknown = ImageNames(config=names.config)
    assert engine_id(CLASSIC, unknown) == names.config
    with pytest.raises(EngineError, match=r"containerd image store.*manifest digest"):
        engine_id(CONTAINERD, unknown)
    with pytest.raises(ValueError, match="unknown image store"):
        engine_id("zfs", names)


# --- the archive ----------------------------------------------------------------------------
def test_the_archive_is_the_same_bytes_every_time_and_its_index_is_k3envs_own() -> None:
    config, diff_id, blob, own = image()
    diff_ids = [*BASE.diff_ids, diff_id]
    first = load_archive(config, diff_ids, own, blob, [BASE_LAYER])
    again = load_archive(config, diff_ids, own, blob, [BASE_LAYER])
    assert joined(first[2]) == joined(again[2]) and first[:2] == again[:2]
    names, manifest, parts = first
    assert manifest is not None
    files = members(joined(parts))
    # index.json: one manifest by digest and size, no name (the engine answers "Loaded image
    # ID"; k3env tags after checking it), sorted keys, no spaces.
    assert (
        files["index.json"]
        == (
            f'{{"manifests":[{{"digest":"{manifest.digest}",'
            '"mediaType":"application/vnd.oci.image.manifest.v1+json",'
            f'"size":{len(manifest.body)}}}],'
            '"mediaType":"application/vnd.oci.image.index.v1+json","schemaVersion":2}'
        ).encode()
    )
    assert files["oci-layout"] == b'{"imageLayoutVersion":"1.0.0"}'
    assert names == ImageNames(config=sha(config), manifest=sha(manifest.body))
    # The manifest: the base's layers as its registry names them, then this layer's blob.
    doc = json.loads(files[f"blobs/sha256/{manifest.digest[7:]}"])
    assert doc["config"] == {"digest": names.config, "size": len(config),
                             "mediaType": "application/vnd.oci.image.config.v1+json"}  # fmt: skip
    assert [x["digest"] for x in doc["layers"]] == [BASE_LAYER.digest, own.digest]
    # The bytes a publish of the same config and layers sends: one manifest for both.
    assert files[f"blobs/sha256/{manifest.digest[7:]}"] == oci_manifest(
        Descriptor(digest=names.config, size=len(config),
                   media_type="application/vnd.oci.image.config.v1+json"),
        [BASE_LAYER, own],
    )  # fmt: skip


def test_both_readers_find_the_same_config_and_only_the_new_layer_travels() -> None:
    config, diff_id, blob, own = image()
    _names, manifest, parts = load_archive(config, [*BASE.diff_ids, diff_id], own, blob,
                                           [BASE_LAYER])  # fmt: skip
    assert manifest is not None
    files = members(joined(parts))
    # The classic store's reader: manifest.json.
    (entry,) = json.loads(files["manifest.json"])
    assert entry["RepoTags"] is None
    assert files[entry["Config"]] == config
    assert files[entry["Layers"][-1]] == blob and entry["Layers"][0] not in files
    # The containerd store's reader: index.json -> manifest -> config and layers, by digest.
    index = json.loads(files["index.json"])
    body = files["blobs/sha256/" + index["manifests"][0]["digest"][7:]]
    doc = json.loads(body)
    assert files["blobs/sha256/" + doc["config"]["digest"][7:]] == config
    assert files["blobs/sha256/" + doc["layers"][-1]["digest"][7:]] == blob
    assert "blobs/sha256/" + BASE_LAYER.digest[7:] not in files  # in the content store
    assert gzip.decompress(blob) and sha(gzip.decompress(blob)) == diff_id
    assert sorted(files) == sorted([
        entry["Config"], f"blobs/sha256/{manifest.digest[7:]}", "index.json", "manifest.json",
        "oci-layout", entry["Layers"][-1],
    ])  # fmt: skip


def test_an_unknown_base_manifest_gives_a_docker_archive_only_and_no_manifest_digest() -> None:
    config, diff_id, blob, own = image()
    names, manifest, parts = load_archive(config, [*BASE.diff_ids, diff_id], own, blob, None)
    assert manifest is None and names == ImageNames(config=sha(config))
    assert sorted(members(joined(parts))) == sorted(
        [f"blobs/sha256/{sha(config)[7:]}", "manifest.json", f"blobs/sha256/{own.digest[7:]}"]
    )


def test_the_layer_file_is_sent_as_it_is_and_a_wrong_size_is_refused(tmp_path: Path) -> None:
    config, diff_id, blob, own = image()
    (tmp_path / "blob").write_bytes(blob)
    _names, _m, parts = load_archive(config, [*BASE.diff_ids, diff_id], own, tmp_path / "blob",
                                     [BASE_LAYER])  # fmt: skip
    assert parts[1] == tmp_path / "blob"
    assert joined(parts) == joined(load_archive(config, [*BASE.diff_ids, diff_id], own, blob,
                                                [BASE_LAYER])[2])  # fmt: skip
    with pytest.raises(Exception, match="descriptor says"):
        load_archive(config, [*BASE.diff_ids, diff_id], own, blob + b"x", [BASE_LAYER])


def test_a_registry_manifest_names_docker_gzip_layers_the_oci_way() -> None:
    body = json.dumps({
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                   "digest": "sha256:" + "c" * 64, "size": 10},
        "layers": [{"mediaType": DOCKER_LAYER_MEDIA_TYPE, "digest": BASE_LAYER.digest,
                    "size": 1234}],
    }).encode()  # fmt: skip
    parsed = parse_manifest(body, "test")
    assert parsed.digest == sha(body) and parsed.config == "sha256:" + "c" * 64
    assert parsed.layers == (BASE_LAYER,)
    with pytest.raises(Exception, match="manifest entry"):
        parse_manifest(body.replace(b'"size": 1234', b'"size": -1'), "test")


# --- the check and the names an engine's ID stands for ---------------------------------------
class _Store:
    """An engine that answers ``answer`` to a load, on image store ``store``."""

    def __init__(self, store: str, answer: str) -> None:
        self.store, self.answer = store, answer
        self.tagged: list[tuple[str, str, str]] = []
        self.removed: list[str] = []

    def image_store(self) -> str:
        return self.store

    def load(self, archive: object) -> str:
        return self.answer

    def tag(self, image_id: str, repository: str, tag: str) -> None:
        self.tagged.append((image_id, repository, tag))

    def remove(self, ref: str) -> None:
        self.removed.append(ref)


@pytest.mark.parametrize("store", [CLASSIC, CONTAINERD])
def test_a_load_is_tagged_only_when_the_engine_names_it_as_its_store_does(store: str) -> None:
    config, diff_id, blob, own = image()
    names, _m, parts = load_archive(config, [*BASE.diff_ids, diff_id], own, blob, [BASE_LAYER])
    assert names.manifest is not None
    right = names.config if store == CLASSIC else names.manifest
    wrong = names.manifest if store == CLASSIC else names.config
    good = _Store(store, right)
    assert load_checked(good, parts, names, "r/x:t", Log(quiet=True)) == right  # type: ignore[arg-type]
    assert good.tagged == [(right, "r/x", "t")] and good.removed == []
    bad = _Store(store, wrong)
    with pytest.raises(EngineError, match=f"the engine stored {wrong}, expected {right}"):
        load_checked(bad, parts, names, "r/x:t", Log(quiet=True))  # type: ignore[arg-type]
    assert bad.tagged == [] and bad.removed == [wrong]


def test_an_image_is_named_from_what_k3env_kept_on_either_store(tmp_path: Path) -> None:
    state = State(tmp_path)
    config, diff_id, blob, own = image()
    names, manifest, _parts = load_archive(config, [*BASE.diff_ids, diff_id], own, blob,
                                           [BASE_LAYER])  # fmt: skip
    assert manifest is not None and names.manifest is not None
    # Nothing kept: the classic store's ID is the config digest, a containerd one's unknown.
    assert identify(CLASSIC, state, names.config) == (ImageNames(config=names.config), None)
    assert identify(CONTAINERD, state, names.manifest) is None
    keep_config(state, config)
    keep_manifest(state, manifest)
    assert identify(CLASSIC, state, names.config) == (names, manifest)
    assert identify(CONTAINERD, state, names.manifest) == (names, manifest)
    # A kept manifest whose bytes changed is no manifest.
    kept = state.path("manifests", f"{manifest.digest[7:]}.json")
    kept.write_bytes(kept.read_bytes() + b" ")
    assert identify(CONTAINERD, state, names.manifest) is None
    assert identify(CLASSIC, state, names.config) == (ImageNames(config=names.config), None)


def test_a_base_is_read_from_its_config_json_not_from_an_engines_view_of_it() -> None:
    """Docker 20.10's inspect answers every container-config field (empty or null), Docker 28's
    only those set: an image over the base read from its config JSON is the same on both."""
    doc = image_config(BASE, diff_id="sha256:" + "3" * 64, env=["PATH=/usr/bin"],
                       labels={"a": "b"}, created_by="k3env", comment="c")  # fmt: skip
    raw = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
    read = image_of_config(raw, "sha256:" + "e" * 64, "test")
    assert read.id == "sha256:" + "e" * 64  # the engine's ID: what engine calls use
    assert read.diff_ids == (*BASE.diff_ids, "sha256:" + "3" * 64)
    assert read.config == doc["config"] and read.created == BASE.created
    assert [h.created_by for h in read.history] == ["k3env"]
    files = [LayerFile(path="/y", content=b"y")]
    over = assemble(read, files, env=[], labels={}, created_by="t", comment="")
    engine_view = dict(doc["config"], Hostname="", Domainname="", User="", OnBuild=None)
    inspected = BaseImage(id=read.id, created=read.created, architecture=read.architecture,
                          os=read.os, variant=None, config=engine_view, diff_ids=read.diff_ids,
                          history=read.history)  # fmt: skip
    assert over.config_json != assemble(inspected, files, env=[], labels={}, created_by="t",
                                        comment="").config_json  # fmt: skip
    assert over.config_json == assemble(
        image_of_config(raw, "sha256:" + "f" * 64, "test"), files, env=[], labels={},
        created_by="t", comment="",
    ).config_json  # fmt: skip


def test_manifest_of_is_the_manifest_bytes_and_their_digest() -> None:
    config = Descriptor(digest="sha256:" + "c" * 64, size=10,
                        media_type="application/vnd.oci.image.config.v1+json")  # fmt: skip
    m = manifest_of(config, [BASE_LAYER])
    assert m.body == oci_manifest(config, [BASE_LAYER]) and m.digest == sha(m.body)
    assert parse_manifest(m.body, "test") == m


class _Info:
    """The engine's HTTP client where only ``GET /info`` answers (and is counted)."""

    socket_path = "/nowhere.sock"

    def __init__(self, status: object) -> None:
        self.status, self.asked = status, 0

    def json(self, method: str, path: str) -> dict[str, object]:
        assert (method, path) == ("GET", "/info")
        self.asked += 1
        return {"Driver": "overlayfs", "DriverStatus": self.status}


@pytest.mark.parametrize(
    ("api", "store", "asked"),
    [("1.41", CLASSIC, 0), ("1.42", CLASSIC, 0), ("1.43", CONTAINERD, 1),
     ("1.51", CONTAINERD, 1), ("", CONTAINERD, 1), ("x.y", CONTAINERD, 1)],
    ids=["20.10", "23.0", "24.0", "28.5", "no-header", "unreadable"],
)  # fmt: skip
def test_an_engine_below_api_1_43_is_classic_without_asking_info(
    api: str, store: str, asked: int
) -> None:
    """Docker 24.0 (API 1.43) grew the containerd image store: below it, no /info (10-25 ms
    of the daemon's time on a rebuild); from it on, /info says, once."""
    from k3env.engine.dockerd import DockerEngine

    engine = DockerEngine.__new__(DockerEngine)  # no socket: only the store is asked
    info = _Info(SNAPSHOTTER)
    engine.http, engine._api, engine._store = info, api, None  # type: ignore[assignment]
    engine.base_url = f"unix://{info.socket_path}"
    assert engine.image_store() == store and engine.image_store() == store
    assert info.asked == asked
