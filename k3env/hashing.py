"""Content hashes: the one place k3env computes sha256, and how digests become cache keys."""

from __future__ import annotations

import base64
import hashlib
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from k3env import jsontext
from k3env.errors import ConfigError


def canonical_sha256(data: Any) -> str:
    """Semantic hash of parsed data: comments and formatting do not change it."""
    blob = jsontext.dumps(data, compact=True, ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def file_sha256(path: Path) -> str:
    """Hex sha256 of a regular file's bytes, read in 1 MiB chunks. Anything else (a FIFO, a
    device, a directory) is refused before a byte is read: opening a FIFO for reading blocks
    until a writer comes, which may be never. (A missing or unreadable file: ``OSError``.)"""
    h = hashlib.sha256()
    where = str(path)
    if not stat.S_ISREG(os.stat(path).st_mode):  # before open: opening a device can act
        raise ConfigError(
            "cannot hash it: not a regular file (a pipe, a device or a directory)",
            where=where, fix="point the pin at a regular file",
        )  # fmt: skip
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):  # swapped since the stat
            raise ConfigError("cannot hash it: not a regular file", where=where,
                              fix="point the pin at a regular file")  # fmt: skip
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256_digest(data: bytes) -> str:
    """An OCI digest (``sha256:<hex>``) of ``data``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def sha256_stream(chunks: Iterable[bytes]) -> bytes:
    """The raw sha256 of ``chunks`` taken one at a time (a file read in blocks, never whole)."""
    h = hashlib.sha256()
    for chunk in chunks:
        h.update(chunk)
    return h.digest()


def record_hash(data: bytes) -> str:
    """sha256 as a wheel's RECORD writes it: urlsafe base64, no padding."""
    return record_b64(hashlib.sha256(data).digest())


def record_b64(raw: bytes) -> str:
    """A raw sha256 in a RECORD's form: urlsafe base64, no padding."""
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def digest_hex(digest: str) -> str:
    """The hex part of ``sha256:<hex>`` (a bare hex string is returned as it is): the form
    every cache file keyed by an image ID or a digest is named by."""
    return digest.removeprefix("sha256:")


class HashingWriter:
    """A write-only stream over ``fh`` that computes the sha256 of what passes through it
    (``digest``: ``sha256:<hex>``), e.g. a layer tar written to disk."""

    def __init__(self, fh: Any) -> None:
        self.fh, self._h, self.size = fh, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self._h.update(data)
        self.size += len(data)
        return int(self.fh.write(data))

    def tell(self) -> int:
        return self.size

    @property
    def digest(self) -> str:
        return "sha256:" + self._h.hexdigest()
