"""The cluster's staged images: k3env's verified ``.sqsh`` exports in a cache directory every
node sees, keyed by platform and manifest digest, for pyxis's importer (``handoff.importer``)
to start a job from without an import.

Layout (``CACHE``: e.g. a Lustre directory; made world-readable, files 0644, directories 0755)::

    CACHE/linux_amd64/<manifest hex>/image.sqsh    the export, byte for byte
    CACHE/linux_amd64/<manifest hex>/entry.json    digest, sha256, size, image, image id, lock
    CACHE/linux_amd64/<manifest hex>/provenance.json   k3env's provenance, read from the image
    CACHE/linux_amd64/<manifest hex>/sbom.cdx.json[.sig], statement.intoto.json
                                                   the export's signed SBOM and provenance
    CACHE/linux_amd64/<manifest hex>/holds/J.S     job J step S uses it (importer get .. release)
    CACHE/.locks/<manifest hex>.lock               one stager per digest (flock)

A file is copied beside its place, hashed as it is copied, checked against the export's
recorded sha256, and renamed into place: a reader never sees a partial file. Stagers of the
same digest take the digest's lock in turn; the second finds it staged and does nothing.
Garbage collection never removes an entry a job holds: the importer writes a hold file when
it hands the image to pyxis and removes it at ``release``.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from k3env.errors import ConfigError, StateError
from k3env.hashing import HashingWriter, digest_hex, file_sha256

DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
SQSH = "image.sqsh"
ENTRY = "entry.json"
PROVENANCE = "provenance.json"  # the image's own /etc/k3env/provenance.json
# The export's signed SBOM and statement (handoff.attest), as staged: their suffix -> name.
ATTESTED = {".cdx.json": "sbom.cdx.json", ".cdx.json.sig": "sbom.cdx.json.sig",
            ".intoto.json": "statement.intoto.json"}  # fmt: skip
HOLDS = "holds"
LOCKS = ".locks"
CHUNK = 1 << 20
MAX_ENTRY = 64 << 10


@dataclass(frozen=True, kw_only=True)
class Staged:
    digest: str
    platform: str
    path: Path
    sha256: str
    size: int
    image: str
    image_id: str
    lock: str
    staged_at: float
    copied: bool = False  # False: it was staged already
    holds: tuple[str, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {k: str(v) if isinstance(v, Path) else v for k, v in self.__dict__.items()} | {
            "holds": list(self.holds)
        }


def platform_dir(platform: str) -> str:
    """``linux/amd64`` as a directory name (``linux_amd64``)."""
    if not re.fullmatch(r"[a-z0-9]+/[a-z0-9]+(/[a-z0-9]+)?", platform):
        raise ConfigError(f"{platform!r} is not a platform", where="platform", fix="linux/amd64")
    return platform.replace("/", "_")


def entry_dir(cache: Path, platform: str, digest: str) -> Path:
    if not DIGEST_RE.match(digest):
        raise ConfigError(
            f"{digest!r} is not a manifest digest",
            where="digest",
            fix="stage an image k3env pushed (sha256:<64 hex>)",
        )
    return cache / platform_dir(platform) / digest.removeprefix("sha256:")


def lock_path(cache: Path, digest: str) -> Path:
    return cache / LOCKS / f"{digest.removeprefix('sha256:')}.lock"


@contextmanager
def digest_lock(cache: Path, digest: str) -> Iterator[None]:
    locks = cache / LOCKS
    locks.mkdir(parents=True, exist_ok=True, mode=0o755)
    path = lock_path(cache, digest)
    with open(path, "a") as f:
        path.chmod(0o644)  # the importer takes it shared, read-only
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def read_entry(directory: Path) -> dict[str, Any] | None:
    """An entry's record (shape checked), or None when there is none or it is not one."""
    try:
        fd = os.open(directory / ENTRY, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            data = json.loads(f.read(MAX_ENTRY))
    except (OSError, ValueError):
        return None
    keys = {"digest": str, "sha256": str, "size": int, "image": str, "staged_at": float}
    if not isinstance(data, dict) or not all(isinstance(data.get(k), t) for k, t in keys.items()):
        return None
    return data


def stage(
    cache: Path,
    *,
    platform: str,
    digest: str,
    sqsh: Path,
    sha256: str,
    meta: dict[str, str],
    provenance: bytes | None = None,
) -> Staged:
    """``sqsh`` (whose export recorded ``sha256``) staged under ``digest``: copied once, its
    provenance (k3env's, read from the image) beside it."""
    with digest_lock(cache, digest):
        return stage_locked(cache, platform=platform, digest=digest, sqsh=sqsh, sha256=sha256,
                            meta=meta, provenance=provenance)  # fmt: skip


def stage_locked(
    cache: Path,
    *,
    platform: str,
    digest: str,
    sqsh: Path,
    sha256: str,
    meta: dict[str, str],
    provenance: bytes | None = None,
) -> Staged:
    """``stage``, its caller holding the digest's lock (``digest_lock``)."""
    where = entry_dir(cache, platform, digest)
    entry = read_entry(where)
    target = where / SQSH
    if (
        entry
        and entry["sha256"] == sha256
        and _size(target) == entry["size"]
        and file_sha256(target) == sha256  # a staged file whose bytes changed is replaced
    ):
        return _staged(where, entry, copied=False)
    where.mkdir(parents=True, exist_ok=True, mode=0o755)
    for d in (where.parent, where):
        d.chmod(0o755)
    # Jobs run as their users: any may leave its hold, none may remove another's.
    (where / HOLDS).mkdir(exist_ok=True)
    (where / HOLDS).chmod(0o1777)
    size = _copy_checked(sqsh, where, sha256)
    entry = {
        "digest": digest,
        "platform": platform,
        "sha256": sha256,
        "size": size,
        "staged_at": time.time(),
        **meta,
    }
    if provenance is not None:
        _write(where / PROVENANCE, provenance.decode(errors="replace"))
    attested = _attested(sqsh)
    for name, text in attested.items():
        _write(where / name, text)
    entry["attested"] = sorted(attested)
    _write(where / ENTRY, json.dumps(entry, indent=1, sort_keys=True) + "\n")
    return _staged(where, entry, copied=True)


def _attested(sqsh: Path) -> dict[str, str]:
    """The export's SBOM, its signature and statement beside ``sqsh`` (all three, or none)."""
    from k3env.files import read_input

    found = {}
    for suffix, name in ATTESTED.items():
        beside = sqsh.with_name(sqsh.name + suffix)
        if not beside.is_file():
            return {}
        found[name] = read_input(beside, limit=256 << 20).decode(errors="replace")
    return found


def _size(path: Path) -> int | None:
    try:
        st = path.lstat()
    except OSError:
        return None
    return st.st_size if path.is_file() and not path.is_symlink() else None


def _copy_checked(sqsh: Path, where: Path, sha256: str) -> int:
    """Copy ``sqsh`` to ``where/image.sqsh`` through a temporary file, hashing it; refuse
    bytes that are not the export's."""
    fd, tmp = tempfile.mkstemp(dir=where, prefix=f".{SQSH}.", suffix=".partial")
    try:
        with open(sqsh, "rb") as src, os.fdopen(fd, "wb") as dst:
            out = HashingWriter(dst)
            shutil.copyfileobj(src, out, CHUNK)
            dst.flush()
            os.fsync(dst.fileno())
        got, size = digest_hex(out.digest), out.size
        if got != sha256:
            raise StateError(
                f"{sqsh} has sha256 {got}, its export recorded {sha256}",
                where=str(sqsh),
                fix="export the image again (`k3env export`), then stage it",
            )
        os.chmod(tmp, 0o644)
        os.replace(tmp, where / SQSH)
        return size
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _write(path: Path, text: str) -> None:
    """``text`` renamed over ``path`` itself: in a shared cache a link at ``path`` is replaced,
    never followed (``files.write_atomic`` writes through a link to its target)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _staged(where: Path, entry: dict[str, Any], *, copied: bool) -> Staged:
    holds = sorted(p.name for p in (where / HOLDS).glob("*")) if (where / HOLDS).is_dir() else []
    return Staged(
        digest=str(entry["digest"]),
        platform=str(entry.get("platform", "")),
        path=where / SQSH,
        sha256=str(entry["sha256"]),
        size=int(entry["size"]),
        image=str(entry["image"]),
        image_id=str(entry.get("image_id", "")),
        lock=str(entry.get("lock", "")),
        staged_at=float(entry["staged_at"]),
        copied=copied,
        holds=tuple(holds),
    )


def staged(cache: Path) -> list[Staged]:
    """Every entry of the cache (oldest first); a directory that is not one is skipped."""
    out = []
    for platform in sorted(p for p in cache.glob("*_*") if p.is_dir() and not p.is_symlink()):
        for where in sorted(platform.iterdir()):
            entry = read_entry(where) if where.is_dir() and not where.is_symlink() else None
            if entry is not None:
                out.append(_staged(where, entry, copied=False))
    return sorted(out, key=lambda s: s.staged_at)


def collect_garbage(
    cache: Path, *, max_age: float | None, max_bytes: int | None, now: float | None = None
) -> tuple[list[Staged], list[Staged]]:
    """Remove entries older than ``max_age`` seconds, then the oldest until the cache holds at
    most ``max_bytes``; never one a job holds (its importer's hold file). (removed, kept
    because held)."""
    now = time.time() if now is None else now
    entries = staged(cache)
    total = sum(s.size for s in entries)
    removed, held = [], []
    for s in entries:
        old = max_age is not None and now - s.staged_at > max_age
        big = max_bytes is not None and total > max_bytes
        if not (old or big):
            continue
        with digest_lock(cache, s.digest):  # an importer holds it shared while it hands out
            holds = s.path.parent / HOLDS
            if holds.is_dir() and any(holds.iterdir()):
                held.append(s)
                continue
            shutil.rmtree(s.path.parent)
        total -= s.size
        removed.append(s)
    return removed, held
