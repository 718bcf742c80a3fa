"""Versions and version ranges: the one place that imports ``packaging``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from packaging.markers import InvalidMarker, UndefinedComparison, UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

__all__ = [
    "Installed",
    "InvalidRequirement",
    "InvalidSpecifier",
    "InvalidVersion",
    "SpecifierSet",
    "Unmet",
    "Version",
    "canonical_name",
    "in_range",
    "newer_than",
    "requirement_name",
    "satisfies",
    "unmet_requirements",
]


def canonical_name(name: str) -> str:
    """A distribution name as PEP 503 compares them (``Ai_Dynamo`` -> ``ai-dynamo``)."""
    return str(canonicalize_name(name))


def requirement_name(line: str) -> str | None:
    """The canonical distribution name of a PEP 508 requirement, or None if it is not one."""
    try:
        return canonical_name(Requirement(line).name)
    except InvalidRequirement:
        return None


def satisfies(line: str, version: str) -> bool:
    """Whether ``version`` meets the version specifier of requirement ``line``."""
    try:
        return Requirement(line).specifier.contains(Version(version), prereleases=True)
    except (InvalidRequirement, InvalidVersion):
        return False


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


@dataclass(frozen=True, kw_only=True)
class Installed:
    """One installed distribution, as the image's own metadata says."""

    name: str
    version: str
    requires: tuple[str, ...]  # its Requires-Dist lines


@dataclass(frozen=True, kw_only=True)
class Unmet:
    """A ``Requires-Dist`` of an installed distribution that what is installed does not meet."""

    dist: str
    version: str
    requirement: str
    extra: str  # "" for the distribution's own requirements
    target: str
    installed: str | None  # None: not installed
    waived: str | None = None  # why this image does not hold it against the requirement

    @property
    def message(self) -> str:
        via = f" (extra {self.extra})" if self.extra else ""
        have = f"installed {self.target} {self.installed}" if self.installed else "not installed"
        return f"{self.dist} {self.version} requires {self.requirement}{via}; {have}"


def unmet_requirements(
    installed: Iterable[Installed],
    environment: Mapping[str, str],
    *,
    extras: Mapping[str, Iterable[str]] = {},
    waived: Mapping[str, str] = {},
) -> list[Unmet]:
    """Every requirement of every installed distribution (and of the ``extras`` in use, and
    the extras those requirements ask for in turn) that the installed set does not meet.

    ``environment`` is the image's own PEP 508 marker environment; ``waived`` maps a
    distribution name to why an unmet requirement on it is not held against the image."""
    dists = {canonical_name(d.name): d for d in installed}
    todo = [(name, "") for name in sorted(dists)]
    todo += [(canonical_name(n), e) for n, es in sorted(extras.items()) for e in sorted(es)]
    seen: set[tuple[str, str]] = set()
    out: dict[tuple[str, str, str], Unmet] = {}
    while todo:
        name, extra = todo.pop(0)
        if (name, extra) in seen or name not in dists:
            continue
        seen.add((name, extra))
        dist = dists[name]
        for line in dist.requires:
            try:
                req = Requirement(line)
                if req.marker is not None and not req.marker.evaluate(
                    {**environment, "extra": extra}
                ):
                    continue
            except (
                InvalidRequirement,
                InvalidMarker,
                UndefinedComparison,
                UndefinedEnvironmentName,
            ):
                continue
            # An extra's pass looks only at the lines that name an extra (the others were
            # judged on the distribution's own pass).
            if bool(extra) != (req.marker is not None and "extra" in str(req.marker)):
                continue
            target = canonical_name(req.name)
            have = dists.get(target)
            if have is not None:
                try:
                    ok = req.specifier.contains(Version(have.version), prereleases=True)
                except InvalidVersion:
                    ok = False
                if ok:
                    todo += [(target, canonical_name(e)) for e in sorted(req.extras)]
                    continue
            spec = str(req).split(";", 1)[0].strip()
            out.setdefault(
                (name, extra, spec),
                Unmet(
                    dist=dist.name,
                    version=dist.version,
                    requirement=spec,
                    extra=extra,
                    target=target,
                    installed=have.version if have else None,
                    waived=waived.get(target),
                ),
            )
    return sorted(out.values(), key=lambda u: (u.dist, u.extra, u.requirement))
