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
    from k3env.image.twinrecord import record_resolved

    assert lock.twin is not None
    twin = lock.twin.for_platform(args.platform)
    done = record_resolved(lock, args.lock, app.log, platform=args.platform,
                           find_links=args.find_links, index_url=args.index_url)  # fmt: skip
    app.emit(
        done.as_json(),
        lambda: print(
            f"{twin.requirements}: {done.packages} pinned wheels "
            f"(+{done.components} baked as components)"
            + (f"; {twin.debian}: the Debian package set" if twin.debian else "")
            + f"; sha256 recorded in {args.lock}"
        ),
    )
    return 0
