"""Versions and version ranges: the one place that imports ``packaging``.

``packaging`` is imported where a function needs it, not with this module: its requirement
parser (markers, specifiers, tags) costs about 40 ms a process, and most commands read a
lock whose requirement lines are plain ``name[extras]==version`` (checked here by
``_SIMPLE``, a strict subset of PEP 508 that ``packaging`` accepts, tested against it)."""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from packaging.requirements import InvalidRequirement
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import InvalidVersion, Version

# The names this module lends from packaging, each imported on first use (PEP 562).
_LENT = {
    "InvalidRequirement": "packaging.requirements",
    "InvalidSpecifier": "packaging.specifiers",
    "SpecifierSet": "packaging.specifiers",
    "InvalidVersion": "packaging.version",
    "Version": "packaging.version",
}


def __getattr__(name: str) -> Any:
    if name in _LENT:
        return getattr(importlib.import_module(_LENT[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# PEP 508's name, and a plain release (PEP 440: N(.N)* with an optional a/b/rc, .postN,
# .devN); a local label (+cpu) only after == or != (PEP 440 allows it nowhere else).
_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_RELEASE = r"[0-9]+(?:\.[0-9]+)*(?:(?:a|b|rc)[0-9]+)?(?:\.post[0-9]+)?(?:\.dev[0-9]+)?"
_CLAUSE = rf"(?:(?:==|!=){_RELEASE}(?:\+[a-z0-9]+(?:\.[a-z0-9]+)*)?|(?:>=|<=|>|<){_RELEASE})"
_SIMPLE = re.compile(
    rf"(?P<name>{_NAME})(?:\[{_NAME}(?:,{_NAME})*\])?(?:{_CLAUSE}(?:,{_CLAUSE})*)?"
)
_SEPARATORS = re.compile(r"[-_.]+")

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
    """A distribution name as PEP 503 compares them (``Ai_Dynamo`` -> ``ai-dynamo``): its
    normative form, runs of ``-_.`` to one ``-``, lower case."""
    return _SEPARATORS.sub("-", name).lower()


def requirement_name(line: str) -> str | None:
    """The canonical distribution name of a PEP 508 requirement, or None if it is not one."""
    simple = _SIMPLE.fullmatch(line)
    if simple is not None:
        return canonical_name(simple["name"])
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        return canonical_name(Requirement(line).name)
    except InvalidRequirement:
        return None


def satisfies(line: str, version: str) -> bool:
    """Whether ``version`` meets the version specifier of requirement ``line``."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.version import InvalidVersion, Version

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
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    return Version(version) in SpecifierSet(specifier, prereleases=True)


def _parse(tag: str) -> Version | None:
    from packaging.version import InvalidVersion, Version

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
    from packaging.markers import InvalidMarker, UndefinedComparison, UndefinedEnvironmentName
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.version import InvalidVersion, Version

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
