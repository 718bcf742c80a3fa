"""Pin bumps as reviewable pull requests.

Pipeline: parse the bump (which leaves change) -> render the new lock (tomlkit, in place) into
a candidate file beside the lock -> before/after: rebuild the images, verify them from inside,
preflight them -> the fate of every container patch on the new base (still applies /
already upstream / conflicts) -> a PR title and markdown body. The lock itself is replaced
only at the end, atomically, and only when everything passed (or with ``keep_failing``); an
interrupted or failed bump leaves it untouched.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from k3env.checks.verify import CHECKS, ImageReport
from k3env.config.lock import Lock, load_lock
from k3env.config.lock_edit import Change, render_leaves, replace_atomically, write_candidate
from k3env.config.reader import COMMIT_RE, DIGEST_RE
from k3env.errors import ConfigError, K3envError, LockError

PINS_HELP = (
    "bases.NAME [TAG | TAG@sha256:...]",
    "dynamo COMMIT",
    "srt-slurm TAG (its commit resolved with git ls-remote; --source for a mirror)",
    "container_patches.NAME (re-hash the patch file)",
)


@dataclass(frozen=True, kw_only=True)
class PatchFate:
    name: str
    base: str
    status: str  # applies | upstream | conflicts | skipped
    detail: str


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """What one lock state gives: verify reports, preflight errors, patch fates."""

    reports: Sequence[ImageReport]
    preflight_errors: Mapping[str, int]  # image -> errors
    patches: Sequence[PatchFate]
    error: str | None = None  # a build that failed outright

    def matrix(self) -> dict[str, dict[str, str]]:
        return {r.image: {c: r.status(c) for c in CHECKS} for r in self.reports}

    @property
    def failed(self) -> bool:
        return (
            self.error is not None
            or any(r.failed for r in self.reports)
            or any(self.preflight_errors.values())
            or any(p.status == "conflicts" for p in self.patches)
        )


def leaf_changes(
    lock: Lock,
    pin: str,
    value: str | None,
    *,
    resolve_digest: Callable[[str, str], str],
    resolve_tag_commit: Callable[[str, str], str],
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
        if value is None or not COMMIT_RE.match(value):
            raise ConfigError(
                f"{value!r} is not a 40-hex commit",
                where=where,
                fix="pass the full commit id (git rev-parse REF)",
            )
        return {"dynamo.commit": value}
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
        name = pin.split(".", 1)[1]
        patch = lock.container_patches.get(name)
        if patch is None:
            raise ConfigError(
                f"no container patch {name!r}",
                where=where,
                fix=f"use one of {sorted(lock.container_patches)}",
            )
        from k3env.hashing import file_sha256

        return {f"container_patches.{name}.sha256": file_sha256(lock.resolve_path(patch.file))}
    raise ConfigError(
        f"unknown pin {pin!r}", where=where, fix="bump one of: " + "; ".join(PINS_HELP)
    )


def candidate_lock(lock: Lock, changes: dict[str, str]) -> tuple[Lock, str, list[Change]]:
    """The bumped lock, loaded from a candidate file beside the real one (then removed)."""
    text, done = render_leaves(lock.path.read_text(), changes)
    if not done:
        raise LockError(
            "nothing to bump: the lock already pins that", where=str(lock.path), fix="none needed"
        )
    candidate = write_candidate(lock.path, text)
    try:
        new = load_lock(candidate)
    finally:
        candidate.unlink(missing_ok=True)
    # The same file, as far as provenance and relative paths go.
    return dataclasses.replace(new, path=lock.path), text, done


def commit_to_tag(source: str, tag: str) -> str:
    """``git ls-remote`` the tag's commit (annotated tags peeled)."""
    from k3env.log import Log
    from k3env.runner import attempt, require_tool

    code, out = attempt(
        [require_tool("git", "git"), "ls-remote", "--tags", source, f"refs/tags/{tag}*"],
        Log(quiet=True),
    )
    refs: dict[str, str] = {}
    for line in out.splitlines():
        sha, _, ref = line.partition("\t")
        if ref:
            refs[ref] = sha
    commit = refs.get(f"refs/tags/{tag}^{{}}") or refs.get(f"refs/tags/{tag}")
    if code != 0 or commit is None:
        raise LockError(
            f"tag {tag} not found in {source}", where="srt_slurm.version", fix="check the tag"
        )
    return commit


# --- the PR --------------------------------------------------------------------------------------
def _link(lock: Lock, change: Change) -> str:
    m = re.match(r"https://github\.com/([^/]+/[^/.]+)", _git_url(lock, change.key) or "")
    if m and change.old and COMMIT_RE.match(change.new) and COMMIT_RE.match(change.old):
        return f" ([diff](https://github.com/{m[1]}/compare/{change.old[:12]}...{change.new[:12]}))"
    if m and COMMIT_RE.match(change.new):
        return f" ([commit](https://github.com/{m[1]}/commit/{change.new}))"
    return ""


def _git_url(lock: Lock, key: str) -> str | None:
    if key.startswith("dynamo.") and lock.dynamo:
        return lock.dynamo.git
    if key.startswith("srt_slurm.") and lock.srt_slurm:
        return lock.srt_slurm.git
    return None


def _short(value: str | None) -> str:
    if value is None:
        return "—"
    return value if len(value) < 20 else f"`{value[:19]}…`"


def title(pin: str, changes: Sequence[Change]) -> str:
    main = changes[-1] if changes else None
    new = main.new if main else "?"
    return f"Bump {pin} to {new[:12] if COMMIT_RE.match(new) or DIGEST_RE.match(new) else new}"


def body(
    lock: Lock,
    pin: str,
    changes: Sequence[Change],
    before: Outcome,
    after: Outcome,
) -> str:
    lines = [
        f"## {title(pin, changes)}",
        "",
        "### Pins",
        "",
        "| pin | old | new |",
        "|---|---|---|",
    ]
    for c in changes:
        lines.append(f"| `{c.key}` | {_short(c.old)} | {_short(c.new)}{_link(lock, c)} |")
    lines += ["", "### Patches on the new pins", ""]
    if after.patches:
        lines += ["| patch | base | status | detail |", "|---|---|---|---|"]
        for p in after.patches:
            mark = {"applies": "✅ applies", "upstream": "⬆️ upstream: drop it",
                    "conflicts": "❌ conflicts", "skipped": "n/a"}[p.status]  # fmt: skip
            lines.append(f"| `{p.name}` | {p.base} | {mark} | {p.detail} |")
    else:
        lines.append("No container patch applies to the bumped pins.")
    lines += ["", "### Compat matrix (before → after)", ""]
    old, new = before.matrix(), after.matrix()
    lines += [
        "| image | " + " | ".join(CHECKS) + " | preflight |",
        "|---|" + "---|" * (len(CHECKS) + 1),
    ]
    for image in sorted(set(old) | set(new)):
        cells = []
        for check in CHECKS:
            a, b = old.get(image, {}).get(check, "—"), new.get(image, {}).get(check, "—")
            cells.append(f"**{a} → {b}**" if a != b else b)
        pa, pb = before.preflight_errors.get(image, 0), after.preflight_errors.get(image, 0)
        cells.append(f"**{pa} → {pb} errors**" if pa != pb else f"{pb} errors")
        lines.append(f"| `{image}` | " + " | ".join(cells) + " |")
    if after.error:
        lines += ["", f"**The bumped lock did not build:** {after.error}"]
    failures = [f for r in after.reports for f in r.failed]
    if failures:
        lines += ["", "<details open><summary>Failing checks after the bump</summary>", ""]
        for f in failures:
            lines += [
                f"**{f.image}{'/' + f.profile if f.profile else ''}** `{f.check}` {f.subject} "
                f"({f.component} {f.version or '?'})",
                "",
                "```",
                *f.output.strip().splitlines()[-12:],
                "```",
                "",
            ]
        lines.append("</details>")
    lines += [
        "",
        "### Changelog",
        "",
        "- pins: "
        + "; ".join(f"{c.key} {_short(c.old)} → {_short(c.new)}" for c in changes)
        + " (`k3env bump "
        + pin
        + "`)",
        "",
        "Generated by `k3env bump`. "
        + (
            "**Not mergeable: checks fail after the bump.**" if after.failed else "All checks pass."
        ),
    ]
    return "\n".join(lines) + "\n"


def finish(lock: Lock, new_text: str, after: Outcome, keep_failing: bool) -> bool:
    """Write the bumped lock (atomically) when it passed or the user asked; True if written."""
    if after.failed and not keep_failing:
        return False
    replace_atomically(lock.path, new_text)
    return True


def commit_branch(root: Path, lock: Lock, pin_title: str, message: str) -> str:
    """A local branch + commit of the lock with the PR message (never pushed)."""
    from k3env.log import Log
    from k3env.runner import run

    log = Log(quiet=True)
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", pin_title.lower()).strip("-")[:60]
    branch = f"k3env/{slug}"
    run(["git", "checkout", "-q", "-b", branch], log, cwd=root, what="git checkout -b")
    run(["git", "add", str(lock.path)], log, cwd=root, what="git add")
    msg = root / ".git" / "K3ENV_BUMP_MSG"
    msg.write_text(f"{pin_title}\n\n{message}")
    try:
        run(["git", "commit", "-q", "-F", str(msg)], log, cwd=root, what="git commit")
    finally:
        os.unlink(msg)
    return branch


def describe_error(e: K3envError) -> str:
    return e.render().replace("\n", " ")


def as_json(
    pin: str, changes: Sequence[Change], before: Outcome, after: Outcome, written: bool, text: str
) -> dict[str, Any]:
    return {
        "pin": pin,
        "title": title(pin, changes),
        "changes": [c.__dict__ for c in changes],
        "before": {"matrix": before.matrix(), "preflight_errors": dict(before.preflight_errors)},
        "after": {
            "matrix": after.matrix(),
            "preflight_errors": dict(after.preflight_errors),
            "patches": [p.__dict__ for p in after.patches],
            "error": after.error,
        },
        "failed": after.failed,
        "lock_written": written,
        "body": text,
    }


def evaluate(
    lock: Lock,
    specs: Sequence[Any],
    *,
    engine: Any,
    state: Any,
    log: Any,
    cluster: Any,
    run_verify: bool,
    srt_source: str | None = None,
) -> Outcome:
    """Build every image on ``lock``, verify and preflight it, and test each container patch."""
    from k3env.checks.preflight import contexts, run_rules
    from k3env.checks.rules import RULES
    from k3env.checks.verify import verify_image
    from k3env.config.lock import verify_patch_file
    from k3env.config.patchfile import load_patch_file
    from k3env.errors import PatchError
    from k3env.image.bases import registry_base
    from k3env.image.build import make_builder, read_base_files, resolve_modules
    from k3env.image.patches import ALREADY_PRESENT, apply_patch

    fates: list[PatchFate] = []
    resolve = registry_base(engine, log)
    for name, pin in lock.container_patches.items():
        patch = load_patch_file(pin, verify_patch_file(lock, pin))
        for base_name in pin.bases:
            base_pin = lock.bases[base_name]
            if base_pin.kind != "registry" or base_pin.digest is None:
                fates.append(PatchFate(name=name, base=base_name, status="skipped",
                                       detail="base not resolvable here"))  # fmt: skip
                continue
            try:
                base = resolve(base_pin)
                target = (
                    pin.path
                    or resolve_modules(engine, state, base, [pin.module or ""], log)[
                        pin.module or ""
                    ]
                )
                file = read_base_files(engine, state, base, [target])[target] if target else None
                if file is None:
                    raise PatchError(f"target {pin.target} not in the image", where=name, fix="")
                result = apply_patch(
                    patch, str(target), file.content.decode(), image=base.reference
                )
                status = "upstream" if result.status == ALREADY_PRESENT else "applies"
                fates.append(
                    PatchFate(name=name, base=base_name, status=status, detail=result.detail)
                )
            except PatchError as e:
                fates.append(PatchFate(name=name, base=base_name, status="conflicts",
                                       detail=e.message))  # fmt: skip
    if lock.srt_slurm is not None and lock.srt_slurm.patches:
        from k3env.handoff.srt import patch_fates

        try:
            for fate in patch_fates(lock, log, source=srt_source):
                fates.append(PatchFate(name=fate.label, base=f"srt-slurm {lock.srt_slurm.version}",
                                       status=fate.status, detail=fate.detail))  # fmt: skip
        except K3envError as e:
            fates.append(PatchFate(name="srt-slurm patches", base=lock.srt_slurm.version,
                                   status="skipped", detail=describe_error(e)))  # fmt: skip
    try:
        builder = make_builder(lock, engine, state, log, False)
        builds = [(spec, builder.build(spec)) for spec in specs]
    except K3envError as e:
        return Outcome(reports=(), preflight_errors={}, patches=fates, error=describe_error(e))
    reports = (
        [verify_image(engine, state, lock, spec, build, twin=False) for spec, build in builds]
        if run_verify
        else []
    )
    pre = run_rules(contexts(lock, specs, cluster, state), RULES)
    errors = {spec.name: 0 for spec in specs}
    for f in pre.findings:
        if f.severity == "error":
            errors[f.image] = errors.get(f.image, 0) + 1
    return Outcome(reports=reports, preflight_errors=errors, patches=fates)
