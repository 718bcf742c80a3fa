"""Build derived images (the spec's pinned components, installed by the base's own pip `--no-deps
--require-hashes` into one deterministic layer, then one layer of patches, env and provenance,
config written by k3env, tagged by the content hash of the inputs; a rebuild with nothing
changed is one inspect); `--twin` builds over each base's CPU twin.
"""

from __future__ import annotations

import argparse
import time

from k3env.commands.app import App, image_args, platform_arg

NAME = "build"
HELP = "build derived images from specs"


def arguments(p: argparse.ArgumentParser) -> None:
    image_args(
        p, twin="build over each base's CPU twin (offline default; verification on a CPU host)"
    )
    platform_arg(p, many=True)


def run(args: argparse.Namespace, app: App) -> int:
    start = time.monotonic()
    lock, _specs, _engine, _state, results = app.builds(args)
    payload = {
        "lock": str(args.lock),
        "lock_sha256": lock.sha256,
        "twin": args.twin,
        "images": [r.as_json() for r in results],
        "seconds": round(time.monotonic() - start, 3),
    }

    def human() -> None:
        for r in results:
            state = "cached" if r.cached else "built "
            print(f"{state} {r.image:24} {r.reference}  {r.image_id[:19]}  ({r.seconds:.2f} s)")
            for p in r.patches:
                print(f"         patch {p.name}: {p.status} ({p.detail})")

    app.emit(payload, human)
    return 0
