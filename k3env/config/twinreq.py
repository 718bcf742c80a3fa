"""The CPU twin's requirements file against the lock: what it pins, and where they disagree.

The file is generated from the lock by ``k3env twin --resolve`` (never edited by hand); this
module only reads it. ``k3env lock --check`` fails on every disagreement listed here.
"""

from __future__ import annotations

import re
from pathlib import Path

from k3env.config.pins import Lock, TwinPin
from k3env.config.shapes import platform_option
from k3env.errors import LockError
from k3env.files import read_input
from k3env.versions import requirement_name, satisfies


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
    out = []
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
