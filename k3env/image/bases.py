"""Base images: which pin an image is built over (the real base or its CPU twin), and the
engine's view of it, pulled by digest from its registry when the engine lacks it; named and
read as its registry (or k3env, for its own) wrote it where the engine's store needs that
(``identity``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from k3env.config.pins import BasePin, Lock
from k3env.config.shapes import platform_name
from k3env.config.spec import ImageSpec
from k3env.engine.naming import CLASSIC
from k3env.engine.protocol import BaseImage, Engine
from k3env.errors import EngineError, LockError
from k3env.image.blobs import Manifest
from k3env.image.identity import named
from k3env.log import Log
from k3env.state import State


@dataclass(frozen=True, kw_only=True)
class ResolvedBase:
    pin: BasePin
    reference: str  # what the engine knows it by
    name: str  # org.opencontainers.image.base.name
    digest: str | None  # registry manifest digest, when known
    image: BaseImage  # id: the engine's (engine.naming); the rest as its config JSON says
    # Its OCI manifest (the layers an image over it names): always known where the engine
    # names images by manifest digest; None: not read (a classic store's base from elsewhere).
    manifest: Manifest | None = None

    @property
    def config_digest(self) -> str:
        """What labels, provenance and keys name the base by, on any store: its config digest
        (the engine's ID on the classic store, which is all an unread manifest happens on)."""
        return self.manifest.config if self.manifest is not None else self.image.id


# A base resolver returns the base image for a pin on a platform (pulling or building it).
BaseResolver = Callable[[BasePin, str], ResolvedBase]


def registry_base(engine: Engine, log: Log, state: State | None = None) -> BaseResolver:
    """Bases pulled by digest. With ``state``, each is named as its registry serves it (its
    manifest and config read there by digest, hashed, kept): on a containerd image store that
    is required, on the classic store used where kept."""

    def resolve(pin: BasePin, platform: str) -> ResolvedBase:
        if platform not in pin.platforms:
            raise LockError(
                f"base {pin.name} ({pin.display}) pins no {platform} manifest (it pins "
                f"{sorted(pin.platforms)})",
                where=f"bases.{pin.name}.platforms",
                fix=f'add "{platform}" = "sha256:..." under [bases.{pin.name}.platforms] '
                f"(skopeo inspect --raw docker://{pin.repository}:{pin.tag})",
            )
        ref = pin.platform_reference(platform)
        if ref is None:
            raise LockError(
                f"base {pin.name} ({pin.display}) has no resolved digest",
                where=f"bases.{pin.name}.digest",
                fix=(
                    "resolve it on a host that reaches the registry (`skopeo inspect --raw "
                    f"docker://{pin.repository}:{pin.tag}`) and record it with "
                    f"`k3env bump bases.{pin.name}`; or build over the CPU twin with --twin"
                ),
            )
        image = engine.inspect(ref)
        if image is None:
            with log.step(f"pull {ref}"):
                engine.pull(ref, log.live)
            image = engine.inspect(ref)
            if image is None:
                raise EngineError("pulled image not found", where=ref, fix="pull it by hand")
        manifest = None
        if state is not None:
            # The base's manifest and config JSON as its registry serves them (read by the
            # pinned digest once, kept), on either store: an engine's view of a config differs
            # by release (20.10 gives history times in whole seconds), so an image built over
            # it would get another config digest on 20.10 than on Docker 28.
            known = named(engine, state, image, repository=pin.repository,
                          digest=pin.platforms[platform])  # fmt: skip
            if known is not None:
                image, manifest = known.image, known.manifest
                if manifest is None:  # the classic store, its registry unreachable
                    log.detail(f"{ref}: built over the engine's view of its config (its "
                               "registry did not answer; another engine may differ)")  # fmt: skip
            elif engine.image_store() != CLASSIC:
                raise EngineError(
                    "the engine names images by manifest digest (containerd image store), and "
                    f"the manifest of {ref} cannot be read from its registry",
                    where=ref,
                    fix="check that the registry is reachable (k3env reads the base's manifest "
                    "and config there, by digest, once; they are kept)",
                )
        found = platform_name(image.os, image.architecture, image.variant)
        if found != platform:
            raise LockError(
                f"{ref} is a {found} image, pinned as {platform}",
                where=f"bases.{pin.name}.platforms",
                fix="pin each platform's own manifest digest (from the index)",
            )
        return ResolvedBase(
            pin=pin,
            reference=ref,
            name=f"{pin.repository}:{pin.tag}",
            digest=pin.platforms[platform],
            image=image,
            manifest=manifest,
        )

    return resolve


def select_base(lock: Lock, spec: ImageSpec, twin: bool) -> BasePin:
    pin = lock.base(spec.base, where=f"{spec.path}: base")
    if twin and pin.kind != "twin":
        if pin.twin is None:
            raise LockError(
                f"base {pin.name} has no CPU twin",
                where=f"{lock.path}: bases.{pin.name}",
                fix='add twin = "NAME" naming a [bases.NAME] with kind = "twin", or drop --twin',
            )
        pin = lock.bases[pin.twin]
    return pin
