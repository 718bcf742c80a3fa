"""Write enroot images (`.sqsh`) as `enroot import` lays them out: the rootfs with the image's own
mtimes (Python's `.pyc` stay valid), root 0755, and `/etc/environment`, `/etc/rc`,
`/etc/rc.local`, `/etc/fstab` in enroot's form, streamed from the engine into `mksquashfs -tar`
with enroot's options; the bytes depend on the image only; sha256 recorded (a file already in
`--out` whose sha256 is the image's recorded export is not written again). With `--check
FILE.sqsh`: check any squashfs (one `enroot import` made on the cluster, or an export) against
what the image carries and this lock: the provenance file (its sha256 in the config labels),
each `/etc/environment` line, the `/etc/rc` script, every file of k3env's layer, every
installed distribution against its RECORD, env and patches (exit 4 naming each difference; exit
2 for a file that is not a k3env image)
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from k3env.commands.app import App, image_args, platform_arg
from k3env.config.lock import load_lock
from k3env.config.spec import load_specs

NAME = "export"
HELP = "write enroot squashfs images (.sqsh), or --check one against the lock"


def arguments(p: argparse.ArgumentParser) -> None:
    image_args(p, twin="the images built over the twin")
    p.add_argument(
        "--out", type=Path, default=Path("out/sqsh"), help="output directory (default: out/sqsh)"
    )
    p.add_argument(
        "--check", type=Path, metavar="FILE.sqsh", help="check a squashfs against the lock"
    )
    platform_arg(p, many=True)


def run(args: argparse.Namespace, app: App) -> int:
    log = app.log
    from k3env.handoff.enroot import cluster_commands
    from k3env.handoff.enroot_export import export_image
    from k3env.handoff.push import last_push
    from k3env.handoff.squashfs_check import check_squashfs, require_ok

    if args.check:
        lock = load_lock(args.lock)
        by_name = {s.name: s for s in load_specs(args.images, lock)}
        items = check_squashfs(args.check, lock, by_name, log)
        app.emit(
            {"file": str(args.check), "checks": [i.as_json() for i in items]},
            lambda: print("\n".join(f"{i.status:<11} {i.name}: {i.detail}" for i in items)),
        )
        require_ok(args.check, items)
        return 0
    _lock, specs, engine, state, builds = app.builds(args)
    exported = []
    for build in builds:
        with log.step(f"export {build.reference} -> {args.out}/ (streamed into mksquashfs)"):
            exported.append(export_image(engine, state, build, args.out, log))

    def commands(spec: Any, build: Any, exp: Any) -> str:
        return cluster_commands(spec, last_push(state, build.image_id), exp)

    app.emit(
        {"images": [e.as_json() for e in exported]},
        lambda: print(
            "\n\n".join(
                f"{e.path}  sha256 {e.sha256}  ({e.size / 1e9:.2f} GB)\n" + commands(s, b, e)
                for s, b, e in zip(specs, builds, exported, strict=True)
            )
        ),
    )
    return 0
