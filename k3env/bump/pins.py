"""Which lock leaves a bump changes, the candidate lock, and writing it.

``k3env bump PIN VALUE``: parse the bump (which leaves change) -> render the new lock
(tomlkit, in place) and load it from a candidate file beside the lock -> ``bump.evaluate``
before and after -> ``bump.body`` writes the PR. The lock itself is replaced only at the end,
atomically, and only when everything passed (or with ``keep_failing``; ``--skip-verify``
checks build and preflight only, ``--edit-only`` nothing); an interrupted or
failed bump leaves it untouched.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable
from pathlib import Path

from k3env.bump.evaluate import Outcome
from k3env.config.cutoff import require_settled, settled_cutoff
from k3env.config.lock import load_lock
from k3env.config.lock_edit import Change, candidate, render_leaves, set_leaves
from k3env.config.pins import OVERLAYS, Lock, WheelPin
from k3env.config.reader import COMMIT_RE, DIGEST_RE
from k3env.config.shapes import DEFAULT_PLATFORM, REF_RE, require_git_source
from k3env.errors import ConfigError, LockError
from k3env.hashing import file_sha256
from k3env.log import Log
from k3env.runner import attempt, require_tool, run

PINS_HELP = (
    "bases.NAME [TAG | TAG@sha256:...]",
    "dynamo TAG|COMMIT (resolved on the lock's git URL, or --source)",
    "srt-slurm TAG (its commit resolved with git ls-remote; --source for a mirror)",
    "container_patches.NAME (re-hash the patch file)",
    "aiperf VERSION (its wheels from the package index, by sha256)",
    "twin [INSTANT] (the package index's cut-off; default the newest settled one)",
)


def leaf_changes(
    lock: Lock,
    pin: str,
    value: str | None,
    *,
    resolve_digest: Callable[[str, str], str],
    resolve_tag_commit: Callable[[str, str], str],
    dynamo_source: str | None = None,
    wheel_sha256s: Callable[[list[str], str], dict[str, tuple[str, str]]] | None = None,
) -> dict[str, str]:
    """The lock leaves a bump of ``pin`` to ``value`` changes (key path -> new value)."""
    where = f"k3env bump {pin}"
    if pin.startswith(("bases.", "base.")):
        name = pin.split(".", 1)[1]
        base = lock.bases.get(name)
        if base is None or base.kind != "registry" or base.repository is None:
            raise ConfigError(
                f"no registry base {name!r} in the lock",
                where=where,
                fix=f"use one of {sorted(n for n, b in lock.bases.items() if b.repository)}",
            )
        tag, _, digest = (value or str(base.tag)).partition("@")
        if digest and not DIGEST_RE.match(digest):
            raise ConfigError(f"{digest!r} is not sha256:<64 hex>", where=where, fix="fix it")
        digest = digest or resolve_digest(base.repository, tag)
        return {f"bases.{name}.tag": tag, f"bases.{name}.digest": digest}
    if pin == "dynamo":
        if lock.dynamo is None:
            raise ConfigError("the lock pins no dynamo", where=where, fix="add [dynamo]")
        if not value:
            raise ConfigError("which tag or commit?", where=where, fix="k3env bump dynamo v1.6.1")
        # Resolved on the source: a tag, or a commit that a tag names. Name, version and
        # commit move together (the rules read the version).
        tag, commit = resolve_ref(dynamo_source or lock.dynamo.git, value)
        changes = {"dynamo.name": tag, "dynamo.commit": commit}
        version = pep440_of_tag(tag)
        if version is None:
            raise ConfigError(
                f"tag {tag} has no PEP 440 form k3env can derive (the rules read the version)",
                where=where,
                fix="bump to a release tag (vX.Y.Z), or edit [dynamo] name/version/commit by hand",
            )
        changes["dynamo.version"] = version
        if lock.dynamo.component is not None:
            # The baked wheels move with the tag: the release's own wheels, by sha256.
            changes.update(_wheel_changes("dynamo", lock.dynamo.component.wheels, version,
                                          wheel_sha256s, where))  # fmt: skip
        return changes
    if pin == "aiperf":
        if lock.aiperf is None or lock.aiperf.component is None:
            raise ConfigError("the lock pins no aiperf wheels", where=where, fix="add [aiperf]")
        if not value:
            raise ConfigError("which version?", where=where, fix="k3env bump aiperf 0.14.0")
        changes = {"aiperf.version": value, "aiperf.name": f"aiperf {value}"}
        changes.update(
            _wheel_changes("aiperf", lock.aiperf.component.wheels, value, wheel_sha256s, where)
        )
        return changes
    if pin in ("srt-slurm", "srt_slurm"):
        if lock.srt_slurm is None:
            raise ConfigError("the lock pins no srt-slurm", where=where, fix="add [srt_slurm]")
        if not value:
            raise ConfigError("which tag?", where=where, fix="k3env bump srt-slurm vX.Y.Z")
        return {
            "srt_slurm.version": value,
            "srt_slurm.commit": resolve_tag_commit(lock.srt_slurm.git, value),
        }
    if pin.startswith("container_patches."):
        return _patch_changes(lock, pin.split(".", 1)[1], where)
    if pin == "twin":
        return cutoff_leaves(lock, value)
    raise ConfigError(
        f"unknown pin {pin!r}", where=where, fix="bump one of: " + "; ".join(PINS_HELP)
    )


def _patch_changes(lock: Lock, name: str, where: str) -> dict[str, str]:
    """``container_patches.NAME``: the patch file re-hashed."""
    patch = lock.container_patches.get(name)
    if patch is None:
        raise ConfigError(f"no container patch {name!r}", where=where,
                          fix=f"use one of {sorted(lock.container_patches)}")  # fmt: skip
    return {f"container_patches.{name}.sha256": file_sha256(lock.resolve_path(patch.file))}


def cutoff_leaves(lock: Lock, value: str | None) -> dict[str, str]:
    """``k3env bump twin [INSTANT]``: the cut-off of the twin and of every variant's closure
    (default: the newest settled one; a later one is refused)."""
    from k3env.config.pinned_files import closure_key
    from k3env.config.twinreq import overlay_of

    if lock.twin is None:
        raise LockError("the lock has no [twin]", where=str(lock.path), fix="add [twin]")
    cutoff = require_settled(value or settled_cutoff(), where="k3env bump twin")
    leaves = {"twin.resolved_before": cutoff}
    for name, variant in sorted(lock.variants.items()):
        if any(n in OVERLAYS for n in variant.components):
            key = closure_key(name, overlay_of(variant).name).removesuffix(".closure_sha256")
            leaves[f"{key}.resolved_before"] = cutoff
    return leaves


def candidate_lock(lock: Lock, changes: dict[str, str]) -> tuple[Lock, list[Change]]:
    """The bumped lock, loaded from a candidate file beside the real one (then removed)."""
    text, done = render_leaves(lock.path.read_text(), changes)
    if not done:
        raise LockError(
            "nothing to bump: the lock already pins that", where=str(lock.path), fix="none needed"
        )
    with candidate(lock.path, text) as path:
        new = load_lock(path)
    # The same file, as far as provenance and relative paths go.
    return dataclasses.replace(new, path=lock.path), done


def pep440_of_tag(tag: str) -> str | None:
    """``v1.6.1`` -> ``1.6.1``; a day-zero dev tag ``v1.4.0-kimi-k3-dev.1`` -> ``1.4.0.dev1``."""
    m = re.match(r"^v?(\d+\.\d+\.\d+)(?:-[A-Za-z0-9.-]*?dev\.?(\d+))?$", tag)
    if m is None:
        return None
    return m.group(1) + (f".dev{m.group(2)}" if m.group(2) else "")


def _wheel_changes(
    section: str,
    wheels: tuple[WheelPin, ...],
    version: str,
    wheel_sha256s: Callable[[list[str], str], dict[str, tuple[str, str]]] | None,
    where: str,
) -> dict[str, str]:
    """Every wheel of a component at ``version``, each with the sha256 of its file, and of
    its file for every other platform the lock pins it for (never a stale one left beside a
    new version)."""
    wanted = [f"{w.name}=={version}" for w in wheels]
    if wheel_sha256s is None:
        raise ConfigError(f"no way to find the wheels {wanted}", where=where, fix="report it")
    found = {DEFAULT_PLATFORM: wheel_sha256s(wanted, DEFAULT_PLATFORM)}
    for platform in sorted({p for w in wheels for p in w.platforms}):
        found[platform] = wheel_sha256s(
            [r for w, r in zip(wheels, wanted, strict=True) if platform in w.platforms], platform
        )
    out = {}
    for i, (w, r) in enumerate(zip(wheels, wanted, strict=True)):
        for platform in (DEFAULT_PLATFORM, *sorted(w.platforms)):
            if r not in found[platform]:
                raise ConfigError(
                    f"no wheel of {r} for the twin's platform {platform}",
                    where=where,
                    fix="bump to a release that publishes wheels for every pinned platform, "
                    "or pin them by hand",
                )
        out[f"{section}.wheels[{i}].version"] = version
        out[f"{section}.wheels[{i}].sha256"] = found[DEFAULT_PLATFORM][r][1]
        for platform in w.platforms:
            out[f"{section}.wheels[{i}].platforms.{platform}"] = found[platform][r][1]
    return out


def git_tags(source: str) -> dict[str, str]:
    """Tag name -> commit on ``source`` (annotated tags peeled): the one reader of a git
    source's tags, for bumps and for `k3env outdated`."""
    require_git_source(source, "--source")
    code, out = attempt(
        [require_tool("git", "git"), "ls-remote", "--tags", "--", source], Log(quiet=True)
    )
    if code != 0:
        raise LockError(f"cannot list the tags of {source}: {out.strip()[-300:]}",
                        where=source, fix="check the URL or pass --source MIRROR")  # fmt: skip
    tags: dict[str, str] = {}
    for line in out.splitlines():
        sha, _, ref = line.partition("\t")
        name = ref.removeprefix("refs/tags/")
        if name.endswith("^{}"):
            tags[name.removesuffix("^{}")] = sha  # the peeled commit wins
        else:
            tags.setdefault(name, sha)
    return tags


def resolve_ref(source: str, ref: str) -> tuple[str, str]:
    """(tag, commit) for a tag name or a commit on ``source``; a commit no tag names is
    refused (a made-up commit would be "verified" as nothing at all)."""
    tags = git_tags(source)
    if ref in tags:
        return ref, tags[ref]
    if COMMIT_RE.match(ref):
        named = sorted(t for t, c in tags.items() if c == ref)
        if named:
            return named[0], ref
        raise LockError(f"commit {ref} is not named by any tag of {source}",
                        where="dynamo.commit", fix="bump to a release tag")  # fmt: skip
    raise LockError(f"{ref!r} is neither a tag nor a tagged commit of {source}",
                    where="dynamo", fix="list the tags: git ls-remote --tags SOURCE")  # fmt: skip


def commit_to_tag(source: str, tag: str) -> str:
    """The commit a tag names on ``source`` (annotated tags peeled)."""
    if not REF_RE.match(tag):
        raise ConfigError(f"{tag!r} is not a tag name", where="k3env bump", fix="e.g. v1.0.49")
    commit = git_tags(source).get(tag)
    if commit is None:
        raise LockError(
            f"tag {tag} not found in {source}", where="srt_slurm.version", fix="check the tag"
        )
    return commit


def finish(lock: Lock, changes: dict[str, str], after: Outcome, keep_failing: bool) -> bool:
    """Write the bumped leaves into the lock as it is now (under its file lock, so an edit made
    meanwhile is kept) when the checks passed or the user asked; True if written."""
    if after.failed and not keep_failing:
        return False
    set_leaves(lock.path, changes)
    return True


def commit_branch(
    root: Path, lock: Lock, pin_title: str, message: str, also: tuple[Path, ...] = ()
) -> str:
    """A local branch + commit of the lock with the PR message (never pushed); ``also``: the
    other files the bump wrote (srt-slurm 2.x: its recorded schema)."""
    log = Log(quiet=True)
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", pin_title.lower()).strip("-")[:60]
    branch = f"k3env/{slug}"
    run(["git", "checkout", "-q", "-b", branch], log, cwd=root, what="git checkout -b")
    run(["git", "add", str(lock.path)], log, cwd=root, what="git add")
    # What the bump regenerated beside the lock (`bump twin`: the twin's pinned files).
    run(["git", "add", "-u", "--", str(lock.path.parent)], log, cwd=root, what="git add")
    if also:
        run(["git", "add", "--", *map(str, also)], log, cwd=root, what="git add")
    msg = root / ".git" / "K3ENV_BUMP_MSG"
    msg.write_text(f"{pin_title}\n\n{message}")
    try:
        run(["git", "commit", "-q", "-F", str(msg)], log, cwd=root, what="git commit")
    finally:
        os.unlink(msg)
    return branch
