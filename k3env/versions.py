"""Versions and version ranges: the one place that imports ``packaging``."""

from __future__ import annotations

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

__all__ = ["InvalidSpecifier", "InvalidVersion", "SpecifierSet", "Version", "in_range"]


def in_range(version: str | None, specifier: str) -> bool | None:
    """Whether ``version`` is in ``specifier``; ``None`` when the version is unknown."""
    if version is None:
        return None
    if specifier in ("", "*"):
        return True
    return Version(version) in SpecifierSet(specifier, prereleases=True)
