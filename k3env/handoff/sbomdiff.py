"""Two images' packages compared: what a bump added, removed and changed (pure; the SBOM's
own JSON, or what verify found installed)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from k3env import jsontext
from k3env.errors import CheckFailed

MAX_SBOM = 128 << 20  # ~500 bytes a component: 200,000 packages fit


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


def sbom_packages(document: bytes, *, where: str = "the SBOM") -> dict[str, str]:
    """``kind:name`` -> version of each package an SBOM lists (the pins left out, and any
    entry not of CycloneDX's shape); an SBOM over its budget of bytes or nesting, or not a
    JSON object, is a CheckFailed naming ``where``."""
    doc = jsontext.loads(document, where=where, limit=MAX_SBOM, max_depth=16, error=CheckFailed,
                         fix="make the SBOM again: k3env export --sign-key KEY.pem")  # fmt: skip
    components = doc.get("components")
    out = {}
    for c in components if isinstance(components, list) else []:
        if not isinstance(c, dict):
            continue
        purl, name, version = c.get("purl"), c.get("name"), c.get("version")
        if (
            isinstance(purl, str)
            and isinstance(name, str)
            and purl.startswith(("pkg:pypi/", "pkg:deb/"))
        ):
            out[f"{purl[4:].split('/', 1)[0]}:{name}"] = version if isinstance(version, str) else ""
    return out
