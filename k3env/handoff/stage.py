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

Who may write where (docs/threat-model.md "Staged images: who may write where"): the stager owns
every directory and file but the holds; a job's importer, as the job's user, writes only its own
hold file in ``holds/`` (mode 1777: sticky, none may remove another's) and reads the rest; other
users of the cluster may have write access to nothing, and whatever they leave is refused by its
type and owner (``cachefs``), never followed, opened, changed or served. Trusted owners: the cache
root's owner and root; a stager also trusts itself.

A file is copied beside its place, hashed as it is copied, checked against the export's
recorded sha256, and renamed into place: a reader never sees a partial file. Stagers of the
same digest take the digest's lock in turn; the second finds it staged and does nothing.
Garbage collection never removes an entry a job holds: the importer writes a hold file when
it hands the image to pyxis and removes it at ``release``.
"""

from __future__ import annotations

import fcntl
import os
import re
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from k3env import jsontext
from k3env.errors import ConfigError, StateError
from k3env.handoff.cachefs import CacheRefused, Dir, blocks, open_root
from k3env.hashing import HashingWriter, digest_hex, sha256_stream

DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
SHA_RE = re.compile(r"^[0-9a-f]{64}$")
SQSH = "image.sqsh"
ENTRY = "entry.json"
PROVENANCE = "provenance.json"  # the image's own /etc/k3env/provenance.json
# The export's signed SBOM and statement (handoff.attest), as staged: their suffix -> name.
ATTESTED = {".cdx.json": "sbom.cdx.json", ".cdx.json.sig": "sbom.cdx.json.sig",
            ".intoto.json": "statement.intoto.json"}  # fmt: skip
HOLDS = "holds"
LOCKS = ".locks"
MAX_ENTRY = 64 << 10
MAX_ATTESTED = 64 << 20  # an SBOM of 20,000 packages is a few MiB
MAX_TEXT = 4 << 10  # one field of an entry (an image name, a URI)
DIR_MODE, FILE_MODE, HOLDS_MODE = 0o755, 0o644, 0o1777


@dataclass(frozen=True, kw_only=True)
class Entry:
    """An entry's ``entry.json``, its fields' types and shapes checked (``read_entry``)."""

    digest: str
    platform: str
    sha256: str
    size: int
    image: str
    image_id: str
    lock: str
    staged_at: float
    attested: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class Staged(Entry):
    """An entry as a stager or a listing found it: its record, where it is, and who holds it."""

    path: Path
    copied: bool = False  # False: it was staged already
    holds: tuple[str, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {k: str(v) if isinstance(v, Path) else v for k, v in self.__dict__.items()} | {
            "holds": list(self.holds), "attested": list(self.attested)
        }  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Skipped:
    """A directory of the cache that is not an entry k3env may use, and why."""

    path: str
    why: str

    def as_json(self) -> dict[str, str]:
        return {"path": self.path, "why": self.why}


def platform_dir(platform: str) -> str:
    """``linux/amd64`` as a directory name (``linux_amd64``)."""
    if not re.fullmatch(r"[a-z0-9]+/[a-z0-9]+(/[a-z0-9]+)?", platform):
        raise ConfigError(f"{platform!r} is not a platform", where="platform", fix="linux/amd64")
    return platform.replace("/", "_")


def digest_hex_of(digest: str) -> str:
    if not DIGEST_RE.match(digest):
        raise ConfigError(
            f"{digest!r} is not a manifest digest",
            where="digest",
            fix="stage an image k3env pushed (sha256:<64 hex>)",
        )
    return digest.removeprefix("sha256:")


def entry_dir(cache: Path, platform: str, digest: str) -> Path:
    """Where an entry is, as a path shown to people and handed to pyxis (never opened by it)."""
    return cache / platform_dir(platform) / digest_hex_of(digest)


def trusted(root: Dir, *, me: bool = False) -> frozenset[int]:
    """The owners the cache's files may have: its root's owner and root (``me``: and this
    process's user, a stager or an importer staging in mode auto)."""
    return frozenset({root.owner, 0, *([os.geteuid()] if me else [])})


@contextmanager
def digest_lock(root: Dir, digest: str, owners: frozenset[int]) -> Iterator[None]:
    """The digest's lock, exclusive (a stager): ``.locks/<hex>.lock``, opened by descriptor."""
    with root.child(LOCKS, owners, create=DIR_MODE) as locks:  # type: ignore[union-attr]
        name = f"{digest_hex_of(digest)}.lock"
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(name, flags, 0o644, dir_fd=locks.fd)
        except OSError as e:  # ELOOP: a link; EACCES: another's file
            raise locks.refuse(name, f"cannot be opened as a lock file ({e.strerror})") from e
        try:
            _check_lock(locks, name, fd, owners)
            if os.fstat(fd).st_uid == os.geteuid():
                os.fchmod(fd, FILE_MODE)  # the importer takes it shared, read-only
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock


def shared_lock(root: Dir, digest: str, owners: frozenset[int]) -> int | None:
    """The digest's lock taken shared (an importer handing the entry out, so garbage collection
    waits for its hold); None when there is none. The caller closes the descriptor."""
    locks = root.child(LOCKS, owners)
    if locks is None:
        return None
    with locks:
        name = f"{digest_hex_of(digest)}.lock"
        got = locks.open_file(name, owners, limit=0)
        if got is None:
            return None
        fd, _ = got
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
        except BaseException:
            os.close(fd)
            raise
        return fd


def _check_lock(locks: Dir, name: str, fd: int, owners: frozenset[int]) -> None:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_uid not in owners:
        raise locks.refuse(name, "is not a lock file the cache's stager made (type, links or "
                           "owner)")  # fmt: skip


def read_entry(where: Dir, owners: frozenset[int]) -> Entry | None:
    """An entry's record (shape checked), None when there is none. One that is not a regular
    file of a trusted owner, or not the shape k3env writes, is refused (``CacheRefused``)."""
    data = where.read(ENTRY, owners, limit=MAX_ENTRY)
    if data is None:
        return None
    shown = where.path(ENTRY)
    try:
        doc = jsontext.loads(data, where=shown, limit=MAX_ENTRY, max_depth=4, error=CacheRefused)
        entry = Entry(
            digest=_text(doc, "digest", shown, DIGEST_RE),
            platform=_text(doc, "platform", shown, default=""),
            sha256=_text(doc, "sha256", shown, SHA_RE),
            size=jsontext.field(doc, "size", int, where=shown, error=CacheRefused),
            image=_text(doc, "image", shown),
            image_id=_text(doc, "image_id", shown, default=""),
            lock=_text(doc, "lock", shown, default=""),
            staged_at=jsontext.field(doc, "staged_at", float, where=shown, error=CacheRefused),
            attested=tuple(
                a
                for a in jsontext.field(
                    doc, "attested", list, where=shown, default=[], error=CacheRefused
                )
                if isinstance(a, str) and a in ATTESTED.values()
            ),
        )
    except CacheRefused as e:
        raise CacheRefused(e.message, where=e.where, fix="stage the image again (`k3env stage`)"
                           " after removing the entry") from e  # fmt: skip
    if entry.size < 0:
        raise CacheRefused(f"a size of {entry.size}", where=shown, fix="stage the image again")
    return entry


def _text(
    doc: dict[str, Any], key: str, shown: str, shape: re.Pattern[str] | None = None,
    default: str | None = None,
) -> str:  # fmt: skip
    value: str = jsontext.field(doc, key, str, where=shown, error=CacheRefused,
                                **({} if default is None else {"default": default}))  # fmt: skip
    if len(value) > MAX_TEXT or (shape is not None and not shape.match(value)):
        raise CacheRefused(f"{key!r} is not the shape k3env writes", where=shown)
    return value


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
    root = open_root(cache, create=True, owners=frozenset({os.geteuid(), 0}))
    assert root is not None
    with root:
        owners = trusted(root, me=True)
        with digest_lock(root, digest, owners):
            return stage_locked(root, owners, platform=platform, digest=digest, sqsh=sqsh,
                                sha256=sha256, meta=meta, provenance=provenance)  # fmt: skip


def stage_locked(
    root: Dir,
    owners: frozenset[int],
    *,
    platform: str,
    digest: str,
    sqsh: Path,
    sha256: str,
    meta: dict[str, str],
    provenance: bytes | None = None,
) -> Staged:
    """``stage``, its caller holding the digest's lock (``digest_lock``)."""
    name = digest_hex_of(digest)
    shown = Path(root.shown) / platform_dir(platform) / name
    with (
        root.child(platform_dir(platform), owners, create=DIR_MODE) as plat,  # type: ignore[union-attr]
        plat.child(name, owners, create=DIR_MODE) as where,  # type: ignore[union-attr]
    ):
        # Jobs run as their users: any may leave its hold, none may remove another's.
        where.child(HOLDS, owners, create=HOLDS_MODE).close()  # type: ignore[union-attr]
        if _already(where, owners, sha256):
            entry = read_entry(where, owners)
            assert entry is not None
            return _staged(where, shown, entry, copied=False)
        size = _copy_checked(sqsh, where, sha256)
        if provenance is not None:
            where.write_bytes(PROVENANCE, provenance)
        attested = _attested(sqsh)
        for file, data in attested.items():
            where.write_bytes(file, data)
        doc = {"digest": digest, "platform": platform, "sha256": sha256, "size": size,
               "staged_at": time.time(), **meta, "attested": sorted(attested)}  # fmt: skip
        where.write_bytes(ENTRY, (jsontext.dumps(doc, indent=1) + "\n").encode())
        entry = read_entry(where, owners)
        assert entry is not None
        return _staged(where, shown, entry, copied=True)


def _already(where: Dir, owners: frozenset[int], sha256: str) -> bool:
    """Whether ``where`` holds the export of ``sha256``, whole. A changed file, and an entry
    that is not what a stager wrote (a link, a FIFO, a stranger's file where a file belongs),
    are staged again: each file is renamed over its name, never followed."""
    try:
        entry = read_entry(where, owners)
        return bool(entry and entry.sha256 == sha256
                    and _staged_sha256(where, owners, entry) == sha256)  # fmt: skip
    except CacheRefused:
        return False


def _staged_sha256(where: Dir, owners: frozenset[int], entry: Entry) -> str | None:
    """The staged file's sha256, read by descriptor; None when it is missing or not its size
    (a link, a FIFO or a stranger's file there is refused)."""
    got = where.open_file(SQSH, owners)
    if got is None:
        return None
    fd, st = got
    try:
        if st.st_size != entry.size:
            return None
        return sha256_stream(blocks(fd)).hex()
    finally:
        os.close(fd)


def _attested(sqsh: Path) -> dict[str, bytes]:
    """The export's SBOM, its signature and statement beside ``sqsh`` (all three, or none)."""
    from k3env.files import read_input

    found = {}
    for suffix, name in ATTESTED.items():
        beside = sqsh.with_name(sqsh.name + suffix)
        if not beside.is_file():
            return {}
        found[name] = read_input(beside, error=StateError, limit=MAX_ATTESTED)
    return found


def _copy_checked(sqsh: Path, where: Dir, sha256: str) -> int:
    """Copy ``sqsh`` (the build host's own export) to ``image.sqsh`` in ``where``, hashing it;
    refuse bytes that are not the export's."""
    got: dict[str, Any] = {}

    def fill(fd: int) -> None:
        with open(sqsh, "rb") as src, os.fdopen(os.dup(fd), "wb") as dst:
            out = HashingWriter(dst)
            while block := src.read(1 << 20):
                out.write(block)
        got["sha256"], got["size"] = digest_hex(out.digest), out.size
        if got["sha256"] != sha256:
            raise StateError(
                f"{sqsh} has sha256 {got['sha256']}, its export recorded {sha256}",
                where=str(sqsh),
                fix="export the image again (`k3env export`), then stage it",
            )

    where.write(SQSH, fill, mode=FILE_MODE)
    return int(got["size"])


def _holds(where: Dir, owners: frozenset[int]) -> tuple[str, ...]:
    holds = where.child(HOLDS, owners)
    if holds is None:
        return ()
    with holds:
        return tuple(holds.names())


def _staged(where: Dir, shown: Path, entry: Entry, *, copied: bool) -> Staged:
    return Staged(**entry.__dict__, path=shown / SQSH, copied=copied,
                  holds=_holds(where, frozenset({where.owner, 0})))  # fmt: skip


def _walk(root: Dir, owners: frozenset[int]) -> Iterator[tuple[Dir, str, Staged | Skipped]]:
    """Each entry of the cache as (its platform directory, its name, what it is): walked by
    descriptor; what is not an entry of a trusted owner is Skipped, with the reason."""
    for pname in root.names():
        if not re.fullmatch(r"[a-z0-9]+_[a-z0-9]+(_[a-z0-9]+)?", pname):
            continue
        try:
            plat = root.child(pname, owners)
        except CacheRefused as e:
            yield root, pname, Skipped(path=root.path(pname), why=e.message)
            continue
        if plat is None:
            continue
        with plat:
            for name in plat.names():
                if not SHA_RE.match(name):
                    continue
                yield plat, name, _entry_at(plat, name, owners)


def _entry_at(plat: Dir, name: str, owners: frozenset[int]) -> Staged | Skipped:
    try:
        where = plat.child(name, owners)
        if where is None:
            return Skipped(path=plat.path(name), why="gone meanwhile")
        with where:
            entry = read_entry(where, owners)
            if entry is None:
                return Skipped(path=plat.path(name), why="no entry.json (a stage under way?)")
            if entry.digest != f"sha256:{name}":
                return Skipped(path=plat.path(name), why=f"entry.json names {entry.digest}")
            return _staged(where, Path(plat.path(name)), entry, copied=False)
    except CacheRefused as e:
        return Skipped(path=plat.path(name), why=e.message)


def staged(cache: Path) -> list[Staged]:
    """Every entry of the cache (oldest first)."""
    return survey(cache)[0]


def survey(cache: Path) -> tuple[list[Staged], list[Skipped]]:
    """Every entry of the cache (oldest first), and what was not one (with why)."""
    root = open_root(cache)
    if root is None:
        return [], []
    with root:
        found = [s for _, _, s in _walk(root, trusted(root, me=True))]
    entries = sorted((s for s in found if isinstance(s, Staged)), key=lambda s: s.staged_at)
    return entries, [s for s in found if isinstance(s, Skipped)]


def collect_garbage(
    cache: Path, *, max_age: float | None, max_bytes: int | None, now: float | None = None
) -> tuple[list[Staged], list[Staged]]:
    """Remove entries older than ``max_age`` seconds, then the oldest until the cache holds at
    most ``max_bytes``; never one a job holds (its importer's hold file), never one that is
    not a trusted owner's. (removed, kept because held)."""
    now = time.time() if now is None else now
    entries = staged(cache)
    total = sum(s.size for s in entries)
    removed, held = [], []
    root = open_root(cache)
    if root is None:
        return [], []
    with root:
        owners = trusted(root, me=True)
        for s in entries:
            old = max_age is not None and now - s.staged_at > max_age
            big = max_bytes is not None and total > max_bytes
            if not (old or big):
                continue
            with digest_lock(root, s.digest, owners):  # an importer holds it shared meanwhile
                if _remove_unheld(root, owners, s):
                    total -= s.size
                    removed.append(s)
                else:
                    held.append(s)
    return removed, held


def _remove_unheld(root: Dir, owners: frozenset[int], s: Staged) -> bool:
    """Remove ``s``'s entry unless a job holds it (or it is no longer a trusted entry)."""
    plat = root.child(platform_dir(s.platform), owners) if s.platform else None
    if plat is None:
        return False
    with plat:
        name = digest_hex_of(s.digest)
        where = plat.child(name, owners)
        if where is None:
            return False
        with where:
            if _holds(where, owners):
                return False
        plat.remove_tree(name)
    return True
