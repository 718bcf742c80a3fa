"""Publish derived images straight to the registry through its API (no engine round-trip): the
layers and config the build kept, base layers mounted from the base's repository (or copied
from its registry), an OCI manifest per platform and, for `--platform linux/amd64,linux/arm64`,
one OCI index under the tag; a tag is never moved off other bytes. Record each platform's
manifest digest by image ID, print the `enroot import docker://REGISTRY#REPO@sha256:...` line
(the platform's own digest) and the `srtslurm.yaml` `containers:` mapping. `--via-engine`:
`docker push` (its credentials; one platform)
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from k3env.commands.app import App, image_args, platform_arg
from k3env.errors import ConfigError

if TYPE_CHECKING:
    pass

NAME = "push"
HELP = "push images to a registry, record each digest"


def arguments(p: argparse.ArgumentParser) -> None:
    image_args(p, twin="the images built over the twin")
    p.add_argument(
        "--registry", default="127.0.0.1:5000", help="registry host[:port] (default: %(default)s)"
    )
    p.add_argument(
        "--via-engine",
        action="store_true",
        help="push through the engine (`docker push`, its credentials) instead of the registry API",
    )
    platform_arg(p, many=True)


def run(args: argparse.Namespace, app: App) -> int:
    log = app.log
    from k3env.handoff.enroot import cluster_commands
    from k3env.handoff.push import publish_images, push_image

    # A --via-engine push sends the engine's own bytes; the registry API sends the kept ones.
    _lock, every, engine, state, builds = app.builds(args, registry_form=not args.via_engine)
    pushed, specs = [], []
    if args.via_engine:
        if len(args.platform) > 1:
            raise ConfigError(
                "an engine holds one platform per tag: it cannot push an index",
                where="--via-engine", fix="publish through the registry API (drop --via-engine)",
            )  # fmt: skip
        for spec, build in zip(every, builds, strict=True):
            with log.step(f"push {build.reference} to {args.registry} (through the engine)"):
                pushed.append(push_image(engine, state, build, args.registry, log))
                specs.append(spec)
    else:
        # One spec's images for every platform under one tag: an OCI index.
        for spec in {s.name: s for s in every}.values():
            group = [b for s, b in zip(every, builds, strict=True) if s.name == spec.name]
            what = ", ".join(b.platform for b in group)
            with log.step(f"publish {spec.name} ({what}) to {args.registry} (registry API)"):
                for p in publish_images(state, group, args.registry, log):
                    pushed.append(p)
                    specs.append(spec)
    app.emit(
        {"images": [p.as_json() for p in pushed]},
        lambda: print(
            "\n\n".join(
                f"{p.by_digest}  ({p.layers_sent} layer(s) sent, "
                f"{p.layers_skipped} already there)\n" + cluster_commands(spec, p, None)
                for spec, p in zip(specs, pushed, strict=True)
            )
        ),
    )
    return 0
