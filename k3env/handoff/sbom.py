"""The SBOM of an exported image: CycloneDX 1.6 JSON, made from the ``.sqsh`` alone.

What it lists, all read from the squashfs (``squashfs_check.Squashfs``, untrusted): every
installed Python distribution (its ``dist-info`` METADATA name and version, where it is
installed, and the sha256 of the wheel the lock pinned where the image's provenance names
it), every Debian package dpkg's status calls installed (``k3env.installed``'s parser, the
one verify's facts use), and the lock's pins the image's provenance carries (its base by
digest, Dynamo, aiperf, srt-slurm and its patches, container patches by sha256). The
document is a pure function of the file: its serial number is derived from the image's
provenance, its timestamp is the provenance file's time in the image (the image's creation),
so the same export gives the same bytes on any host, and
``export --check`` makes it again to compare.

cyclonedx-python-lib (and packageurl) are imported here only.
"""

from __future__ import annotations

import re
import uuid
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cyclonedx.model import HashAlgorithm, HashType, Property
from cyclonedx.model.bom import Bom
from cyclonedx.model.component import Component, ComponentType
from cyclonedx.output.json import JsonV1Dot6
from packageurl import PackageURL

from k3env import untrusted
from k3env.errors import UntrustedFileError
from k3env.handoff.squashfs_check import Squashfs, _installed_records, _provenance
from k3env.hashing import digest_hex, sha256_digest
from k3env.image.build import PROVENANCE_PATH
from k3env.installed import (
    DPKG_STATUS,
    MAX_PACKAGES,
    NAME,
    STATUS_LIMIT,
    debian_installed,
    field,
    headers,
)
from k3env.quoting import one_line
from k3env.versions import canonical_name

METADATA_LIMIT = 1 << 20  # a METADATA's headers come first; its long description is cut


@dataclass(frozen=True, kw_only=True)
class Package:
    kind: str  # pypi | deb
    name: str
    version: str
    where: str  # the dist-info directory, or dpkg's status
    arch: str = ""
    sha256: str = ""  # of the wheel the lock pinned (pypi), where known


def python_packages(fs: Squashfs, wheels: Mapping[tuple[str, str], str]) -> list[Package]:
    """Each installed distribution (by its RECORD's dist-info), name and version from its
    METADATA; ``wheels``: (canonical name, version) -> the pinned wheel's sha256."""
    metadata = [r.rsplit("/", 1)[0] + "/METADATA" for r in _installed_records(fs.listing())]
    dest = fs.fresh()
    fs.extract(dest, metadata)
    out = []
    for path in metadata[:MAX_PACKAGES]:
        try:
            text = untrusted.read_text(dest, path, limit=METADATA_LIMIT, shown_as="/")
        except UntrustedFileError:
            text = None
        got = headers(text or "", ("Name", "Version"))
        where = one_line(path.rsplit("/", 1)[0])
        name, version = got.get("Name", ""), got.get("Version", "")
        if not (NAME.match(name) and NAME.match(version)):
            name, version = f"unreadable:{where}", ""
        key = (canonical_name(name), version)
        out.append(Package(kind="pypi", name=name, version=version, where=where,
                           sha256=wheels.get(key, "")))  # fmt: skip
    return out


def debian_packages(fs: Squashfs) -> list[Package]:
    """Each package dpkg's status says is installed (none: an image without dpkg)."""
    try:
        raw = fs.read(DPKG_STATUS, limit=STATUS_LIMIT)
    except UntrustedFileError:
        raw = None
    return [
        Package(kind="deb", name=d.name, version=d.version, arch=d.arch, where="/" + DPKG_STATUS)
        for d in debian_installed((raw or b"").decode(errors="replace"))
    ]


def _pinned_wheels(prov: Mapping[str, Any]) -> dict[tuple[str, str], str]:
    wheels = (prov.get("components") or {}).get("wheels") or []
    return {
        (canonical_name(str(w.get("name"))), str(w.get("version"))): str(w.get("sha256"))
        for w in wheels
        if isinstance(w, dict)
    }


def _component(p: Package) -> Component:
    qualifiers = {"arch": p.arch} if p.arch else None
    purl = PackageURL(type=p.kind, namespace="debian" if p.kind == "deb" else None, name=p.name,
                      version=p.version or None, qualifiers=qualifiers)  # fmt: skip
    return Component(
        type=ComponentType.LIBRARY if p.kind == "pypi" else ComponentType.APPLICATION,
        name=p.name,
        version=p.version or None,
        purl=purl,
        bom_ref=f"{purl.to_string()}#{p.where}",
        hashes=[HashType(alg=HashAlgorithm.SHA_256, content=p.sha256)] if p.sha256 else [],
        properties=[Property(name="k3env:installed-at", value=p.where)],
    )


def _pins(prov: Mapping[str, Any]) -> list[Component]:
    """The lock's pins the image's provenance names (``pins``: pin -> identity)."""
    out = []
    for pin, identity in sorted((prov.get("pins") or {}).items()):
        pin, identity = field(str(pin)), field(str(identity))
        sha = re.fullmatch(r"(?:.*@sha256:)?([0-9a-f]{64})", identity)
        kind = ComponentType.CONTAINER if pin.startswith("base.") else (
            ComponentType.FILE if pin.startswith(("patch.", "srt-slurm.")) else
            ComponentType.APPLICATION)  # fmt: skip
        out.append(
            Component(
                type=kind,
                name=f"lock:{pin}",
                version=identity,
                bom_ref=f"k3env-pin:{pin}",
                hashes=[HashType(alg=HashAlgorithm.SHA_256, content=sha.group(1))] if sha else [],
                properties=[Property(name="k3env:pin", value=pin)],
            )
        )
    return out


def sbom(fs: Squashfs) -> bytes:
    """The CycloneDX 1.6 JSON of the image in ``fs`` (its bytes: a function of the file)."""
    prov, raw = _provenance(fs)
    prov_hex = digest_hex(sha256_digest(raw))
    listed = fs.entries().get(PROVENANCE_PATH.lstrip("/"))
    when = datetime.strptime(listed.when, "%Y-%m-%d %H:%M") if listed and listed.when else None
    bom = Bom()
    bom.serial_number = uuid.UUID(bytes=bytes.fromhex(prov_hex)[:16], version=5)
    bom.metadata.timestamp = (when or datetime(1970, 1, 1)).replace(tzinfo=UTC)
    image = Component(
        type=ComponentType.CONTAINER,
        name=field(str(prov.get("image", "?"))),
        version=field(str(prov.get("inputs", ""))) or None,
        bom_ref="image",
        properties=[
            Property(name=f"k3env:{k}-sha256", value=field(str((prov.get(k) or {}).get("sha256"))))
            for k in ("lock", "spec")
        ]
        + [Property(name="k3env:provenance-sha256", value=prov_hex)],
    )
    bom.metadata.component = image
    packages = python_packages(fs, _pinned_wheels(prov)) + debian_packages(fs)
    components = [_component(p) for p in packages] + _pins(prov)
    for c in components:
        bom.components.add(c)
    bom.register_dependency(image, components)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the library's advice on dependency graphs
        text = JsonV1Dot6(bom).output_as_string(indent=1)
    return (text + "\n").encode()
