"""An image's SBOM and signed provenance attached to its pushed manifest as OCI referrers.

Each file becomes an OCI artifact manifest (image-spec 1.1: ``artifactType``, the empty
config, the file as its one layer, ``subject`` the pushed manifest), stored by digest. A
registry with the referrers API lists it by itself; one without it (distribution 2.8) gets
the spec's fallback: the tag ``sha256-<hex of the subject>`` names an OCI index of the
referrers, merged with what it held (``oras discover``, ``regctl artifact list`` and cosign
read either). Nothing is tagged but that index; no tag moves but that one.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from k3env.engine import registry
from k3env.handoff.push import Pushed
from k3env.hashing import digest_hex, file_sha256, sha256_digest
from k3env.log import Log

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
EMPTY_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY = b"{}"
MAX_REFERRERS = 1000  # descriptors kept in a fallback index (others' entries are bounded)


@dataclass(frozen=True, kw_only=True)
class Artifact:
    path: Path
    artifact_type: str  # e.g. application/vnd.cyclonedx+json
    media_type: str  # the file's own type


def _json(doc: object) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def artifact_manifest(artifact: Artifact, subject: dict[str, Any]) -> bytes:
    """The manifest of one attached file (its bytes are a function of the file and subject)."""
    return _json(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "artifactType": artifact.artifact_type,
            "config": {"mediaType": EMPTY_TYPE, "digest": sha256_digest(EMPTY), "size": 2},
            "layers": [
                {
                    "mediaType": artifact.media_type,
                    "digest": "sha256:" + file_sha256(artifact.path),
                    "size": artifact.path.stat().st_size,
                    "annotations": {"org.opencontainers.image.title": artifact.path.name},
                }
            ],
            "subject": subject,
        }
    )


def attach(pushed: Pushed, artifacts: Sequence[Artifact], log: Log) -> list[dict[str, Any]]:
    """Store each artifact as a referrer of ``pushed``'s manifest; the descriptors stored."""
    repository = pushed.reference.rsplit(":", 1)[0]
    digest, media_type, body = registry.get_manifest(repository, pushed.digest)
    subject = {"mediaType": media_type or OCI_MANIFEST, "digest": digest, "size": len(body)}
    stored = []
    with tempfile.TemporaryDirectory(prefix="k3env-referrers-") as tmp:
        empty = Path(tmp) / "empty"
        empty.write_bytes(EMPTY)
        if not registry.blob_exists(repository, sha256_digest(EMPTY)):
            registry.put_blob(repository, sha256_digest(EMPTY), empty)
        for a in artifacts:
            blob = "sha256:" + file_sha256(a.path)
            if not registry.blob_exists(repository, blob):
                registry.put_blob(repository, blob, a.path)
            manifest = artifact_manifest(a, subject)
            at = registry.put_manifest(repository, sha256_digest(manifest), manifest, OCI_MANIFEST)
            stored.append({"mediaType": OCI_MANIFEST, "digest": at, "size": len(manifest),
                           "artifactType": a.artifact_type})  # fmt: skip
            log.info(f"    {a.path.name} -> {repository}@{at} (referrer of {digest[:19]})")
    if registry.referrers(repository, digest) is None:
        _fallback(repository, digest, stored, log)
    return stored


def _fallback(repository: str, subject: str, stored: list[dict[str, Any]], log: Log) -> None:
    """The referrers tag schema: ``sha256-<hex>`` names an index of the subject's referrers,
    what it held kept (well-formed descriptors only), ours added once."""
    tag = f"sha256-{digest_hex(subject)}"
    held = registry.tagged_index(repository, tag)
    old = json.loads(held).get("manifests") if held else []
    keep = [
        m
        for m in (old if isinstance(old, list) else [])[:MAX_REFERRERS]
        if isinstance(m, dict)
        and isinstance(m.get("digest"), str)
        and registry.DIGEST.fullmatch(m["digest"])
        and m["digest"] not in {s["digest"] for s in stored}
    ]
    index = _json({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": keep + stored})
    registry.put_manifest(repository, tag, index, OCI_INDEX)
    log.info(f"    {repository}:{tag}: {len(keep) + len(stored)} referrer(s) (the registry has no "
             "referrers API: the spec's fallback tag)")  # fmt: skip
