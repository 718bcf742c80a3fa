"""The SBOM rebuild `export --check` runs (k3env.handoff.sbom): linear in packages (20,000
Debian packages under 5 s, the issue's bar; quadratic before), rendered byte for byte as
cyclonedx-python-lib wrote it (an SBOM written before compares equal), and an image's
provenance with fields of the wrong type refused in words, never a traceback."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import uuid
import warnings
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from k3env.errors import ConfigError
from k3env.handoff.provenance import Provenance, provenance_of
from k3env.handoff.sbom import Package, _image, _package, _pins, render, sbom
from k3env.handoff.squashfs import Squashfs
from k3env.log import Log

QUIET = Log(quiet=True)
SQUASHFS_TOOLS = pytest.mark.skipif(
    not (shutil.which("mksquashfs") and shutil.which("unsquashfs")), reason="squashfs-tools"
)
HEX = "ab" * 32
PROVENANCE = {
    "config": {},
    "image": "kimi-k3-dynamo",
    "inputs": "cd" * 32,
    "lock": {"path": "pins/k3.lock.toml", "sha256": "0" * 64},
    "spec": {"path": "images/kimi-k3-dynamo.toml", "sha256": "1" * 64},
    "base": {"pin": "cuda", "name": "nvcr.io/x", "digest": "sha256:" + "2" * 64},
    "pins": {
        "base.cuda": "nvcr.io/x:1@sha256:" + "2" * 64,
        "patch.int64": "3" * 64,
        "srt-slurm": "2.1.0@" + "4" * 40,
        "srt-slurm.pr12": "5" * 64,
        "dynamo": "ai-dynamo@" + "6" * 40,
        "aiperf": "0.13.0",
        "wheel.ai-dynamo": "1.6.1@sha256:" + "7" * 64,
    },
    "components": {"wheels": [{"name": "ai-dynamo", "version": "1.6.1", "sha256": HEX}]},
}
SITE = "usr/lib/python3/dist-packages"
PACKAGES = [
    Package(kind="deb", name="libc6", version="2.36-9+deb12u7", arch="amd64",
            where="/var/lib/dpkg/status"),
    Package(kind="deb", name="libc6", version="2.36-9+deb12u7", arch="amd64",
            where="/var/lib/dpkg/status"),  # listed twice: one component
    Package(kind="deb", name="bash", version="5.2.15-2+b2", where="/var/lib/dpkg/status"),
    Package(kind="deb", name="zlib1g", version="1:1.2.13.dfsg-1", arch="amd64",
            where="/var/lib/dpkg/status"),
    Package(kind="deb", name="libstdc++6", version="12.2.0-14~b1", arch="amd64",
            where="/var/lib/dpkg/status"),
    Package(kind="deb", name="tzdata", version="2024a-0+deb12u1", arch="all",
            where="/var/lib/dpkg/status"),
    Package(kind="deb", name="noversion", version="", arch="amd64", where="/var/lib/dpkg/status"),
    Package(kind="pypi", name="vllm", version="0.31.0", where=f"{SITE}/vllm-0.31.0.dist-info"),
    Package(kind="pypi", name="Ai_Dynamo", version="1.6.1", sha256=HEX,
            where=f"{SITE}/ai_dynamo-1.6.1.dist-info"),
    Package(kind="pypi", name="vllm", version="0.31.0",
            where="usr/local/lib/python3.12/site-packages/vllm-0.31.0.dist-info"),
    Package(kind="pypi", name=f"unreadable:{SITE}/évil 1%.dist-info", version="",
            where=f"{SITE}/évil 1%.dist-info"),
]  # fmt: skip
WHEN = datetime(2026, 12, 1, 7, 30, tzinfo=UTC)


def _library(prov: Provenance, packages: list[Package], when: datetime) -> bytes:
    """The document as k3env made it through cyclonedx-python-lib's model until the rebuild
    went quadratic (k3env/handoff/sbom.py at 590049a), from the same inputs."""
    import re

    pytest.importorskip("cyclonedx")  # k3env no longer needs it; the comparison does

    from cyclonedx.model import HashAlgorithm, HashType, Property
    from cyclonedx.model.bom import Bom
    from cyclonedx.model.component import Component, ComponentType
    from cyclonedx.output.json import JsonV1Dot6
    from packageurl import PackageURL

    from k3env.installed import field

    def component(p: Package) -> Component:
        qualifiers = {"arch": p.arch} if p.arch else None
        namespace = "debian" if p.kind == "deb" else None
        purl = PackageURL(type=p.kind, namespace=namespace, name=p.name,
                          version=p.version or None, qualifiers=qualifiers)  # fmt: skip
        return Component(
            type=ComponentType.LIBRARY if p.kind == "pypi" else ComponentType.APPLICATION,
            name=p.name, version=p.version or None, purl=purl,
            bom_ref=f"{purl.to_string()}#{p.where}",
            hashes=[HashType(alg=HashAlgorithm.SHA_256, content=p.sha256)] if p.sha256 else [],
            properties=[Property(name="k3env:installed-at", value=p.where)],
        )  # fmt: skip

    doc = prov.doc
    pins = []
    for pin, identity in sorted((doc.get("pins") or {}).items()):
        pin, identity = field(str(pin)), field(str(identity))
        sha = re.fullmatch(r"(?:.*@sha256:)?([0-9a-f]{64})", identity)
        kind = ComponentType.CONTAINER if pin.startswith("base.") else (
            ComponentType.FILE if pin.startswith(("patch.", "srt-slurm.")) else
            ComponentType.APPLICATION)  # fmt: skip
        pins.append(Component(
            type=kind, name=f"lock:{pin}", version=identity, bom_ref=f"k3env-pin:{pin}",
            hashes=[HashType(alg=HashAlgorithm.SHA_256, content=sha.group(1))] if sha else [],
            properties=[Property(name="k3env:pin", value=pin)],
        ))  # fmt: skip
    bom = Bom()
    bom.serial_number = uuid.UUID(bytes=bytes.fromhex(prov.sha256)[:16], version=5)
    bom.metadata.timestamp = when
    image = Component(
        type=ComponentType.CONTAINER, name=field(str(doc.get("image", "?"))),
        version=field(str(doc.get("inputs", ""))) or None, bom_ref="image",
        properties=[
            Property(name=f"k3env:{k}-sha256", value=field(str((doc.get(k) or {}).get("sha256"))))
            for k in ("lock", "spec")
        ] + [Property(name="k3env:provenance-sha256", value=prov.sha256)],
    )  # fmt: skip
    bom.metadata.component = image
    components = [component(p) for p in packages] + pins
    for c in components:
        bom.components.add(c)
    bom.register_dependency(image, components)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return (JsonV1Dot6(bom).output_as_string(indent=1) + "\n").encode()


def _rendered(prov: Provenance, packages: list[Package], when: datetime) -> bytes:
    return render(
        image=_image(prov),
        components=[*map(_package, packages), *_pins(prov)],
        when=when,
        serial=uuid.UUID(bytes=bytes.fromhex(prov.sha256)[:16], version=5),
    ).data


@pytest.mark.parametrize(
    ("doc", "packages"),
    [
        (PROVENANCE, PACKAGES),
        (PROVENANCE, []),
        ({**PROVENANCE, "pins": {}}, PACKAGES[:3]),
        ({"config": {}, "image": "bare"}, PACKAGES[-4:]),
        ({"config": {}}, []),
    ],
    ids=["every-kind", "pins-only", "packages-only", "no-lock-no-pins", "nothing"],
)
def test_the_rendered_sbom_is_byte_for_byte_what_cyclonedx_python_lib_wrote(
    doc: dict[str, Any], packages: list[Package]
) -> None:
    """SBOMs exported before this change compare equal when made again: the same keys, order,
    indent, component order, dependency graph and escapes as the library's outputter."""
    raw = json.dumps(doc).encode()
    prov = provenance_of(doc, raw)
    ours, theirs = _rendered(prov, packages, WHEN), _library(prov, packages, WHEN)
    assert ours.decode().splitlines() == theirs.decode().splitlines()  # a diff when not
    assert ours == theirs


def _status(n: int) -> str:
    return "\n".join(
        f"Package: lib{i}-pkg\nStatus: install ok installed\nPriority: optional\n"
        f"Architecture: amd64\nVersion: 1:{i}.0-1+b1\nDescription: p {i}\n line two\n"
        for i in range(n)
    )


def _image_of(tmp_path: Path, prov: Any, status: str = "") -> Path:
    root = tmp_path / "root"
    (root / "etc/k3env").mkdir(parents=True)
    (root / "etc/k3env/provenance.json").write_text(json.dumps(prov))
    if status:
        (root / "var/lib/dpkg").mkdir(parents=True)
        (root / "var/lib/dpkg/status").write_text(status)
    sqsh = tmp_path / "image.sqsh"
    subprocess.run(["mksquashfs", str(root), str(sqsh), "-noappend", "-quiet", "-no-progress"],
                   check=True, capture_output=True)  # fmt: skip
    return sqsh


@SQUASHFS_TOOLS
def test_an_image_of_20000_debian_packages_has_each_in_its_sbom_once(tmp_path: Path) -> None:
    """20,000 packages in dpkg's status, each in the SBOM once, with its dependency entry (the
    time it takes, linear and under 5 s, is benchmarks/bench_sbom.py's to measure)."""
    sqsh = _image_of(tmp_path, PROVENANCE, _status(20_000))
    with tempfile.TemporaryDirectory() as work:
        data = sbom(Squashfs(sqsh, QUIET, Path(work)))
    doc = json.loads(data)
    debs = [c for c in doc["components"] if c.get("purl", "").startswith("pkg:deb/")]
    assert len(debs) == 20_000 and len(doc["dependencies"]) == 20_000 + 7 + 1


@SQUASHFS_TOOLS
@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"pins": ["base.cuda"]}, 'its pins is a JSON array ["base.cuda"]'),
        ({"pins": {"dynamo": 7}}, 'its pins is a JSON object {"dynamo": 7}'),
        ({"components": "ai-dynamo"}, 'its components is a JSON string "ai-dynamo"'),
        ({"components": {"wheels": {"name": "x"}}}, "its components is a JSON object"),
        ({"components": {"wheels": [{"name": "x", "version": 1, "sha256": HEX}]}},
         "its components.wheels is a JSON array"),
        ({"components": {"wheels": ["ai-dynamo"]}}, "its components.wheels is a JSON array"),
        ({"inputs": {"a": 1}}, "its inputs is a JSON object"),
        ({"base": {"digest": ["sha256:x"]}}, "its base is a JSON object"),
        ({"patches": [{"name": "p", "status": "applied", "sha256": 5}]}, "its patches is"),
    ],
    ids=["pins-list", "pin-int", "components-str", "wheels-object", "wheel-version-int",
         "wheel-str", "inputs-object", "base-digest-list", "patch-sha-int"],
)  # fmt: skip
def test_provenance_fields_of_the_wrong_type_are_refused_naming_the_field(
    tmp_path: Path, change: dict[str, Any], says: str
) -> None:
    sqsh = _image_of(tmp_path, {**PROVENANCE, **change})
    with tempfile.TemporaryDirectory() as work, pytest.raises(ConfigError) as e:
        sbom(Squashfs(sqsh, QUIET, Path(work)))
    assert "/etc/k3env/provenance.json is not valid provenance (" in e.value.message
    assert says in e.value.message and "not as k3env writes it" in e.value.message
    assert e.value.where == str(sqsh) and e.value.return_code == 2


@SQUASHFS_TOOLS
@pytest.mark.parametrize(
    ("provenance", "says"),
    [
        ({**PROVENANCE, "pins": ["base.cuda"]}, "its pins is a JSON array"),
        ({**PROVENANCE, "components": "ai-dynamo"}, "its components is a JSON string"),
        (b'{"config": {}, "pins": ' + b"[" * 10_000 + b"]" * 10_000 + b"}",
         "JSON nested deeper than 16 levels; not read"),
        (b'{"config": {}, "inputs": NaN}', "not strict JSON"),
    ],
    ids=["pins-list", "components-str", "10000-deep", "nan"],
)  # fmt: skip
def test_export_check_of_such_an_image_says_so_and_exits_2(
    repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], provenance: Any, says: str
) -> None:
    from k3env.cli import main

    root = tmp_path / "img"
    (root / "etc/k3env").mkdir(parents=True)
    raw = provenance if isinstance(provenance, bytes) else json.dumps(provenance).encode()
    (root / "etc/k3env/provenance.json").write_bytes(raw)
    sqsh = tmp_path / "p.sqsh"
    subprocess.run(["mksquashfs", str(root), str(sqsh), "-noappend", "-quiet", "-no-progress"],
                   check=True, capture_output=True)  # fmt: skip
    assert main(["export", "--check", str(sqsh)]) == 2
    err = capsys.readouterr().err
    assert "is not valid provenance (" in err and says in err, err
    assert "Traceback" not in err


def test_a_provenance_document_given_as_a_mapping_is_typed_before_use() -> None:
    """``attest.statement`` takes a document too: read through the same typed reader."""
    from k3env.handoff.attest import statement

    said = json.loads(statement(Path("x.sqsh"), "e" * 64, PROVENANCE, "f" * 64))
    built = said["predicate"]["buildDefinition"]
    assert built["internalParameters"]["pins"] == PROVENANCE["pins"]
    assert built["externalParameters"]["lock"] == PROVENANCE["lock"]
    assert {"name": "ai-dynamo==1.6.1", "digest": {"sha256": HEX}} in built["resolvedDependencies"]
    with pytest.raises(ConfigError, match=r"its pins is a JSON array"):
        statement(Path("x.sqsh"), "e" * 64, {"pins": ["a"]}, "f" * 64)
