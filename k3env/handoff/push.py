"""Push derived images to a registry and remember each registry digest by image ID, so that
the cluster imports exactly what was built and verified."""

from __future__ import annotations

from collections.abc import Sequence

from k3env.config.spec import ImageSpec
from k3env.engine.protocol import Engine
from k3env.engine.registry import refuse_to_move
from k3env.errors import ConfigError
from k3env.handoff.publish import MOUNTED, PRESENT, SENT, index_tag, publish
from k3env.image import records
from k3env.image.build import BuildResult
from k3env.image.records import Pushed
from k3env.log import Log
from k3env.state import State


def push_image(engine: Engine, state: State, build: BuildResult, registry: str, log: Log) -> Pushed:
    repository = f"{registry}/{build.reference.rsplit(':', 1)[0]}"
    tag = build.reference.rsplit(":", 1)[1]
    refuse_to_move(repository, tag, build.image_id)
    engine.tag(build.engine_id, repository, tag)
    try:
        result = engine.push(repository, tag, log.live)
    except BaseException:
        # The registry tag was never written: the local one made for the push goes too.
        engine.remove(f"{repository}:{tag}")
        raise
    pushed = Pushed(
        image=build.image,
        image_id=build.image_id,
        reference=f"{repository}:{tag}",
        digest=result.digest,
        layers_sent=len(result.sent),
        layers_skipped=len(result.layers) - len(result.sent),
    )
    # Written only after the registry answered with a digest: no record claims a failed push.
    records.write(state, pushed, build.image_id)
    return pushed


def publish_images(
    state: State, builds: Sequence[BuildResult], registry: str, log: Log
) -> list[Pushed]:
    """Publish one spec's images (one per platform) straight to the registry: one image
    under its own tag as an OCI manifest; several under one tag as an OCI index. Each
    image's record names its own platform's manifest digest (what enroot imports)."""
    first = builds[0]
    repository = f"{registry}/{first.reference.rsplit(':', 1)[0]}"
    tags = [b.reference.rsplit(":", 1)[1] for b in builds]
    tag = tags[0] if len(builds) == 1 else index_tag(tags)
    published = publish(state, repository, tag, [b.image_id for b in builds], log)
    # Layers, as the engine counts them: the configs are blobs, not layers.
    layers = {x.digest for p in published.platforms for x in p.layers}
    out = []
    for build, platform in zip(builds, published.platforms, strict=True):
        pushed = Pushed(
            image=build.image,
            image_id=build.image_id,
            reference=published.reference,
            digest=platform.digest,
            layers_sent=published.count(SENT, layers),
            layers_skipped=published.count(PRESENT, layers) + published.count(MOUNTED, layers),
            platform=platform.platform,
            index=published.digest if len(builds) > 1 else None,
        )
        records.write(state, pushed, build.image_id)
        out.append(pushed)
    return out


def push_by_engine(
    engine: Engine,
    state: State,
    specs: Sequence[ImageSpec],
    builds: Sequence[BuildResult],
    registry: str,
    log: Log,
) -> list[tuple[ImageSpec, Pushed]]:
    """``docker push`` each build (its own credentials): one platform per tag."""
    if len({b.platform for b in builds}) > 1:
        raise ConfigError(
            "an engine holds one platform per tag: it cannot push an index",
            where="--via-engine", fix="publish through the registry API (drop --via-engine)",
        )  # fmt: skip
    out = []
    for spec, build in zip(specs, builds, strict=True):
        with log.step(f"push {build.reference} to {registry} (through the engine)"):
            out.append((spec, push_image(engine, state, build, registry, log)))
    return out


def publish_by_spec(
    state: State,
    specs: Sequence[ImageSpec],
    builds: Sequence[BuildResult],
    registry: str,
    log: Log,
) -> list[tuple[ImageSpec, Pushed]]:
    """Publish through the registry API: one spec's images for every platform under one
    tag (an OCI index when there are several)."""
    out = []
    for spec in {s.name: s for s in specs}.values():
        group = [b for s, b in zip(specs, builds, strict=True) if s.name == spec.name]
        what = ", ".join(b.platform for b in group)
        with log.step(f"publish {spec.name} ({what}) to {registry} (registry API)"):
            out += [(spec, p) for p in publish_images(state, group, registry, log)]
    return out
