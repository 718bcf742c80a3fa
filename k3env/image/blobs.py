"""The registry form of what k3env writes: each layer it assembles, gzip-compressed once,
kept by diff ID, each image config it writes, kept by its digest, and each image's OCI manifest
(the one its load archive carries: the engine's ID for it on a containerd image store), kept by
its digest, so that a publish sends the very bytes that were built and verified without asking
the engine for them, and an image the engine holds can be named as k3env wrote it.

A layer is compressed when it is made (deterministic: zlib's gzip wrapper, no name, mtime 0,
level 6; the same tar gives the same blob with the same zlib), and its record names the
compressed digest and size. A layer kept at another level is another blob, kept apart (the
twin's, stored at level 0). Base layers are never kept here: they are in a registry already,
named by the base's own manifest.
"""

from __future__ import annotations

import json
import os
import re
import threading
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from k3env import jsontext
from k3env.errors import K3envError, StateError
from k3env.hashing import HashingWriter, digest_hex, sha256_digest
from k3env.image import records
from k3env.state import State

LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"
# A base's layer a registry names the Docker way: the same bytes; k3env's manifests name it the
# OCI way (as a publish does).
DOCKER_LAYER_MEDIA_TYPE = "application/vnd.docker.image.rootfs.diff.tar.gzip"
CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
LEVEL = 6
_CHUNK = 1 << 20
_MAX_MANIFEST = 4 << 20
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


@dataclass(frozen=True, kw_only=True)
class Blob:
    """A blob the registry will hold: its digest, size, media type and where it is here."""

    digest: str
    size: int
    media_type: str
    path: Path


class Described(Protocol):
    """What a manifest says of a blob."""

    @property
    def digest(self) -> str: ...
    @property
    def size(self) -> int: ...
    @property
    def media_type(self) -> str: ...


@dataclass(frozen=True, kw_only=True)
class Descriptor:
    """A blob as a manifest names it."""

    digest: str
    size: int
    media_type: str


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """An image's OCI manifest in the byte form k3env writes: its digest, its config's, its
    layers in order (a base's as its registry names them, the Docker gzip type the OCI way)."""

    body: bytes
    digest: str
    config: str
    layers: tuple[Descriptor, ...]


def manifest_of(config: Described, layers: Sequence[Described]) -> Manifest:
    """The OCI manifest of an image with ``config`` and ``layers`` (``oci_manifest``'s bytes)."""
    body = oci_manifest(config, layers)
    named = tuple(Descriptor(digest=x.digest, size=x.size, media_type=x.media_type) for x in layers)
    return Manifest(body=body, digest=sha256_digest(body), config=config.digest, layers=named)


def parse_manifest(body: bytes, where: str, error: type[K3envError] = StateError) -> Manifest:
    """A single-image manifest (OCI or Docker schema 2), each field k3env builds on checked
    (``error`` naming ``where`` otherwise); its layers as k3env's manifests name them."""
    doc = jsontext.loads(body, where=where, limit=_MAX_MANIFEST, error=error)
    config = jsontext.field(doc, "config", dict, where=where, error=error)
    entries = jsontext.field(doc, "layers", list, where=where, error=error)
    layers = []
    for entry in [config, *entries]:
        if not isinstance(entry, dict):
            raise error("a manifest entry is not an object", where=where,
                        fix="the manifest is not one of an image k3env can build on")  # fmt: skip
        digest = jsontext.field(entry, "digest", str, where=where, error=error)
        size = jsontext.field(entry, "size", int, where=where, error=error)
        media_type = jsontext.field(entry, "mediaType", str, where=where, error=error)
        if not _DIGEST.fullmatch(digest) or size < 0:
            raise error(f"a manifest entry names {digest[:80]!r}, size {size}", where=where,
                        fix="the manifest is not one of an image k3env can build on")  # fmt: skip
        if media_type == DOCKER_LAYER_MEDIA_TYPE:
            media_type = LAYER_MEDIA_TYPE
        layers.append(Descriptor(digest=digest, size=size, media_type=media_type))
    return Manifest(body=body, digest=sha256_digest(body), config=layers[0].digest,
                    layers=tuple(layers[1:]))  # fmt: skip


def keep_manifest(state: State, manifest: Manifest) -> None:
    """Keep ``manifest`` by its digest, and which manifest k3env wrote for its config (where
    an engine that names images by config digest finds it)."""
    name = f"{digest_hex(manifest.digest)}.json"
    path = state.path("manifests", name)
    if not path.is_file() or path.read_bytes() != manifest.body:
        state.write_bytes(manifest.body, "manifests", name)
    records.write(state, records.ManifestOf(manifest=manifest.digest), manifest.config)


def kept_manifest(state: State, digest: str) -> Manifest | None:
    """The manifest kept under ``digest``, checked against it; ``None``: not kept (or not
    those bytes)."""
    if not _DIGEST.fullmatch(digest):
        return None
    body = state.read_bytes("manifests", f"{digest_hex(digest)}.json")
    if body is None or sha256_digest(body) != digest:
        return None
    return parse_manifest(body, str(state.path("manifests", f"{digest_hex(digest)}.json")))


def manifest_for_config(state: State, config: str) -> Manifest | None:
    """The manifest k3env last wrote for the image whose config digest is ``config``."""
    record = records.read(state, records.ManifestOf, config) if _DIGEST.fullmatch(config) else None
    if record is None:
        return None
    found = kept_manifest(state, record.manifest)
    return found if found is not None and found.config == config else None


def oci_manifest(config: Described, layers: Sequence[Described]) -> bytes:
    """An OCI image manifest naming ``config`` and ``layers``, in the one byte form k3env
    writes (sorted keys, no spaces): its sha256 is the digest a registry serves it by."""
    doc = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": {"mediaType": config.media_type, "digest": config.digest, "size": config.size},
        "layers": [{"mediaType": x.media_type, "digest": x.digest, "size": x.size} for x in layers],
    }
    return jsontext.canonical(doc)


def _layer_path(state: State, diff_id: str, level: int) -> Path:
    return state.path("layers", f"{digest_hex(diff_id)}{_suffix(level)}.tar.gz")


def _record(diff_id: str, level: int) -> str:
    return f"{diff_id}{_suffix(level)}"


def _suffix(level: int) -> str:
    return "" if level == LEVEL else f".l{level}"  # level 6's names predate levels


def keep_layer(state: State, layer: Path | bytes, diff_id: str, level: int = LEVEL) -> Blob:
    """Compress ``layer`` (a tar file or its bytes, whose sha256 is ``diff_id``) into the
    state at zlib ``level``, checking the diff ID on the way; the blob's record is written
    last. A layer kept once at ``level`` is not compressed again."""
    found = kept_layer(state, diff_id, level)
    if found is not None:
        return found

    def write(packer: _Packer) -> None:
        for chunk in _chunks(layer):
            packer.write(chunk)

    where = str(layer) if isinstance(layer, Path) else "the assembled layer"
    return _keep(state, level, write, where, expected=diff_id)[1]


def keep_tree(state: State, level: int, write: Callable[[Any], None]) -> tuple[str, Blob]:
    """Keep the layer tar that ``write(sink)`` writes, compressed into the state as it is
    written (no tar file of its own); its diff ID and blob. The same bytes as
    ``keep_layer`` of that tar at ``level``."""
    return _keep(state, level, write, "the layer being written", expected=None)


def _keep(
    state: State,
    level: int,
    write: Callable[[_Packer], None],
    where: str,
    *,
    expected: str | None,
) -> tuple[str, Blob]:
    """Write a blob through ``write`` into a partial file of the state, move it under its
    diff ID (checked against ``expected`` when given), and write its record last."""
    folder = state.path("layers")
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / f".partial-{os.getpid()}-{threading.get_ident()}.tar.gz"
    try:
        with partial.open("wb") as out:
            packer = _Packer(out, level)
            write(packer)
            packer.close()
        diff_id = packer.diff_id
        if expected is not None and diff_id != expected:
            raise StateError(
                f"a layer changed while it was kept: sha256 {diff_id}, expected {expected}",
                where=where,
                fix="build again",
            )
        target = _layer_path(state, diff_id, level)
        partial.replace(target)
    except OSError as e:
        partial.unlink(missing_ok=True)
        raise StateError(
            f"cannot keep a layer: {e.strerror}",
            where=str(folder),
            fix="free disk space or point K3ENV_STATE_DIR at a writable directory",
        ) from e
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    record = records.KeptLayer(digest=packer.sink.digest, size=packer.sink.size)
    records.write(state, record, _record(diff_id, level))
    blob = Blob(digest=packer.sink.digest, size=packer.sink.size, media_type=LAYER_MEDIA_TYPE,
                path=target)  # fmt: skip
    return diff_id, blob


class _Packer:
    """A write-only stream: what passes is hashed (the diff ID) and gzip'd at ``level`` into
    ``out`` (the blob's sha256 and size on ``sink``), fed to zlib in pieces of exactly
    ``_CHUNK`` bytes whatever the writes, so the blob's bytes depend on the tar alone."""

    def __init__(self, out: Any, level: int) -> None:
        self.sink = HashingWriter(out)
        self._plain = HashingWriter(_Null())
        self._z = zlib.compressobj(level, zlib.DEFLATED, 31)
        self._buf = bytearray()

    def write(self, data: bytes) -> int:
        self._plain.write(data)
        self._buf += data
        if len(self._buf) >= _CHUNK:
            whole = len(self._buf) - len(self._buf) % _CHUNK
            view = memoryview(self._buf)
            for i in range(0, whole, _CHUNK):
                self.sink.write(self._z.compress(view[i : i + _CHUNK]))
            view.release()
            del self._buf[:whole]
        return len(data)

    def tell(self) -> int:
        return self._plain.size

    def close(self) -> None:
        if self._buf:
            self.sink.write(self._z.compress(bytes(self._buf)))
            self._buf.clear()
        self.sink.write(self._z.flush())

    @property
    def diff_id(self) -> str:
        return self._plain.digest


class _Null:
    def write(self, data: bytes) -> int:
        return len(data)


def kept_layer(state: State, diff_id: str, level: int = LEVEL) -> Blob | None:
    """The blob of ``diff_id`` kept at ``level``, or ``None`` (never kept, or its file is gone
    or cut)."""
    record = records.read(state, records.KeptLayer, _record(diff_id, level))
    path = _layer_path(state, diff_id, level)
    if record is None or not path.is_file() or path.stat().st_size != record.size:
        return None
    return Blob(digest=record.digest, size=record.size, media_type=LAYER_MEDIA_TYPE, path=path)


def keep_config(state: State, config_json: bytes) -> Blob:
    """Keep an image config k3env wrote, by its digest (the image ID)."""
    digest = sha256_digest(config_json)
    name = f"{digest_hex(digest)}.json"
    path = state.path("configs", name)
    if not path.is_file() or path.read_bytes() != config_json:
        state.write_bytes(config_json, "configs", name)
    return Blob(digest=digest, size=len(config_json), media_type=CONFIG_MEDIA_TYPE, path=path)


def kept_config(state: State, image_id: str) -> Blob | None:
    """The config of ``image_id`` as k3env wrote it, checked against the ID."""
    path = state.path("configs", f"{digest_hex(image_id)}.json")
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if sha256_digest(data) != image_id:
        return None
    return Blob(digest=image_id, size=len(data), media_type=CONFIG_MEDIA_TYPE, path=path)


def kept_image(state: State, image_id: str) -> bool:
    """Whether the registry form of an image k3env wrote is kept: its config and its own
    (last) layer. When it is not, the builder makes them again (the same bytes, checked by
    image ID) rather than asking the engine for them."""
    config = kept_config(state, image_id)
    if config is None:
        return False
    diff_ids = json.loads(config.path.read_bytes())["rootfs"]["diff_ids"]
    return kept_layer(state, diff_ids[-1]) is not None


def _chunks(layer: Path | bytes) -> Iterator[bytes]:
    if isinstance(layer, bytes):
        for i in range(0, len(layer), _CHUNK):
            yield layer[i : i + _CHUNK]
        return
    with layer.open("rb") as f:
        while chunk := f.read(_CHUNK):
            yield chunk
