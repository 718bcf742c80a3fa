"""Reading trees others made (an unpacked image, a checked-out repository): the one place that
opens their files.

Regular files only: every component of a path under the root is checked with lstat and opened
with ``O_NOFOLLOW`` (directories with ``O_DIRECTORY``, each from its parent's descriptor, so a
component swapped for a link between the check and the open is refused too); the file itself
with ``O_NONBLOCK`` (a FIFO never blocks) and checked again with fstat. A symlink, device,
FIFO or socket is reported as what it is, never followed or opened. Every read has a size
limit, and hashing is streamed in 1 MiB blocks, never a whole-file read. A checkout's links are
checked by ``check_links``: links stay links, none may point outside the tree or at a
directory holding it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

from k3env.errors import UntrustedFileError
from k3env.hashing import sha256_stream
from k3env.quoting import one_line as shown

TEXT_LIMIT = 64 << 20  # a RECORD, a provenance file, /etc/rc, a patched source file
# The largest file hashed: a CUDA library in a vLLM image is a few GiB.
HASH_LIMIT = 16 << 30
BLOCK = 1 << 20

_KINDS = {
    stat.S_IFLNK: "a symlink",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a directory",
    stat.S_IFREG: "a regular file",
}
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def kind(mode: int) -> str:
    """What an entry of mode ``mode`` is, as a message says it (``a FIFO``)."""
    return _KINDS.get(stat.S_IFMT(mode), f"a file of type {stat.S_IFMT(mode):o}")


def not_regular(name: str, mode: int, target: str | None = None) -> UntrustedFileError:
    """The refusal of ``name`` (as a message shows it), which is not a regular file."""
    if stat.S_ISLNK(mode):
        what = f"is a symlink to {shown(target or '?')}; not followed"
    else:
        what = f"is {kind(mode)}, not a regular file; not read"
    return UntrustedFileError(
        f"{shown(name)} {what}",
        fix="a file the check reads must be a regular file in the image or repository; "
        "one that is not was put there by whoever made it",
    )


def parts(rel: str, shown_as: str = "") -> list[str]:
    """The components of ``rel`` (leading ``/`` and ``.`` dropped); a path that climbs out
    (``..``) or holds a NUL is refused."""
    names = [p for p in rel.split("/") if p not in ("", ".")]
    if not names or ".." in names or any("\0" in p for p in names):
        raise UntrustedFileError(
            f"{shown(shown_as + rel)} is not a path inside the tree (empty, `..` or NUL); not read",
            fix="a path an image or repository names must stay inside it",
        )
    return names


def _step(fd: int, name: str, here: str, last: bool) -> int | None:
    """A descriptor of ``name`` in the directory ``fd`` (the caller closes both): a directory
    on the way, or the regular file at the end (``last``); None when it is missing; anything
    else is refused as what it is. ``here``: the path as messages show it."""
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISREG(st.st_mode) and not last:
        return None  # a/b where a is a file: b is not there
    if not (stat.S_ISREG(st.st_mode) if last else stat.S_ISDIR(st.st_mode)):
        target = os.readlink(name, dir_fd=fd) if stat.S_ISLNK(st.st_mode) else None
        raise not_regular(here, st.st_mode, target)
    try:
        nxt = os.open(name, _FILE_FLAGS if last else _DIR_FLAGS, dir_fd=fd)
    except OSError as e:  # ELOOP: swapped for a link since the lstat
        raise UntrustedFileError(
            f"{shown(here)} cannot be opened as it was listed ({e.strerror}); not read"
        ) from e
    if last and not stat.S_ISREG(os.fstat(nxt).st_mode):
        mode = os.fstat(nxt).st_mode
        os.close(nxt)
        raise not_regular(here, mode)
    return nxt


def _open_regular(root: Path, rel: str, shown_as: str) -> int | None:
    """A descriptor of the regular file ``rel`` under ``root`` (caller closes), None when it
    is missing; anything else on the way is refused as what it is."""
    names = parts(rel, shown_as)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, name in enumerate(names):
            nxt = _step(fd, name, shown_as + "/".join(names[: i + 1]), i == len(names) - 1)
            os.close(fd)
            fd = -1 if nxt is None else nxt
            if nxt is None:
                return None
        out, fd = fd, -1
        return out
    finally:
        if fd >= 0:
            os.close(fd)


def _too_large(name: str, size: int, limit: int) -> UntrustedFileError:
    return UntrustedFileError(
        f"{shown(name)} is {size} bytes or more, over the limit of {limit} for it; not read",
        fix="a file this large is not what the check expects there",
    )


def _blocks(fd: int, name: str, limit: int) -> Iterator[bytes]:
    """The file's bytes in blocks of at most 1 MiB, refused past ``limit`` (it may grow)."""
    size = os.fstat(fd).st_size
    if size > limit:
        raise _too_large(name, size, limit)
    total = 0
    while block := os.read(fd, BLOCK):
        total += len(block)
        if total > limit:
            raise _too_large(name, total, limit)
        yield block


def read_bytes(
    root: Path, rel: str, *, limit: int = TEXT_LIMIT, shown_as: str = ""
) -> bytes | None:
    """The bytes of the regular file ``rel`` under ``root``, None when it is missing. Names in
    messages are ``shown_as`` + the path (``/`` for an image's)."""
    fd = _open_regular(root, rel, shown_as)
    if fd is None:
        return None
    try:
        return b"".join(_blocks(fd, shown_as + rel.lstrip("/"), limit))
    finally:
        os.close(fd)


def read_text(root: Path, rel: str, *, limit: int = TEXT_LIMIT, shown_as: str = "") -> str | None:
    """``read_bytes`` decoded as UTF-8 (an undecodable byte replaced)."""
    data = read_bytes(root, rel, limit=limit, shown_as=shown_as)
    return None if data is None else data.decode(errors="replace")


def read_tail(root: Path, rel: str, *, limit: int, shown_as: str = "") -> tuple[bytes, int] | None:
    """The last ``limit`` bytes of the regular file ``rel`` under ``root``, and its size (None
    when missing): a log of any length is read within the bound, its end kept."""
    fd = _open_regular(root, rel, shown_as)
    if fd is None:
        return None
    try:
        size = os.fstat(fd).st_size
        os.lseek(fd, max(0, size - limit), os.SEEK_SET)
        chunks, got = [], 0
        while got < limit and (block := os.read(fd, min(BLOCK, limit - got))):
            chunks.append(block)
            got += len(block)
        return b"".join(chunks), size
    finally:
        os.close(fd)


def file_sha256(
    root: Path, rel: str, *, limit: int | None = None, shown_as: str = ""
) -> tuple[bytes, int] | None:
    """(raw sha256, size) of the regular file ``rel`` under ``root``, read in 1 MiB blocks
    (refused past ``limit``, HASH_LIMIT unless given); None when it is missing."""
    limit = HASH_LIMIT if limit is None else limit
    fd = _open_regular(root, rel, shown_as)
    return None if fd is None else _hash_and_close(fd, shown_as + rel.lstrip("/"), limit)


def _hash_and_close(fd: int, name: str, limit: int) -> tuple[bytes, int]:
    """(raw sha256, size) of the open regular file ``fd``, read in blocks; ``fd`` closed."""
    try:
        size = 0

        def counted() -> Iterator[bytes]:
            nonlocal size
            for block in _blocks(fd, name, limit):
                size += len(block)
                yield block

        return sha256_stream(counted()), size
    finally:
        os.close(fd)


def files_sha256(
    root: Path, rels: Iterable[str], *, limit: int | None = None, shown_as: str = ""
) -> Iterator[tuple[str, tuple[bytes, int] | UntrustedFileError | None]]:
    """``file_sha256`` of each of ``rels``, in their order: each path is walked and refused
    exactly as there, but the directories consecutive paths share stay open between them
    (sorted paths: each directory is opened once), so a tree of N files costs N opens."""
    limit = HASH_LIMIT if limit is None else limit
    chain: list[tuple[str, int]] = [
        ("", os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
    ]
    try:
        for rel in rels:
            try:
                yield rel, _hash_in_chain(chain, parts(rel, shown_as), rel, limit, shown_as)
            except UntrustedFileError as e:
                yield rel, e
    finally:
        for _, fd in chain:
            os.close(fd)


def _hash_in_chain(
    chain: list[tuple[str, int]], names: list[str], rel: str, limit: int, shown_as: str
) -> tuple[bytes, int] | None:
    """(sha256, size) of ``names`` walked from ``chain`` (the root, then the open directories
    of the previous path), the chain left at the path's directory."""
    keep = 1
    while keep < len(chain) and keep - 1 < len(names) - 1 and chain[keep][0] == names[keep - 1]:
        keep += 1
    while len(chain) > keep:
        os.close(chain.pop()[1])
    for i in range(len(chain) - 1, len(names)):
        last = i == len(names) - 1
        fd = _step(chain[-1][1], names[i], shown_as + "/".join(names[: i + 1]), last)
        if fd is None:
            return None
        if not last:
            chain.append((names[i], fd))
            continue
        return _hash_and_close(fd, shown_as + rel.lstrip("/"), limit)
    return None


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def link_problem(root: Path, link: Path) -> str | None:
    """Why the symlink ``link`` (inside ``root``) may not be copied as a link, or None: its
    target is absolute, climbs out of ``root`` (by its text or through other links), or is a
    directory holding the link (a loop a walk that follows links never leaves)."""
    target = os.readlink(link)
    rel = link.relative_to(root).as_posix()
    if os.path.isabs(target):
        return f"{shown(rel)} is a symlink to {shown(target)}, an absolute path; not followed"
    lexical = os.path.normpath(os.path.join(os.path.dirname(rel), target))
    real_root = os.path.realpath(root)
    real = os.path.realpath(link)
    if lexical == ".." or lexical.startswith("../") or not _within(real, real_root):
        return f"{shown(rel)} is a symlink to {shown(target)}, outside the repository; not followed"
    if os.path.isdir(real) and _within(os.path.realpath(link.parent), real):
        return (
            f"{shown(rel)} is a symlink to {shown(target)}, a directory holding it (a loop); "
            "not followed"
        )
    return None


def check_links(root: Path, *, where: str, skip: tuple[str, ...] = (".git",)) -> None:
    """Refuse (naming each) every symlink under ``root`` that ``link_problem`` refuses; the
    top-level directories ``skip`` are not walked. Never follows a link."""
    problems = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        if here == root:
            dirnames[:] = [d for d in dirnames if d not in skip]
        for name in sorted(dirnames + filenames):
            path = here / name
            if path.is_symlink() and (why := link_problem(root, path)):
                problems.append(why)
    if problems:
        raise UntrustedFileError(
            f"{len(problems)} symlink(s) point outside the tree or loop: "
            + "; ".join(problems[:5])
            + (f"; and {len(problems) - 5} more" if len(problems) > 5 else ""),
            where=where,
            fix="a link in the repository must stay inside it and not loop: fix the "
            "repository (or pin a commit without the link)",
        )
