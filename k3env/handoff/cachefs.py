"""The stage cache's filesystem as strangers share it: the one place the stager and pyxis's
importer touch the cache (``handoff.stage`` says what the cache holds, docs/threat-model.md
"Staged images: who may write where" the threat model this holds).

Below the cache root nothing is reached by a path a stranger could swap: every directory is
opened with ``O_DIRECTORY|O_NOFOLLOW`` relative to its parent's descriptor, every file with
``O_NOFOLLOW|O_NONBLOCK`` (a FIFO never blocks) relative to its directory's, and checked with
``fstat`` on what was opened: its type, its owner (one of the owners the caller trusts), its
link count (a hard link is another file's name) and its size, before a byte is read. Modes are
set with ``fchmod`` on an open descriptor, and only on what the caller owns; files are created
``O_EXCL`` beside their place and renamed over it within one directory's descriptor, so a link
planted at the place is replaced, never followed. A refusal is a ``CacheRefused`` naming the
entry, what it is and whose.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import stat
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from k3env.errors import CheckFailed
from k3env.quoting import one_line
from k3env.untrusted import kind

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
BLOCK = 1 << 20


class CacheRefused(CheckFailed):
    """An entry of the shared cache is not what a trusted stager wrote there (a link, a FIFO, a
    hard link, another user's file, too large): refused, never followed, opened or changed."""


def user(uid: int) -> str:
    """``uid`` as a message names it: ``alice (uid 1001)``."""
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


@dataclass(frozen=True, kw_only=True)
class Identity:
    """What says a file is the one checked before: a file rewritten in place and its mtime set
    back keeps (dev, ino, size, mtime) but not its ctime, which no user can set."""

    dev: int
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> Identity:
        return cls(dev=st.st_dev, ino=st.st_ino, size=st.st_size, mtime_ns=st.st_mtime_ns,
                   ctime_ns=st.st_ctime_ns)  # fmt: skip


class Dir:
    """An open directory of the cache (or a node-local one): ``shown`` names it in messages,
    ``owner`` is its owner's uid. Close it, or use it as a context manager."""

    def __init__(self, fd: int, shown: str, owner: int, mode: int) -> None:
        self.fd, self.shown, self.owner, self.mode = fd, shown, owner, mode

    def __enter__(self) -> Dir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def path(self, name: str = "") -> str:
        return f"{self.shown}/{name}" if name else self.shown

    def refuse(self, name: str, why: str, fix: str | None = None) -> CacheRefused:
        return CacheRefused(
            f"{one_line(self.path(name))} {why}; refused",
            fix=fix
            or "the cache's files are written by its stager only: remove what is "
            "there (`k3env stage` writes it again), and find out who put it there",
        )

    def lstat(self, name: str) -> os.stat_result | None:
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def names(self) -> list[str]:
        return sorted(os.listdir(self.fd))

    def _kind_of(self, name: str, st: os.stat_result) -> str:
        if stat.S_ISLNK(st.st_mode):
            return f"is a symlink to {one_line(os.readlink(name, dir_fd=self.fd))}"
        return f"is {kind(st.st_mode)}"

    def child(self, name: str, owners: frozenset[int], *, create: int | None = None) -> Dir | None:
        """The directory ``name`` in this one, opened without following a link; None when it
        is missing (made with mode ``create`` when that is given). Not a directory, or not
        owned by one of ``owners``: refused."""
        st = self.lstat(name)
        if st is None and create is not None:
            with suppress(FileExistsError):  # another stager made it meanwhile: checked below
                os.mkdir(name, 0o700, dir_fd=self.fd)
            st = self.lstat(name)
        if st is None:
            return None
        if not stat.S_ISDIR(st.st_mode):
            raise self.refuse(name, f"{self._kind_of(name, st)}, not a directory")
        try:
            fd = os.open(name, _DIR, dir_fd=self.fd)
        except OSError as e:  # ELOOP: swapped for a link since the lstat
            raise self.refuse(name, f"cannot be opened as a directory ({e.strerror})") from e
        opened = os.fstat(fd)
        out = Dir(fd, self.path(name), opened.st_uid, stat.S_IMODE(opened.st_mode))
        try:
            _owned(out, opened, owners)
            if create is not None and out.mode != create and opened.st_uid == os.geteuid():
                os.fchmod(fd, create)  # the descriptor's directory, never a path's
                out.mode = create
        except BaseException:
            out.close()
            raise
        return out

    def open_file(
        self, name: str, owners: frozenset[int], *, limit: int | None = None
    ) -> tuple[int, os.stat_result] | None:
        """A descriptor of the regular file ``name`` (caller closes) and its fstat; None when
        missing. A link, FIFO, device, hard link, another owner's file or one over ``limit``
        bytes: refused, before a byte is read."""
        st = self.lstat(name)
        if st is None:
            return None
        if not stat.S_ISREG(st.st_mode):  # before open: opening a device can act
            raise self.refuse(name, f"{self._kind_of(name, st)}, not a regular file")
        try:
            fd = os.open(name, _FILE, dir_fd=self.fd)
        except OSError as e:
            raise self.refuse(name, f"cannot be opened as a regular file ({e.strerror})") from e
        try:
            opened = os.fstat(fd)
            if not stat.S_ISREG(opened.st_mode):
                raise self.refuse(name, f"is {kind(opened.st_mode)}, not a regular file")
            _owned(Dir(-1, self.path(name), opened.st_uid, 0), opened, owners)
            if opened.st_nlink != 1:
                raise self.refuse(name, f"has {opened.st_nlink} hard links (another file's name)")
            if limit is not None and opened.st_size > limit:
                raise self.refuse(name, f"is {opened.st_size} bytes, over the {limit} for it")
        except BaseException:
            os.close(fd)
            raise
        return fd, opened

    def read(self, name: str, owners: frozenset[int], *, limit: int) -> bytes | None:
        """The bytes of the regular file ``name`` (``open_file``'s checks), at most ``limit``."""
        got = self.open_file(name, owners, limit=limit)
        if got is None:
            return None
        fd, _ = got
        try:
            data = b"".join(blocks(fd))
        finally:
            os.close(fd)
        if len(data) > limit:  # it grew since the fstat
            raise self.refuse(name, f"grew past the {limit} bytes allowed for it")
        return data

    def write(self, name: str, fill: Callable[[int], object], *, mode: int = 0o644) -> None:
        """A new file ``name``: ``fill(fd)`` writes it beside its place (a fresh name, created
        exclusively, never followed), then it is renamed over ``name`` in this directory:
        whatever ``name`` was (a link too) is replaced; a reader sees the old or the new."""
        tmp = f".{name}.{secrets.token_hex(6)}.partial"
        fd = os.open(tmp, _NEW, 0o600, dir_fd=self.fd)
        try:
            try:
                fill(fd)
                os.fsync(fd)
                os.fchmod(fd, mode)
            finally:
                os.close(fd)
            os.replace(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            with suppress(OSError):
                os.unlink(tmp, dir_fd=self.fd)
            raise

    def write_bytes(self, name: str, data: bytes, *, mode: int = 0o644) -> None:
        self.write(name, lambda fd: _write_all(fd, data), mode=mode)

    def remove_tree(self, name: str) -> None:
        """The directory ``name`` and all under it, walked by descriptor (a link inside is
        removed as a link, never followed)."""
        shutil.rmtree(name, dir_fd=self.fd)

    def unlink(self, name: str) -> None:
        os.unlink(name, dir_fd=self.fd)


def _owned(d: Dir, st: os.stat_result, owners: frozenset[int]) -> None:
    if st.st_uid not in owners:
        trusted = ", ".join(user(u) for u in sorted(owners))
        raise CacheRefused(
            f"{one_line(d.shown)} is owned by {user(st.st_uid)}, not by the cache's stager "
            f"({trusted}); refused",
            fix="only the cache's owner stages images in it: remove the entry (as root or its "
            "owner), and stage it again with `k3env stage`",
        )


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def blocks(fd: int) -> Iterator[bytes]:
    while block := os.read(fd, BLOCK):
        yield block


def open_root(
    cache: Path, *, create: bool = False, owners: frozenset[int] | None = None
) -> Dir | None:
    """The cache root (None when missing, unless ``create``: made with its parents, 0755). The
    path is the admin's; its last component must be the directory itself, not a link to one
    (a link there is one a stranger with write access to its parent could swap). ``owners``:
    the root must be one of theirs (a stager writes only into a cache it or root owns)."""
    if create:
        with suppress(FileExistsError):  # a file or a link there: refused by the open below
            cache.mkdir(parents=True, exist_ok=True, mode=0o755)
    try:
        fd = os.open(cache, _DIR)
    except FileNotFoundError:
        return None
    except OSError as e:
        what = "a symlink" if cache.is_symlink() else f"not a directory ({e.strerror})"
        raise CacheRefused(
            f"the cache {one_line(str(cache))} is {what}; refused",
            fix="name the cache directory itself (K3ENV_STAGE_CACHE / --cache), not a link",
        ) from e
    st = os.fstat(fd)
    root = Dir(fd, str(cache), st.st_uid, stat.S_IMODE(st.st_mode))
    if owners is not None and st.st_uid not in owners:
        root.close()
        raise CacheRefused(
            f"the cache {one_line(str(cache))} is owned by {user(st.st_uid)}, not by you or "
            "root; refused",
            fix="stage into a cache directory you (or root) made; whoever owns the cache "
            "decides what jobs start from it",
        )
    return root
