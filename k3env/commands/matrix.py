"""Build and verify every image on the CPU twin with the pinned components and with each
`[variants.NAME]` of the lock (other releases by sha256: Dynamo's wheels, or a vLLM release laid
over the twin with its closure): images x variants, each column naming its vLLM, Dynamo and
aiperf, each failed cell its first failing line, as markdown (`--markdown FILE`) and `--json`;
`--smoke` also serves each built cell with the CPU build of its column's vLLM
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from k3env.commands.app import App, image_args, platform_arg
from k3env.config.lock import load_lock
from k3env.config.pins import Lock
from k3env.config.spec import ImageSpec, load_specs
from k3env.errors import ConfigError
from k3env.files import write_atomic

NAME = "matrix"
HELP = "verify every image on the twin with each variant of the pinned components"


def arguments(p: argparse.ArgumentParser) -> None:
    image_args(p, twin=None)
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        help="a [variants.NAME] of the lock (default: every one), beside the pinned components",
    )
    p.add_argument("--markdown", type=Path, help="also write the matrix (markdown) here")
    p.add_argument(
        "--smoke",
        action="store_true",
        help="also smoke each built cell (`k3env smoke` with the CPU build of its column's "
        "vLLM; ~1 min a profile; a column without one is said as not checked)",
    )
    platform_arg(p, many=True)
    p.add_argument(
        "--timeout", type=float, default=600, help="seconds per probe (default: %(default)s)"
    )


def run(args: argparse.Namespace, app: App) -> int:
    log = app.log
    from k3env.checks.matrix import markdown, run_matrix
    from k3env.checks.verify import verify_image
    from k3env.image.build import make_builder

    lock = load_lock(args.lock)
    unknown = [v for v in args.variant if v not in lock.variants]
    if unknown:
        raise ConfigError(
            f"unknown variant(s) {unknown}",
            where=f"{args.lock} [variants]",
            fix=f"use one of {sorted(lock.variants)}, or add [variants.NAME] to the lock",
        )
    variants = args.variant or sorted(lock.variants)
    specs = load_specs(args.images, lock, tuple(args.image))
    engine = app.engine()
    state = app.state()
    builders: dict[tuple[str, str], Any] = {}
    builds: dict[tuple[str, str, str], Any] = {}  # (lock, image, platform): what smoke runs

    def verify(vlock: Lock, spec: ImageSpec, platform: str) -> Any:
        builder = builders.setdefault(
            (vlock.sha256, platform),
            make_builder(vlock, engine, state, log, twin=True, platform=platform),
        )
        with log.step(f"build and verify {spec.name} {platform} ({vlock.sha256[:12]})"):
            build = builder.build(spec)
            builds[(vlock.sha256, spec.name, platform)] = build
            return verify_image(
                engine, state, vlock, spec, build, twin=True, timeout=args.timeout, log=log
            )

    def smoke(vlock: Lock, spec: ImageSpec, platform: str) -> str:
        from k3env.checks.matrix import smoke_cell
        from k3env.smoke.prefix import smoke_pin
        from k3env.smoke.run import smoke_images

        try:
            smoke_pin(vlock, platform)
        except ConfigError as e:
            return f"not checked: {e.message}"
        build = builds[(vlock.sha256, spec.name, platform)]
        with log.step(f"smoke {spec.name} {platform} ({vlock.variant or 'pinned'})"):
            reports = smoke_images(engine, state, vlock, [(spec, build)], log,
                                   timeout=args.timeout)  # fmt: skip
        return smoke_cell(reports)

    cells = run_matrix(lock, specs, variants, verify, args.platform,
                       smoke if args.smoke else None)  # fmt: skip
    text = markdown(lock, cells)
    if args.markdown:
        write_atomic(args.markdown, text)
        log.info(f"version matrix written to {args.markdown}")
    payload = {"variants": ["pinned", *variants], "cells": [c.as_json() for c in cells],
               "markdown": text}  # fmt: skip
    app.emit(payload, lambda: print(text))
    return 0
