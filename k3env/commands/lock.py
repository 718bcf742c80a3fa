"""Validate the lock, report unresolved pins, fail when a pinned file's sha256 differs (exit 4).
With `--update-hashes`: record the sha256 of edited pinned files in place (comments, key order
kept; atomic).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from k3env.commands.app import App
from k3env.config.lock import check_files, load_lock
from k3env.errors import CheckFailed

if TYPE_CHECKING:
    pass

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
    from k3env.config.twinreq import twin_disagreements

    files = check_files(lock)
    stale = [f for f in files if f.expected is not None and f.actual != f.expected]
    disagree = twin_disagreements(lock)
    payload = {
        "lock": str(args.lock),
        "version": lock.version,
        "sha256": lock.sha256,
        "pins": lock.pins_summary(),
        "unresolved": [{"key": u.key, "hint": u.hint} for u in lock.unresolved],
        "files": [
            {"key": f.key, "file": f.file, "expected": f.expected, "actual": f.actual, "ok": f.ok}
            for f in files
        ],
        "stale": [f.key for f in stale],
        "twin_disagreements": disagree,
        "ok": not stale and not disagree and (not args.require_resolved or not lock.unresolved),
    }

    def human() -> None:
        print(f"{args.lock}: version {lock.version}, content sha256 {lock.sha256[:16]}")
        for key, value in lock.pins_summary().items():
            print(f"  {key:34} {value}")
        for u in lock.unresolved:
            print(f"  UNRESOLVED {u.key}  (resolve: {u.hint})")
        for f in files:
            if f.expected is None:
                continue
            state = "ok" if f.ok else ("MISSING" if f.actual is None else "SHA256 DIFFERS")
            print(f"  {state:14} {f.file}  ({f.key})")
        for d in disagree:
            print(f"  TWIN DISAGREES {d}")
        print(f"{len(lock.unresolved)} unresolved pin(s), {len(stale)} stale file hash(es)")

    app.emit(payload, human)
    if stale:
        raise CheckFailed(
            f"{len(stale)} pinned file(s) differ from the lock: {[f.key for f in stale]}",
            where=str(args.lock),
            fix="restore the files, or record deliberate edits with `k3env lock --update-hashes`",
        )
    if disagree:
        raise CheckFailed(
            f"the twin's requirements and the lock disagree ({len(disagree)}): {disagree[0]}",
            where=str(args.lock),
            fix="regenerate them from the lock with `k3env twin --resolve`",
        )
    if args.require_resolved and lock.unresolved:
        raise CheckFailed(
            f"{len(lock.unresolved)} pin(s) unresolved: {[u.key for u in lock.unresolved]}",
            where=str(args.lock),
            fix="resolve them on a host that reaches their source (hints above)",
        )
    return 0
