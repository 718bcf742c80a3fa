"""Signatures k3env makes and checks: ECDSA P-256 over SHA-256, keys in PEM (a PKCS#8 private
key, a SubjectPublicKeyInfo public key), the form `openssl` and `cosign verify-blob --key`
read. A blob's signature is written base64 (DER inside), as cosign writes one; an in-toto
statement is signed in a DSSE envelope (its PAE), as `cosign attest-blob` makes one.

cryptography is imported here only. A key cosign generated (``cosign generate-key-pair``:
an encrypted sigstore key) is not read: convert it, or make one with openssl (README).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from k3env import jsontext
from k3env.errors import ConfigError
from k3env.files import read_input

INTOTO = "application/vnd.in-toto+json"
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


def open_envelope(key: VerifyKey | None, data: bytes) -> tuple[Any, str]:
    """The payload of a DSSE envelope (parsed JSON), and how its signature stands: ``signed``,
    ``unsigned`` (no key given: not checked), or why it was refused (``ValueError``)."""
    try:
        doc = json.loads(data[: 64 << 20])
        kind, payload = str(doc["payloadType"]), base64.b64decode(doc["payload"], validate=True)
        sigs = [str(s["sig"]) for s in doc["signatures"][:16]]
        statement = json.loads(payload)
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"not a DSSE envelope ({type(e).__name__}: {str(e)[:120]})") from e
    if kind != INTOTO:
        raise ValueError(f"payloadType {kind[:80]!r}, not {INTOTO}")
    if key is None:
        return statement, "unsigned"
    if not any(key.verify(pae(kind, payload), s) for s in sigs):
        raise ValueError("no signature in the envelope is the given key's")
    return statement, "signed"
