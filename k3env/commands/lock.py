"""Validate the lock, report unresolved pins, fail when a pinned file's sha256 differs (exit 4).
With `--update-hashes`: record the sha256 of edited pinned files in place (comments, key order
kept; atomic).
"""

from __future__ import annotations

import argparse

from k3env.commands.app import App
from k3env.config.lock import load_lock

NAME = "lock"
HELP = "check the lockfile against what it pins"


def arguments(p: argparse.ArgumentParser) -> None:
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--check",
        action="store_true",
        help="report unresolved pins; fail when a pinned file's sha256 differs (default)",
    )
    mode.add_argument(
        "--update-hashes",
        action="store_true",
        help="record the sha256 of pinned files in place (comments and order kept)",
    )
    p.add_argument("--require-resolved", action="store_true", help="also fail on unresolved pins")


def run(args: argparse.Namespace, app: App) -> int:
    lock = load_lock(args.lock)
    if args.update_hashes:
        from k3env.config.lock_edit import update_hashes

        changes = update_hashes(lock)
        app.emit(
            {"lock": str(args.lock), "changes": [c.__dict__ for c in changes]},
            lambda: print(
                "\n".join(f"{c.key}: {c.old} -> {c.new}" for c in changes)
                or f"{args.lock}: every pinned file matches its sha256"
            ),
        )
        return 0
    from k3env.config.lockcheck import check_lock

    report = check_lock(lock, args.lock, require_resolved=args.require_resolved)
    app.emit(report.as_json(), lambda: print("\n".join(report.lines())))
    report.raise_for_problems()
    return 0
