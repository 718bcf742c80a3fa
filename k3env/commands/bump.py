"""Change one pin (`bases.NAME TAG` resolves and records the digest; `dynamo TAG|COMMIT` resolved on
the source, name, version, commit and the baked wheels (by sha256) together; `srt-slurm TAG`, to a
2.x release with what moves with it: the PR patches it has dropped, srtctl's requirements from its
pyproject.toml, its schema, k3env's recipes as schema 2 judged by its own gate, and `--recipes`'
changes from its own migrate; `aiperf VERSION`; `container_patches.NAME`; `twin [INSTANT]`, the
package index's cut-off, the twin's files regenerated at it, every wheel that moved listed) in place
(only the changed leaves differ), rebuild, verify and preflight before and after, report each
container patch as applies / upstream (drop it) / conflicts, and write a PR title and markdown body;
the lock is replaced atomically only when everything passes (or `--keep-failing`; `--skip-verify`
writes it after build and preflight alone, `--edit-only` with no check at all); `--commit` makes a
local branch and commit, never a push; `--twin` builds, verifies and tests patches over the CPU
twins (the offline default). `.github/workflows/pin-bump.yml` runs it for each pin `k3env outdated`
finds, one PR each
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from k3env.commands.app import App
from k3env.config.cluster import DEFAULT_CLUSTER
from k3env.config.lock import load_lock
from k3env.config.pins import Lock
from k3env.config.spec import DEFAULT_IMAGES, load_specs
from k3env.errors import ConfigError, LockError
from k3env.verdict import exit_code

if TYPE_CHECKING:
    from k3env.bump.closures import Regenerated
    from k3env.bump.evaluate import Outcome
    from k3env.bump.srt import Crossing
    from k3env.config.lock_edit import Change

NAME = "bump"
HELP = "change one pin, rebuild, verify, preflight, and write a PR title and body"


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "pin", help="bases.NAME | dynamo | srt-slurm | aiperf | container_patches.NAME | twin"
    )
    p.add_argument("value", nargs="?", help="tag, tag@digest, commit, version or instant")
    p.add_argument(
        "--twin-find-links",
        action="append",
        default=[],
        metavar="DIR",
        help="bump twin: also look for wheels here (the CPU torch build)",
    )
    p.add_argument("--twin-index-url", help="bump twin: the package index (uv's default)")
    p.add_argument("--images", type=Path, default=DEFAULT_IMAGES, help="image spec directory")
    p.add_argument(
        "--twin",
        action="store_true",
        help="build, verify and test patches over each base's CPU twin (the offline default)",
    )
    p.add_argument("--cluster", type=Path, default=DEFAULT_CLUSTER, help="cluster profile")
    p.add_argument(
        "--source", help="git URL or mirror to resolve an srt-slurm or Dynamo tag (or commit)"
    )
    p.add_argument(
        "--wheels-from",
        action="append",
        metavar="DIR",
        help="find a component's wheels (srt-slurm 2.x: srtctl's requirements) here only (no "
        "package index); default: the index",
    )
    p.add_argument(
        "--recipes",
        action="append",
        default=[],
        type=Path,
        metavar="FILE|DIR",
        help="srt-slurm 2.x: list what each of these recipes must change (srt-slurm's own "
        "migrate, on a copy: the files are never rewritten)",
    )
    p.add_argument("--body", type=Path, help="write the PR body (markdown) here")
    p.add_argument(
        "--keep-failing", action="store_true", help="write the lock even when checks fail"
    )
    p.add_argument("--commit", action="store_true", help="local branch + commit (never pushed)")
    p.add_argument("--skip-verify", action="store_true", help="build and preflight only")
    p.add_argument(
        "--edit-only", action="store_true", help="only edit the lock (no build, no checks)"
    )


def run(args: argparse.Namespace, app: App) -> int:
    log = app.log
    from k3env.bump.body import as_json, title
    from k3env.bump.closures import regenerate as regenerate_twin
    from k3env.bump.evaluate import evaluate
    from k3env.bump.pins import candidate_lock, commit_branch, commit_to_tag, leaf_changes
    from k3env.config.cluster import load_cluster
    from k3env.engine.registry import resolve_digest
    from k3env.image.wheels import wheel_sha256s

    lock = load_lock(args.lock)
    changes_wanted = leaf_changes(
        lock,
        args.pin,
        args.value,
        resolve_digest=resolve_digest,
        resolve_tag_commit=lambda url, tag: commit_to_tag(args.source or url, tag),
        dynamo_source=args.source,
        wheel_sha256s=lambda reqs, platform: wheel_sha256s(
            reqs, log, find_links=tuple(args.wheels_from or ()), platform=platform
        ),
    )
    twin = args.pin == "twin"  # a new index cut-off: the twin's files regenerated at it
    changes: list[Change] = []
    if twin:
        new_lock = lock
    else:
        new_lock, changes = candidate_lock(lock, changes_wanted)
    # The twin's files regenerated at the new cut-off (the leaves); for srt-slurm 2.x, its
    # patches, srtctl's requirements, the schema and the recipes move too.
    regenerate = (
        partial(regenerate_twin, log=log, find_links=args.twin_find_links,
                index_url=args.twin_index_url)
        if twin else _crossing(args, app, lock, changes_wanted)
    )  # fmt: skip
    if args.edit_only:
        return _edit_only(app, args, lock, changes_wanted, changes, regenerate)
    # --source names the source of the pin bumped: srt-slurm's for an srt-slurm bump, else
    # (a Dynamo source, say) not srt-slurm's, whose patches are judged on the lock's git URL.
    srt_source = args.source if args.pin in ("srt-slurm", "srt_slurm") else None
    engine = app.engine()
    state = app.state()
    cluster = load_cluster(args.cluster)
    judge = partial(
        evaluate,
        engine=engine,
        state=state,
        log=log,
        cluster=cluster,
        run_verify=not args.skip_verify,
        srt_source=srt_source,
        twin=args.twin,
    )
    with log.step("before: build, verify, preflight on the current lock"):
        before = judge(lock, load_specs(args.images, lock))
    with log.step("after: build, verify, preflight on the bumped lock"):
        new_lock, changes, after, text, written, crossing = _after(
            args, lock, new_lock, changes, changes_wanted, regenerate,
            lambda bumped: judge(bumped, load_specs(args.images, bumped)), before,
        )  # fmt: skip
    if args.body:
        args.body.write_text(text)
    branch = None
    if args.commit and written:
        also = tuple(crossing.saved) if crossing else ()
        branch = commit_branch(lock.root, lock, title(args.pin, changes), text, also)
    payload = {**as_json(args.pin, changes, before, after, written, text), "branch": branch}
    if crossing is not None:
        payload["srt_slurm"] = crossing.as_json()
    app.emit(payload, lambda: print(text))
    return exit_code(
        (*after.gates, *(crossing.gates if crossing else ())),
        what="checks fail after the bump ("
        + ("the lock was written: --keep-failing" if written else "the lock is unchanged")
        + ")",
        where=str(lock.path),
        fix="read the PR body above: fix the failing checks or patches, then bump again",
    )


def _after(
    args: argparse.Namespace,
    lock: Lock,
    new_lock: Lock,
    changes: list[Change],
    leaves: dict[str, str],
    regenerate: Callable[[Lock, dict[str, str]], Regenerated | Crossing] | None,
    judge: Callable[[Lock], Outcome],
    before: Outcome,
) -> tuple[Lock, list[Change], Outcome, str, bool, Crossing | None]:
    """The bumped lock judged, and written if it passes (or ``--keep-failing``): a transaction.
    ``bump twin`` (the twin's files) and a bump to srt-slurm 2.x (the lock, srtctl's
    requirements, the recorded schema) write their files before they are judged; whatever
    ends the judging (a failure, an OSError, Ctrl-C, SIGTERM) restores them unless kept."""
    from k3env.bump.body import body
    from k3env.bump.closures import restore
    from k3env.bump.pins import finish
    from k3env.bump.srt import Crossing, body_lines

    regenerated, written, crossing = None, False, None
    try:
        if regenerate is not None:
            # The files the new pin needs, written now (the old bytes kept): the judging
            # builds what they pin.
            regenerated = regenerate(lock, leaves)
            crossing = regenerated if isinstance(regenerated, Crossing) else None
            new_lock, changes = load_lock(args.lock), list(regenerated.changes)
            if not changes:
                raise LockError("nothing to bump: the lock already pins that",
                                where=str(lock.path), fix="none needed")  # fmt: skip
        after = judge(new_lock)
        text = body(new_lock, args.pin, changes, before, after,
                    body_lines(crossing) if crossing else [])  # fmt: skip
        if regenerated is not None:
            failed = after.failed or (crossing is not None and crossing.failed)
            written = not failed or args.keep_failing
        else:
            written = finish(lock, leaves, after, args.keep_failing)
    finally:
        if regenerated is not None and not written:
            restore(regenerated.saved)
    return new_lock, changes, after, text, written, crossing


def _crossing(
    args: argparse.Namespace, app: App, lock: Lock, leaves: dict[str, str]
) -> Callable[[Lock, dict[str, str]], Crossing] | None:
    """A bump of srt-slurm to a release that loads schema 2: what moves with it
    (``bump.srt.cross``); None for any other bump. ``--recipes`` read first (bad input
    refused before anything is written)."""
    from k3env.bump.srt import cross, crosses, user_recipes
    from k3env.config.cluster import load_cluster

    if args.pin not in ("srt-slurm", "srt_slurm") or not crosses(lock.srt_slurm, leaves):
        if args.recipes:
            raise ConfigError("--recipes lists what srt-slurm 2.x's migrate would change",
                              where="k3env bump --recipes",
                              fix="use it with `k3env bump srt-slurm v2.X.Y`")  # fmt: skip
        return None
    recipes = user_recipes(args.recipes)

    def crossing(lock: Lock, leaves: dict[str, str]) -> Crossing:
        return cross(lock, leaves, app.log, app.state(), source=args.source,
                     find_links=args.wheels_from or (), index_url=args.twin_index_url,
                     specs=load_specs(args.images, lock), cluster=load_cluster(args.cluster),
                     recipes=recipes)  # fmt: skip

    return crossing


def _edit_only(
    app: App,
    args: argparse.Namespace,
    lock: Lock,
    leaves: dict[str, str],
    changes: list[Change],
    regenerate: Callable[[Lock, dict[str, str]], Regenerated | Crossing] | None,
) -> int:
    """``--edit-only``: the leaves written (and, for the twin, its files regenerated; for
    srt-slurm 2.x, what moves with it, judged on its own), no image built or checked."""
    from k3env.bump.srt import Crossing
    from k3env.config.lock_edit import set_leaves

    if regenerate is not None:
        regenerated = regenerate(lock, leaves)
        changes = list(regenerated.changes)
        if isinstance(regenerated, Crossing):
            return _edit_only_crossing(app, args, lock, regenerated)
    else:
        set_leaves(lock.path, leaves)
    app.emit(
        {"changes": [c.__dict__ for c in changes]},
        lambda: print("\n".join(f"{c.key}: {c.old} -> {c.new}" for c in changes)),
    )
    return 0


def _edit_only_crossing(app: App, args: argparse.Namespace, lock: Lock, c: Crossing) -> int:
    """``--edit-only`` to srt-slurm 2.x: the files kept when the crossing's own checks pass
    (or ``--keep-failing``), else put back; its PR body and JSON."""
    from k3env.bump.closures import restore
    from k3env.bump.srt import body_lines

    written = not c.failed or args.keep_failing
    if not written:
        restore(c.saved)
    text = "\n".join([f"## Bump {args.pin} to {args.value}", "", "### Pins", "",
                      *(f"- `{x.key}`: {x.old} → {x.new}" for x in c.changes), *body_lines(c),
                      "", "Generated by `k3env bump --edit-only`: no image built, verified or "
                      "preflighted."]) + "\n"  # fmt: skip
    if args.body:
        args.body.write_text(text)
    payload = {"changes": [x.__dict__ for x in c.changes], "srt_slurm": c.as_json(),
               "lock_written": written, "body": text}  # fmt: skip
    app.emit(payload, lambda: print(text))
    return exit_code(c.gates, what="srt-slurm's checks fail after the bump ("
                     + ("kept: --keep-failing" if written else "every file put back") + ")",
                     where=str(lock.path), fix="read the PR body above")  # fmt: skip
