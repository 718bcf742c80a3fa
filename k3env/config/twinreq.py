"""The CPU twin's requirements file against the lock: what it pins, and where they disagree.

The file is generated from the lock by ``k3env twin --resolve`` (never edited by hand); this
module only reads it. ``k3env lock --check`` fails on every disagreement listed here.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from k3env import jsontext
from k3env.config.pins import OVERLAYS, ComponentPin, Lock, TwinPin, VariantPin
from k3env.config.shapes import platform_option
from k3env.errors import LockError
from k3env.files import read_input
from k3env.hashing import sha256_digest
from k3env.versions import canonical_name, requirement_name, satisfies

INPUTS_LINE = re.compile(r"(?m)^# inputs: (sha256:[0-9a-f]{64}), resolved before (\S+)$")


@dataclass(frozen=True, kw_only=True)
class Inputs:
    """What one resolution is made from, all of it read from the lock: the top-level
    requirements, the overrides (the stand-ins' pins, ``omit`` pruned by a never-true marker),
    the platform, the package index's cut-off and, for a variant's closure, the twin's file
    whose versions it prefers. A generated file names their digest (``line``), so ``lock
    --check`` tells, offline, a file resolved from other inputs than the lock now has."""

    tops: tuple[str, ...]
    overrides: tuple[str, ...]
    platform: str
    resolved_before: str | None
    preferences: str | None = None  # sha256 of the file whose versions are preferred
    # The pinned components' wheels, resolved with the twin but not part of the digest: a
    # component bump is checked by its own pins (a wheel by sha256, never listed in the file)
    # and resolved with the twin by the bump, not flagged on every lock that carries it.
    components: tuple[str, ...] = ()

    @property
    def requirements(self) -> tuple[str, ...]:
        """Everything uv resolves."""
        return (*self.tops, *self.components)

    @property
    def digest(self) -> str:
        fields = {"tops": list(self.tops), "overrides": list(self.overrides),
                  "platform": self.platform, "resolved_before": self.resolved_before,
                  "preferences": self.preferences}  # fmt: skip
        return sha256_digest(jsontext.dumps(fields).encode())

    @property
    def line(self) -> str:
        return f"# inputs: {self.digest}, resolved before {self.resolved_before or 'none'}\n"


def component_tops(lock: Lock, only: Collection[str] | None = None) -> list[str]:
    """``name[extras]==version`` of each component's wheels (``only``: those components)."""
    tops = []
    for component in lock.components.values():
        if only is not None and component.name not in only:
            continue
        for w in component.wheels:
            extras = f"[{','.join(component.extras)}]" if component.extras else ""
            # The extras belong to the distribution that declares them (the first wheel).
            if w is not component.wheels[0]:
                extras = ""
            tops.append(f"{w.name}{extras}=={w.version}")
    return tops


def _overrides(twin: TwinPin, tops: list[str]) -> tuple[str, ...]:
    stand_ins = {canonical_name(n) for n in twin.stand_ins}
    overrides = [r for r in tops if requirement_name(r) in stand_ins]
    overrides += [f"{n} ; sys_platform == 'never'" for n in twin.omit]
    return tuple(overrides)


def twin_inputs(lock: Lock, twin: TwinPin, resolved_before: str | None) -> Inputs:
    """The twin's requirements: ``[twin].requires`` and every component's pinned wheels."""
    components = component_tops(lock)
    return Inputs(tops=twin.requires, components=tuple(components),
                  overrides=_overrides(twin, [*twin.requires, *components]),
                  platform=twin.platform, resolved_before=resolved_before)  # fmt: skip


def overlay_of(variant: VariantPin) -> ComponentPin:
    return next(c for n, c in variant.components.items() if n in OVERLAYS)


def overlay_inputs(
    lock: Lock, variant: VariantPin, twin_file_sha256: str, resolved_before: str | None
) -> Inputs:
    """A variant's vLLM release resolved against the twin: the twin's requirements with the
    release (and the overlay's ``requires``) in place of the twin's, the variant's own
    components beside, the twin's file (by its sha256) as the versions preferred."""
    assert lock.twin is not None
    twin = lock.twin
    overlay = overlay_of(variant)
    wheel = overlay.wheels[0]
    tops = [f"{wheel.name}=={wheel.version}", *overlay.requires]
    replaced = {requirement_name(r) for r in tops}
    requires = [r for r in twin.requires if requirement_name(r) not in replaced]
    # Only the components the variant pins take part: a pinned Dynamo whose extra pins
    # another vLLM is the Dynamo image's verdict in this column, not a resolution failure.
    vlock = lock.with_variant(variant)
    every = [*requires, *tops, *component_tops(vlock, set(variant.components))]
    return Inputs(tops=tuple(every), overrides=_overrides(twin, every), platform=twin.platform,
                  resolved_before=resolved_before, preferences=twin_file_sha256)  # fmt: skip


def parse_pinned(text: str) -> Pinned:
    """A hash-pinned requirements text (pip's form, or uv's with ``\\`` continuations):
    canonical distribution name -> (version, [sha256, ...]) for each ``name==version`` line."""
    out: Pinned = {}
    for line in text.replace("\\\n", " ").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-") or "==" not in line:
            continue
        requirement = line.split(" --", 1)[0].strip()
        name = requirement_name(requirement)
        if name is None:
            continue
        version = requirement.split("==", 1)[1].split(";", 1)[0].strip()
        out[name] = (version, re.findall(r"--hash=sha256:([0-9a-f]{64})", line))
    return out


Pinned = dict[str, tuple[str, list[str]]]  # canonical name -> (version, [sha256, ...])


def pinned_line(name: str, version: str, hashes: list[str]) -> str:
    """One hash-pinned requirement line, as ``parse_pinned`` reads it back."""
    return f"{name}=={version} " + " ".join(f"--hash=sha256:{h}" for h in hashes)


def pinned_versions(path: Path) -> dict[str, str]:
    """Canonical distribution name -> version, for each ``name==version`` line (``path``: a
    regular file of at most 16 MiB, see ``files.read_input``)."""
    text = read_input(path, error=LockError).decode("utf-8", errors="replace")
    return {name: version for name, (version, _) in parse_pinned(text).items()}


def twin_disagreements(lock: Lock) -> list[str]:
    """Each way a twin's requirements file (or a variant's closure over it) and the lock's
    pins disagree (empty: agree), for every platform the lock pins a twin for."""
    if lock.twin is None:
        return []
    out = []
    for twin in (lock.twin, *lock.twin.platforms.values()):
        out += _disagreements(lock, twin)
    return out + closure_disagreements(lock)


RELEASE_LINE = re.compile(r"(?m)^# release: (\S+)$")


def release_line(name: str, version: str) -> str:
    """The line of a closure file naming the release it was resolved for (``RELEASE_LINE``)."""
    return f"# release: {name}=={version}\n"


def closure_disagreements(lock: Lock) -> list[str]:
    """A variant's closure that was resolved for another release than the one its lock
    table pins, or that pins what is baked on its own (the release, a component's wheel)."""
    out = []
    for name, variant in sorted(lock.variants.items()):
        for c in variant.components.values():
            if c.closure is None:
                continue
            path = lock.resolve_path(c.closure, key=f'variants."{name}".{c.name}.closure')
            if not path.is_file():
                continue  # the hash check says it is missing
            text = read_input(path, error=LockError).decode("utf-8", errors="replace")
            fix = f"regenerate it with `k3env twin --resolve --variant {name}`"
            wheel = c.wheels[0]
            m = RELEASE_LINE.search(text)
            if m is None or m.group(1) != f"{wheel.name}=={wheel.version}":
                said = m.group(1) if m else "no release"
                out.append(f"{c.closure} was resolved for {said}; variant {name} pins "
                           f"{wheel.name} {wheel.version}: {fix}")  # fmt: skip
            if lock.twin is not None and lock.twin.requirements_sha256:
                want = overlay_inputs(lock, variant, lock.twin.requirements_sha256,
                                      c.resolved_before)  # fmt: skip
                where = f'[variants."{name}".{c.name}]'
                out += _inputs_disagree(text, want, c.closure, where, fix)
            baked = {wheel.name} | {w.name for v in variant.components.values()
                                    if v is not c for w in v.wheels}  # fmt: skip
            for dist in sorted(baked & set(parse_pinned(text))):
                out.append(f"{c.closure} pins {dist}, which variant {name} bakes from its "
                           f"own wheel: {fix}")  # fmt: skip
    return out


def _disagreements(lock: Lock, twin: TwinPin) -> list[str]:
    path = lock.resolve_path(twin.requirements, key=f"{twin.key}.requirements")
    again = platform_option(twin.platform)
    table = "[twin]" if twin.key == "twin" else f'[twin.platforms."{twin.platform}"]'
    if not path.is_file():
        return [f"{twin.requirements} is missing: run `k3env twin --resolve{again}`"]
    pinned = pinned_versions(path)
    fix = f"regenerate it with `k3env twin --resolve{again}`"
    text = read_input(path, error=LockError).decode("utf-8", errors="replace")
    out = _inputs_disagree(
        text, twin_inputs(lock, twin, twin.resolved_before), twin.requirements, table, fix
    )
    for component in lock.components.values():
        for w in component.wheels:
            if w.name in pinned:
                out.append(
                    f"{twin.requirements} pins {w.name} {pinned[w.name]}, which the lock bakes "
                    f"as component {component.name} ({w.name} {w.version}): {fix}"
                )
    for line in twin.requires:
        name = requirement_name(line)
        assert name is not None
        have = pinned.get(name)
        if have is None:
            out.append(f"{table}.requires has {line!r}, {twin.requirements} lacks {name}: {fix}")
        elif not satisfies(line, have):
            out.append(f"{table}.requires has {line!r}, {twin.requirements} pins {have}: {fix}")
    for name in twin.omit:
        canonical = requirement_name(name)
        if canonical in pinned:
            have = pinned[canonical]
            out.append(f"{table}.omit leaves out {name}, {twin.requirements} pins {have}: {fix}")
    return out


def _inputs_disagree(text: str, want: Inputs, file: str, table: str, fix: str) -> list[str]:
    """The generated file's ``# inputs:`` line against what the lock's inputs are now."""
    m = INPUTS_LINE.search(text)
    if m is None:
        return [f"{file} names no inputs (it was generated before k3env recorded them): {fix}"]
    digest, cutoff = m.group(1), m.group(2)
    if cutoff != (want.resolved_before or "none"):
        return [f"{file} was resolved before {cutoff}; {table}.resolved_before is "
                f"{want.resolved_before or 'not set'}: {fix}"]  # fmt: skip
    if digest != want.digest:
        return [f"{file} was resolved from other inputs than {table} "
                f"now has (requires, stand_ins or omit): {fix}"]  # fmt: skip
    return []
