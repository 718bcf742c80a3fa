"""For every pin, the newer versions its source offers: a base image's registry tags (and whether
the pinned tag now names another digest), git tags for srt-slurm and Dynamo, package-index
releases for aiperf, the CPU twin's closure at the newest settled index cut-off (which wheels
and Debian packages would move); each with the `k3env bump` that takes it; a source that cannot
be asked is said so, never reported up to date
"""

from __future__ import annotations

import argparse
from pathlib import Path

from k3env.commands.app import App
from k3env.config.lock import load_lock
from k3env.quoting import one_line

NAME = "outdated"
HELP = "list, for every pin, the newer versions its source offers"


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--find-links", type=Path, help="a wheel directory instead of the package index")
    p.add_argument(
        "--twin-find-links",
        action="append",
        default=[],
        metavar="DIR",
        help="the twin's closure: also look for wheels here (the CPU torch build), as `twin "
        "--resolve --find-links` does",
    )
    p.add_argument("--twin-index-url", help="the twin's closure: the package index (uv's default)")
    p.add_argument(
        "--no-twin",
        action="store_true",
        help="skip the twin (its closure at the newest settled cut-off, the Debian mirror)",
    )


def run(args: argparse.Namespace, app: App) -> int:
    log = app.log
    from k3env.bump.outdated import outdated

    lock = load_lock(args.lock)
    index_args = ["--no-index", "--find-links", str(args.find_links)] if args.find_links else []
    found = outdated(lock, log, index_args=index_args)
    if lock.twin is not None and not args.no_twin:
        from k3env.bump.closures import twin_outdated

        found.append(twin_outdated(lock, log, find_links=args.twin_find_links,
                                   index_url=args.twin_index_url))  # fmt: skip
    payload = {"lock": str(args.lock), "pins": [o.as_json() for o in found],
               "outdated": [o.pin for o in found if o.outdated]}  # fmt: skip

    def say(line: str) -> None:  # a tag or an error a registry sent: one line, escaped
        print(one_line(line))

    def human() -> None:
        for o in found:
            if o.error:
                say(f"?  {o.pin:24} {o.current}: could not ask its source: {o.error}")
            elif not o.outdated:
                say(f"ok {o.pin:24} {o.current}")
            else:
                what = ", ".join(o.newer[:8]) + (
                    f" (+{len(o.newer) - 8} more)" if len(o.newer) > 8 else ""
                )
                what += f" (tag now names {o.moved})" if o.moved else ""
                say(f"-> {o.pin:24} {o.current}: {what}")
                for line in o.bump[:3]:
                    say(f"     {line}")

    app.emit(payload, human)
    return 0
