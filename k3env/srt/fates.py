"""Each pinned srt-slurm PR patch against the pinned version: applies, upstream, or conflicts.

``k3env bump`` asks this of a candidate version: a patch whose commits are in the version's
history, whose change the version already has (``git patch-id``) or that reverses cleanly is
upstream (drop it from the lock); one that applies is kept; one that does neither conflicts,
with the file and hunk. The patches are tried in order on one clone, each applying one on
top of those before it.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from k3env.config.pins import Lock, SrtPatchPin, SrtSlurmPin
from k3env.config.shapes import require_git_source
from k3env.files import read_input
from k3env.log import Log
from k3env.runner import attempt, require_tool, run, run_streaming
from k3env.srt.materialize import conflict, patch_files, pinned_srt, run_git


@dataclass(frozen=True, kw_only=True)
class SrtPatchFate:
    label: str
    status: str  # applies | upstream | conflicts
    detail: str


def _patch_ids(git: str, patches: bytes, log: Log) -> set[str]:
    """The stable patch-ids of the commits in ``patches`` (a format-patch file or `git log
    -p` output)."""
    out = run_streaming([git, "patch-id", "--stable"], [patches], log, what="git patch-id")
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _history_patch_ids(git: str, src: Path, commit: str, log: Log, depth: int = 2000) -> set[str]:
    """The stable patch-ids of the last ``depth`` commits up to ``commit``."""
    diff = run(
        [git, "log", "-p", "--no-color", f"-{depth}", commit],
        log,
        cwd=src,
        capture=True,
        what="git log -p",
    )
    return _patch_ids(git, diff.encode(), log)


def patch_fates(lock: Lock, log: Log, *, source: str | None = None) -> list[SrtPatchFate]:
    """Each pinned PR patch against the pinned version, in order: applies, is already
    upstream (it reverses cleanly: propose dropping it), or conflicts (file and hunk)."""
    srt = pinned_srt(lock)
    patches = patch_files(lock, srt)
    git = require_tool("git", "git")
    with tempfile.TemporaryDirectory(prefix="k3env-srt-fates-") as tmp:
        src = Path(tmp) / "src"
        origin = require_git_source(source, "--source") if source else srt.git
        run_git(["clone", "--quiet", "--no-checkout", "--", origin, str(src)], log, what="clone")
        run_git(["checkout", "--quiet", "--detach", srt.commit], log, cwd=src, what="git checkout")
        # Read once, and only when a patch gets that far: the history's patch-ids.
        upstream_ids = cache(lambda: _history_patch_ids(git, src, srt.commit, log))
        return [_fate(git, src, srt, pin, path, upstream_ids, log) for pin, path in patches]


def _fate(
    git: str,
    src: Path,
    srt: SrtSlurmPin,
    pin: SrtPatchPin,
    path: Path,
    upstream_ids: Callable[[], set[str]],
    log: Log,
) -> SrtPatchFate:
    """One patch's fate on ``src`` (the version and the patches before it that apply): it
    is applied there when it applies."""
    # History first: a merged PR whose lines changed again later neither applies nor
    # reverses, and is still upstream.
    merged = _merged(git, src, srt, pin, log)
    if merged is not None:
        return merged
    ids = _patch_ids(git, read_input(path), log)
    if ids and ids <= upstream_ids():
        return SrtPatchFate(
            label=pin.label,
            status="upstream",
            detail=f"{srt.version} has the same change (git patch-id): drop it from the lock",
        )
    return _apply_or_reverse(git, src, srt, pin, path, log)


def _merged(
    git: str, src: Path, srt: SrtSlurmPin, pin: SrtPatchPin, log: Log
) -> SrtPatchFate | None:
    """Upstream when the patch's commits (its pinned range), or the upstream commit a
    back-port carries, are in the version's history."""
    if pin.range is not None:
        head = pin.range.split("..")[1]
        what = f"its commits ({pin.range[:12]}..{head[:12]})"
    elif pin.backports is not None:
        head = pin.backports
        what = f"the commit it back-ports ({head[:12]})"
    else:
        return None
    merged, _ = attempt([git, "merge-base", "--is-ancestor", head, srt.commit], log, cwd=src)
    if merged != 0:
        return None
    return SrtPatchFate(
        label=pin.label,
        status="upstream",
        detail=f"{what} {'is' if pin.range is None else 'are'} in {srt.version}'s history: "
        "drop it from the lock",
    )


def _apply_or_reverse(
    git: str, src: Path, srt: SrtSlurmPin, pin: SrtPatchPin, path: Path, log: Log
) -> SrtPatchFate:
    """Applies (and is applied), reverses cleanly (upstream), or conflicts (file and hunk)."""
    code, out = attempt([git, "apply", "--check", str(path)], log, cwd=src)
    if code == 0:
        run_git(["apply", str(path)], log, cwd=src, what="git apply")
        return SrtPatchFate(label=pin.label, status="applies", detail=pin.file)
    back, _ = attempt([git, "apply", "--reverse", "--check", str(path)], log, cwd=src)
    if back == 0:
        return SrtPatchFate(
            label=pin.label,
            status="upstream",
            detail=f"{srt.version} already contains it: drop it from the lock",
        )
    return SrtPatchFate(label=pin.label, status="conflicts", detail=conflict(path, out))
