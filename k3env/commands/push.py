"""Publish derived images straight to the registry through its API (no engine round-trip): the
layers and config the build kept, base layers mounted from the base's repository (or copied
from its registry), an OCI manifest per platform and, for `--platform linux/amd64,linux/arm64`,
one OCI index under the tag; a tag is never moved off other bytes. Record each platform's
manifest digest by image ID, print the `enroot import docker://REGISTRY#REPO@sha256:...` line
(the platform's own digest) and the `srtslurm.yaml` `containers:` mapping; warn when the
registry answers enroot's permission probe for it with anything but 200 or 401 (enroot's
import would stop there: stage it instead). `--via-engine`:
`docker push` (one platform; no credentials are sent to the engine: an empty
X-Registry-Auth, so the registry must take anonymous pushes)
"""

from __future__ import annotations

import argparse

from k3env.commands.app import App, image_args, platform_arg

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
        help="push through the engine (`docker push`, with no credentials: the registry must take "
        "anonymous pushes) instead of the registry API",
    )
    platform_arg(p, many=True)


def run(args: argparse.Namespace, app: App) -> int:
    log = app.log
    from k3env.handoff.enroot import cluster_commands
    from k3env.handoff.push import publish_by_spec, push_by_engine

    # A --via-engine push sends the engine's own bytes; the registry API sends the kept ones.
    _lock, every, engine, state, builds = app.builds(args, registry_form=not args.via_engine)
    if args.via_engine:
        done = push_by_engine(engine, state, every, builds, args.registry, log)
    else:
        done = publish_by_spec(state, every, builds, args.registry, log)
    specs, pushed = [s for s, _ in done], [p for _, p in done]
    enroot = {p.digest: _enroot_says(p) for p in pushed}
    for p in pushed:
        if enroot[p.digest]:
            log.info(f"    warning: {p.by_digest}: {enroot[p.digest]}")
    app.emit(
        {"images": [{**p.as_json(), "enroot_probe": enroot[p.digest]} for p in pushed]},
        lambda: print(
            "\n\n".join(
                f"{p.by_digest}  ({p.layers_sent} layer(s) sent, "
                f"{p.layers_skipped} already there)\n" + cluster_commands(spec, p, None)
                for spec, p in zip(specs, pushed, strict=True)
            )
        ),
    )
    return 0


def _enroot_says(p: object) -> str | None:
    """What enroot's import would meet at this registry, when it is not an answer it takes
    (None: it would go on)."""
    from k3env.engine.registry import enroot_probe
    from k3env.image.records import Pushed

    assert isinstance(p, Pushed)
    status = enroot_probe(p.reference.rsplit(":", 1)[0], p.digest)
    if status in (200, 401):
        return None
    return (
        f"enroot's permission probe (a HEAD with no Accept header, enroot <= 4.1.2) gets HTTP "
        f"{status} for this OCI manifest: `enroot import` (and pyxis) stop at 'Querying "
        "registry for permission grant'; stage the image (`k3env stage`), or use a registry "
        "that serves OCI manifests to it (or asks for auth first)"
    )
