"""The SBOM of an exported image: CycloneDX 1.6 JSON, made from the ``.sqsh`` alone.

What it lists, all read from the squashfs (``squashfs.Squashfs``, untrusted): every
installed Python distribution (its ``dist-info`` METADATA name and version, where it is
installed, and the sha256 of the wheel the lock pinned where the image's provenance names
it), every Debian package dpkg's status calls installed (``k3env.installed``'s parser, the
one verify's facts use), and the lock's pins the image's provenance carries (its base by
digest, Dynamo, aiperf, srt-slurm and its patches, container patches by sha256). The
document is a pure function of the file: its serial number is derived from the image's
provenance, its timestamp is the provenance file's time in the image (the image's creation),
so the same export gives the same bytes on any host, and
``export --check`` makes it again to compare.

The document is rendered here (``render``), in the form cyclonedx-python-lib's JSON 1.6
outputter writes (its keys, order and indent: an SBOM written before compares byte-identical;
tests/test_sbom_budget.py holds the two equal), not through the library's model: building
and writing a ``Bom`` there is quadratic in components (``Bom.validate`` registers each
component's dependency by a linear search of the graph, c.f.
https://github.com/CycloneDX/cyclonedx-python-lib/issues/1006, and its bom-ref
discriminator checks a list), and slow besides (a model object, a sorted set of them
compared field by field): 4,000 Debian packages took 58 s, 20,000 never finished. Here it is
one sort and one encode: 20,000 in well under a second (benchmarks/bench_sbom.py).

packageurl is imported here only (each package's purl, as the library spells it).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from packageurl import PackageURL

from k3env import jsontext, untrusted
from k3env.errors import UntrustedFileError
from k3env.handoff.provenance import Provenance, read_provenance
from k3env.handoff.squashfs import Squashfs, installed_records
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
SCHEMA = "http://cyclonedx.org/schema/bom-1.6.schema.json"
SHA256 = re.compile(r"[0-9a-f]{64}")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, kw_only=True)
class Package:
    kind: str  # pypi | deb
    name: str
    version: str
    where: str  # the dist-info directory, or dpkg's status
    arch: str = ""
    sha256: str = ""  # of the wheel the lock pinned (pypi), where known


@dataclass(frozen=True, kw_only=True)
class Component:
    """One entry of the SBOM's ``components``, as CycloneDX names its fields."""

    type: str  # application | container | file | library
    name: str
    version: str  # "" when unknown (left out of the document)
    bom_ref: str
    purl: str = ""
    sha256: str = ""  # "" when none
    properties: tuple[tuple[str, str], ...] = ()

    def order(self) -> tuple[str, str, bool, str, str]:
        """Where it sorts: as the library's model sorts components (type, name, version with
        a missing one last, bom-ref)."""
        return (self.type, self.name, not self.version, self.version, self.bom_ref)

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"bom-ref": self.bom_ref}  # keys in sorted order, as written
        if self.sha256:
            out["hashes"] = [{"alg": "SHA-256", "content": self.sha256}]
        out["name"] = self.name
        if self.properties:
            out["properties"] = [{"name": n, "value": v} for n, v in sorted(self.properties)]
        if self.purl:
            out["purl"] = self.purl
        out["type"] = self.type
        if self.version:
            out["version"] = self.version
        return out


@dataclass(frozen=True, kw_only=True)
class Document:
    """The SBOM's bytes, and how many components it lists."""

    data: bytes
    components: int


def python_packages(fs: Squashfs, wheels: Mapping[tuple[str, str], str]) -> list[Package]:
    """Each installed distribution (by its RECORD's dist-info), name and version from its
    METADATA; ``wheels``: (canonical name, version) -> the pinned wheel's sha256."""
    records = installed_records(fs.listing())[:MAX_PACKAGES]
    metadata = [r.rsplit("/", 1)[0] + "/METADATA" for r in records]
    dest = fs.fresh()
    fs.extract(dest, metadata)
    out = []
    for path in metadata:
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


def _package(p: Package) -> Component:
    qualifiers = {"arch": p.arch} if p.arch else None
    purl = PackageURL(type=p.kind, namespace="debian" if p.kind == "deb" else None, name=p.name,
                      version=p.version or None, qualifiers=qualifiers).to_string()  # fmt: skip
    return Component(
        type="library" if p.kind == "pypi" else "application",
        name=p.name,
        version=p.version,
        purl=purl,
        bom_ref=f"{purl}#{p.where}",
        sha256=p.sha256 if SHA256.fullmatch(p.sha256) else "",
        properties=(("k3env:installed-at", p.where),),
    )


def _pins(prov: Provenance) -> list[Component]:
    """The lock's pins the image's provenance names (``pins``: pin -> identity)."""
    out = []
    for raw_pin, raw_identity in prov.pins:
        pin, identity = field(raw_pin), field(raw_identity)
        sha = re.fullmatch(r"(?:.*@sha256:)?([0-9a-f]{64})", identity)
        kind = "container" if pin.startswith("base.") else (
            "file" if pin.startswith(("patch.", "srt-slurm.")) else "application")  # fmt: skip
        out.append(Component(type=kind, name=f"lock:{pin}", version=identity,
                             bom_ref=f"k3env-pin:{pin}", sha256=sha.group(1) if sha else "",
                             properties=(("k3env:pin", pin),)))  # fmt: skip
    return out


def _image(prov: Provenance) -> Component:
    """The image itself (the document's subject), as its provenance names it."""
    props = [(f"k3env:{k}-sha256", field(str(v.sha256 if v else None)))
             for k, v in (("lock", prov.lock), ("spec", prov.spec))]  # fmt: skip
    return Component(
        type="container",
        name=field(prov.image if prov.image is not None else "?"),
        version=field(prov.inputs or ""),
        bom_ref="image",
        properties=(*props, ("k3env:provenance-sha256", prov.sha256)),
    )


def render(
    *, image: Component, components: Iterable[Component], when: datetime, serial: uuid.UUID
) -> Document:
    """The CycloneDX 1.6 JSON document of ``image`` and ``components`` (pure: the same
    arguments, the same bytes). Components are sorted; of two with one bom-ref (the same
    package listed twice) the first in that order is kept, so every bom-ref is one
    component's and the dependency graph names each once."""
    kept: dict[str, Component] = {}
    for c in sorted(components, key=Component.order):
        kept.setdefault(c.bom_ref, c)
    refs = sorted(kept)
    graph = [{"dependsOn": refs, "ref": image.bom_ref} if refs else {"ref": image.bom_ref}]
    graph += [{"ref": r} for r in refs]
    graph.sort(key=lambda d: str(d["ref"]))
    doc: dict[str, Any] = {}  # keys in the library's order: its model's sorted, then the header
    if kept:
        doc["components"] = [c.as_json() for c in kept.values()]
    doc["dependencies"] = graph
    doc["metadata"] = {"component": image.as_json(), "timestamp": when.isoformat()}
    doc["serialNumber"] = serial.urn
    doc["version"] = 1
    doc.update({"$schema": SCHEMA, "bomFormat": "CycloneDX", "specVersion": "1.6"})
    text = jsontext.dumps(doc, indent=1, sort_keys=False)
    return Document(data=(text + "\n").encode(), components=len(kept))


def _created(fs: Squashfs) -> datetime:
    """The provenance file's time in the image (its listing's, to the minute), else 1970."""
    listed = fs.entries().get(PROVENANCE_PATH.lstrip("/"))
    try:
        when = datetime.strptime(listed.when, "%Y-%m-%d %H:%M") if listed else None
    except ValueError:  # a listing k3env cannot read as a time: the image's own bytes decide
        when = None
    return when.replace(tzinfo=UTC) if when else EPOCH


def document(fs: Squashfs) -> Document:
    """The CycloneDX 1.6 JSON of the image in ``fs`` (its bytes: a function of the file)."""
    prov = read_provenance(fs)
    pinned = {(canonical_name(w.name), w.version): w.sha256 for w in prov.wheels}
    packages = python_packages(fs, pinned) + debian_packages(fs)
    return render(
        image=_image(prov),
        components=[*map(_package, packages), *_pins(prov)],
        when=_created(fs),
        serial=uuid.UUID(bytes=bytes.fromhex(prov.sha256)[:16], version=5),
    )


def sbom(fs: Squashfs) -> bytes:
    """The CycloneDX 1.6 JSON of the image in ``fs`` (its bytes: a function of the file)."""
    return document(fs).data
