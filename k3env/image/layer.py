"""Deterministic image assembly: one new layer over an existing base, as bytes.

Pure functions, no engine. The builder hands the result to ``Engine.load``.

Why not ``docker build``: the legacy builder (the only one the docker SDK drives) stamps
``created`` and parent-directory mtimes, so the same Dockerfile twice gives two image IDs.
Here the layer tar has sorted entries, fixed owners and a fixed mtime, and the config JSON is
written by us, so the image's names (the sha256 of that JSON, and of the OCI manifest naming it
and the layers) are known before the load. The load archive carries only the new layer's blob:
the engine finds the base's layers in its own stores and never reads or copies the base (moby
image/tarexport/load.go looks a layer up by chain ID before opening its file; containerd finds
a blob in its content store by digest).

A base's image as k3env builds on it is read from its config JSON (``image_of_config``), not
from the engine's inspect: the engine's view of a config differs by release (Docker 20.10
answers every container-config field, Docker 28 only those set), and what an image over it
holds must not.
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

from k3env import jsontext
from k3env.config.shapes import control_character, is_normal_absolute_path
from k3env.engine.naming import ImageNames
from k3env.engine.protocol import BaseImage, HistoryEntry
from k3env.errors import PatchError, StateError
from k3env.hashing import HashingWriter, digest_hex, sha256_digest
from k3env.image.blobs import (
    CONFIG_MEDIA_TYPE,
    MANIFEST_MEDIA_TYPE,
    Described,
    Descriptor,
    Manifest,
    manifest_of,
)

INDEX_MEDIA_TYPE = "application/vnd.oci.image.index.v1+json"
OCI_LAYOUT = {"imageLayoutVersion": "1.0.0"}


@dataclass(frozen=True, kw_only=True)
class LayerFile:
    path: str  # absolute path in the image
    content: bytes = b""
    mode: int = 0o644
    uid: int = 0
    gid: int = 0
    is_dir: bool = False


@dataclass(frozen=True, kw_only=True)
class Assembled:
    config_json: bytes
    image_id: str  # sha256 of config_json
    layer_tar: bytes
    diff_id: str  # sha256 of layer_tar


def epoch_of(created: str) -> int:
    """Seconds since the epoch for an RFC 3339 timestamp (nanoseconds allowed)."""
    text = created.rstrip("Z")
    if "." in text:
        head, frac = text.split(".", 1)
        text = head + "." + frac[:6]
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp())


def check_entry_path(path: str) -> None:
    """Refuse a layer entry that is not an absolute, normalised path below ``/``: a ``..``
    entry would write outside the directory it names when the layer is applied."""
    if not is_normal_absolute_path(path) or control_character(path):
        raise PatchError(
            f"refusing to write {path!r} into a layer: not an absolute, normalised path",
            where="image layer",
            fix="a patch target must resolve inside the image without '..' (check the lock)",
        )


def with_parents(files: Sequence[LayerFile]) -> list[LayerFile]:
    """``files`` and an entry for every directory above them that they do not name (0755,
    root): without one, an engine makes the directory when it loads the layer and dates it
    then, so an export of the same image differed by when and where it was loaded."""
    named = {f.path for f in files}
    parents = {str(p) for f in files for p in PurePosixPath(f.path).parents if str(p) != "/"}
    return [*files, *(LayerFile(path=p, mode=0o755, is_dir=True) for p in parents - named)]


def layer_tar(files: Sequence[LayerFile], mtime: int) -> bytes:
    """A tar with sorted entries, fixed owners and ``mtime``, every parent directory named:
    same files, same bytes."""
    for f in files:
        check_entry_path(f.path)
    files = with_parents(files)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for f in sorted(files, key=lambda f: f.path):
            info = tarfile.TarInfo(f.path.lstrip("/") + ("/" if f.is_dir else ""))
            info.mtime = mtime
            info.uid, info.gid = f.uid, f.gid
            info.uname = info.gname = ""
            info.mode = f.mode
            if f.is_dir:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(f.content)
                tar.addfile(info, io.BytesIO(f.content))
    return buf.getvalue()


def runtime_config(
    base: BaseImage, *, env: Sequence[str], labels: Mapping[str, str]
) -> dict[str, Any]:
    """The derived image's container config: the base's, with ``env`` and the labels merged
    over the base's (sorted)."""
    config = dict(base.config)
    config["Env"] = list(env)
    merged = dict(base.config.get("Labels") or {})
    merged.update(labels)
    config["Labels"] = dict(sorted(merged.items()))
    return config


def image_config(
    base: BaseImage,
    *,
    diff_id: str,
    env: Sequence[str],
    labels: Mapping[str, str],
    created_by: str,
    comment: str,
) -> dict[str, Any]:
    config = runtime_config(base, env=env, labels=labels)
    history: list[dict[str, Any]] = [_history_json(h) for h in base.history]
    history.append(
        _history_json(HistoryEntry(created=base.created, created_by=created_by, comment=comment))
    )
    out: dict[str, Any] = {
        "architecture": base.architecture,
        "os": base.os,
        # The base's timestamp: nothing about this build's wall clock enters the image.
        "created": base.created,
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [*base.diff_ids, diff_id]},
        "history": history,
    }
    if base.variant:
        out["variant"] = base.variant
    return out


def image_of_config(config_json: bytes, engine_id: str, where: str) -> BaseImage:
    """The image whose config JSON is ``config_json`` (the engine calls it ``engine_id``), as
    an image over it is built: its container config, history and diff IDs as written."""
    doc = jsontext.loads(config_json, where=where)
    rootfs = jsontext.field(doc, "rootfs", dict, where=where)
    diff_ids = jsontext.field(rootfs, "diff_ids", list, where=where)
    history = jsontext.field(doc, "history", list, where=where, default=[])
    if not all(isinstance(d, str) for d in diff_ids) or not all(
        isinstance(h, dict) for h in history
    ):
        raise StateError("an image config with a malformed rootfs or history", where=where,
                         fix="remove the kept config; k3env writes it again")  # fmt: skip
    return BaseImage(
        id=engine_id,
        created=jsontext.field(doc, "created", str, where=where),
        architecture=jsontext.field(doc, "architecture", str, where=where),
        os=jsontext.field(doc, "os", str, where=where),
        variant=jsontext.field(doc, "variant", str, where=where, default=None),
        config=jsontext.field(doc, "config", dict, where=where, default={}),
        diff_ids=tuple(diff_ids),
        history=tuple(
            HistoryEntry(
                created=str(h.get("created") or ""),
                created_by=str(h.get("created_by") or ""),
                comment=str(h.get("comment") or ""),
                empty_layer=bool(h.get("empty_layer")),
            )
            for h in history
        ),
    )


def _history_json(h: HistoryEntry) -> dict[str, Any]:
    out: dict[str, Any] = {"created": h.created, "created_by": h.created_by}
    if h.comment:
        out["comment"] = h.comment
    if h.empty_layer:
        out["empty_layer"] = True
    return out


def assemble(
    base: BaseImage,
    files: Sequence[LayerFile],
    *,
    env: Sequence[str],
    labels: Mapping[str, str],
    created_by: str,
    comment: str,
) -> Assembled:
    tar = layer_tar(files, epoch_of(base.created))
    diff_id = sha256_digest(tar)
    config = image_config(
        base, diff_id=diff_id, env=env, labels=labels, created_by=created_by, comment=comment
    )
    config_json = jsontext.canonical(config)
    return Assembled(
        config_json=config_json,
        image_id=sha256_digest(config_json),
        layer_tar=tar,
        diff_id=diff_id,
    )


def tree_layer(
    root: Path,
    out: Path,
    *,
    mtime: int,
    owners: bool = True,
    dirs: Mapping[str, Sequence[int]] | None = None,
) -> str:
    """Write the tree under ``root`` as a layer tar at ``out``, streamed from disk: entries
    sorted, every mtime clamped to ``mtime``, no user or group names, hard links kept.
    ``owners=False`` makes every entry 0:0 (a tree written by an unprivileged installer);
    ``dirs`` gives (mode, uid, gid) for directories the layer shares with its base. Returns
    the layer's diff ID."""
    with out.open("wb") as fh:
        sink = HashingWriter(fh)
        write_tree(root, sink, mtime=mtime, owners=owners, dirs=dirs)
    return sink.digest


def write_tree(
    root: Path,
    sink: Any,
    *,
    mtime: int,
    owners: bool = True,
    dirs: Mapping[str, Sequence[int]] | None = None,
) -> None:
    """``tree_layer``'s tar, written to ``sink`` (anything with ``write`` and ``tell``)."""
    with tarfile.open(fileobj=sink, mode="w", format=tarfile.PAX_FORMAT) as tar:
        paths: list[Path] = []
        for current, subdirs, names in os.walk(root):
            subdirs.sort()
            base = Path(current)
            paths.extend(base / n for n in sorted(names + subdirs))
        for path in sorted(paths, key=lambda p: p.relative_to(root).as_posix()):
            name = path.relative_to(root).as_posix()
            check_entry_path("/" + name)
            info = tar.gettarinfo(str(path), arcname=name)
            info.mtime = min(int(info.mtime), mtime)
            info.uname = info.gname = ""
            if not owners:
                info.uid = info.gid = 0
                if info.isreg() or info.isdir():
                    info.mode = 0o755 if info.mode & 0o111 or info.isdir() else 0o644
            if info.isdir() and dirs and ("/" + name) in dirs:
                info.mode, info.uid, info.gid = (int(v) for v in dirs["/" + name])
            if info.isreg():
                with path.open("rb") as src:
                    tar.addfile(info, src)
            elif not stat.S_ISSOCK(path.lstat().st_mode):
                tar.addfile(info)


def load_archive(
    config_json: bytes,
    diff_ids: Sequence[str],
    layer: Described,
    data: bytes | Path,
    base_layers: Sequence[Described] | None,
) -> tuple[ImageNames, Manifest | None, tuple[bytes | Path, ...]]:
    """The ``docker load`` archive of an image k3env wrote, as pieces to send one after the
    other (``data``, the last layer's blob ``layer``, among them as it is, never copied),
    with the image's names and manifest.

    One archive for both image stores, the same bytes for both. It holds the config, the last
    layer's blob and, when the base's manifest layers are known (``base_layers``), the OCI
    manifest naming them and this layer, as an OCI image layout (``oci-layout``, ``index.json``,
    ``blobs/sha256/``); beside it, ``manifest.json`` names the same config and blobs as a
    docker-archive. The classic store reads only ``manifest.json`` and finds the base's layers
    in its layer store by chain ID (their absent files are never opened); the containerd store
    reads the layout when there is one (containerd core/images/archive/importer.go) and finds
    the base's blobs in its content store, where the base's own load or pull put them. The
    index names no image (no ``org.opencontainers.image.ref.name``): the engine answers
    ``Loaded image ID``, and k3env tags only after it has checked that ID
    (``naming.engine_id``). ``diff_ids`` is the config's ``rootfs.diff_ids``; ``data`` may be
    gzip'd (the engine checks what it unpacks against the last diff ID)."""
    config_name = _blob_name(sha256_digest(config_json))
    known = base_layers is not None and len(base_layers) == len(diff_ids) - 1
    names = (
        [_blob_name(b.digest) for b in base_layers or ()]
        if known
        else [_blob_name(d) for d in diff_ids[:-1]]
    )
    docker = [
        {"Config": config_name, "RepoTags": None, "Layers": [*names, _blob_name(layer.digest)]}
    ]
    members = [(config_name, config_json)]
    manifest = None
    if known:
        assert base_layers is not None
        config = Descriptor(digest=sha256_digest(config_json), size=len(config_json),
                            media_type=CONFIG_MEDIA_TYPE)  # fmt: skip
        manifest = manifest_of(config, [*base_layers, layer])
        index = {
            "schemaVersion": 2,
            "mediaType": INDEX_MEDIA_TYPE,
            "manifests": [
                {"mediaType": MANIFEST_MEDIA_TYPE, "digest": manifest.digest,
                 "size": len(manifest.body)}
            ],
        }  # fmt: skip
        members += [
            (_blob_name(manifest.digest), manifest.body),
            ("index.json", jsontext.canonical(index)),
        ]
    members.append(("manifest.json", jsontext.dumps(docker, sort_keys=False).encode()))
    if known:
        members.append(("oci-layout", jsontext.canonical(OCI_LAYOUT)))
    head = b"".join(_member(name, len(d)) + d + _padding(len(d)) for name, d in members)
    size = len(data) if isinstance(data, bytes) else data.stat().st_size
    if size != layer.size:
        raise StateError(
            f"the layer blob {layer.digest[:19]} is {size} bytes, its descriptor says {layer.size}",
            where=str(data) if isinstance(data, Path) else "the assembled layer",
            fix="build again (the kept blob changed under k3env)",
        )
    tail = _padding(size) + b"\0" * (2 * tarfile.BLOCKSIZE)
    image = ImageNames(config=sha256_digest(config_json),
                       manifest=manifest.digest if manifest else None)  # fmt: skip
    return image, manifest, (head + _member(_blob_name(layer.digest), size), data, tail)


def _blob_name(digest: str) -> str:
    return f"blobs/sha256/{digest_hex(digest)}"


def _member(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    return info.tobuf(format=tarfile.PAX_FORMAT)


def _padding(size: int) -> bytes:
    return b"\0" * (-size % tarfile.BLOCKSIZE)
