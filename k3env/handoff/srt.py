"""srt-slurm: materialize the pinned version with its PR patches, and validate recipes with it.

``materialize``: clone the pinned repository (its git URL or a local mirror), check the tag
points at the pinned commit, check out that commit, verify each PR patch against its sha256
and apply them in order (each checked first, so a conflict names the patch, file and hunk),
then install ``srtctl`` from the result into its own virtual environment. Everything happens
in a temporary directory renamed into the cache at the end: nothing half-materialized is ever
found there. The cache key is the commit plus the patch hashes; a second call reuses it.

``validate``: load recipes with the materialized srt-slurm's own config loading (its
marshmallow schema), not a copy of it: each error comes back with the recipe file, the key
path and srt-slurm's message.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from k3env.config.lock import Lock, SrtPatchPin, SrtSlurmPin, verify_pinned_file
from k3env.config.shapes import require_git_source
from k3env.errors import ConfigError, LockError, PatchError, ToolError
from k3env.hashing import canonical_sha256, file_sha256
from k3env.log import Log
from k3env.runner import attempt, require_tool, run, run_streaming
from k3env.state import State

# 2: venv scripts point at the cache entry, not the build directory
# 3: srtctl's dependencies from the lock's hashed requirements; the venv's files recorded
# 4: the record includes bytecode caches
SRT_FORMAT = 4
MARKER = "k3env-materialized.json"
VENV_MANIFEST = "k3env-venv.json"  # sha256 of each file of srtctl's environment
# Fixed identity and dates for the commits k3env makes: the same inputs give the same HEAD.
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "k3env",
    "GIT_AUTHOR_EMAIL": "k3env@localhost",
    "GIT_COMMITTER_NAME": "k3env",
    "GIT_COMMITTER_EMAIL": "k3env@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z",
}


@dataclass(frozen=True, kw_only=True)
class Materialized:
    path: Path
    source: str
    version: str
    commit: str
    head: str
    patches: tuple[str, ...]
    python: Path  # the isolated environment's interpreter, with srtctl installed
    reused: bool

    def as_json(self) -> dict[str, Any]:
        return {k: str(v) if isinstance(v, Path) else v for k, v in self.__dict__.items()}


def _pin(lock: Lock) -> SrtSlurmPin:
    if lock.srt_slurm is None:
        raise LockError("the lock pins no srt-slurm", where=str(lock.path), fix="add [srt_slurm]")
    return lock.srt_slurm


def _patch_files(lock: Lock, srt: SrtSlurmPin) -> list[tuple[SrtPatchPin, Path]]:
    out = []
    for p in srt.patches:
        where = f"{lock.path}: srt_slurm.patches[{p.index}]"
        label = p.label
        if p.sha256 is None:
            hint = f"git format-patch --stdout {p.range} > {p.file}" if p.range else "write it"
            raise LockError(
                f"patch {label} is unresolved (no sha256 pinned)",
                where=f"{where}.sha256",
                fix=f"on a host with the repository: {hint}; then `k3env lock --update-hashes`",
            )
        path = verify_pinned_file(
            lock, p.file, p.sha256, key=f"srt_slurm.patches[{p.index}]", label=f" ({label})"
        )
        out.append((p, path))
    return out


def cache_key(srt: SrtSlurmPin) -> str:
    # Where it was cloned from is not part of the key: a mirror gives the same content.
    return canonical_sha256(
        {
            "format": SRT_FORMAT,
            "version": srt.version,
            "commit": srt.commit,
            "patches": [p.sha256 for p in srt.patches],
            "requirements": srt.requirements_sha256,
        }
    )


def _requirements(lock: Lock, srt: SrtSlurmPin) -> Path | None:
    """The lock's hashed requirements for srtctl (checked), or None when it pins none."""
    if srt.requirements is None:
        return None
    if srt.requirements_sha256 is None:
        raise LockError(
            f"srtctl's requirements file {srt.requirements} is unresolved (no sha256 pinned)",
            where=f"{lock.path}: srt_slurm.requirements_sha256",
            fix="`k3env lock --update-hashes`",
        )
    return verify_pinned_file(
        lock,
        srt.requirements,
        srt.requirements_sha256,
        key="srt_slurm.requirements",
        label="",
        what="requirements file",
        sha_key="srt_slurm.requirements_sha256",
    )


def venv_files(venv: Path) -> dict[str, str]:
    """sha256 of every file in srtctl's environment (bytecode caches included: Python runs a
    ``.pyc`` whose source is unchanged without reading the source), by path relative to the
    environment; symlinks by target."""
    out = {}
    for path in sorted(venv.rglob("*")):
        rel = path.relative_to(venv).as_posix()
        if path.is_symlink():
            out[rel] = "-> " + os.readlink(path)
        elif path.is_file():
            out[rel] = file_sha256(path)
    return out


def venv_changes(recorded: dict[str, str], now: dict[str, str]) -> list[str]:
    """Files changed, removed or added since the install; a bytecode cache Python wrote later
    for a module pip did not compile is the one addition allowed."""
    changed = [k for k in recorded if now.get(k) != recorded[k]]
    added = [k for k in now if k not in recorded and "__pycache__" not in k.split("/")]
    return sorted(changed + added)


def _git(args: list[str], log: Log, *, cwd: Path | None = None, what: str) -> str:
    return run(
        [require_tool("git", "git"), *args], log, cwd=cwd, capture=True, what=what, env=_GIT_ENV
    )


def _check_cache(final: Path, log: Log) -> dict[str, Any]:
    marker = final / MARKER
    fix = f"remove {final} (rm -rf) and materialize again"
    if not marker.is_file():
        raise ConfigError(
            "the srt-slurm cache directory exists but was not completed by k3env",
            where=str(final),
            fix=fix,
        )
    record: dict[str, Any] = json.loads(marker.read_text())
    status = _git(["status", "--porcelain"], log, cwd=final / "src", what="git status")
    head = _git(["rev-parse", "HEAD"], log, cwd=final / "src", what="git rev-parse").strip()
    if status.strip() or head != record["head"]:
        raise ConfigError(
            "the srt-slurm cache is dirty (files changed since k3env materialized it"
            + (f": {status.strip().splitlines()[:5]}" if status.strip() else f"; HEAD is {head}")
            + ")",
            where=str(final),
            fix=fix,
        )
    try:
        recorded = json.loads((final / VENV_MANIFEST).read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"the srtctl environment's record cannot be read ({e})", where=str(final), fix=fix
        ) from e
    if canonical_sha256(recorded) != record.get("venv_sha256"):
        raise ConfigError("the srtctl environment's record was edited", where=str(final), fix=fix)
    changed = venv_changes(recorded, venv_files(final / "venv"))
    if changed:
        raise ConfigError(
            f"srtctl's environment changed since k3env installed it ({len(changed)} file(s): "
            f"{', '.join(changed[:5])})",
            where=str(final / "venv"),
            fix=fix,
        )
    return record


_FAILED = re.compile(r"patch failed: (?P<file>[^:\n]+):(?P<line>\d+)")
_NOT_APPLY = re.compile(r"error: (?P<file>[^:\n]+): (?P<why>.+)")


def _conflict(patch: Path, output: str) -> str:
    """``file, hunk`` from git apply's output and the patch itself."""
    m = _FAILED.search(output)
    if m is None:
        m2 = _NOT_APPLY.search(output)
        return f"{m2['file']}: {m2['why']}" if m2 else output.strip()[-500:]
    file, line = m["file"], int(m["line"])
    current = None
    for text in patch.read_text(errors="replace").splitlines():
        if text.startswith("+++ "):
            current = text[4:].removeprefix("b/")
        elif text.startswith("@@") and current == file:
            start = re.match(r"@@ -(\d+)", text)
            if start and int(start[1]) == line:
                return f"{file}, hunk {text.strip()}"
    return f"{file}, hunk at line {line}"


def _relocate_venv(built: Path, final: Path) -> None:
    """Rewrite ``built`` (a venv's path) to ``final`` in its bin/ scripts."""
    old, new = str(built).encode(), str(final).encode()
    for script in (built / "bin").iterdir():
        if script.is_symlink() or not script.is_file():
            continue
        data = script.read_bytes()
        if old in data and b"\0" not in data[:1024]:
            script.write_bytes(data.replace(old, new))


def materialize(lock: Lock, state: State, log: Log, *, source: str | None = None) -> Materialized:
    """The pinned srt-slurm + its PR patches with srtctl installed, in the state's cache
    (built in a temporary directory renamed at the end): clone, check the tag, apply the
    patches, install srtctl, record every file of its venv."""
    srt = _pin(lock)
    patches = _patch_files(lock, srt)
    requirements = _requirements(lock, srt)
    final = state.path("srt", cache_key(srt)[:20])
    origin = require_git_source(source, "--source") if source else srt.git
    if final.exists():
        record = _check_cache(final, log)
        log.info(f"    srt-slurm {srt.version} + {len(patches)} patch(es): cache hit {final}")
        return _materialized(final, record, reused=True)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.{os.getpid()}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        src = tmp / "src"
        _checkout(lock, srt, origin, src, log)
        applied = _apply_patches(lock, srt, patches, src, log)
        head = _git(["rev-parse", "HEAD"], log, cwd=src, what="git rev-parse").strip()
        with log.step("install srtctl into an isolated environment"):
            _install_srtctl(lock, srt, requirements, src, tmp, log)
            # pip writes the venv's absolute path into each script's first line (and venv
            # into activate): point them at where the cache entry will live.
            _relocate_venv(tmp / "venv", final / "venv")
        manifest = venv_files(tmp / "venv")
        (tmp / VENV_MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
        record = {
            "source": origin,
            "version": srt.version,
            "commit": srt.commit,
            "head": head,
            "patches": applied,
            "venv_sha256": canonical_sha256(manifest),
        }
        (tmp / MARKER).write_text(json.dumps(record, indent=2))
        os.rename(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return _materialized(final, record, reused=False)


def _materialized(final: Path, record: dict[str, Any], *, reused: bool) -> Materialized:
    return Materialized(
        path=final,
        source=record["source"],
        version=record["version"],
        commit=record["commit"],
        head=record["head"],
        patches=tuple(record["patches"]),
        python=final / "venv/bin/python",
        reused=reused,
    )


def _checkout(lock: Lock, srt: SrtSlurmPin, origin: str, src: Path, log: Log) -> None:
    """Clone ``origin`` and check out the pinned commit, which the pinned tag must name."""
    with log.step(f"clone {origin}"):
        _git(["clone", "--quiet", "--no-checkout", "--", origin, str(src)], log, what="git clone")
    code, tagged = attempt(
        [require_tool("git", "git"), "rev-parse", "--verify", "--quiet",
         f"refs/tags/{srt.version}^{{commit}}"],
        log,
        cwd=src,
    )  # fmt: skip
    tagged = tagged.strip()
    if code != 0 or not tagged:
        raise LockError(
            f"tag {srt.version} does not exist in {origin}",
            where=f"{lock.path}: srt_slurm.version",
            fix="check the tag name (git ls-remote --tags URL), or the repository",
        )
    if tagged != srt.commit:
        raise LockError(
            f"tag {srt.version} is commit {tagged} in {origin}; the lock pins {srt.commit}",
            where=f"{lock.path}: srt_slurm.commit",
            fix="pin the tag's commit, or check that the mirror is the right repository",
        )
    _git(["checkout", "--quiet", "--detach", srt.commit], log, cwd=src, what="git checkout")


def _apply_patches(
    lock: Lock, srt: SrtSlurmPin, patches: Sequence[tuple[SrtPatchPin, Path]], src: Path, log: Log
) -> list[str]:
    """Each PR patch in order, checked first (a conflict names the patch, file and hunk),
    one commit each; their labels."""
    applied = []
    for pin, path in patches:
        label = pin.label
        code, check = attempt(
            [require_tool("git", "git"), "apply", "--check", "--verbose", str(path)],
            log,
            cwd=src,
        )
        if code != 0:
            raise PatchError(
                f"srt-slurm patch {label} ({pin.file}) does not apply to {srt.version} + "
                f"the patches before it: {_conflict(path, check)}",
                where=f"{lock.path}: srt_slurm.patches[{pin.index}]",
                fix="rebase the patch on the pinned version (or drop it if it is upstream), "
                "then `k3env lock --update-hashes`",
            )
        _git(["apply", "--index", str(path)], log, cwd=src, what="git apply")
        _git(
            ["commit", "--quiet", "--no-verify", "-m", f"k3env: apply {label}: {pin.title}"],
            log,
            cwd=src,
            what="git commit",
        )
        applied.append(label)
    return applied


def _install_srtctl(
    lock: Lock, srt: SrtSlurmPin, requirements: Path | None, src: Path, tmp: Path, log: Log
) -> None:
    """srtctl into ``tmp/venv``: the pinned closure by hash, then srtctl itself resolving
    nothing (``pip check`` after); unpinned, pip resolves srt-slurm's ranges."""
    # From a copy: a build writes build/ and *.egg-info into its source tree, and the
    # checkout must stay exactly the pinned commit + patches.
    pkg = tmp / "pkg"
    shutil.copytree(src, pkg, ignore=shutil.ignore_patterns(".git"))
    run([sys.executable, "-m", "venv", str(tmp / "venv")], log, what="venv")
    pip = [str(tmp / "venv/bin/python"), "-m", "pip", "install", "--quiet",
           "--disable-pip-version-check"]  # fmt: skip
    if requirements is None:
        log.info(
            "    warning: srtctl's dependencies are not pinned (no "
            "srt_slurm.requirements in the lock): pip resolves srt-slurm's version "
            "ranges as of today"
        )
        run([*pip, str(pkg)], log, capture=True, what="pip install srtctl")
    else:
        # The pinned closure by hash, wheels only; then srtctl itself, built with the
        # pinned backend from that closure, resolving nothing.
        run([*pip, "--require-hashes", "--no-deps", "--only-binary", ":all:",
             "-r", str(requirements)], log, capture=True,
            what="pip install srtctl's pinned requirements")  # fmt: skip
        run([*pip, "--no-deps", "--no-index", "--no-build-isolation", str(pkg)], log,
            capture=True, what="pip install srtctl")  # fmt: skip
        code, broken = attempt([str(tmp / "venv/bin/python"), "-m", "pip", "check"], log)
        if code != 0:
            raise LockError(
                f"srtctl's pinned requirements do not satisfy srt-slurm {srt.version}: "
                f"{broken.strip()[-1500:]}",
                where=f"{lock.path}: srt_slurm.requirements",
                fix="regenerate the requirements from srt-slurm's pyproject.toml "
                "dependencies (the command is in the file's header)",
            )
    shutil.rmtree(pkg)


# --- validate ------------------------------------------------------------------------------------
# srtctl's own dry-run: loads the recipe and renders the sbatch script, without Slurm.
DRY_RUN = ("-m", "srtctl.cli.submit", "dry-run", "-f")
# srt-slurm names the field at the head of its cross-field messages ("frontend.type: vllm ...",
# "dynamo.wheel must be ..."): the key path of an error that has none.
_KEY_HEAD = re.compile(r"^([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)+):? ")
_NOT_A_KEY = re.compile(r"\.(?:ya?ml|json|py|toml|sh)$")


@dataclass(frozen=True, kw_only=True)
class RecipeError:
    file: str
    key: str
    message: str
    stage: str = "load"  # load (load_config) | job (a lookup the job makes) | dry-run (render)


def _keyed(file: str, key: str, message: str, stage: str) -> RecipeError:
    if not key or key == "_schema":
        m = _KEY_HEAD.match(message)
        key = m.group(1) if m and not _NOT_A_KEY.search(m.group(1)) else ""
    return RecipeError(file=file, key=key, message=message, stage=stage)


@dataclass(frozen=True, kw_only=True)
class Validation:
    errors: list[RecipeError]
    not_checked: list[str]  # what this srt-slurm could not be asked (it has no such function)


def validate(m: Materialized, recipes: list[Path], log: Log) -> Validation:
    """Each recipe through srt-slurm's own ``load_config`` and the lookups its job makes by
    the recipe's types (frontend, benchmark runner); then, for a recipe that passes those,
    srtctl's dry-run (it renders the sbatch script). Errors with key paths.

    Both run in one fresh directory with no ``SRTSLURM_CONFIG``: srt-slurm reads a site
    ``srtslurm.yaml`` from the working directory and two above it, and the verdict must not
    depend on one that happens to be there."""
    paths = [str(r.resolve()) for r in recipes]
    env = {k: v for k, v in os.environ.items() if k != "SRTSLURM_CONFIG"}
    # Rich wraps srtctl's output at 80 columns when it is not a terminal: one line a message.
    env["COLUMNS"] = "10000"
    errors: list[RecipeError] = []
    with tempfile.TemporaryDirectory(prefix="k3env-srt-validate-") as tmp:
        cwd = Path(tmp) / "a" / "b"  # its parents are ours, and empty
        cwd.mkdir(parents=True)
        with resources.as_file(resources.files("k3env.probes") / "srt_validate.py") as script:
            code, out = attempt([str(m.python), str(script), *paths], log, cwd=cwd, env=env)
        try:
            verdict = json.loads(out.strip().splitlines()[-1])
            rows, not_checked = verdict["errors"], verdict["not_checked"]
        except (ValueError, IndexError, KeyError, TypeError) as e:
            raise ToolError(
                f"srt-slurm's validation printed no verdict (exit {code}): {out[-2000:]}",
                where=str(m.path),
                fix="check that the materialized srt-slurm has srtctl.core.config.load_config",
            ) from e
        errors = [_keyed(r["file"], r["key"], r["message"], r.get("stage", "load")) for r in rows]
        failed = {e.file for e in errors}
        for path in paths:
            if path in failed:
                continue
            with log.step(f"srtctl dry-run {Path(path).name}"):
                code, text = attempt([str(m.python), *DRY_RUN, path], log, cwd=cwd, env=env)
            if code != 0:
                errors.append(_keyed(path, "", _dry_run_message(text, path), "dry-run"))
    return Validation(errors=errors, not_checked=list(not_checked))


def _dry_run_message(output: str, path: str) -> str:
    """srtctl's ``Error: ...`` line (its own words), else the end of what it printed."""
    for line in output.splitlines():
        if line.strip().startswith("Error:"):
            message = line.strip().removeprefix("Error:").strip()
            return message.removeprefix(f"Invalid config in {path}: ")
    return output.strip()[-1500:] or "srtctl dry-run failed and printed nothing"


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
    import tempfile

    srt = _pin(lock)
    patches = _patch_files(lock, srt)
    git = require_tool("git", "git")
    fates = []
    with tempfile.TemporaryDirectory(prefix="k3env-srt-fates-") as tmp:
        src = Path(tmp) / "src"
        origin = require_git_source(source, "--source") if source else srt.git
        _git(["clone", "--quiet", "--no-checkout", "--", origin, str(src)], log, what="clone")
        _git(["checkout", "--quiet", "--detach", srt.commit], log, cwd=src, what="git checkout")
        upstream_ids: set[str] | None = None
        for pin, path in patches:
            label = pin.label
            # History first: a merged PR whose lines changed again later neither applies nor
            # reverses, and is still upstream.
            if pin.range is not None:
                head = pin.range.split("..")[1]
                merged, _ = attempt(
                    [git, "merge-base", "--is-ancestor", head, srt.commit], log, cwd=src
                )
                if merged == 0:
                    fates.append(
                        SrtPatchFate(
                            label=label,
                            status="upstream",
                            detail=(
                                f"its commits ({pin.range[:12]}..{head[:12]}) are in "
                                f"{srt.version}'s history: drop it from the lock"
                            ),
                        )
                    )
                    continue
            if upstream_ids is None:
                upstream_ids = _history_patch_ids(git, src, srt.commit, log)
            ids = _patch_ids(git, path.read_bytes(), log)
            if ids and ids <= upstream_ids:
                fates.append(
                    SrtPatchFate(
                        label=label,
                        status="upstream",
                        detail=(
                            f"{srt.version} has the same change (git patch-id): "
                            "drop it from the lock"
                        ),
                    )
                )
                continue
            code, out = attempt([git, "apply", "--check", str(path)], log, cwd=src)
            if code == 0:
                _git(["apply", str(path)], log, cwd=src, what="git apply")
                fates.append(SrtPatchFate(label=label, status="applies", detail=pin.file))
                continue
            back, _ = attempt([git, "apply", "--reverse", "--check", str(path)], log, cwd=src)
            if back == 0:
                fates.append(
                    SrtPatchFate(
                        label=label,
                        status="upstream",
                        detail=f"{srt.version} already contains it: drop it from the lock",
                    )
                )
            else:
                fates.append(
                    SrtPatchFate(label=label, status="conflicts", detail=_conflict(path, out))
                )
    return fates
