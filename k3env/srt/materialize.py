"""srt-slurm: materialize the pinned version with its PR patches, srtctl installed.

``materialize``: clone the pinned repository (its git URL or a local mirror), check the tag
points at the pinned commit, check out that commit, verify each PR patch against its sha256
and apply them in order (each checked first, so a conflict names the patch, file and hunk),
then install ``srtctl`` from a copy of the result (its symlinks copied as links, none
allowed out of the repository) into its own virtual environment. Everything happens
in a temporary directory renamed into the cache at the end: nothing half-materialized is ever
found there. The cache key is the commit plus the patch hashes; a second call reuses it.

What the result is asked lives beside it: ``srt_validate`` (recipes through srt-slurm's own
config loading and dry-run) and ``srt_fates`` (each PR patch on a candidate version).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from k3env import jsontext
from k3env.config.pinned_files import verify_pinned_file
from k3env.config.pins import Lock, SrtPatchPin, SrtSlurmPin
from k3env.config.shapes import require_git_source
from k3env.errors import ConfigError, LockError, PatchError
from k3env.files import read_input
from k3env.hashing import canonical_sha256, file_sha256
from k3env.log import Log
from k3env.runner import attempt, require_tool, run
from k3env.state import State
from k3env.untrusted import check_links
from k3env.versions import in_range

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


def pinned_srt(lock: Lock) -> SrtSlurmPin:
    """The lock's [srt_slurm] pin (refused when it pins none)."""
    if lock.srt_slurm is None:
        raise LockError("the lock pins no srt-slurm", where=str(lock.path), fix="add [srt_slurm]")
    return lock.srt_slurm


def patch_files(lock: Lock, srt: SrtSlurmPin) -> list[tuple[SrtPatchPin, Path]]:
    """Each PR patch pin with its file, checked against its pinned sha256."""
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


def run_git(args: list[str], log: Log, *, cwd: Path | None = None, what: str) -> str:
    """git's output, its commits made with k3env's fixed identity and dates."""
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
    try:
        record = json.loads(read_input(marker, error=ConfigError))
    except (ValueError, RecursionError) as e:
        raise ConfigError(f"the srt-slurm cache's marker does not parse ({e})"[:300],
                          where=str(marker), fix=fix) from e  # fmt: skip
    if not isinstance(record, dict) or not isinstance(record.get("head"), str):
        raise ConfigError("the srt-slurm cache's marker was rewritten (it names no HEAD)",
                          where=str(marker), fix=fix)  # fmt: skip
    status = run_git(["status", "--porcelain"], log, cwd=final / "src", what="git status")
    head = run_git(["rev-parse", "HEAD"], log, cwd=final / "src", what="git rev-parse").strip()
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


def conflict(patch: Path, output: str) -> str:
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
    srt = pinned_srt(lock)
    patches = patch_files(lock, srt)
    requirements = _requirements(lock, srt)
    final = state.path("srt", cache_key(srt)[:20])
    origin = require_git_source(source, "--source") if source else srt.git
    if final.exists():  # the cache entry, checked unchanged since k3env made it
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
        head = run_git(["rev-parse", "HEAD"], log, cwd=src, what="git rev-parse").strip()
        _install(lock, srt, requirements, src, tmp, final, log)
        record = _write_record(tmp, origin, srt, head, applied)
        os.rename(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return _materialized(final, record, reused=False)


def _install(
    lock: Lock,
    srt: SrtSlurmPin,
    requirements: Path | None,
    src: Path,
    tmp: Path,
    final: Path,
    log: Log,
) -> None:
    """srtctl into ``tmp/venv``, its scripts pointing at ``final/venv``."""
    with log.step("install srtctl into an isolated environment"):
        _install_srtctl(lock, srt, requirements, src, tmp, log)
        # pip writes the venv's absolute path into each script's first line (and venv
        # into activate): point them at where the cache entry will live.
        _relocate_venv(tmp / "venv", final / "venv")


def _write_record(
    tmp: Path, origin: str, srt: SrtSlurmPin, head: str, applied: list[str]
) -> dict[str, Any]:
    """Record every file of the venv, then what was materialized (the marker, written last)."""
    manifest = venv_files(tmp / "venv")
    (tmp / VENV_MANIFEST).write_text(jsontext.dumps(manifest, indent=1))
    record = {
        "source": origin,
        "version": srt.version,
        "commit": srt.commit,
        "head": head,
        "patches": applied,
        "venv_sha256": canonical_sha256(manifest),
    }
    (tmp / MARKER).write_text(jsontext.dumps(record, indent=2, sort_keys=False))
    return record


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
        run_git(
            ["clone", "--quiet", "--no-checkout", "--", origin, str(src)], log, what="git clone"
        )
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
    run_git(["checkout", "--quiet", "--detach", srt.commit], log, cwd=src, what="git checkout")


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
                f"the patches before it: {conflict(path, check)}",
                where=f"{lock.path}: srt_slurm.patches[{pin.index}]",
                fix="rebase the patch on the pinned version (or drop it if it is upstream), "
                "then `k3env lock --update-hashes`",
            )
        run_git(["apply", "--index", str(path)], log, cwd=src, what="git apply")
        run_git(
            ["commit", "--quiet", "--no-verify", "-m", f"k3env: apply {label}: {pin.title}"],
            log,
            cwd=src,
            what="git commit",
        )
        applied.append(label)
    return applied


def copy_checkout(src: Path, dest: Path, *, where: str) -> None:
    """Copy the checkout ``src`` (not its .git) to ``dest``, its symlinks as symlinks; one
    whose target is outside the repository, absolute, or a directory holding it (a loop) is
    refused first, naming it (a repository's ``leak -> /host/dir`` would otherwise copy that
    host directory; two links to ``.``, a tree that grows without end)."""
    check_links(src, where=where)
    shutil.copytree(src, dest, symlinks=True, ignore=shutil.ignore_patterns(".git"))


def _host_pip() -> bool:
    """Whether k3env's own interpreter has a pip that can install into another environment
    (``--python``, pip 22.3 or later)."""
    import importlib.metadata

    try:
        version = importlib.metadata.version("pip")
    except importlib.metadata.PackageNotFoundError:
        return False
    return in_range(version, ">=22.3") is True


def venv_pip(venv: Path, log: Log) -> list[str]:
    """Create ``venv`` and return the pip command that installs into it. With k3env's own pip
    the venv is made without one (``ensurepip`` is 3.7 of materialize's 6.5 s) and that pip
    is pointed at it; otherwise the venv gets its own pip."""
    if _host_pip():
        run([sys.executable, "-m", "venv", "--without-pip", str(venv)], log, what="venv")
        return [sys.executable, "-m", "pip", "--python", str(venv / "bin/python")]
    run([sys.executable, "-m", "venv", str(venv)], log, what="venv")
    return [str(venv / "bin/python"), "-m", "pip"]


def _install_srtctl(
    lock: Lock, srt: SrtSlurmPin, requirements: Path | None, src: Path, tmp: Path, log: Log
) -> None:
    """srtctl into ``tmp/venv``: the pinned closure by hash, then srtctl itself resolving
    nothing (``pip check`` after); unpinned, pip resolves srt-slurm's ranges."""
    # From a copy: a build writes build/ and *.egg-info into its source tree, and the
    # checkout must stay exactly the pinned commit + patches.
    pkg = tmp / "pkg"
    copy_checkout(src, pkg, where=f"srt-slurm {srt.version} + its patches")
    pip_argv = venv_pip(tmp / "venv", log)
    pip = [*pip_argv, "install", "--quiet", "--disable-pip-version-check"]
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
        code, broken = attempt([*pip_argv, "check"], log)
        if code != 0:
            raise LockError(
                f"srtctl's pinned requirements do not satisfy srt-slurm {srt.version}: "
                f"{broken.strip()[-1500:]}",
                where=f"{lock.path}: srt_slurm.requirements",
                fix="regenerate the requirements from srt-slurm's pyproject.toml "
                "dependencies (the command is in the file's header)",
            )
    shutil.rmtree(pkg)
