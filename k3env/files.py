"""Files on the host that k3env is told to read or write.

Reading: an input (the lock, a spec, a cluster profile, a patch file, a pinned requirements
file) is a regular file of bounded size. A FIFO would block the read forever and
``/dev/zero`` would fill memory, so each is refused before a byte is read: the path is
stat'ed, then opened with ``O_NONBLOCK`` (opening a FIFO with no writer does not wait) and
checked again with ``fstat`` on what was opened.

Writing: a reader sees the old content or the new, never half of either (a temporary file
beside the target, fsync'ed, renamed over it). The rename replaces whatever the path names, so
a path that names a directory, a device, a FIFO or a socket is refused, and a symlink is
followed to the file it points to: that file is replaced, the link stays a link.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from k3env.errors import ConfigError, K3envError
from k3env.untrusted import kind

MAX_INPUT_BYTES = 16 << 20  # a lock, a spec, a patch file: far below this


def file_kind(path: Path) -> str | None:
    """What ``path`` is if it is there and not a regular file ("a FIFO", ...);
    None for a regular file or nothing (symlinks followed)."""
    try:
        return _kind(os.stat(path).st_mode)
    except OSError:
        return None


def _kind(mode: int) -> str | None:
    """What a non-regular file is, in words (None: a regular file); the words are the ones
    every refusal of an untrusted tree uses."""
    return None if stat.S_ISREG(mode) else kind(mode)


def read_input(
    path: Path, *, error: type[K3envError] = ConfigError, limit: int = MAX_INPUT_BYTES
) -> bytes:
    """The bytes of ``path``: a regular file (a symlink is followed to one) of at most
    ``limit`` bytes. Anything else is an ``error`` naming the path, raised before reading."""
    where = str(path)
    fd = None
    try:
        kind = _kind(os.stat(path).st_mode)  # before open: opening a device can act
        if kind is None:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
            st = os.fstat(fd)  # what was opened, not what the path named a moment ago
            kind = _kind(st.st_mode)
        if kind is not None:
            raise error(
                f"cannot read the file: it is {kind}, and k3env reads only regular files",
                where=where,
                fix="pass the path of a regular file (not a pipe, a device or a directory)",
            )
        assert fd is not None
        data = _read_at_most(fd, limit + 1)
    except FileNotFoundError as e:
        raise error("file not found", where=where, fix="check the path, or create the file") from e
    except OSError as e:  # no permission, a name too long, an I/O error
        raise error(
            f"cannot read the file: {e.strerror}", where=where, fix="pass a readable file"
        ) from e
    finally:
        if fd is not None:
            os.close(fd)
    if len(data) > limit:
        raise error(
            f"the file is larger than the {limit >> 20} MiB k3env reads from an input",
            where=where,
            fix="pass the file k3env expects here (a lock, a spec, a patch: a few KiB)",
        )
    return data


def _read_at_most(fd: int, most: int) -> bytes:
    chunks, size = [], 0
    while size < most and (chunk := os.read(fd, min(1 << 20, most - size))):
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def output_path(path: Path) -> Path:
    """Where a write to ``path`` lands: ``path``, or, if it is a symlink, the file at the
    end of it (so the link stays a link). A directory, a device, a FIFO or a socket is
    refused: renaming a file over it would replace the node itself."""
    real = Path(os.path.realpath(path))
    try:
        kind = _kind(os.stat(real).st_mode)
    except OSError:  # not there yet (written new), or unreadable (the write says why)
        return real
    if kind is not None:
        shown = f"{path} (a link to {real})" if real != Path(os.path.abspath(path)) else str(path)
        raise ConfigError(
            f"refusing to write {shown}: it is {kind}, and k3env replaces only regular files",
            where=str(path),
            fix="name a regular file, or a path that does not exist yet",
        )
    return real


def write_atomic(path: Path, data: bytes | str, *, mode: int | None = None) -> None:
    """Write ``data`` to a temporary file beside ``path``'s target (``output_path``), fsync
    it, rename it over the target.

    On any failure (a full disk, an interrupt) the temporary file is removed and the target is
    untouched."""
    raw = data.encode() if isinstance(data, str) else data
    target = output_path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".partial")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        elif target.exists():
            os.chmod(tmp, target.stat().st_mode & 0o7777)
        else:
            os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
