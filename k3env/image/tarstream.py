"""Filter a tar stream without unpacking it: drop some entries, append others.

``docker export`` gives the image's root filesystem as one tar stream; mksquashfs (4.5+)
reads a tar on stdin (``-tar``). In between, the enroot files (/etc/environment, /etc/rc, ...)
replace the image's own and ``/dev/*`` and ``/.dockerenv`` are dropped. Headers are parsed
one 512-byte block at a time and data is copied in large chunks, so the 2+ GB of a serving
image pass through at pipe speed and never touch the disk. Pure: bytes in, bytes out.
"""

from __future__ import annotations

import tarfile
from collections.abc import Callable, Iterable, Iterator

BLOCK = 512
_CHUNK = 1 << 20


class _Reader:
    """Exact-size reads over an iterator of byte chunks."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._it = iter(chunks)
        self._buf = bytearray()

    def read(self, n: int) -> bytes:
        while len(self._buf) < n:
            try:
                self._buf += next(self._it)
            except StopIteration:
                break
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out


def _padded(size: int) -> int:
    return (size + BLOCK - 1) // BLOCK * BLOCK


def _pax_path(data: bytes) -> str | None:
    """The ``path`` record of a pax extended header, if any."""
    for record in data.decode("utf-8", "replace").split("\n"):
        _, _, kv = record.partition(" ")
        key, _, value = kv.partition("=")
        if key == "path":
            return value
    return None


def filter_tar(
    chunks: Iterable[bytes],
    drop: Callable[[str], bool],
    append: bytes,
) -> Iterator[bytes]:
    """Yield the tar of ``chunks`` without entries whose path ``drop`` accepts, plus ``append``.

    ``append`` is a tar's entries without its end-of-archive blocks (see ``entries``).
    Long names (pax ``path``, GNU ``L``) are honoured; an extended header is dropped together
    with the entry it describes.
    """
    reader = _Reader(chunks)
    pending: list[bytes] = []  # extended headers (and their data) waiting for their entry
    long_name: str | None = None
    while True:
        header = reader.read(BLOCK)
        if len(header) < BLOCK or header == b"\0" * BLOCK:
            break
        info = tarfile.TarInfo.frombuf(header, tarfile.ENCODING, "surrogateescape")
        size = _padded(info.size)
        if info.type in (tarfile.XHDTYPE, tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK):
            data = reader.read(size)
            if info.type == tarfile.XHDTYPE:
                long_name = _pax_path(data[: info.size]) or long_name
            elif info.type == tarfile.GNUTYPE_LONGNAME:
                long_name = data[: info.size].rstrip(b"\0").decode("utf-8", "surrogateescape")
            pending.append(header + data)
            continue
        name = (long_name or info.name).removeprefix("./").lstrip("/").rstrip("/")
        long_name = None
        if drop(name):
            pending.clear()
            remaining = size
            while remaining:
                remaining -= len(reader.read(min(remaining, _CHUNK)))
            continue
        yield from pending
        pending.clear()
        yield header
        remaining = size
        while remaining:
            chunk = reader.read(min(remaining, _CHUNK))
            if not chunk:
                raise ValueError(f"tar stream ended inside {name!r}")
            remaining -= len(chunk)
            yield chunk
    yield append
    yield b"\0" * (2 * BLOCK)


def entries(files: Iterable[tuple[str, bytes, int]], mtime: int) -> bytes:
    """Tar entries (no end-of-archive) for ``(path, content, mode)``, owned by root."""
    out = bytearray()
    for path, content, mode in files:
        info = tarfile.TarInfo(path.lstrip("/"))
        info.size = len(content)
        info.mode = mode
        info.mtime = mtime
        info.uname = info.gname = ""
        out += info.tobuf(format=tarfile.PAX_FORMAT)
        out += content + b"\0" * (_padded(len(content)) - len(content))
    return bytes(out)
