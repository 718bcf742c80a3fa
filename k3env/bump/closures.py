"""What a newer index cut-off would change in the CPU twin: the twin's closure for each platform
resolved at the newest settled cut-off and compared with the committed files (which wheels
moved), and the Debian package set as the mirror serves it now against the pinned one (which
``.deb`` moved or is gone). Drift is reported as a pin to bump (``k3env bump twin INSTANT``),
never as a failure of an unchanged commit: the committed files are what the lock's own cut-off
resolves to.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from k3env.bump.outdated import Outdated
from k3env.config.cutoff import settled_cutoff
from k3env.config.lock import load_lock
from k3env.config.lock_edit import Change, set_leaves
from k3env.config.pins import Lock
from k3env.config.twinreq import Pinned, parse_pinned
from k3env.errors import K3envError, LockError
from k3env.files import read_input, write_atomic
from k3env.image.twindebian import moved, parse_debian_list, read_debian_list, resolve_debian
from k3env.image.twinresolve import resolve_twin
from k3env.log import Log
from k3env.versions import canonical_name

PIN = "twin"


def version_moves(
    committed: Pinned, resolved: Pinned, skip: set[str]
) -> list[tuple[str, str | None, str | None]]:
    """(name, old version or None, new version or None) of each distribution whose version
    differs between two pinned sets, in name order (``skip``: names left out)."""
    out = []
    for name in sorted((set(committed) | set(resolved)) - skip):
        old = committed[name][0] if name in committed else None
        new = resolved[name][0] if name in resolved else None
        if old != new:
            out.append((name, old, new))
    return out


def wheel_moves(committed: Pinned, resolved: Pinned, baked: set[str]) -> list[str]:
    """``name old -> new`` for each distribution whose version differs, ``+name new`` for one
    the newer closure adds and ``-name old`` for one it drops (the components left out)."""
    return [
        f"+{name} {new}" if old is None else f"-{name} {old}" if new is None
        else f"{name} {old} -> {new}"
        for name, old, new in version_moves(committed, resolved, baked)
    ]  # fmt: skip


def twin_outdated(
    lock: Lock,
    log: Log,
    *,
    find_links: Sequence[str] = (),
    index_url: str | None = None,
    debian: bool = True,
    now: datetime | None = None,
) -> Outdated:
    """The twin as a pin of ``k3env outdated``: its cut-off, and what the newest settled one
    would move (one line per moved wheel, prefixed by its platform, and per moved ``.deb``;
    nothing is written). An index or mirror that cannot be asked is said so."""
    assert lock.twin is not None
    current = f"index before {lock.twin.resolved_before or '(no cut-off)'}"
    cutoff = settled_cutoff(now)
    baked = {canonical_name(w.name) for c in lock.components.values() for w in c.wheels}
    moves: list[str] = []
    try:
        for platform in lock.twin.all_platforms:
            twin = lock.twin.for_platform(platform)
            path = lock.resolve_path(twin.requirements, key=f"{twin.key}.requirements")
            committed = parse_pinned(read_input(path, error=LockError).decode("utf-8", "replace"))
            newer = resolve_twin(lock, log, resolved_before=cutoff, platform=platform,
                                 find_links=find_links, index_url=index_url)  # fmt: skip
            moves += [f"{platform}: {m}" for m in wheel_moves(committed, newer.pinned, baked)]
            if debian and twin.debian:
                pinned = read_debian_list(lock.resolve_path(twin.debian, key=f"{twin.key}.debian"))
                served = parse_debian_list(
                    resolve_debian(lock, log, platform),
                    where=f"{twin.debian_mirror} {twin.debian_suite}",
                )
                moves += [f"{platform}: deb {m}" for m in moved(pinned, list(served.values()))]
    except K3envError as e:
        return Outdated(pin=PIN, current=current, error=e.said)
    return Outdated(pin=PIN, current=current, newer=tuple(moves),
                    bump=(f"k3env bump {PIN} {cutoff}",) if moves else ())  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Regenerated:
    changes: tuple[Change, ...]  # the lock's leaves, then one per moved wheel
    saved: dict[Path, bytes]  # what the files were, to put back


def regenerate(
    lock: Lock,
    leaves: dict[str, str],
    log: Log,
    *,
    find_links: Sequence[str] = (),
    index_url: str | None = None,
) -> Regenerated:
    """The twin's files regenerated at the cut-off ``leaves`` sets, every platform and
    variant, as `twin --resolve` writes them (the lock's leaves and hashes recorded); the
    files' old bytes kept for ``restore``."""
    from k3env.image.twinrecord import overlay_variants, record_overlays, record_resolved

    assert lock.twin is not None
    paths = [lock.path]
    for platform in lock.twin.all_platforms:
        twin = lock.twin.for_platform(platform)
        paths.append(lock.resolve_path(twin.requirements, key=f"{twin.key}.requirements"))
        if twin.debian:
            paths.append(lock.resolve_path(twin.debian, key=f"{twin.key}.debian"))
    for variant in lock.variants.values():
        for c in variant.components.values():
            if c.closure is not None:
                paths.append(lock.resolve_path(c.closure, key=f"{variant.name}.closure"))
    saved = {p: p.read_bytes() for p in paths if p.is_file()}
    before = {p: parse_pinned(b.decode("utf-8", "replace")) for p, b in saved.items()}
    changes = list(set_leaves(lock.path, leaves))
    try:
        for platform in lock.twin.all_platforms:
            record_resolved(load_lock(lock.path), lock.path, log, platform=platform,
                            find_links=find_links, index_url=index_url,
                            resolved_before=leaves["twin.resolved_before"],
                            refresh=True)  # fmt: skip
        now = load_lock(lock.path)
        record_overlays(now, lock.path, log, names=overlay_variants(now), find_links=find_links,
                        index_url=index_url, refresh=True)  # fmt: skip
    except BaseException:
        restore(saved)
        raise
    for p in paths[1:]:
        if p in before and p.is_file():
            after = parse_pinned(p.read_text(errors="replace"))
            rel = p.relative_to(lock.root).as_posix()
            changes += [Change(key=f"{rel}: {name}", old=old, new=new or "(dropped)")
                        for name, old, new in version_moves(before[p], after, set())]  # fmt: skip
    return Regenerated(changes=tuple(changes), saved=saved)


def restore(saved: dict[Path, bytes]) -> None:
    """Each file as it was (atomically), the lock last."""
    for path, data in sorted(saved.items(), key=lambda kv: kv[0].suffix == ".toml"):
        write_atomic(path, data)
