"""An srt-slurm recipe from a serve profile for a cluster profile: the image built for the
cluster's platform, by its pushed manifest digest, `vllm_config` engine flags, env, frontend
type, the profile's `benchmark:` with the lock's aiperf as `aiperf_package`, `dynamo: {install:
false}` when Dynamo is baked (a job-start build only with `dynamo_install = "from-commit"` in
the spec), no `setup_script`
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from k3env.commands.app import App
from k3env.config.cluster import DEFAULT_CLUSTER
from k3env.config.lock import load_lock
from k3env.config.shapes import platform_option
from k3env.config.spec import DEFAULT_IMAGES, load_specs
from k3env.errors import ConfigError
from k3env.files import write_atomic

NAME = "srt recipe"
HELP = "generate an srt-slurm recipe from an image spec profile"


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("image", help="image spec name")
    p.add_argument("--profile", help="serve profile (default: the spec's first)")
    p.add_argument("--images", type=Path, default=DEFAULT_IMAGES, help="image spec directory")
    p.add_argument("--cluster", type=Path, default=DEFAULT_CLUSTER, help="cluster profile")
    p.add_argument("--container", help="image reference or .sqsh path (default: pushed digest)")
    p.add_argument("--model-path", help="model path on the cluster (default: cluster profile)")
    p.add_argument("--out", type=Path, help="write the recipe here (atomically)")


def run(args: argparse.Namespace, app: App) -> int:
    log = app.log
    from k3env.config.cluster import load_cluster
    from k3env.image.envpolicy import merged_env
    from k3env.image.records import Facts, last_build, read, shipped
    from k3env.srt.recipe import as_pinned, precision_of, recipe, to_yaml
    from k3env.srt.recipe import header as recipe_header

    lock = load_lock(args.lock)
    (spec,) = load_specs(args.images, lock, (args.image,))
    cluster = load_cluster(args.cluster)
    profile_name = str(args.profile or next(iter(spec.profiles), ""))
    if profile_name not in spec.profiles:
        raise ConfigError(
            f"no serve profile {profile_name!r} in {spec.path}",
            where="--profile",
            fix=f"choose from {sorted(spec.profiles)}",
        )
    profile = spec.profiles[profile_name]
    state = app.state()
    container = args.container
    facts: dict[str, Any] = {}
    if container is None:
        # The cluster's nodes import their own platform's manifest: name that one's digest.
        on = platform_option(cluster.platform)
        build = last_build(state, lock, spec, cluster.platform)
        pushed = shipped(state, build.image_id).pushed if build else None
        if build is None or pushed is None:
            raise ConfigError(
                f"image {spec.name} has not been pushed for {cluster.platform} (the platform of "
                f"{cluster.name}): the recipe needs that image by digest",
                where=str(spec.path),
                fix=f"k3env push{on} {spec.name} (or pass --container REF|PATH.sqsh)",
            )
        container = pushed.by_digest
        recorded = read(state, Facts, build.image_id)
        facts = recorded.facts if recorded else {}
    model_path = args.model_path or cluster.model_path
    if not model_path:
        raise ConfigError(
            "no model path", where=str(args.cluster), fix="set model_path, or pass --model-path"
        )
    base = lock.bases[spec.base]
    versions = facts.get("versions") or {}
    if facts:  # what verify found in the image
        dynamo_baked = bool(versions.get("dynamo"))
    else:  # no record of verify: the spec's word, said
        dynamo_baked = "dynamo" in spec.components
        if dynamo_baked:
            log.info(
                f"    no verify record of the image: Dynamo taken as baked, as {spec.path} lists "
                f"it in components (`k3env verify {spec.name}` checks it)"
            )
    rendered = recipe(
        spec,
        profile,
        cluster,
        merged_env(lock, spec, base),
        container=container,
        model_path=model_path,
        precision=precision_of(profile.tokenizer_model_type),
        dynamo_baked=dynamo_baked,
        dynamo_commit=lock.dynamo.commit if lock.dynamo else None,
        aiperf_version=lock.aiperf.version if lock.aiperf else None,
    )
    # As the pinned srt-slurm loads it: schema 2 for srt-slurm 2.x.
    text = to_yaml(as_pinned(rendered, lock.srt_slurm))
    header = recipe_header(
        spec.name, spec.path, args.lock, cluster, by_platform=args.container is None
    )
    if args.out:
        write_atomic(args.out, header + text)
        log.info(f"recipe written to {args.out}")
    app.emit(
        {"recipe": header + text, "out": str(args.out) if args.out else None},
        lambda: None if args.out else print(header + text, end=""),
    )
    return 0
