"""Signatures k3env makes and checks: ECDSA P-256 over SHA-256, keys in PEM (a PKCS#8 private
key, a SubjectPublicKeyInfo public key), the form `openssl` and `cosign verify-blob --key`
read. A blob's signature is written base64 (DER inside), as cosign writes one; an in-toto
statement is signed in a DSSE envelope (its PAE), as `cosign attest-blob` makes one.

cryptography is imported here only. A key cosign generated (``cosign generate-key-pair``:
an encrypted sigstore key) is not read: convert it, or make one with openssl (docs/sbom.md).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from k3env import jsontext
from k3env.errors import CheckFailed, ConfigError, K3envError
from k3env.files import read_input

INTOTO = "application/vnd.in-toto+json"
# An envelope and the statement in it are others' JSON: read within a budget of bytes and of
# nesting (k3env's statement nests 7 deep; the envelope 3), never parsed by recursion past it.
ENVELOPE_LIMIT = 16 << 20
ENVELOPE_DEPTH = 4
STATEMENT_DEPTH = 32
MAX_SIGNATURES = 16
ENVELOPE_FIX = "sign the export again (k3env export --sign-key KEY.pem), or fetch its files again"
KEY_FIX = (
    "make a key pair with openssl: `openssl ecparam -name prime256v1 -genkey -noout | openssl "
    "pkcs8 -topk8 -nocrypt -out k3env.key && openssl ec -in k3env.key -pubout -out k3env.pub`"
)


@dataclass(frozen=True)
class SigningKey:
    key: ec.EllipticCurvePrivateKey

    def sign(self, data: bytes) -> str:
        """The base64 of the DER ECDSA signature of ``data`` (cosign's blob signature)."""
        return base64.b64encode(self.key.sign(data, ec.ECDSA(hashes.SHA256()))).decode()


@dataclass(frozen=True)
class VerifyKey:
    key: ec.EllipticCurvePublicKey

    def verify(self, data: bytes, signature: str) -> bool:
        """Whether ``signature`` (base64 DER, as ``sign`` writes it) signs ``data``."""
        try:
            raw = base64.b64decode(signature.strip(), validate=True)
            self.key.verify(raw, data, ec.ECDSA(hashes.SHA256()))
        except (InvalidSignature, ValueError):
            return False
        return True


def _load(path: Path, what: str, load: Callable[[bytes], object], kind: type) -> Any:
    """The P-256 key of ``kind`` in the PEM file at ``path`` (``what``: as messages say it)."""
    data = read_input(path, limit=1 << 16)
    try:
        key = load(data)
    except (ValueError, TypeError, UnsupportedAlgorithm) as e:
        raise ConfigError(
            f"not a PEM {what} k3env can read ({str(e).splitlines()[0][:120]})",
            where=str(path),
            fix=KEY_FIX,
        ) from e
    if not isinstance(key, kind) or not isinstance(getattr(key, "curve", None), ec.SECP256R1):
        raise ConfigError(f"not an ECDSA P-256 {what}", where=str(path), fix=KEY_FIX)
    return key


def load_signing_key(path: Path) -> SigningKey:
    """A PEM PKCS#8 (or SEC1) P-256 private key, unencrypted."""
    load = partial(serialization.load_pem_private_key, password=None)
    return SigningKey(_load(path, "private key", load, ec.EllipticCurvePrivateKey))


def load_verify_key(path: Path) -> VerifyKey:
    """A PEM SubjectPublicKeyInfo P-256 public key (``-----BEGIN PUBLIC KEY-----``)."""
    load = serialization.load_pem_public_key
    return VerifyKey(_load(path, "public key", load, ec.EllipticCurvePublicKey))


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what an envelope's signature signs."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %b %d %b" % (len(kind), kind, len(payload), payload)


def envelope(key: SigningKey, payload: bytes, payload_type: str = INTOTO) -> bytes:
    """A DSSE envelope of ``payload`` signed by ``key`` (one JSON line)."""
    doc = {
        "payloadType": payload_type,
        "payload": base64.b64encode(payload).decode(),
        "signatures": [{"keyid": "", "sig": key.sign(pae(payload_type, payload))}],
    }
    return (jsontext.dumps(doc, compact=True) + "\n").encode()


def open_envelope(
    key: VerifyKey | None, data: bytes, *, where: str = "the DSSE envelope"
) -> tuple[dict[str, Any], str]:
    """The payload of a DSSE envelope (a JSON object), and how its signature stands:
    ``signed``, or ``unsigned`` (no key given: not checked). Refused (``CheckFailed`` naming
    why): not an envelope, its payload not a JSON object, either over its budget of bytes or
    nesting, or (with a key) no signature in it the key's."""
    try:
        doc = jsontext.loads(data, where=where, limit=ENVELOPE_LIMIT, max_depth=ENVELOPE_DEPTH,
                             error=CheckFailed)  # fmt: skip
        kind = jsontext.field(doc, "payloadType", str, where=where, error=CheckFailed)
        encoded = jsontext.field(doc, "payload", str, where=where, error=CheckFailed)
        listed = jsontext.field(doc, "signatures", list, where=where, error=CheckFailed)
        sigs = _signatures(listed, where)
        payload = base64.b64decode(encoded, validate=True)
    except binascii.Error as e:
        raise CheckFailed(f"not a DSSE envelope (its payload is not base64: {e})", where=where,
                          fix=ENVELOPE_FIX) from e  # fmt: skip
    except K3envError as e:
        raise CheckFailed(f"not a DSSE envelope ({e.message})", where=where,
                          fix=ENVELOPE_FIX) from e  # fmt: skip
    if kind != INTOTO:
        raise CheckFailed(f"payloadType {kind[:80]!r}, not {INTOTO}", where=where,
                          fix=ENVELOPE_FIX)  # fmt: skip
    if key is not None and not any(key.verify(pae(kind, payload), s) for s in sigs):
        raise CheckFailed("no signature in the envelope is the given key's", where=where,
                          fix="check it with the public key of the key that signed it")  # fmt: skip
    try:
        statement = jsontext.loads(payload, where=where, limit=ENVELOPE_LIMIT,
                                   max_depth=STATEMENT_DEPTH, error=CheckFailed)  # fmt: skip
    except K3envError as e:
        raise CheckFailed(f"its payload is not an in-toto statement k3env reads ({e.message})",
                          where=where, fix=ENVELOPE_FIX) from e  # fmt: skip
    return statement, "unsigned" if key is None else "signed"


def _signatures(listed: list[Any], where: str) -> list[str]:
    """The ``sig`` of each of an envelope's first ``MAX_SIGNATURES`` signatures."""
    sigs = []
    for i, entry in enumerate(listed[:MAX_SIGNATURES]):
        sig = entry.get("sig") if isinstance(entry, dict) else None
        if not isinstance(sig, str):
            raise CheckFailed(f"signatures[{i}] is not an object with a string 'sig'", where=where)
        sigs.append(sig)
    return sigs
