"""In-place edits of the lockfile: the one place that imports ``tomlkit``.

Leaves are assigned in place, so comments, key order and formatting survive and a diff shows
only the changed values. Every write re-reads the lock under an exclusive file lock, applies
its leaves to what is there now, checks the result loads, and replaces the file atomically: a
failed edit leaves it untouched and no candidate file behind. A lock that is a symlink is
edited at its target (``files.output_path``): the file behind the link is replaced, the link
stays; a lock that is not a regular file is refused.
"""

from __future__ import annotations

import fcntl
import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomlkit

from k3env.config.lock import load_lock
from k3env.config.pinned_files import check_files
from k3env.config.pins import Lock
from k3env.errors import LockError
from k3env.files import output_path, read_input, write_atomic


@dataclass(frozen=True, kw_only=True)
class Change:
    key: str
    old: str | None
    new: str


_INDEX = re.compile(r"^(?P<name>[^\[]+)(\[(?P<i>\d+)\])?$")


_PART = re.compile(r'"(?P<quoted>[^"]*)"|(?P<bare>[^."]+(\[\d+\])?)')


def key_parts(dotted: str) -> list[str]:
    """``a."b.c"[2].d`` -> ``["a", "b.c[2]"...]``: dots inside quotes belong to the key."""
    parts, pos = [], 0
    while pos <= len(dotted):
        m = _PART.match(dotted, pos)
        if m is None:
            raise LockError(f"bad key path {dotted!r}", where=dotted, fix="report this as a bug")
        parts.append(m["quoted"] if m["quoted"] is not None else m["bare"])
        pos = m.end() + 1
        if m.end() < len(dotted) and dotted[m.end()] != ".":
            raise LockError(f"bad key path {dotted!r}", where=dotted, fix="report this as a bug")
    return parts


def _container_of(doc: Any, dotted: str) -> tuple[Any, str]:
    """The table holding the leaf ``dotted`` (``a.b[2].c``, ``variants."x.y".c``) and the
    leaf's key."""
    parts = key_parts(dotted)
    node = doc
    for part in parts[:-1]:
        m = _INDEX.match(part)
        if m is None:
            raise LockError(f"bad key path {dotted!r}", where=dotted, fix="report this as a bug")
        node = node[m["name"]]
        if m["i"] is not None:
            node = node[int(m["i"])]
    return node, parts[-1]


def render_leaves(text: str, changes: dict[str, str]) -> tuple[str, list[Change]]:
    """``text`` with each ``key path -> value`` assigned in place (comments, order kept)."""
    doc = tomlkit.parse(text)
    done = []
    for dotted, value in changes.items():
        try:
            table, leaf = _container_of(doc, dotted)
        except (KeyError, IndexError) as e:
            raise LockError(
                f"no pin at {dotted}", where=dotted, fix="name a key the lock has"
            ) from e
        old = table.get(leaf)
        old_s = None if old is None else str(old)
        if old_s == value:
            continue
        table[leaf] = value
        done.append(Change(key=dotted, old=old_s, new=value))
    return tomlkit.dumps(doc), done


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on the lockfile ``path`` for the length of a read-modify-write: two
    writers (``bump``, ``lock --update-hashes``) on one lock never lose each other's edits."""
    guard = path.with_name(f".{path.name}.flock")
    try:
        fd = os.open(guard, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise LockError(
            f"cannot lock {path} for writing: {e.strerror}",
            where=str(guard),
            fix="check that the directory is writable",
        ) from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def set_leaves(path: Path, changes: dict[str, str]) -> list[Change]:
    """Assign each ``key path -> value`` to the lock as it is now (read under the file lock,
    so a concurrent edit is kept); validates the result before replacing the file. A symlinked
    lock is read, locked and replaced at its target, so writers through the link and through
    the file itself exclude each other."""
    path = output_path(path)
    with locked(path):
        new_text, done = render_leaves(_read(path), changes)
        if done:
            _write_checked(path, new_text)
    return done


def write_lock(path: Path, text: str) -> None:
    """Replace the lock with ``text`` (refused unless it loads), under its file lock."""
    path = output_path(path)
    with locked(path):
        _write_checked(path, text)


@contextmanager
def candidate(path: Path, text: str) -> Iterator[Path]:
    """``text`` in a temporary file beside ``path`` (beside its target if it is a symlink:
    same directory, so relative paths resolve the same), removed on the way out whatever
    happens."""
    path = output_path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".candidate")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        yield Path(tmp)
    except OSError as e:
        raise LockError(
            f"cannot write a candidate lock: {e.strerror}",
            where=str(path.parent),
            fix="free disk space or check permissions; the lock is unchanged",
        ) from e
    finally:
        Path(tmp).unlink(missing_ok=True)


def _read(path: Path) -> str:
    data = read_input(path, error=LockError)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise LockError("the lock is not UTF-8", where=str(path), fix="restore the lock") from e


def _write_checked(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` only if ``text`` loads as a lock."""
    with candidate(path, text) as tmp:
        load_lock(tmp)  # refuse to write a lock that does not load
        try:
            write_atomic(path, text)
        except OSError as e:
            raise LockError(
                f"cannot write the lock: {e.strerror}",
                where=str(path),
                fix="free disk space or check permissions; the lock is unchanged",
            ) from e


def update_hashes(lock: Lock) -> list[Change]:
    """Record the sha256 of every pinned file that exists and differs from the lock."""
    changes = {}
    for c in check_files(lock):
        if c.actual is not None and c.actual != c.expected:
            changes[c.key] = c.actual
    return set_leaves(lock.path, changes)
