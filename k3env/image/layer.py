"""Deterministic image assembly: one new layer over an existing base, as bytes.

Pure functions, no engine. The builder hands the result to ``Engine.load``.

Why not ``docker build``: the legacy builder (the only one the docker SDK drives) stamps
``created`` and parent-directory mtimes, so the same Dockerfile twice gives two image IDs.
Here the layer tar has sorted entries, fixed owners and a fixed mtime, and the config JSON is
written by us, so the image ID (the sha256 of that JSON) is known before the load. The
docker-archive lists the base's layers by diff ID but carries only the new layer's tar: the
engine resolves the base's chain from its layer store and never reads or copies the base
(moby image/tarexport/load.go looks a layer up by chain ID before opening its file).
"""

from __future__ import annotations

import io
import os
import shutil
import stat
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from k3env import jsontext
from k3env.config.shapes import control_character, is_normal_absolute_path
from k3env.engine.protocol import BaseImage, HistoryEntry
from k3env.errors import PatchError
from k3env.hashing import HashingWriter, sha256_digest


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


def layer_tar(files: Sequence[LayerFile], mtime: int) -> bytes:
    """A tar with sorted entries, fixed owners and ``mtime``: same files, same bytes."""
    for f in files:
        check_entry_path(f.path)
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
    config_json = jsontext.dumps(config, compact=True).encode()
    return Assembled(
        config_json=config_json,
        image_id=sha256_digest(config_json),
        layer_tar=tar,
        diff_id=diff_id,
    )


def docker_archive(assembled: Assembled, base_diff_ids: Sequence[str]) -> bytes:
    """A ``docker load`` archive holding only the config and the new layer.

    The manifest still lists every layer: the base's are found in the engine's layer store
    by chain ID, so their (absent) files are never opened. No ``RepoTags``: the builder tags
    only after it has checked the loaded image's ID.
    """
    layers = [f"{d.split(':', 1)[1]}/layer.tar" for d in (*base_diff_ids, assembled.diff_id)]
    config_name = assembled.image_id.split(":", 1)[1] + ".json"
    manifest = [{"Config": config_name, "RepoTags": None, "Layers": layers}]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in (
            (config_name, assembled.config_json),
            (layers[-1], assembled.layer_tar),
            ("manifest.json", jsontext.dumps(manifest, sort_keys=False).encode()),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


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


def archive_parts(
    config_json: bytes, layer: Path, diff_ids: Sequence[str]
) -> tuple[str, tuple[bytes | Path, ...]]:
    """The ``docker load`` archive of ``archive_file`` as pieces to send one after the other
    (the layer file itself among them, never copied), and the image ID. The layer file may be
    gzip'd: the engine decompresses a layer it loads, and checks it against its diff ID."""
    image_id = sha256_digest(config_json)
    layers = [f"{d.split(':', 1)[1]}/layer.tar" for d in diff_ids]
    config_name = image_id.split(":", 1)[1] + ".json"
    manifest = jsontext.dumps(
        [{"Config": config_name, "RepoTags": None, "Layers": layers}], sort_keys=False
    ).encode()
    head = b""
    for name, data in ((config_name, config_json), ("manifest.json", manifest)):
        head += _member(name, len(data)) + data + _padding(len(data))
    size = layer.stat().st_size
    tail = _padding(size) + b"\0" * (2 * tarfile.BLOCKSIZE)
    return image_id, (head + _member(layers[-1], size), layer, tail)


def _member(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    return info.tobuf(format=tarfile.PAX_FORMAT)


def _padding(size: int) -> bytes:
    return b"\0" * (-size % tarfile.BLOCKSIZE)


def archive_file(config_json: bytes, layer: Path, diff_ids: Sequence[str], out: Path) -> str:
    """A ``docker load`` archive at ``out`` holding the config and one layer file (the last
    of ``diff_ids``); the others are the base's, found by chain ID. Returns the image ID."""
    image_id, parts = archive_parts(config_json, layer, diff_ids)
    with out.open("wb") as f:
        for part in parts:
            if isinstance(part, Path):
                with part.open("rb") as src:
                    shutil.copyfileobj(src, f, 1 << 20)
            else:
                f.write(part)
    return image_id
