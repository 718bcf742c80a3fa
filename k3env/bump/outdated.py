"""What moved upstream: for every pin, the newer versions its source offers, and the bump
that would take each one.

Sources: a base image's registry (its tags, and whether the pinned tag still names the pinned
digest), git tags for srt-slurm and Dynamo, and the package index for wheel pins (aiperf).
Each source that cannot be reached is reported as such, never as "up to date".
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from k3env.bump.pins import git_tags
from k3env.config.pins import Lock
from k3env.config.shapes import REF_RE
from k3env.engine.registry import list_tags, resolve_digest
from k3env.errors import K3envError
from k3env.log import Log
from k3env.runner import attempt
from k3env.versions import newer_than


@dataclass(frozen=True, kw_only=True)
class Outdated:
    pin: str  # what `k3env bump` takes
    current: str
    newer: tuple[str, ...] = ()
    moved: str | None = None  # the pinned tag names another digest now
    error: str | None = None  # the source could not be asked
    bump: tuple[str, ...] = field(default=())  # one `k3env bump` line per newer version

    @property
    def outdated(self) -> bool:
        return bool(self.newer or self.moved)

    def as_json(self) -> dict[str, Any]:
        return {**self.__dict__, "newer": list(self.newer), "bump": list(self.bump),
                "outdated": self.outdated}  # fmt: skip


def index_versions(name: str, log: Log, index_args: Sequence[str] = ()) -> list[str]:
    """The releases of ``name`` on the package index (``pip index versions``)."""
    _code, out = attempt([sys.executable, "-m", "pip", "index", "versions", name,
                         "--disable-pip-version-check", *index_args], log)  # fmt: skip
    for line in out.splitlines():
        if line.startswith("Available versions:"):
            return [v.strip() for v in line.split(":", 1)[1].split(",") if v.strip()]
    raise K3envError(f"the package index lists no {name}: {out.strip()[-300:]}", where=name)


def outdated(
    lock: Lock,
    log: Log,
    *,
    index_args: Sequence[str] = (),
    tags_of: Callable[[str], list[str]] = list_tags,
    digest_of: Callable[[str, str], str] = resolve_digest,
) -> list[Outdated]:
    """One entry per pin that has an upstream to ask."""
    out: list[Outdated] = []
    for base in lock.bases.values():
        if base.kind != "registry" or base.repository is None or base.tag is None:
            continue
        pin = f"bases.{base.name}"
        current = f"{base.repository}:{base.tag}@{base.digest or 'unresolved'}"
        try:
            tags = tags_of(base.repository)
            newer = newer_than(base.tag, tags)
            now = digest_of(base.repository, base.tag) if base.tag in tags else None
        except K3envError as e:
            out.append(Outdated(pin=pin, current=current, error=e.said))
            continue
        moved = now if now and base.digest and now != base.digest else None
        bumps = [f"k3env bump {pin} {t}" for t in newer]
        if moved:
            bumps.insert(0, f"k3env bump {pin} {base.tag}")
        out.append(Outdated(pin=pin, current=current, newer=tuple(newer), moved=moved,
                            bump=tuple(bumps)))  # fmt: skip
    for pin, git, version in (
        ("srt-slurm", lock.srt_slurm.git if lock.srt_slurm else None,
         lock.srt_slurm.version if lock.srt_slurm else None),
        ("dynamo", lock.dynamo.git if lock.dynamo else None,
         lock.dynamo.version if lock.dynamo else None),
    ):  # fmt: skip
        if git is None or version is None:
            continue
        try:
            newer = newer_than(version, [t for t in git_tags(git) if REF_RE.match(t)])
        except K3envError as e:
            out.append(Outdated(pin=pin, current=version, error=e.said))
            continue
        out.append(Outdated(pin=pin, current=version, newer=tuple(newer),
                            bump=tuple(f"k3env bump {pin} {t}" for t in newer)))  # fmt: skip
    if lock.aiperf is not None:
        try:
            newer = newer_than(lock.aiperf.version, index_versions("aiperf", log, index_args))
        except K3envError as e:
            out.append(Outdated(pin="aiperf", current=lock.aiperf.version, error=e.said))
        else:
            out.append(Outdated(pin="aiperf", current=lock.aiperf.version, newer=tuple(newer),
                                bump=tuple(f"k3env bump aiperf {v}" for v in newer)))  # fmt: skip
    return out
