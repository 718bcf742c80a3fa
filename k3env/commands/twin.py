"""Build (cached by content) and push the CPU twin base. With `--resolve`: regenerate its
requirements from the lock (`[twin]` requires / stand_ins / omit plus every component's pinned
wheels and extras, resolved together by uv, every wheel by sha256; the components themselves
are left to the builder) and record their sha256
"""

from __future__ import annotations

import argparse

from k3env.commands.app import App, platform_arg
from k3env.config.lock import load_lock
from k3env.config.pins import Lock
from k3env.config.shapes import DEFAULT_PLATFORM
from k3env.errors import ConfigError

NAME = "twin"
HELP = "build and push the CPU twin base"


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--resolve",
        action="store_true",
        help="regenerate the twin's requirements from the lock (uv; needs the package index) "
        "and record their sha256 in the lock; builds nothing",
    )
    p.add_argument(
        "--find-links",
        action="append",
        default=[],
        metavar="DIR",
        help="with --resolve: also look for wheels here (e.g. the CPU torch build)",
    )
    p.add_argument("--index-url", help="with --resolve: the package index (default: uv's)")
    p.add_argument(
        "--refresh",
        action="store_true",
        help="with --resolve: move the index cut-off (resolved_before) to the newest settled "
        "instant (midnight UTC a day ago) and resolve every platform's twin and every "
        "variant's closure at it; without it, the lock's cut-off gives the same files any day",
    )
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME",
        help="with --resolve: only this variant's closure over the twin (default: the twin's "
        "files, then every variant that lays a vLLM release over it)",
    )
    platform_arg(p, many=False)


def run(args: argparse.Namespace, app: App) -> int:
    log = app.log
    from k3env.image.twin import ensure_twin

    lock = load_lock(args.lock)
    if args.resolve:
        return _resolve_twin(args, lock, app)
    engine = app.engine()
    reference, digest = ensure_twin(lock, engine, app.state(), log, args.platform)
    image = engine.inspect(reference)
    payload = {"reference": reference, "digest": digest, "image_id": image.id if image else None}
    app.emit(payload, lambda: print(f"{reference}@{digest}"))
    return 0


def _resolve_twin(args: argparse.Namespace, lock: Lock, app: App) -> int:
    from k3env.image.twinrecord import (
        overlay_variants,
        record_overlays,
        record_resolved,
        twin_cutoff,
    )

    if lock.twin is None:
        raise ConfigError("the lock has no [twin]", where=str(args.lock), fix="add [twin]")
    twin = lock.twin.for_platform(args.platform)
    overlays = overlay_variants(lock)
    unknown = [v for v in args.variant if v not in overlays]
    if unknown or (args.variant and args.platform != DEFAULT_PLATFORM):
        raise ConfigError(
            f"not a variant laid over the {DEFAULT_PLATFORM} twin: {unknown or args.variant}",
            where=f"{args.lock} [variants]",
            fix=f"use one of {overlays} (they resolve for {DEFAULT_PLATFORM} only)",
        )
    if args.refresh and args.variant:
        raise ConfigError(
            "--refresh moves the twin's cut-off, which every closure is resolved against",
            where="k3env twin --resolve --refresh --variant",
            fix="run `k3env twin --resolve --refresh` (every platform and variant at once)",
        )
    cutoff = twin_cutoff(lock, refresh=args.refresh)
    # One cut-off for the twin of every platform: --refresh moves them all.
    platforms = lock.twin.all_platforms if args.refresh else (args.platform,)
    done = [
        record_resolved(load_lock(args.lock), args.lock, app.log, platform=platform,
                        find_links=args.find_links, index_url=args.index_url,
                        resolved_before=cutoff, refresh=args.refresh)
        for platform in ([] if args.variant else platforms)
    ]  # fmt: skip
    names = args.variant or (overlays if DEFAULT_PLATFORM in platforms else [])
    # The closures are resolved against the twin's file as it now is.
    closures = record_overlays(load_lock(args.lock), args.lock, app.log, names=names,
                               find_links=args.find_links, index_url=args.index_url,
                               refresh=args.refresh)  # fmt: skip
    payload = {
        **(done[0].as_json() if done else {}),
        "resolved_before": cutoff,
        "platforms": [d.as_json() for d in done],
        "variants": {n: c.as_json() for n, c in zip(names, closures, strict=True)},
    }

    def show() -> None:
        for d in done:
            t = lock.twin.for_platform(d.platform) if lock.twin else twin
            debian = f"; {t.debian}: the Debian package set" if t.debian else ""
            print(f"{t.requirements}: {d.packages} pinned wheels "
                  f"(+{d.components} baked as components){debian}")  # fmt: skip
        for n, c in zip(names, closures, strict=True):
            (file,) = c.files
            print(f"{file}: variant {n}, {c.packages} wheels that differ from the twin's")
        print(f"sha256 recorded in {args.lock} (index cut-off {cutoff})")

    app.emit(payload, show)
    return 0
