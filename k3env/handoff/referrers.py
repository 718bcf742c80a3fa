"""An image's SBOM and signed provenance attached to its pushed manifest as OCI referrers.

Each file becomes an OCI artifact manifest (image-spec 1.1: ``artifactType``, the empty
config, the file as its one layer, ``subject`` the pushed manifest), stored by digest. A
registry with the referrers API lists it by itself; one without it (distribution 2.8) gets
the spec's fallback: the tag ``sha256-<hex of the subject>`` names an OCI index of the
referrers, merged with what it held (``oras discover``, ``regctl artifact list`` and cosign
read either). Nothing is tagged but that index; no tag moves but that one.

What that tag held is others' data: each entry is kept only if it is a well-formed descriptor
(a media type, a digest in the OCI grammar, a size that is a non-negative integer); anything
else is dropped with a note naming it, never published again. A NaN or an infinity (not JSON,
but a registry that does not parse what it stores keeps it) makes its entry malformed, not the
whole index unreadable: one stranger's bad entry must not stop ours being listed, nor drop the
good entries of others.
"""

from __future__ import annotations

import json
import math
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from k3env import jsontext
from k3env.engine import registry
from k3env.errors import EngineError
from k3env.hashing import digest_hex, file_sha256, sha256_digest
from k3env.image.records import Pushed
from k3env.log import Log
from k3env.quoting import one_line

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
EMPTY_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY = b"{}"
MAX_REFERRERS = 1000  # descriptors kept in a fallback index (others' entries are bounded)
# The image spec's descriptor grammars: a media type (RFC 6838) and a digest of a registered
# algorithm (sha256, sha512).
MEDIA_TYPE = re.compile(
    r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}"
)
DIGEST = re.compile(r"sha256:[0-9a-f]{64}|sha512:[0-9a-f]{128}")
MAX_SIZE = (1 << 63) - 1  # an int64, as the spec's size is


@dataclass(frozen=True, kw_only=True)
class Artifact:
    path: Path
    artifact_type: str  # e.g. application/vnd.cyclonedx+json
    media_type: str  # the file's own type


def artifact_manifest(artifact: Artifact, subject: dict[str, Any]) -> bytes:
    """The manifest of one attached file (its bytes are a function of the file and subject)."""
    return jsontext.canonical(
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
    what it held kept (well-formed descriptors only, the rest dropped with a note), ours
    added once."""
    tag = f"sha256-{digest_hex(subject)}"
    held = registry.tagged_index(repository, tag)
    where = f"{repository}:{tag}"
    ours = {s["digest"] for s in stored}
    keep: list[dict[str, Any]] = []
    for i, entry in enumerate(_held_entries(held, where) if held else []):
        why = _malformed(entry) if i < MAX_REFERRERS else f"past the first {MAX_REFERRERS}"
        if why is None and entry["digest"] in {k["digest"] for k in keep}:
            why = "a second entry for the same digest"
        if why is not None:
            log.info(f"    {where}: entry {i} dropped ({why}): {_shown(entry)}")
        elif entry["digest"] not in ours:  # ours: replaced by what we just stored
            keep.append(entry)
    doc = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": keep + stored}
    index = jsontext.canonical(doc)
    registry.put_manifest(repository, tag, index, OCI_INDEX)
    log.info(f"    {repository}:{tag}: {len(keep) + len(stored)} referrer(s) (the registry has no "
             "referrers API: the spec's fallback tag)")  # fmt: skip


class _NotFinite:
    """Where the held index had a NaN or an infinity: a value no descriptor field can take."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _number(text: str) -> float | _NotFinite:
    value = float(text)
    return value if math.isfinite(value) else _NotFinite(text)


def _held_entries(body: bytes, where: str) -> list[Any]:
    """The ``manifests`` of the index the fallback tag holds, each entry as it is (checked by
    the caller). Read as ``jsontext`` reads (the size and nesting caps), but a non-finite
    number is kept as a marker in its entry rather than refusing the whole index; an index
    that is not JSON, or not an OCI index, is an error: it is not ours to replace."""
    fix = (f"look at it (regctl manifest get {where}); if nothing else uses it, delete the tag "
           "and attach again")  # fmt: skip
    if len(body) > registry.MAX_MANIFEST:
        raise EngineError(f"the index is {len(body)} bytes, over {registry.MAX_MANIFEST}",
                          where=where, fix=fix)  # fmt: skip
    try:
        # The one read that is not jsontext.loads: it refuses the whole document for one NaN.
        doc = json.loads(body, parse_constant=_NotFinite, parse_float=_number)
        levels = jsontext.depth(doc)
    except (ValueError, RecursionError) as e:  # not JSON, not UTF-8, nested past recursion
        raise EngineError(f"the referrers index the tag holds is not JSON ({str(e)[:200]})",
                          where=where, fix=fix) from e  # fmt: skip
    if levels > jsontext.MAX_DEPTH:
        raise EngineError(f"the referrers index the tag holds nests {levels} levels deep",
                          where=where, fix=fix)  # fmt: skip
    # The image spec: an index's mediaType SHOULD be given (absent: taken as an index).
    media = doc.get("mediaType", OCI_INDEX) if isinstance(doc, dict) else None
    if media != OCI_INDEX or not isinstance(doc.get("manifests"), list):
        what = one_line(str(media))[:80] if isinstance(media, str) else "JSON of another shape"
        raise EngineError(f"the tag names a {what}, not an OCI index of referrers",
                          where=where, fix=fix)  # fmt: skip
    return list(doc["manifests"])


def _malformed(entry: Any) -> str | None:
    """Why ``entry`` is not a descriptor k3env may publish again, or None."""
    if not isinstance(entry, dict):
        return "not an object"
    for key in ("mediaType", "digest", "size"):
        if key not in entry:
            return f"no {key}"
    media, digest, size = entry["mediaType"], entry["digest"], entry["size"]
    if not isinstance(media, str) or not MEDIA_TYPE.fullmatch(media):
        return "mediaType is not a media type"
    if not isinstance(digest, str) or not DIGEST.fullmatch(digest):
        return "digest is not a digest (sha256:<64 hex> or sha512:<128 hex>)"
    if isinstance(size, _NotFinite) or (isinstance(size, float) and not math.isfinite(size)):
        return f"size is {size!r}, not a finite number"
    if not isinstance(size, int) or isinstance(size, bool):
        return "size is not an integer"
    if not 0 <= size <= MAX_SIZE:
        return f"size {size} is out of range"
    artifact = entry.get("artifactType", "")
    if not isinstance(artifact, str) or (artifact and not MEDIA_TYPE.fullmatch(artifact)):
        return "artifactType is not a media type"
    try:
        jsontext.dumps(entry)
    except (ValueError, TypeError):  # a non-finite number elsewhere in it
        return "a NaN or an infinity in it"
    return None


def _shown(entry: Any) -> str:
    """``entry`` on one line, short, its control characters escaped."""
    return one_line(repr(entry))[:200]
