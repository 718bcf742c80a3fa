"""Two images' packages compared: what a bump added, removed and changed (pure; what verify
found installed)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class PackageDiff:
    added: tuple[tuple[str, str], ...]  # (name, version)
    removed: tuple[tuple[str, str], ...]
    changed: tuple[tuple[str, str, str], ...]  # (name, old, new)

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.changed)


def diff(old: Mapping[str, str], new: Mapping[str, str]) -> PackageDiff:
    """What changed between two images' packages (name -> version)."""
    return PackageDiff(
        added=tuple((n, new[n]) for n in sorted(set(new) - set(old))),
        removed=tuple((n, old[n]) for n in sorted(set(old) - set(new))),
        changed=tuple((n, old[n], new[n]) for n in sorted(set(old) & set(new)) if old[n] != new[n]),
    )
