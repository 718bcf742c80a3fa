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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from k3env import __version__, jsontext
from k3env.errors import CheckFailed, ConfigError, K3envError
from k3env.files import read_input, write_atomic
from k3env.handoff.provenance import Pinned, Provenance, provenance_of, read_provenance
from k3env.handoff.sbom import document as sbom_document
from k3env.handoff.squashfs import Squashfs
from k3env.hashing import digest_hex, file_sha256, sha256_digest
from k3env.image.build import BUILD_FORMAT
from k3env.signing import INTOTO, SigningKey, VerifyKey, envelope, open_envelope
from k3env.verdict import FAILED, NOT_CHECKED, PASSED, Gate

SBOM_SUFFIX = ".cdx.json"
SIG_SUFFIX = ".cdx.json.sig"
STATEMENT_SUFFIX = ".intoto.json"
CYCLONEDX = "application/vnd.cyclonedx+json"
BUILD_TYPE = f"urn:k3env:build-format:{BUILD_FORMAT}"
# What is read beside a file (others may have written it): an SBOM grows with the packages
# (~550 bytes each; 200,000 at most), a signature is ~100 bytes, a statement a few KiB.
SBOM_LIMIT = 128 << 20
SIG_LIMIT = 64 << 10
STATEMENT_LIMIT = 16 << 20


def beside(sqsh: Path, suffix: str) -> Path:
    return sqsh.with_name(sqsh.name + suffix)


def _dependencies(prov: Provenance) -> list[dict[str, Any]]:
    """The image's inputs by sha256, as its provenance names them."""
    out: list[dict[str, Any]] = []
    base = prov.base
    if base is not None and base.digest is not None and base.digest.startswith("sha256:"):
        out.append({"name": f"base {base.name}", "digest": {"sha256": digest_hex(base.digest)}})
    for w in prov.wheels:
        out.append({"name": f"{w.name}=={w.version}", "digest": {"sha256": w.sha256}})
    for p in prov.patches:
        out.append({"name": f"container patch {p.name}", "digest": {"sha256": str(p.sha256)}})
    return out


def _pinned(value: Pinned | None) -> dict[str, str | None] | None:
    return None if value is None else {"path": value.path, "sha256": value.sha256}


def statement(
    sqsh: Path, sqsh_sha256: str, prov: Provenance | Mapping[str, Any], sbom_sha256: str
) -> bytes:
    """The in-toto statement of the export at ``sqsh`` (SLSA provenance v1); ``prov``: the
    image's provenance (a document is read through its typed reader first)."""
    if not isinstance(prov, Provenance):
        prov = provenance_of(prov)
    doc = {
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": sqsh.name, "digest": {"sha256": sqsh_sha256}}],
        "predicateType": "https://slsa.dev/provenance/v1",
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {
                    "image": prov.image,
                    "lock": _pinned(prov.lock),
                    "spec": _pinned(prov.spec),
                },
                "internalParameters": {"inputs": prov.inputs, "pins": dict(prov.pins)},
                "resolvedDependencies": _dependencies(prov),
            },
            "runDetails": {
                "builder": {"id": f"urn:k3env:{__version__}"},
                "metadata": {"invocationId": str(prov.inputs)},
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
    return jsontext.canonical(doc)


def attest(sqsh: Path, sqsh_sha256: str, fs: Squashfs, key: SigningKey) -> list[Path]:
    """Write the SBOM, its signature and the signed statement beside ``sqsh``."""
    document = sbom_document(fs).data
    prov = read_provenance(fs)
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


def _read(path: Path, limit: int) -> tuple[bytes | None, str | None]:
    """(the bytes of the file at ``path``, None when there is none; why it was not read: not
    a regular file, over ``limit``, unreadable)."""
    if not (path.exists() or path.is_symlink()):
        return None, None
    try:
        size = path.stat().st_size  # a 1 GiB file is refused unread (read_input holds, too)
        if size > limit:
            return None, f"it has {size:,} bytes, more than the {limit >> 20} MiB read there"
        return read_input(path, limit=limit), None
    except OSError as e:
        return None, f"cannot read it: {e.strerror}"
    except ConfigError as e:
        return None, e.message


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
    document, refused = _read(beside(sqsh, SBOM_SUFFIX), SBOM_LIMIT)
    if document is None:
        return [_no_sbom(sqsh, key, refused)]
    again = sbom_document(fs)
    made = (
        Gate(name="sbom", status=PASSED,
             detail=f"made again from the file, byte-identical ({again.components} components)")
        if again.data == document
        else Gate(name="sbom", status=FAILED,
                  detail="differs from the SBOM made from the file: the file or its SBOM changed")
    )  # fmt: skip
    return [made, *signatures(sqsh, document, key, subject)]


def check_signed(sqsh: Path, key: VerifyKey | None, subject: Subject) -> list[Gate]:
    """The gates of the files beside ``sqsh`` without reading the image: the SBOM is there
    (not made again from the file: ``export --check`` does), both signatures, and the
    statement naming ``subject`` and this SBOM."""
    document, refused = _read(beside(sqsh, SBOM_SUFFIX), SBOM_LIMIT)
    if document is None:
        return [_no_sbom(sqsh, key, refused)]
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


def _no_sbom(sqsh: Path, key: VerifyKey | None, refused: str | None) -> Gate:
    name = beside(sqsh, SBOM_SUFFIX).name
    if refused:
        return Gate(name="sbom", status=FAILED, detail=f"{name} not read: {refused}")
    return Gate(name="sbom", status=_absent(key), detail=f"no SBOM beside the file ({name})")


def _signature(path: Path, document: bytes, key: VerifyKey | None) -> Gate:
    if key is None:
        return Gate(name="sbom signature", status=NOT_CHECKED, detail="no --key given")
    sig, refused = _read(path, SIG_LIMIT)
    if refused:
        return Gate(name="sbom signature", status=FAILED, detail=f"{path.name} not read: {refused}")
    if sig is None:
        return Gate(name="sbom signature", status=FAILED, detail=f"no signature ({path.name})")
    if key.verify(document, sig.decode(errors="replace")):
        return Gate(name="sbom signature", status=PASSED, detail="signed by the given key")
    return Gate(name="sbom signature", status=FAILED, detail="not the given key's signature")


@dataclass(frozen=True, kw_only=True)
class Said:
    """What k3env reads of an in-toto statement: the sha256 of its subject and of the SBOM
    it names as its byproduct."""

    subject: str
    sbom: str


SUBJECT = ("subject", 0, "digest", "sha256")
BYPRODUCT = ("predicate", "runDetails", "byproducts", 0, "digest", "sha256")


def said(statement: Any) -> Said:
    """The fields k3env reads of a statement, each checked to be there and a string; else
    CheckFailed naming the first that is not."""
    return Said(subject=_at(statement, SUBJECT), sbom=_at(statement, BYPRODUCT))


def _at(doc: Any, path: tuple[str | int, ...]) -> str:
    node = doc
    for depth, step in enumerate(path, 1):
        node = _child(node, step)
        if node is _ABSENT:
            _no_string(path[:depth])
    if not isinstance(node, str):
        _no_string(path)
    return node


_ABSENT = object()


def _child(node: Any, step: str | int) -> Any:
    """``node[step]`` when ``node`` is an object holding key ``step`` or an array that long,
    else ``_ABSENT``."""
    if isinstance(step, str):
        return node.get(step, _ABSENT) if isinstance(node, dict) else _ABSENT
    return node[step] if isinstance(node, list) and len(node) > step else _ABSENT


def _no_string(path: tuple[str | int, ...]) -> NoReturn:
    shown = "".join(f"[{s}]" if isinstance(s, int) else f".{s}" for s in path).lstrip(".")
    raise CheckFailed(f"its statement has no string at {shown}",
                      fix="sign the export again: k3env export --sign-key KEY.pem")  # fmt: skip


def _statement(sqsh: Path, document: bytes, key: VerifyKey | None, subject: Subject) -> Gate:
    name = "provenance"
    path = beside(sqsh, STATEMENT_SUFFIX)
    data, refused = _read(path, STATEMENT_LIMIT)
    if refused:
        return Gate(name=name, status=FAILED, detail=f"{path.name} not read: {refused}")
    if data is None:
        return Gate(name=name, status=_absent(key), detail=f"no statement ({path.name})")
    try:
        statement, signed = open_envelope(key, data, where=path.name)
        named = said(statement)
    except K3envError as e:
        return Gate(name=name, status=FAILED, detail=f"refused: {e.message[:300]}")
    if named.subject != subject.sha256():
        return Gate(name=name, status=FAILED, detail=subject.differs)
    if named.sbom != digest_hex(sha256_digest(document)):
        return Gate(name=name, status=FAILED, detail="it names another SBOM (sha256 differs)")
    if signed != "signed":
        return Gate(
            name=name,
            status=NOT_CHECKED,
            detail="subject and SBOM match; signature not checked: no --key given",
        )
    detail = f"signed by the given key; its subject is {subject.named}, its SBOM this one"
    return Gate(name=name, status=PASSED, detail=detail)
