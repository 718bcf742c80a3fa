"""In-place edits of the lockfile: the one place that imports ``tomlkit``.

Leaves are assigned in place, so comments, key order and formatting survive and a diff shows
only the changed values. The file is replaced atomically: a failed edit leaves it untouched.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomlkit

from k3env.config.lock import Lock, check_files, load_lock
from k3env.errors import LockError


@dataclass(frozen=True, kw_only=True)
class Change:
    key: str
    old: str | None
    new: str


_INDEX = re.compile(r"^(?P<name>[^\[]+)(\[(?P<i>\d+)\])?$")


def _container_of(doc: Any, dotted: str) -> tuple[Any, str]:
    """The table holding the leaf ``dotted`` (``a.b[2].c``) and the leaf's key."""
    parts = dotted.split(".")
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


def set_leaves(path: Path, changes: dict[str, str]) -> list[Change]:
    """Assign each ``key path -> value``; validates the result before replacing the file."""
    new_text, done = render_leaves(path.read_text(), changes)
    if done:
        _write_checked(path, new_text)
    return done


def write_candidate(path: Path, text: str) -> Path:
    """``text`` beside ``path`` (same directory, so relative paths resolve the same)."""
    candidate = path.with_name(f".{path.name}.candidate")
    candidate.write_text(text)
    return candidate


def replace_atomically(path: Path, text: str) -> None:
    _write_checked(path, text)


def _write_checked(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        load_lock(Path(tmp))  # refuse to write a lock that does not load
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def update_hashes(lock: Lock) -> list[Change]:
    """Record the sha256 of every pinned file that exists and differs from the lock."""
    changes = {}
    for c in check_files(lock):
        if c.actual is not None and c.actual != c.expected:
            changes[c.key] = c.actual
    return set_leaves(lock.path, changes)
