"""Stage each image's exported `.sqsh` in a cluster cache directory, keyed by platform and the
manifest digest it was pushed under (`k3env export` and `k3env push` first): copied beside its
place while hashed against the export's recorded sha256, renamed into place, world-readable,
with its record (`entry.json`) and provenance; a digest already staged is re-hashed and
kept (one whose bytes changed is replaced). pyxis's
importer (`k3env-pyxis-importer`, docs/staging.md) starts jobs from it. `--list`: what is staged;
`--gc --max-age DAYS --max-bytes N`: remove old entries, then the oldest past the size, never
one a job holds (the importer's hold file, from `get` to `release`)
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from k3env.commands.app import App, image_args, platform_arg
from k3env.errors import ConfigError, StateError
from k3env.quoting import one_line

NAME = "stage"
HELP = "stage exported images in a cluster cache for pyxis's importer"


def arguments(p: argparse.ArgumentParser) -> None:
    image_args(p, twin="the images built over the twin")
    p.add_argument(
        "--cache", type=Path, default=os.environ.get("K3ENV_STAGE_CACHE"), metavar="DIR",
        help="the cache directory every node sees (default: $K3ENV_STAGE_CACHE)",
    )  # fmt: skip
    p.add_argument("--list", action="store_true", help="show what is staged, write nothing")
    p.add_argument("--gc", action="store_true", help="remove old or excess entries")
    p.add_argument("--max-age", type=float, metavar="DAYS", help="with --gc: older than this")
    p.add_argument("--max-bytes", type=int, metavar="N", help="with --gc: keep at most N bytes")
    platform_arg(p, many=True)


def run(args: argparse.Namespace, app: App) -> int:
    from k3env.handoff.stage import collect_garbage, survey

    if args.cache is None:
        raise ConfigError(
            "no cache directory", where="--cache", fix="pass --cache DIR or set K3ENV_STAGE_CACHE"
        )
    cache: Path = args.cache
    if args.list:
        entries, skipped = survey(cache)
        app.emit(
            {"cache": str(cache), "staged": [s.as_json() for s in entries],
             "refused": [s.as_json() for s in skipped]},
            lambda: print(
                "\n".join([*(_line(s) for s in entries),
                           *(f"refused {one_line(s.path)}: {one_line(s.why)}" for s in skipped)])
                or f"nothing staged in {one_line(str(cache))}"
            ),
        )  # fmt: skip
        return 0
    if args.gc:
        if args.max_age is None and args.max_bytes is None:
            raise ConfigError(
                "--gc needs a bound", where="--gc", fix="add --max-age or --max-bytes"
            )
        for flag, value in (("--max-age", args.max_age), ("--max-bytes", args.max_bytes)):
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"{value} is not a bound", where=flag,
                                  fix="a finite number, 0 or more")  # fmt: skip
        age = None if args.max_age is None else args.max_age * 86400
        removed, held = collect_garbage(cache, max_age=age, max_bytes=args.max_bytes)
        app.emit(
            {"removed": [s.as_json() for s in removed], "held": [s.as_json() for s in held]},
            lambda: print(
                "\n".join(
                    [
                        *(f"removed {_line(s)}" for s in removed),
                        *(f"kept (held by a job) {_line(s)}" for s in held),
                    ]
                )
                or "nothing to remove"
            ),
        )
        return 0
    return _stage(args, app, cache)


def _line(s: object) -> str:
    from k3env.handoff.stage import Staged

    assert isinstance(s, Staged)
    holds = f", held by {len(s.holds)} job step(s)" if s.holds else ""
    text = (
        f"{s.platform} {s.digest[:19]} {s.image} ({s.size / 1e9:.2f} GB, lock {s.lock[:12]}{holds})"
    )
    return one_line(text)  # an image name, a lock: what the entry says, escaped


def _provenance(sqsh: Path, app: App) -> bytes | None:
    """k3env's provenance file, read from the export (no mount)."""
    import tempfile

    from k3env.handoff.squashfs import Squashfs
    from k3env.image.build import PROVENANCE_PATH

    with tempfile.TemporaryDirectory(prefix="k3env-stage-") as work:
        return Squashfs(sqsh, app.log, Path(work)).read(PROVENANCE_PATH)


def _stage(args: argparse.Namespace, app: App, cache: Path) -> int:
    from k3env.handoff.stage import stage
    from k3env.image.records import shipped

    lock, specs, _engine, state, builds = app.builds(args)
    done = []
    for spec, build in zip(specs, builds, strict=True):
        on = f" --platform {build.platform}"
        found = shipped(state, build.image_id)
        exported, pushed = found.exported, found.pushed
        if exported is None:
            raise StateError(
                f"{spec.name} ({build.platform}) has no export on this host",
                where=spec.name,
                fix=f"k3env export{on} {spec.name}",
            )
        if pushed is None:
            raise StateError(
                f"{spec.name} ({build.platform}) was not pushed: the importer is asked for it by "
                "its manifest digest",
                where=spec.name,
                fix=f"k3env push{on} {spec.name}",
            )
        provenance = _provenance(Path(exported.path), app)
        with app.log.step(f"stage {spec.name} {pushed.digest[:19]} -> {cache}"):
            done.append(
                stage(
                    cache,
                    platform=build.platform,
                    digest=pushed.digest,
                    sqsh=Path(exported.path),
                    sha256=exported.sha256,
                    meta={
                        "image": spec.name,
                        "image_id": build.image_id,
                        "lock": lock.sha256,
                        "uri": pushed.enroot_uri,
                    },
                    provenance=provenance,
                )
            )
    app.emit(
        {"cache": str(cache), "staged": [s.as_json() for s in done]},
        lambda: print(
            "\n".join(f"{'staged' if s.copied else 'already staged'} {_line(s)}" for s in done)
        ),
    )
    return 0
