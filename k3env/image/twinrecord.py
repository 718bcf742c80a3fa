"""``k3env twin --resolve``: the twin's pinned files regenerated (its requirements from the
lock by uv, its Debian package set from the mirror) and their sha256 recorded in the lock.

The files are written first, then their hashes: an interruption between the two leaves a
mismatch that ``k3env lock --check`` reports, never a lock that vouches for a file it has
not seen.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from k3env.config.cutoff import require_settled, settled_cutoff
from k3env.config.lock_edit import Change, set_leaves
from k3env.config.pinned_files import closure_key
from k3env.config.pins import OVERLAYS, Lock
from k3env.config.shapes import DEFAULT_PLATFORM
from k3env.errors import LockError
from k3env.files import write_atomic
from k3env.hashing import digest_hex, sha256_digest
from k3env.image.twindebian import resolve_debian
from k3env.image.twinresolve import resolve_overlay, resolve_twin
from k3env.log import Log


@dataclass(frozen=True, kw_only=True)
class Recorded:
    platform: str
    files: dict[str, str]  # pinned file -> its new sha256
    packages: int
    components: int
    changes: tuple[Change, ...]

    def as_json(self) -> dict[str, Any]:
        return {
            "platform": self.platform,
            "files": self.files,
            "packages": self.packages,
            "components": self.components,
            "changes": [c.__dict__ for c in self.changes],
        }


def twin_cutoff(lock: Lock, *, refresh: bool) -> str:
    """The index cut-off a twin resolution takes: the lock's (refused unless settled), or,
    with ``refresh`` or none recorded, the newest settled one."""
    assert lock.twin is not None
    if refresh or lock.twin.resolved_before is None:
        return settled_cutoff()
    return require_settled(lock.twin.resolved_before, where=f"{lock.path}: twin.resolved_before")


def record_resolved(
    lock: Lock,
    lock_path: Path,
    log: Log,
    *,
    platform: str,
    find_links: Sequence[str],
    index_url: str | None,
    resolved_before: str,
    refresh: bool = False,
) -> Recorded:
    """The twin's files for ``platform``. Sticky: the committed requirements file's versions
    are kept where the lock's inputs still allow them (uv's preferences), so a release an
    index shows later, whatever upload time it claims, moves nothing until ``refresh`` (or
    ``k3env bump twin``) resolves afresh."""
    assert lock.twin is not None
    twin = lock.twin.for_platform(platform)
    current = lock.resolve_path(twin.requirements, key=f"{twin.key}.requirements")
    keep = None if refresh or not current.is_file() else current
    resolved = resolve_twin(lock, log, find_links=find_links, index_url=index_url,
                            platform=platform, resolved_before=resolved_before,
                            preferences=keep)  # fmt: skip
    files = {f"{twin.key}.requirements": (twin.requirements, resolved.text)}
    if twin.debian:
        files[f"{twin.key}.debian"] = (twin.debian, resolve_debian(lock, log, platform))
    hashes, changes = _write_and_record(
        lock, lock_path, files, {"twin.resolved_before": resolved_before}
    )
    return Recorded(platform=platform, files=hashes, packages=resolved.packages,
                    components=resolved.components, changes=tuple(changes))  # fmt: skip


def _write_and_record(
    lock: Lock, lock_path: Path, files: dict[str, tuple[str, str]], leaves: dict[str, str]
) -> tuple[dict[str, str], list[Change]]:
    """Each generated file (lock key -> (path, text)) written, then its sha256 recorded at
    ``KEY_sha256`` with the other ``leaves`` (the cut-off it was resolved at): a file first,
    its hash after, never a lock vouching for an unseen file. Returns (path -> sha256, the
    lock's changes)."""
    hashes, recorded = {}, dict(leaves)
    for key, (rel, text) in files.items():
        path = lock.resolve_path(rel, key=key)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text.encode())
        hashes[rel] = recorded[f"{key}_sha256"] = digest_hex(sha256_digest(text.encode()))
    return hashes, set_leaves(lock_path, recorded)


def record_overlays(
    lock: Lock,
    lock_path: Path,
    log: Log,
    *,
    names: Sequence[str],
    find_links: Sequence[str],
    index_url: str | None,
    refresh: bool,
) -> list[Recorded]:
    """Each named variant's overlay closure resolved against the twin's (current) file, at
    its own recorded cut-off (the twin's where it has none, or with ``refresh``), written,
    then its sha256 and cut-off recorded (the same order as the twin's)."""
    out = []
    for name in names:
        variant = lock.variants[name]
        for c in variant.components.values():
            if c.name not in OVERLAYS:
                continue
            key = closure_key(name, c.name)
            if c.closure is None:
                raise LockError(
                    f"variant {name}'s {c.name} names no closure file",
                    where=f"{lock.path}: {key.removesuffix('_sha256')}",
                    fix=f'add closure = "pins/variants/{name}.requirements.txt"',
                )
            table = key.removesuffix(".closure_sha256")
            if refresh or c.resolved_before is None:
                cutoff = twin_cutoff(lock, refresh=False)
            else:
                cutoff = require_settled(c.resolved_before,
                                         where=f"{lock.path}: {table}.resolved_before")  # fmt: skip
            current = lock.resolve_path(c.closure, key=f"{table}.closure")
            keep = None if refresh or not current.is_file() else current
            resolved = resolve_overlay(lock, variant, log, find_links=find_links,
                                       index_url=index_url, resolved_before=cutoff,
                                       closure=keep)  # fmt: skip
            files = {key.removesuffix("_sha256"): (c.closure, resolved.text)}
            hashes, changes = _write_and_record(
                lock, lock_path, files, {f"{table}.resolved_before": cutoff}
            )
            out.append(Recorded(platform=DEFAULT_PLATFORM, files=hashes,
                                packages=resolved.packages, components=resolved.components,
                                changes=tuple(changes)))  # fmt: skip
    return out


def overlay_variants(lock: Lock) -> list[str]:
    """The lock's variants that lay a release over the twin."""
    return sorted(n for n, v in lock.variants.items() if set(v.components) & set(OVERLAYS))
