"""Clone the pinned srt-slurm (its git URL, or a local mirror), check the tag is the pinned
commit, verify each PR patch's sha256 and apply them in order (`git apply --check` first: a
conflict names the patch, file and hunk), install `srtctl` into its own venv from the lock's
hashed requirements (`--require-hashes`, then `pip check`); cached by version + commit + patch
and requirement hashes, built in a temp dir renamed at the end; every file of the venv is
recorded and an edit to it is an error on the next use
"""

from __future__ import annotations

import argparse

from k3env.commands.app import SOURCE_HELP, App
from k3env.config.lock import load_lock

NAME = "srt materialize"
HELP = "clone the pinned srt-slurm, apply its PR patches"


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--source", help=SOURCE_HELP)


def run(args: argparse.Namespace, app: App) -> int:
    log = app.log
    from k3env.srt.materialize import materialize

    m = materialize(load_lock(args.lock), app.state(), log, source=args.source)
    app.emit(
        m.as_json(),
        lambda: print(
            f"srt-slurm {m.version} ({m.commit[:12]}) + {list(m.patches)} at {m.path}"
            f"{' (cache hit)' if m.reused else ''}\n  srtctl: {m.python.parent / 'srtctl'}"
        ),
    )
    return 0
