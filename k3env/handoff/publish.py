"""Publish derived images straight to a registry: blobs, configs, OCI manifests and (for
more than one platform) an OCI image index, through the registry API, never through the
engine.

Each image's own layers and config are the bytes the build kept (``image.blobs``); its base
layers are named by the base's manifest in its registry, checked against the image: the base
manifest's config is the base image ID the image's labels name, and its diff IDs are the first
ones of the image's. A base layer the target repository lacks is mounted from the base's
repository (same registry) or copied (another registry); a kept layer it lacks is uploaded.
The index lists each platform's manifest; enroot and pyxis import the per-platform digest.

What the base's registry answers is read as data: each manifest and config is fetched by digest
and hashed against it (``registry``), parsed strictly (``jsontext``), and each field this module
builds on (a platform, a layer's digest, size and media type, the diff IDs) checked for its type
before use; the manifests and indexes written are strict JSON.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from k3env import jsontext
from k3env.config.shapes import platform_name
from k3env.engine import registry
from k3env.errors import CheckFailed, EngineError, K3envError, LockError, StateError
from k3env.hashing import canonical_sha256, sha256_digest
from k3env.image import records
from k3env.image.blobs import (
    LAYER_MEDIA_TYPE,
    MANIFEST_MEDIA_TYPE,
    Blob,
    kept_config,
    kept_layer,
    oci_manifest,
)
from k3env.log import Log
from k3env.state import State

MANIFEST = MANIFEST_MEDIA_TYPE
INDEX = "application/vnd.oci.image.index.v1+json"
_DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
_BASE_NAME = "org.opencontainers.image.base.name"
_BASE_DIGEST = "org.opencontainers.image.base.digest"
_BASE_ID = "io.k3env.base.id"
SENT, MOUNTED, PRESENT = "sent", "mounted", "present"


@dataclass(frozen=True, kw_only=True)
class Layer:
    """One layer of a manifest: where its bytes come from."""

    digest: str
    size: int
    media_type: str
    kept: Blob | None  # k3env's own layer; None: a base layer, in ``source``
    source: str  # the repository that holds a base layer


@dataclass(frozen=True, kw_only=True)
class PlatformImage:
    platform: str  # os/architecture[/variant]
    image_id: str
    digest: str  # the platform's manifest digest
    size: int
    body: bytes = field(repr=False)
    config: Blob = field(repr=False)
    layers: tuple[Layer, ...] = field(repr=False)


@dataclass(frozen=True, kw_only=True)
class Published:
    repository: str  # REGISTRY/REPO
    tag: str
    digest: str  # what the tag names: the index, or the one manifest
    media_type: str
    platforms: tuple[PlatformImage, ...]
    # Each blob's fate: SENT (uploaded or copied), MOUNTED (linked from another repository
    # of the registry) or PRESENT (the repository had it).
    fates: Mapping[str, str]
    bytes_sent: int
    seconds: float

    @property
    def reference(self) -> str:
        return f"{self.repository}:{self.tag}"

    def count(self, fate: str, digests: Iterable[str] | None = None) -> int:
        """How many blobs (of ``digests``, default all) met ``fate``."""
        wanted = self.fates if digests is None else set(digests)
        return sum(1 for d in wanted if self.fates.get(d) == fate)


def platform_of(config: dict[str, Any]) -> str:
    """The platform an image config or an index entry names."""
    return platform_name(
        str(config.get("os") or "linux"),
        str(config.get("architecture") or ""),
        str(config["variant"]) if config.get("variant") else None,
    )


def _platform_json(platform: str) -> dict[str, str]:
    parts = platform.split("/")
    out = {"os": parts[0], "architecture": parts[1]}
    if len(parts) > 2:
        out["variant"] = parts[2]
    return out


def _registry_doc(body: bytes, where: str) -> dict[str, Any]:
    """A manifest, an index or a config a registry sent: a strict JSON object, or an
    EngineError naming it."""
    doc: dict[str, Any] = jsontext.loads(
        body, where=where, limit=registry.MAX_MANIFEST, error=EngineError,
        fix="check the registry (or a proxy in front of it)",
    )  # fmt: skip
    return doc


def _descriptor(entry: Any, where: str) -> tuple[str, int, str]:
    """(digest, size, media type) of a manifest's layer entry, each checked."""
    if not isinstance(entry, dict):
        raise EngineError("a layer entry is not an object", where=where,
                          fix="check the registry (or a proxy in front of it)")  # fmt: skip
    digest = registry.field(entry, "digest", str, where)
    registry.check_digest(digest, where)
    size = registry.field(entry, "size", int, where)
    if size < 0:
        raise EngineError(f"layer {digest[:19]} has a negative size", where=where,
                          fix="check the registry (or a proxy in front of it)")  # fmt: skip
    return digest, size, registry.field(entry, "mediaType", str, where, default=LAYER_MEDIA_TYPE)


def _diff_ids(config: dict[str, Any], where: str, error: type[K3envError]) -> list[str]:
    """An image config's ``rootfs.diff_ids``: a list of strings, or ``error``."""
    rootfs = jsontext.field(config, "rootfs", dict, where=where, error=error)
    ids = jsontext.field(rootfs, "diff_ids", list, where=where, error=error)
    if not all(isinstance(i, str) for i in ids):
        raise error("rootfs.diff_ids holds something other than strings", where=where,
                    fix="the image config is not one k3env can build on")  # fmt: skip
    return list(ids)


def _base_manifest(name: str, digest: str, platform: str) -> tuple[str, dict[str, Any]]:
    """The base's manifest for ``platform`` (through its index when it has one):
    (its repository, the manifest)."""
    repository = name.split("@", 1)[0]
    last = repository.rsplit("/", 1)[-1]
    if ":" in last:
        repository = repository.rsplit(":", 1)[0]
    where = f"{repository}@{digest}"
    registry.check_digest(digest, where)  # by digest: the bytes are hashed against it
    _d, media_type, body = registry.get_manifest(repository, digest)
    doc = _registry_doc(body, where)
    if media_type in (INDEX, _DOCKER_LIST) or "manifests" in doc:
        match = [
            m
            for m in registry.field(doc, "manifests", list, where)
            if isinstance(m, dict)
            and isinstance(m.get("platform"), dict)
            and platform_of(m["platform"]) == platform
        ]
        if not match:
            raise CheckFailed(
                f"the base index {repository}@{digest[:19]} has no {platform} manifest",
                where=where,
                fix="pin a base that is built for this platform",
            )
        chosen = registry.field(match[0], "digest", str, where)
        registry.check_digest(chosen, where)
        _d, _t, body = registry.get_manifest(repository, chosen)
        doc = _registry_doc(body, f"{repository}@{chosen}")
    return repository, doc


def plan_image(state: State, image_id: str) -> PlatformImage:
    """An image's OCI manifest from what the build kept and its base's manifest."""
    config_blob = kept_config(state, image_id)
    if config_blob is None:
        raise StateError(
            f"the registry form of image {image_id[:19]} is not kept on this host",
            where=str(state.path("configs")),
            fix="publish with `k3env push` (it makes what is not kept again: the same bytes, "
            "checked by image ID), or push through the engine with --via-engine",
        )
    kept = str(config_blob.path)
    config = jsontext.loads(config_blob.path.read_bytes(), where=kept, error=StateError)
    platform = platform_of(config)
    diff_ids = _diff_ids(config, kept, StateError)
    labels = (config.get("config") or {}).get("Labels") or {}
    own: list[Blob] = []
    while diff_ids and (blob := kept_layer(state, diff_ids[-1])) is not None:
        own.insert(0, blob)
        diff_ids.pop()
    layers: list[Layer] = []
    if diff_ids:
        name, digest = labels.get(_BASE_NAME), labels.get(_BASE_DIGEST)
        if not name or not digest:
            raise CheckFailed(
                f"image {image_id[:19]} names no base in a registry, and {len(diff_ids)} of "
                "its layers are not k3env's",
                where=image_id, fix="build it with k3env over a base pinned by digest",
            )  # fmt: skip
        source, base = _base_manifest(str(name), str(digest), platform)
        where = f"{source}@{digest}"
        base_config = registry.field(base, "config", dict, where, default={})
        if base_config.get("digest") != labels.get(_BASE_ID):
            raise CheckFailed(
                f"the base {source}@{str(digest)[:19]} is image "
                f"{str(base_config.get('digest'))[:19]} for {platform}; image {image_id[:19]} "
                f"was built over {str(labels.get(_BASE_ID))[:19]}",
                where=f"{source}@{digest}",
                fix="the registry's base moved: build again over the pinned digest",
            )
        config_digest = str(base_config["digest"])
        base_diff_ids = _diff_ids(
            _registry_doc(_config_of(source, config_digest), f"{source}@{config_digest}"),
            f"{source}@{config_digest}",
            EngineError,
        )
        base_layers = registry.field(base, "layers", list, where, default=[])
        if base_diff_ids != diff_ids or len(base_layers) != len(diff_ids):
            raise CheckFailed(
                f"the layers of {source}@{str(digest)[:19]} are not the first layers of image "
                f"{image_id[:19]}",
                where=f"{source}@{digest}",
                fix="build the image again (its base layers are not the pinned base's)",
            )
        for entry in base_layers:
            layer_digest, size, media_type = _descriptor(entry, where)
            if media_type == "application/vnd.docker.image.rootfs.diff.tar.gzip":
                media_type = LAYER_MEDIA_TYPE  # the same bytes, named the OCI way
            layers.append(
                Layer(digest=layer_digest, size=size, media_type=media_type, kept=None,
                      source=source)
            )  # fmt: skip
    layers += [
        Layer(digest=b.digest, size=b.size, media_type=b.media_type, kept=b, source="") for b in own
    ]
    body = oci_manifest(config_blob, layers)
    return PlatformImage(
        platform=platform, image_id=image_id, digest=sha256_digest(body), size=len(body),
        body=body, config=config_blob, layers=tuple(layers),
    )  # fmt: skip


def _config_of(repository: str, digest: str) -> bytes:
    """An image config from its registry (``read_blob`` hashes it against its digest)."""
    with tempfile.TemporaryDirectory(prefix="k3env-config-") as tmp:
        path = Path(tmp) / "config.json"
        registry.read_blob(repository, digest, path)
        if path.stat().st_size > registry.MAX_MANIFEST:
            raise EngineError(f"config {digest[:19]} is over {registry.MAX_MANIFEST} bytes",
                              where=repository, fix="check the registry")  # fmt: skip
        return path.read_bytes()


def index_body(images: Sequence[PlatformImage]) -> bytes:
    return jsontext.canonical(
        {
            "schemaVersion": 2,
            "mediaType": INDEX,
            "manifests": [
                {
                    "mediaType": MANIFEST,
                    "digest": p.digest,
                    "size": p.size,
                    "platform": _platform_json(p.platform),
                }
                for p in sorted(images, key=lambda p: p.platform)
            ],
        }
    )


def index_tag(tags: Sequence[str]) -> str:
    """The tag of an index over images tagged ``tags`` (each its own inputs hash)."""
    return canonical_sha256(sorted(tags))[:20]


def publish(
    state: State, repository: str, tag: str, image_ids: Sequence[str], log: Log
) -> Published:
    """Send what ``repository`` lacks of ``image_ids``, then their manifests, then the tag:
    an index when there is more than one image, else the one manifest. The tag is written
    last and is never moved off other bytes."""
    start = time.monotonic()
    images = [plan_image(state, i) for i in image_ids]
    platforms = [p.platform for p in images]
    if len(set(platforms)) != len(platforms):
        raise CheckFailed(
            f"two images for one platform: {sorted(platforms)}",
            where=repository, fix="publish one image per platform",
        )  # fmt: skip
    as_index = len(images) > 1
    if as_index:
        body, media_type = index_body(images), INDEX
    else:
        body, media_type = images[0].body, MANIFEST
    digest = sha256_digest(body)
    _refuse_to_move(repository, tag, digest, images)
    fates: dict[str, str] = {}
    bytes_sent = 0
    with tempfile.TemporaryDirectory(prefix="k3env-publish-") as tmp:
        for image in images:
            c = image.config
            config = Layer(digest=c.digest, size=c.size, media_type=c.media_type, kept=c, source="")
            for layer in (*image.layers, config):
                if layer.digest not in fates:
                    fates[layer.digest] = _send(state, repository, layer, Path(tmp), log)
                    bytes_sent += layer.size if fates[layer.digest] == SENT else 0
        for image in images if as_index else ():
            registry.put_manifest(repository, image.digest, image.body, MANIFEST)
        registry.put_manifest(repository, tag, body, media_type)
    return Published(
        repository=repository, tag=tag, digest=digest, media_type=media_type,
        platforms=tuple(images), fates=fates, bytes_sent=bytes_sent,
        seconds=time.monotonic() - start,
    )  # fmt: skip


def _send(state: State, repository: str, blob: Layer, tmp: Path, log: Log) -> str:
    """Put one blob in ``repository`` the cheapest way it can get there; its fate."""
    if registry.blob_exists(repository, blob.digest):
        return PRESENT
    if blob.kept is None:  # a base layer: linked from its repository, or copied
        if _same_registry(blob.source, repository) and registry.mount_blob(
            repository, blob.digest, blob.source
        ):
            return MOUNTED
        with log.step(f"copy base layer {blob.digest[7:19]} from {blob.source}"):
            registry.copy_blob(blob.source, repository, blob.digest, tmp / "blob")
        return SENT
    # A blob this host published before, to another repository of the registry, is linked
    # from there rather than sent again (as the engine does).
    if any(
        _same_registry(other, repository) and registry.mount_blob(repository, blob.digest, other)
        for other in _published_at(state, blob.digest)
    ):
        return MOUNTED
    with log.step(f"send {blob.digest[7:19]} ({blob.size / 1e6:.1f} MB)"):
        registry.put_blob(repository, blob.digest, blob.kept.path, _progress(log, blob.size))
    _remember(state, blob.digest, repository)
    return SENT


def _published_at(state: State, digest: str) -> list[str]:
    record = records.read(state, records.PublishedAt, digest)
    return list(record.repositories) if record else []


def _remember(state: State, digest: str, repository: str) -> None:
    seen = _published_at(state, digest)
    if repository not in seen:
        records.write(state, records.PublishedAt(repositories=(repository, *seen)[:8]), digest)


def _same_registry(a: str, b: str) -> bool:
    return registry.split_repository(a)[0] == registry.split_repository(b)[0]


def _progress(log: Log, size: int) -> Callable[[int], None]:
    def report(sent: int) -> None:
        log.live(f"      {sent / 1e6:.0f} / {size / 1e6:.0f} MB")

    return report


def _refuse_to_move(
    repository: str, tag: str, digest: str, images: Sequence[PlatformImage]
) -> None:
    """A tag names the content hash of the inputs: another image under it means the same
    inputs built other bytes. The same images under another manifest form (docker's) is not
    a move."""
    try:
        current, media_type, body = registry.get_manifest(repository, tag)
    except LockError:  # no such tag
        return
    if current == digest:
        return
    where = f"{repository}:{tag}"
    doc = _registry_doc(body, where)
    if media_type in (INDEX, _DOCKER_LIST) or "manifests" in doc:
        entries = registry.field(doc, "manifests", list, where, default=[])
        named = sorted(str(m.get("digest")) if isinstance(m, dict) else "" for m in entries)
        ours = sorted(p.digest for p in images)
        what = f"an index of {[n[:19] for n in named]}"
        if named == ours:
            return
    else:
        config = str(registry.field(doc, "config", dict, where, default={}).get("digest"))
        what = f"image {config[:19]}"
        if len(images) == 1 and config == images[0].image_id:
            return
    raise CheckFailed(
        f"{repository}:{tag} already names {what}, not what these inputs built",
        where=f"{repository}:{tag}",
        fix="do not overwrite it: find what differs (the same inputs built different bytes "
        "here); pull the registry's image by digest to build on the same bytes",
    )
