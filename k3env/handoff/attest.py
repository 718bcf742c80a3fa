"""An export's SBOM and signed provenance, written beside the ``.sqsh`` and checked there.

Beside ``NAME.sqsh`` (the files travel with it to the cluster):

- ``NAME.sqsh.cdx.json``: the image's CycloneDX SBOM (``handoff.sbom``, made from the file);
- ``NAME.sqsh.cdx.json.sig``: its signature (base64 ECDSA P-256, as ``cosign sign-blob``
  writes one; ``openssl dgst -sha256 -verify`` reads it decoded);
- ``NAME.sqsh.intoto.json``: an in-toto Statement v1 with a SLSA provenance v1 predicate, in a
  signed DSSE envelope: its subject the ``.sqsh`` by sha256, its inputs the image's own
  provenance (lock, spec, base by digest, pinned wheels and patches by sha256), the SBOM a
  byproduct by sha256.

``check`` makes the SBOM again from the file and compares bytes (the files match the SBOM),
and checks both signatures with the given public key; without a key they are not checked.
``check_signed`` checks the signatures alone, the statement's subject against the export's
recorded sha256 (``k3env verify``: a multi-GB file is not read there).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from k3env import __version__
from k3env.files import write_atomic
from k3env.handoff.sbom import sbom
from k3env.handoff.squashfs_check import Squashfs, _provenance
from k3env.hashing import digest_hex, file_sha256, sha256_digest
from k3env.image.build import BUILD_FORMAT
from k3env.signing import INTOTO, SigningKey, VerifyKey, envelope, open_envelope
from k3env.verdict import FAILED, NOT_CHECKED, PASSED, Gate

SBOM_SUFFIX = ".cdx.json"
SIG_SUFFIX = ".cdx.json.sig"
STATEMENT_SUFFIX = ".intoto.json"
CYCLONEDX = "application/vnd.cyclonedx+json"
BUILD_TYPE = f"urn:k3env:build-format:{BUILD_FORMAT}"


def beside(sqsh: Path, suffix: str) -> Path:
    return sqsh.with_name(sqsh.name + suffix)


def _dependencies(prov: dict[str, Any]) -> list[dict[str, Any]]:
    """The image's inputs by sha256, as its provenance names them."""
    base = prov.get("base") or {}
    out: list[dict[str, Any]] = []
    if isinstance(base.get("digest"), str) and base["digest"].startswith("sha256:"):
        out.append(
            {"name": f"base {base.get('name')}", "digest": {"sha256": digest_hex(base["digest"])}}
        )
    for w in (prov.get("components") or {}).get("wheels") or []:
        out.append(
            {
                "name": f"{w.get('name')}=={w.get('version')}",
                "digest": {"sha256": str(w.get("sha256"))},
            }
        )
    for p in prov.get("patches") or []:
        out.append(
            {"name": f"container patch {p.get('name')}", "digest": {"sha256": str(p.get("sha256"))}}
        )
    return out


def statement(sqsh: Path, sqsh_sha256: str, prov: dict[str, Any], sbom_sha256: str) -> bytes:
    """The in-toto statement of the export at ``sqsh`` (SLSA provenance v1)."""
    doc = {
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": sqsh.name, "digest": {"sha256": sqsh_sha256}}],
        "predicateType": "https://slsa.dev/provenance/v1",
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {
                    "image": prov.get("image"),
                    "lock": prov.get("lock"),
                    "spec": prov.get("spec"),
                },
                "internalParameters": {"inputs": prov.get("inputs"), "pins": prov.get("pins")},
                "resolvedDependencies": _dependencies(prov),
            },
            "runDetails": {
                "builder": {"id": f"urn:k3env:{__version__}"},
                "metadata": {"invocationId": str(prov.get("inputs"))},
                "byproducts": [
                    {
                        "name": beside(sqsh, SBOM_SUFFIX).name,
                        "mediaType": CYCLONEDX,
                        "digest": {"sha256": sbom_sha256},
                    }
                ],
            },
        },
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def attest(sqsh: Path, sqsh_sha256: str, fs: Squashfs, key: SigningKey) -> list[Path]:
    """Write the SBOM, its signature and the signed statement beside ``sqsh``."""
    document = sbom(fs)
    prov, _raw = _provenance(fs)
    sbom_sha = digest_hex(sha256_digest(document))
    said = statement(sqsh, sqsh_sha256, prov, sbom_sha)
    written = []
    for suffix, data in (
        (SBOM_SUFFIX, document),
        (SIG_SUFFIX, (key.sign(document) + "\n").encode()),
        (STATEMENT_SUFFIX, envelope(key, said, INTOTO)),
    ):
        write_atomic(beside(sqsh, suffix), data)
        written.append(beside(sqsh, suffix))
    return written


def _read(path: Path) -> bytes | None:
    from k3env.errors import ConfigError
    from k3env.files import read_input

    try:
        return read_input(path, limit=256 << 20) if path.exists() or path.is_symlink() else None
    except ConfigError:
        return None


@dataclass(frozen=True, kw_only=True)
class Subject:
    """What the statement's subject must be: the ``.sqsh``'s sha256, asked for only when a
    statement is there to compare (``export --check`` hashes the file then, once), and how
    the gate names it."""

    sha256: Callable[[], str]
    named: str = "this file"
    differs: str = "its subject is another file (sha256 differs)"


def hashed(sqsh: Path) -> Subject:
    """The subject as the file's own bytes give it: hashed when first asked, then kept."""
    return Subject(sha256=functools.cache(lambda: file_sha256(sqsh)))


def recorded(sha256: str) -> Subject:
    """The subject as the export's record gives it (the file not hashed again: ``verify``)."""
    return Subject(
        sha256=lambda: sha256,
        named="the export's recorded sha256 (the file's own bytes: k3env export --check)",
        differs="its subject is not the export's recorded sha256 (another file)",
    )


def check(sqsh: Path, fs: Squashfs, key: VerifyKey | None, subject: Subject) -> list[Gate]:
    """The gates of the SBOM and provenance beside ``sqsh``: missing ones are not checked
    without a key and failed with one (a key says they must be there)."""
    document = _read(beside(sqsh, SBOM_SUFFIX))
    if document is None:
        return [_no_sbom(sqsh, key)]
    again = sbom(fs)
    count = len(json.loads(again).get("components") or [])
    made = (
        Gate(name="sbom", status=PASSED,
             detail=f"made again from the file, byte-identical ({count} components)")
        if again == document
        else Gate(name="sbom", status=FAILED,
                  detail="differs from the SBOM made from the file: the file or its SBOM changed")
    )  # fmt: skip
    return [made, *signatures(sqsh, document, key, subject)]


def check_signed(sqsh: Path, key: VerifyKey | None, subject: Subject) -> list[Gate]:
    """The gates of the files beside ``sqsh`` without reading the image: the SBOM is there
    (not made again from the file: ``export --check`` does), both signatures, and the
    statement naming ``subject`` and this SBOM."""
    document = _read(beside(sqsh, SBOM_SUFFIX))
    if document is None:
        return [_no_sbom(sqsh, key)]
    there = Gate(name="sbom", status=NOT_CHECKED, detail=(
        f"{beside(sqsh, SBOM_SUFFIX).name} is there ({len(document)} bytes); not made again "
        f"from the image here: k3env export --check {sqsh} --key PUB.pem"))  # fmt: skip
    return [there, *signatures(sqsh, document, key, subject)]


def signatures(sqsh: Path, document: bytes, key: VerifyKey | None, subject: Subject) -> list[Gate]:
    """The SBOM's signature and the signed statement beside ``sqsh`` (``document``: the SBOM
    read there)."""
    return [
        _signature(beside(sqsh, SIG_SUFFIX), document, key),
        _statement(sqsh, document, key, subject),
    ]


def _absent(key: VerifyKey | None) -> str:
    """A missing file's status: failed with a key (it says they must be there), else not
    checked."""
    return FAILED if key is not None else NOT_CHECKED


def _no_sbom(sqsh: Path, key: VerifyKey | None) -> Gate:
    why = f"no SBOM beside the file ({beside(sqsh, SBOM_SUFFIX).name})"
    return Gate(name="sbom", status=_absent(key), detail=why)


def _signature(path: Path, document: bytes, key: VerifyKey | None) -> Gate:
    if key is None:
        return Gate(name="sbom signature", status=NOT_CHECKED, detail="no --key given")
    sig = _read(path)
    if sig is None:
        return Gate(name="sbom signature", status=FAILED, detail=f"no signature ({path.name})")
    if key.verify(document, sig.decode(errors="replace")):
        return Gate(name="sbom signature", status=PASSED, detail="signed by the given key")
    return Gate(name="sbom signature", status=FAILED, detail="not the given key's signature")


def _statement(sqsh: Path, document: bytes, key: VerifyKey | None, subject: Subject) -> Gate:
    name = "provenance"
    data = _read(beside(sqsh, STATEMENT_SUFFIX))
    if data is None:
        why = f"no statement ({beside(sqsh, STATEMENT_SUFFIX).name})"
        return Gate(name=name, status=_absent(key), detail=why)
    try:
        said, signed = open_envelope(key, data)
        named = said["subject"][0]["digest"]["sha256"]
        byproduct = said["predicate"]["runDetails"]["byproducts"][0]["digest"]["sha256"]
    except (ValueError, KeyError, IndexError, TypeError) as e:
        return Gate(name=name, status=FAILED, detail=f"refused: {str(e)[:200]}")
    if named != subject.sha256():
        return Gate(name=name, status=FAILED, detail=subject.differs)
    if byproduct != digest_hex(sha256_digest(document)):
        return Gate(name=name, status=FAILED, detail="it names another SBOM (sha256 differs)")
    if signed != "signed":
        return Gate(
            name=name,
            status=NOT_CHECKED,
            detail="subject and SBOM match; signature not checked: no --key given",
        )
    detail = f"signed by the given key; its subject is {subject.named}, its SBOM this one"
    return Gate(name=name, status=PASSED, detail=detail)
