"""Versions and version ranges: the one place that imports ``packaging``."""

from __future__ import annotations

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

__all__ = [
    "InvalidSpecifier",
    "InvalidVersion",
    "SpecifierSet",
    "Version",
    "in_range",
    "newer_than",
]


def in_range(version: str | None, specifier: str) -> bool | None:
    """Whether ``version`` is in ``specifier``; ``None`` when the version is unknown."""
    if version is None:
        return None
    if specifier in ("", "*"):
        return True
    return Version(version) in SpecifierSet(specifier, prereleases=True)


def _parse(tag: str) -> Version | None:
    try:
        return Version(tag.removeprefix("v"))
    except InvalidVersion:
        return None


def newer_than(current: str, candidates: list[str]) -> list[str]:
    """The candidates (tags or releases, a leading ``v`` allowed) that are versions newer than
    ``current``, newest first; candidates that are not versions are left out. A current that
    is not a version has nothing newer by this measure."""
    now = _parse(current)
    if now is None:
        return []
    found = [(v, c) for c in candidates if (v := _parse(c)) is not None and v > now]
    # Pre-releases count only when the pin is one itself (a dev tag pinned on day zero).
    if not now.is_prerelease:
        found = [(v, c) for v, c in found if not v.is_prerelease]
    return [c for _, c in sorted(found, reverse=True)]
