"""Every record k3env keeps in its state directory: one frozen dataclass per kind, read and
written here only, under its kind's directory and a content key (an image ID, a hash).

A record is k3env's own file, read as untrusted all the same: a regular file within a size
bound, strict JSON (``jsontext``), each field of its dataclass's type. One that is not is an
error naming the file and what was wrong, never taken as missing. ``shipped`` and
``shipped_as`` are the one way to find what k3env shipped of an image (its push by manifest
digest, its ``.sqsh`` export), from the image or from the name a recipe gives it.
"""

from __future__ import annotations

import dataclasses
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar, get_args, get_origin, get_type_hints

from k3env import jsontext
from k3env.config.pins import Lock
from k3env.config.shapes import DEFAULT_PLATFORM
from k3env.config.spec import ImageSpec
from k3env.errors import StateError
from k3env.hashing import canonical_sha256, digest_hex
from k3env.state import FIX, State

R = TypeVar("R", bound="Record")


class Record:
    """A record kind: ``KIND`` names its directory; its dataclass fields are the keys of its
    JSON object, or ``WHOLE`` names the one field that is the whole document."""

    KIND: ClassVar[str]
    WHOLE: ClassVar[str] = ""

    def as_json(self) -> Any:
        doc = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]
        return doc[self.WHOLE] if self.WHOLE else doc

    @classmethod
    def from_json(cls: type[R], doc: Any, where: str) -> R:
        doc = {cls.WHOLE: doc} if cls.WHOLE else doc
        hints = get_type_hints(cls)
        values = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if f.name in doc or f.default is dataclasses.MISSING:
                values[f.name] = _typed(doc, f.name, hints[f.name], where)
        return cls(**values)


def _typed(doc: dict[str, Any], key: str, hint: Any, where: str) -> Any:
    """``doc[key]`` checked against ``hint`` (str, int, bool, tuple[str, ...], dict, list, or
    one of those or None); a JSON array read as a tuple."""
    if isinstance(hint, types.UnionType):
        if doc.get(key) is None and type(None) in get_args(hint):
            return jsontext.field(doc, key, type(None), where=where)
        (hint,) = (a for a in get_args(hint) if a is not type(None))
    origin, args = get_origin(hint) or hint, get_args(hint)
    value = jsontext.field(doc, key, list if origin is tuple else origin, where=where)
    if origin is tuple:
        for item in value:
            if not isinstance(item, args[0]):
                raise StateError(f"{key!r} holds {item!r}, not a {args[0].__name__}",
                                 where=where, fix=FIX)  # fmt: skip
        return tuple(value)
    return value


def _load(state: State, cls: type[R], name: str) -> R | None:
    doc = state.read_json(cls.KIND, name, expect=object if cls.WHOLE else dict)
    return None if doc is None else cls.from_json(doc, str(state.path(cls.KIND, name)))


def read(state: State, cls: type[R], key: str) -> R | None:
    """The ``cls`` record under ``key``; None when there is none."""
    return _load(state, cls, f"{digest_hex(key)}.json")


def write(state: State, record: Record, key: str) -> None:
    """``record`` under ``key``, atomically (a reader sees the old record or the new)."""
    state.write_json(record.as_json(), record.KIND, f"{digest_hex(key)}.json")


def every(state: State, cls: type[R]) -> list[R]:
    """Every ``cls`` record on this host, in file-name order."""
    found = (_load(state, cls, p.name) for p in sorted(state.path(cls.KIND).glob("*.json")))
    return [r for r in found if r is not None]


# --- the kinds (each a directory; the key a file name's hex) -----------------------------------
@dataclass(frozen=True, kw_only=True)
class Build(Record):
    KIND = "builds"  # by ``build_key``: the image this lock and spec built
    image_id: str
    reference: str
    twin: bool
    platform: str = DEFAULT_PLATFORM
    manifest: str | None = None
    engine_id: str = ""


@dataclass(frozen=True, kw_only=True)
class Facts(Record):
    KIND, WHOLE = "facts", "facts"  # by image ID: what verify learned (a free-form document)
    facts: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class ProbeOutput(Record):
    """What the probe printed: its verdicts, the facts it learned, the patch targets' text."""

    KIND = "verify"  # by the hash of (image, plan, probe)
    rows: list[Any]  # each read by ``CheckResult.read``
    facts: dict[str, Any]
    patch_targets: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class Tokenizers(Record):
    KIND = "tiktoken"  # by wheel sha256: the model types its frontend loads (None: not said)
    supported: tuple[str, ...] | None


@dataclass(frozen=True, kw_only=True)
class SourceWheels(Record):
    KIND = "source-wheels"  # the wheels a pinned source commit built to, in the wheelhouse
    files: tuple[str, ...]
    sha256: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class TwinPush(Record):
    KIND = "twin"  # by the twin's input hash: where it was pushed
    reference: str
    digest: str


@dataclass(frozen=True, kw_only=True)
class ManifestOf(Record):
    KIND = "manifest-of"  # by config digest: the manifest k3env last wrote for it
    manifest: str


@dataclass(frozen=True, kw_only=True)
class KeptLayer(Record):
    KIND = "layers"  # by diff ID and gzip level: the kept blob's digest and size
    digest: str
    size: int


@dataclass(frozen=True, kw_only=True)
class PublishedAt(Record):
    KIND, WHOLE = "published-blobs", "repositories"  # by blob digest: where sent, newest first
    repositories: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class Pushed(Record):
    KIND = "pushed"  # by image ID: the registry's manifest digest (what enroot imports)
    image: str
    image_id: str
    reference: str  # REGISTRY/REPO:TAG
    digest: str  # manifest digest in the registry
    layers_sent: int
    layers_skipped: int
    platform: str | None = None  # os/architecture of the manifest ``digest`` names
    index: str | None = None  # the OCI index the tag names, when it covers more platforms

    @property
    def by_digest(self) -> str:
        return f"{self.reference.rsplit(':', 1)[0]}@{self.digest}"

    @property
    def enroot_uri(self) -> str:
        """``docker://REGISTRY#REPO@sha256:...`` (enroot >= 4.0 takes digests)."""
        registry, _, repo = self.by_digest.partition("/")
        return f"docker://{registry}#{repo}"

    def as_json(self) -> Any:
        return {**super().as_json(), "by_digest": self.by_digest, "enroot_uri": self.enroot_uri}


@dataclass(frozen=True, kw_only=True)
class Exported(Record):
    KIND = "exports"  # by image ID: where its ``.sqsh`` was written, and its sha256
    image: str
    image_id: str
    path: str
    sha256: str
    size: int
    mksquashfs: str
    options: tuple[str, ...]
    platform: str = DEFAULT_PLATFORM
    format: int = 0  # how k3env wrote it (enroot_export.EXPORT_FORMAT); 0: before it was said


# --- builds and what was shipped of them -------------------------------------------------------
def build_key(lock: Lock, spec: ImageSpec, twin: bool, platform: str = DEFAULT_PLATFORM) -> str:
    """What a build record is keyed by: the lock's and the spec's content, the base kind and
    (other than the default) the platform. Another checkout with another lock never finds
    this image's record."""
    on = {} if platform == DEFAULT_PLATFORM else {"platform": platform}
    return canonical_sha256({"lock": lock.sha256, "spec": spec.sha256, "twin": twin, **on})


def last_build(
    state: State, lock: Lock, spec: ImageSpec, platform: str = DEFAULT_PLATFORM
) -> Build | None:
    """The recorded build of ``spec`` under ``lock``: over the real base if there is one,
    else over the CPU twin; ``None`` when neither was built from this lock and spec."""
    for twin in (False, True):
        record = read(state, Build, build_key(lock, spec, twin, platform))
        if record is not None:
            return record
    return None


@dataclass(frozen=True, kw_only=True)
class Shipped:
    """What k3env shipped of one image: its push (by manifest digest) and its export."""

    image_id: str
    pushed: Pushed | None
    exported: Exported | None

    @property
    def image(self) -> str:
        """Its spec's name, as the records say."""
        return self.pushed.image if self.pushed else self.exported.image if self.exported else ""


def shipped(state: State, image_id: str) -> Shipped:
    """What was shipped of ``image_id`` (nothing when it is empty)."""
    if not image_id:
        return Shipped(image_id=image_id, pushed=None, exported=None)
    return Shipped(image_id=image_id, pushed=read(state, Pushed, image_id),
                   exported=read(state, Exported, image_id))  # fmt: skip


def as_reference(container: str) -> str:
    """``docker://REGISTRY#REPO@sha256:...`` (enroot's form) as ``REGISTRY/REPO@sha256:...``."""
    text = container.removeprefix("docker://")
    return text.replace("#", "/", 1) if "#" in text else text


def _pushed_as(p: Pushed, ref: str) -> str | None:
    if ref == p.by_digest:
        return f"pushed by k3env as {p.by_digest}"
    if ref == p.reference:
        return f"pushed by k3env as {ref} (by tag: the tag can move; name {p.by_digest})"
    if ref == p.digest or ("@" in ref and ref.rsplit("@", 1)[1] == p.digest):
        return f"manifest {p.digest} that k3env pushed (as {p.by_digest})"
    return None


def _exported_as(e: Exported, container: str) -> str | None:
    if container == e.path:
        return f"exported by k3env to {e.path} (sha256 {e.sha256})"
    if container.endswith(".sqsh") and Path(container).name == Path(e.path).name:
        return (
            f"by file name, the enroot image k3env exported to {e.path} (sha256 {e.sha256}): "
            f"check the cluster's copy with `k3env export --check {container}`"
        )
    return None


def shipped_as(state: State, container: str) -> tuple[Shipped, str] | None:
    """The image k3env shipped as ``container`` (a reference by digest or tag, a manifest
    digest, enroot's ``docker://`` URI, an ``.sqsh`` path), and how it matched; else None."""
    ref = as_reference(container)
    for p in every(state, Pushed):
        if how := _pushed_as(p, ref):
            return shipped(state, p.image_id), how
    for e in every(state, Exported):
        if how := _exported_as(e, container):
            return shipped(state, e.image_id), how
    return None
