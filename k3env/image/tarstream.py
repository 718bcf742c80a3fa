"""Filter a tar stream without unpacking it: drop some entries, append others.

``docker export`` gives the image's root filesystem as one tar stream; mksquashfs (4.5+)
reads a tar on stdin (``-tar``). In between, the enroot files (/etc/environment, /etc/rc, ...)
replace the image's own and ``/dev/*`` and ``/.dockerenv`` are dropped. Headers are parsed
one 512-byte block at a time and data passes as views of the chunks read, so the 2+ GB of a serving
image pass through at pipe speed and never touch the disk. Pure: bytes in, bytes out.
"""

from __future__ import annotations

import tarfile
from collections.abc import Callable, Iterable, Iterator, Mapping

BLOCK = 512


class _Reader:
    """Reads over an iterator of byte chunks: exact-size copies for headers (``read``), and
    views of the chunks themselves for data (``take``), so an entry's bytes are never copied
    on their way through (a chunk must not change once given: each is a buffer of its own)."""

    def __init__(self, chunks: Iterable[bytes | bytearray | memoryview]) -> None:
        self._it = iter(chunks)
        self._chunk = memoryview(b"")

    def _fill(self) -> bool:
        while not self._chunk:
            try:
                self._chunk = memoryview(next(self._it)).cast("B")
            except StopIteration:
                return False
        return True

    def take(self, n: int) -> memoryview:
        """Up to ``n`` bytes (fewer at a chunk's end; empty at the stream's), not copied."""
        if not self._fill():
            return memoryview(b"")
        out, self._chunk = self._chunk[:n], self._chunk[n:]
        return out

    def entry(self, n: int, name: str) -> Iterator[memoryview]:
        """An entry's ``n`` bytes of data, as views; the stream ending inside it is an error."""
        while n:
            chunk = self.take(n)
            if not chunk:
                raise ValueError(f"tar stream ended inside {name!r}")
            n -= len(chunk)
            yield chunk

    def read(self, n: int) -> bytes:
        """Exactly ``n`` bytes, fewer only at the stream's end."""
        parts = []
        while n and (part := self.take(n)):
            parts.append(part)
            n -= len(part)
        return b"".join(parts)


def _padded(size: int) -> int:
    return (size + BLOCK - 1) // BLOCK * BLOCK


def _pax_records(data: bytes) -> list[tuple[str, bytes]]:
    """The ``key=value`` records of a pax extended header's data, in order."""
    out = []
    pos = 0
    while pos < len(data) and data[pos : pos + 1] not in (b"", b"\0"):
        space = data.index(b" ", pos)
        length = int(data[pos:space])
        key, _, value = data[space + 1 : pos + length - 1].partition(b"=")
        out.append((key.decode("utf-8", "surrogateescape"), value))
        pos += length
    return out


def _pax_record(key: str, value: bytes) -> bytes:
    body = f" {key}=".encode() + value + b"\n"
    n = len(body) + 1
    while len(str(n)) + len(body) != n:
        n += 1
    return str(n).encode() + body


def _pax_path(data: bytes) -> str | None:
    """The ``path`` record of a pax extended header, if any."""
    for key, value in _pax_records(data):
        if key == "path":
            return value.decode("utf-8", "surrogateescape")
    return None


def _pax_has(ext: bytes, key: str) -> bool:
    info = tarfile.TarInfo.frombuf(ext[:BLOCK], tarfile.ENCODING, "surrogateescape")
    return info.type == tarfile.XHDTYPE and any(
        k == key for k, _ in _pax_records(ext[BLOCK : BLOCK + info.size])
    )


def _with_checksum(header: bytearray) -> bytes:
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    return bytes(header)


def _relink(pending: list[bytes], header: bytes) -> tuple[list[bytes], bytes]:
    """Move a symlink target out of a pax ``linkpath`` record.

    mksquashfs -tar (squashfs-tools 4.5.1) drops the leading ``/`` of a target it reads from
    a pax ``linkpath`` record (docker export writes one next to a non-ASCII name, e.g. under
    /etc/ssl/certs), so an absolute symlink would point elsewhere in the image. A target that
    fits goes into the ustar header's own linkname field; a longer one into a GNU long-link
    entry, which mksquashfs reads intact."""
    out: list[bytes] = []
    target: bytes | None = None
    for ext in pending:
        info = tarfile.TarInfo.frombuf(ext[:BLOCK], tarfile.ENCODING, "surrogateescape")
        if info.type != tarfile.XHDTYPE:
            out.append(ext)
            continue
        records = _pax_records(ext[BLOCK : BLOCK + info.size])
        if not any(k == "linkpath" for k, _ in records):
            out.append(ext)
            continue
        target = next(v for k, v in records if k == "linkpath")
        kept = b"".join(_pax_record(k, v) for k, v in records if k != "linkpath")
        if kept:
            head = bytearray(ext[:BLOCK])
            head[124:136] = b"%011o\0" % len(kept)
            out.append(_with_checksum(head) + kept + b"\0" * (_padded(len(kept)) - len(kept)))
    if target is None:
        return pending, header
    if len(target) <= 100:
        head = bytearray(header)
        head[157:257] = target + b"\0" * (100 - len(target))
        return out, _with_checksum(head)
    long = tarfile.TarInfo("././@LongLink")
    long.type = tarfile.GNUTYPE_LONGLINK
    long.size = len(target) + 1
    data = target + b"\0"
    out.append(
        long.tobuf(format=tarfile.GNU_FORMAT)[:BLOCK]
        + data
        + b"\0" * (_padded(len(data)) - len(data))
    )
    return out, header


def filter_tar(
    chunks: Iterable[bytes | bytearray | memoryview],
    drop: Callable[[str], bool],
    append: bytes,
    *,
    mtimes: Mapping[str, int] | None = None,
) -> Iterator[bytes | memoryview]:
    """Yield the tar of ``chunks`` without entries whose path ``drop`` accepts, plus ``append``.

    ``append`` is a tar's entries without its end-of-archive blocks (see ``entries``).
    ``mtimes`` gives entries (by name, ``""`` for the root) a fixed mtime.
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
            for _ in reader.entry(size, name):
                pass
            continue
        if info.type == tarfile.SYMTYPE and pending:
            pending, header = _relink(pending, header)
        if mtimes and name in mtimes and info.mtime != mtimes[name]:
            head = bytearray(header)
            head[136:148] = b"%011o\0" % mtimes[name]
            header = _with_checksum(head)
            pending = [p for p in pending if not _pax_has(p, "mtime")]
        yield from pending
        pending.clear()
        yield header
        yield from reader.entry(size, name)
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
