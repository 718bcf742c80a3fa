"""An image the engine holds, named as k3env wrote it.

The engine answers one digest for an image (``engine.naming``: the config's on the classic
store, the manifest's on the containerd image store); k3env needs both, and the image as its
config JSON says (what an image over it is built from). What k3env loaded itself, it kept
(``blobs``: each manifest and config by digest); a base pulled from a registry is read there
by the digest the engine answered (hashed against it), and kept. An image k3env cannot name
is ``None``: on a containerd store its config digest is unknown, and the caller builds it
again (the same bytes) or reads it from its registry.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from k3env.engine import registry
from k3env.engine.naming import CLASSIC, ImageNames, engine_id
from k3env.engine.protocol import BaseImage, Engine
from k3env.errors import EngineError, LockError
from k3env.image.blobs import (
    Blob,
    Manifest,
    keep_config,
    keep_manifest,
    kept_config,
    kept_manifest,
    manifest_for_config,
    parse_manifest,
)
from k3env.image.layer import image_of_config
from k3env.state import State


@dataclass(frozen=True, kw_only=True)
class Known:
    """An image the engine holds, as k3env names and builds on it."""

    names: ImageNames
    manifest: Manifest | None  # None: not known (classic store only)
    image: BaseImage  # id: the engine's; the rest from its config JSON where k3env has it

    @property
    def engine_id(self) -> str:
        return self.image.id


def identify(
    store: str,
    state: State,
    found: str,
    *,
    repository: str | None = None,
    digest: str | None = None,
) -> tuple[ImageNames, Manifest | None] | None:
    """The names and manifest of the image an engine with ``store`` calls ``found``: from
    what k3env kept, else the registry's (``repository``) manifest under that digest, or on
    a classic store under ``digest`` (the one the caller pushed or pinned it by), when that
    manifest names this config."""
    if store == CLASSIC:
        manifest = manifest_for_config(state, found)
        if manifest is None and repository is not None and digest is not None:
            fetched = _fetched_manifest(state, repository, digest)
            manifest = fetched if fetched is not None and fetched.config == found else None
        return ImageNames(config=found, manifest=manifest.digest if manifest else None), manifest
    manifest = kept_manifest(state, found)
    if manifest is None and repository is not None:
        manifest = _fetched_manifest(state, repository, found)
    if manifest is None:
        return None
    names = ImageNames(config=manifest.config, manifest=manifest.digest)
    assert engine_id(store, names) == found  # the rule, and a manifest kept by its digest
    return names, manifest


def know(
    engine: Engine,
    state: State,
    ref: str,
    *,
    repository: str | None = None,
    digest: str | None = None,
) -> Known | None:
    """The image ``ref`` names in ``engine``, named and read as k3env wrote it (or its
    registry, ``repository``, holds it: ``identify``); ``None``: the engine lacks it, or
    k3env cannot name it on this engine's store."""
    image = engine.inspect(ref)
    if image is None:
        return None
    return named(engine, state, image, repository=repository, digest=digest)


def named(
    engine: Engine,
    state: State,
    image: BaseImage,
    *,
    repository: str | None = None,
    digest: str | None = None,
) -> Known | None:
    """``know`` of an image already inspected. Its image is read from its config JSON, kept
    or (``repository``) read from its registry by digest; only on a classic store, where
    neither has it, from the engine's view (which differs by engine release)."""
    store = engine.image_store()
    found = identify(store, state, image.id, repository=repository, digest=digest)
    if found is None:
        return None
    names, manifest = found
    config = kept_config(state, names.config)
    if config is None and repository is not None:
        config = _fetched_config(state, repository, names.config)
    if config is not None:
        image = image_of_config(config.path.read_bytes(), image.id, str(config.path))
    elif store != CLASSIC:
        return None  # the engine's view of the config is its own: none to build on
    return Known(names=names, manifest=manifest, image=image)


def _fetched_manifest(state: State, repository: str, digest: str) -> Manifest | None:
    try:
        _d, _type, body = registry.get_manifest(repository, digest)
        manifest = parse_manifest(body, f"{repository}@{digest}", EngineError)
    except (EngineError, LockError):
        return None  # unreachable, not there, or an index: not a manifest k3env can name
    keep_manifest(state, manifest)
    return manifest


def _fetched_config(state: State, repository: str, digest: str) -> Blob | None:
    with tempfile.TemporaryDirectory(prefix="k3env-config-") as tmp:
        path = Path(tmp) / "config.json"
        try:
            registry.read_blob(repository, digest, path)
        except (EngineError, LockError):
            return None
        if path.stat().st_size > registry.MAX_MANIFEST:
            return None
        return keep_config(state, path.read_bytes())
