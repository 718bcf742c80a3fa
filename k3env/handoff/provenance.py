"""An image's provenance file (``/etc/k3env/provenance.json``, k3env's layer), read from a
squashfs within its budgets and every field's type checked into frozen dataclasses: what the
SBOM, the in-toto statement and the image checks use. The file is the image's, so untrusted: a
field of another type than k3env writes is a ConfigError naming it, never a traceback later.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from k3env import jsontext
from k3env.errors import ConfigError, UntrustedFileError
from k3env.handoff.squashfs import Squashfs
from k3env.hashing import digest_hex, sha256_digest
from k3env.image.build import PROVENANCE_PATH
from k3env.quoting import one_line

PROVENANCE_LIMIT = 16 << 20  # k3env writes KiB (its layer's files by sha256, the wheels)
PROVENANCE_DEPTH = 16  # k3env's nests 4 deep (components.wheels[].name)
PROVENANCE_FIX = "re-export or re-import the image from the registry digest"


@dataclass(frozen=True, kw_only=True)
class Pinned:
    """A file the image was built from, by path and sha256 (its lock, its spec)."""

    path: str | None
    sha256: str | None


@dataclass(frozen=True, kw_only=True)
class BaseImage:
    pin: str | None
    name: str | None
    digest: str | None


@dataclass(frozen=True, kw_only=True)
class Wheel:
    """A pinned wheel baked into the image's components layer."""

    name: str
    version: str
    sha256: str


@dataclass(frozen=True, kw_only=True)
class AppliedPatch:
    name: str
    status: str
    target: str | None
    sha256: str | None


@dataclass(frozen=True, kw_only=True)
class Provenance:
    """An image's provenance file, read within its budgets and every field's type checked
    (``read_provenance``): what the SBOM, the in-toto statement and the image checks use.
    ``doc`` is the whole document, its shape checked, for the checks that compare its config
    and files with the image's."""

    raw: bytes
    sha256: str  # hex, of ``raw``
    image: str | None
    inputs: str | None
    lock: Pinned | None
    spec: Pinned | None
    base: BaseImage | None
    pins: tuple[tuple[str, str], ...]  # pin -> identity, sorted by pin
    wheels: tuple[Wheel, ...]
    patches: tuple[AppliedPatch, ...]
    doc: Mapping[str, Any]


def provenance_of(doc: Mapping[str, Any], raw: bytes = b"") -> Provenance:
    """``doc`` as typed fields, each field's type checked first (``_misshapen``); one of
    another type than k3env writes is a ConfigError naming it, never a traceback later."""
    if wrong := _misshapen(doc, config=False):
        raise ConfigError(f"{PROVENANCE_PATH} is not valid provenance ({wrong})",
                          fix=PROVENANCE_FIX)  # fmt: skip

    def pinned(value: Any) -> Pinned | None:
        return None if value is None else Pinned(path=value.get("path"), sha256=value.get("sha256"))

    base = doc.get("base")
    components = doc.get("components") or {}
    return Provenance(
        raw=raw,
        sha256=digest_hex(sha256_digest(raw)),
        image=doc.get("image"),
        inputs=doc.get("inputs"),
        lock=pinned(doc.get("lock")),
        spec=pinned(doc.get("spec")),
        base=None if base is None else BaseImage(pin=base.get("pin"), name=base.get("name"),
                                                 digest=base.get("digest")),
        pins=tuple(sorted((doc.get("pins") or {}).items())),
        wheels=tuple(Wheel(name=w["name"], version=w["version"], sha256=w["sha256"])
                     for w in components.get("wheels") or []),
        patches=tuple(AppliedPatch(name=p["name"], status=p["status"], target=p.get("target"),
                                   sha256=p.get("sha256")) for p in doc.get("patches") or []),
        doc=doc,
    )  # fmt: skip


def read_provenance(fs: Squashfs) -> Provenance:
    """The image's provenance file, typed (``Provenance``); a file over its budgets or not of
    the shape k3env writes is a ConfigError naming the field."""
    doc, raw = provenance_document(fs)
    return provenance_of(doc, raw)


def provenance_document(fs: Squashfs) -> tuple[dict[str, Any], bytes]:
    """The image's provenance document (read within its budgets, its shape checked) and its
    bytes."""
    try:
        raw = fs.read(PROVENANCE_PATH, limit=PROVENANCE_LIMIT)
    except UntrustedFileError as e:
        raise UntrustedFileError(e.message, where=str(fs.path), fix=e.fix) from e
    if raw is None:
        raise ConfigError(
            f"{PROVENANCE_PATH} is not in the image: it was not built by k3env (or its layer "
            "was removed)",
            where=str(fs.path),
            fix="check an image that `k3env build` made (import it by the digest k3env push "
            "printed)",
        )
    doc: dict[str, Any] = {}
    try:
        doc = jsontext.loads(raw, where=PROVENANCE_PATH, limit=PROVENANCE_LIMIT,
                             max_depth=PROVENANCE_DEPTH, error=ConfigError)  # fmt: skip
        wrong = _misshapen(doc)
    except ConfigError as e:
        wrong = e.message
    if wrong:
        raise ConfigError(
            f"{PROVENANCE_PATH} is not valid provenance ({wrong}): the image was altered, or "
            "built by an older k3env",
            where=str(fs.path),
            fix=PROVENANCE_FIX,
        )
    return doc, raw


def _is_strs(value: Any, container: type) -> bool:
    if container is list:
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    )


def _fields(value: Any, **kinds: Any) -> bool:
    """Whether ``value`` is an object whose keys ``kinds`` names are of those types (a key
    missing counts as None)."""
    return isinstance(value, dict) and all(isinstance(value.get(k), t) for k, t in kinds.items())


def _misshapen(doc: Mapping[str, Any], *, config: bool = True) -> str | None:
    """The first field of a provenance document whose type is not the one k3env writes (the
    file is the image's, so untrusted: a check must say so, not fail on it), else None.
    ``config``: its config too (what the image checks compare), else the typed fields."""
    fields: list[tuple[str, Any, bool]] = []
    if config:
        if not isinstance(doc.get("config"), dict):
            return (f"its config is {_shown(doc.get('config'))}: not a k3env provenance "
                    "document of this format")  # fmt: skip
        fields += _config_fields(doc["config"])
    opt = str | None
    components = doc.get("components")
    fields += [
        ("files", doc.get("files"), doc.get("files") is None or _is_strs(doc.get("files"), dict)),
        ("image", doc.get("image"), isinstance(doc.get("image"), opt)),
        ("inputs", doc.get("inputs"), isinstance(doc.get("inputs"), opt)),
        ("patches", doc.get("patches"), isinstance(doc.get("patches"), list | None) and all(
            _fields(p, name=str, status=str, target=opt, sha256=opt)
            for p in doc.get("patches") or [])),
        ("pins", doc.get("pins"), doc.get("pins") is None or _is_strs(doc.get("pins"), dict)),
        ("components", components, components is None or _fields(components, wheels=list | None)),
    ]  # fmt: skip
    if isinstance(components, dict):
        wheels = components.get("wheels") or []
        fields.append(("components.wheels", wheels, all(
            _fields(w, name=str, version=str, sha256=str) for w in wheels)))  # fmt: skip
    for key, inner in (("lock", ("path", "sha256")), ("spec", ("path", "sha256")),
                       ("base", ("pin", "name", "digest"))):  # fmt: skip
        value = doc.get(key)
        fits = value is None or _fields(value, **dict.fromkeys(inner, opt))
        fields.append((key, value, fits))
    for name, value, fits in fields:
        if not fits:
            return f"its {name} is {_shown(value)}, not as k3env writes it"
    return None


def _config_fields(config: Mapping[str, Any]) -> list[tuple[str, Any, bool]]:
    def strs(key: str, container: type) -> tuple[str, Any, bool]:
        value = config.get(key)
        return f"config.{key}", value, value is None or _is_strs(value, container)

    return [
        strs("Env", list), strs("Labels", dict), strs("Entrypoint", list), strs("Cmd", list),
        ("config.WorkingDir", config.get("WorkingDir"),
         isinstance(config.get("WorkingDir"), str | None)),
        ("config.Volumes", config.get("Volumes"), isinstance(config.get("Volumes"), dict | None)),
    ]  # fmt: skip


def _shown(value: Any) -> str:
    """``value`` named for a message: its JSON type and its first characters."""
    if value is None:
        return "null"
    kind = {dict: "object", list: "array", str: "string", bool: "boolean",
            int: "number", float: "number"}.get(type(value), type(value).__name__)  # fmt: skip
    return f"a JSON {kind} {one_line(jsontext.dumps(value, default=str)[:60])}"
