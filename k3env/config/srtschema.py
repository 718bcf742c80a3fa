"""srt-slurm's recipe and cluster-config schema, as recorded from its own loader, and a YAML
document checked against it (pure: no files but the one read, no processes).

``k3env srt schema`` records it from the materialized srt-slurm (``probes/srt_schema.py``
walks the marshmallow schemas srt-slurm loads with) into the file the lock pins
(``[srt_slurm] schema``, by sha256), with the srt-slurm it was read from and marshmallow's own
messages. Preflight checks a recipe's (and a cluster config's) keys, types, required fields
and choices against it where srt-slurm itself is not materialized: marshmallow refuses an
unknown key (``Unknown field.``) or a wrong type before a job starts; here the same refusal
comes in the same words, at the key's line, in milliseconds. What the schema cannot say (a
field of srt-slurm's own kind, a union, srt-slurm's cross-field checks, its job-time lookups
and dry-run) is left to srt-slurm's loader.

The file is data k3env wrote, pinned by hash; it is still read as untrusted: bounded, and
every node's shape checked before use.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from k3env.config.pins import SrtSlurmPin
from k3env.errors import LockError
from k3env.files import read_input

MAX_BYTES = 4 << 20
MAX_DEPTH = 16
MAX_ERRORS = 50
# srt-slurm's load_config pops `lock:` before the schema loads the rest (a lockfile is a
# valid recipe): src/srtctl/core/config.py, v1.0.36 `load_config`.
POPPED = ("lock",)
MESSAGES = (
    "unknown", "type", "required", "null", "choices", "string", "integer", "number",
    "boolean", "list", "mapping",
)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class SrtSchema:
    path: Path
    version: str
    commit: str
    patches: tuple[str, ...]  # the sha256 of each patch applied, in order
    messages: Mapping[str, str]
    truthy: tuple[Any, ...]
    falsy: tuple[Any, ...]
    recipe: Mapping[str, Any]
    cluster: Mapping[str, Any]

    def of(self, srt: SrtSlurmPin) -> bool:
        """Recorded from the srt-slurm ``srt`` pins (version, commit, patches)."""
        mine = {"version": self.version, "commit": self.commit, "patches": list(self.patches)}
        return mine == identity(srt)

    def said(self) -> str:
        return f"srt-slurm {self.version}'s schema as its loader reads it ({self.path})"


def identity(srt: SrtSlurmPin) -> dict[str, Any]:
    """What a recorded schema says it was read from."""
    return {
        "version": srt.version,
        "commit": srt.commit,
        "patches": [p.sha256 or "" for p in srt.patches],
    }


def load_srt_schema(path: Path) -> SrtSchema:
    """The recorded schema at ``path`` (its shape checked)."""
    where = str(path)
    try:
        doc = json.loads(read_input(path, error=LockError, limit=MAX_BYTES))
        srt = doc["srt_slurm"]
        messages = {k: str(doc["messages"][k]) for k in MESSAGES}
        booleans = doc["booleans"]
        recipe, cluster = doc["recipe"], doc["cluster"]
        nodes = (recipe, cluster)
        ok = all(isinstance(n, dict) and isinstance(n.get("fields"), dict) for n in nodes)
        if not ok or not isinstance(srt.get("patches"), list):
            raise TypeError("recipe, cluster or patches misshapen")
        return SrtSchema(
            path=path,
            version=str(srt["version"]),
            commit=str(srt["commit"]),
            patches=tuple(str(p) for p in srt["patches"]),
            messages=messages,
            truthy=tuple(booleans["truthy"]),
            falsy=tuple(booleans["falsy"]),
            recipe=recipe,
            cluster=cluster,
        )
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise LockError(
            f"srt-slurm's recorded schema is not one k3env wrote: {type(e).__name__}: {e}",
            where=where,
            fix="record it again: `k3env srt schema` (then `k3env lock --update-hashes`)",
        ) from e


def check(data: Any, node: Mapping[str, Any], schema: SrtSchema, *, top: bool = True
          ) -> list[tuple[str, str]]:  # fmt: skip
    """``(dotted key, marshmallow's message)`` for each refusal the schema ``node`` (the
    recipe's or the cluster config's) makes of ``data``, at most ``MAX_ERRORS``."""
    out: list[tuple[str, str]] = []
    if top and isinstance(data, dict):
        data = {k: v for k, v in data.items() if k not in POPPED}
    _object(data, node, "", schema, out, 0)
    return out[:MAX_ERRORS]


def _at(key: str, name: object) -> str:
    return f"{key}.{name}" if key else str(name)


def _object(
    data: Any, node: Mapping[str, Any], key: str, s: SrtSchema, out: list[tuple[str, str]],
    depth: int,
) -> None:  # fmt: skip
    if not isinstance(data, dict):
        out.append((key, s.messages["type"]))
        return
    fields = node.get("fields")
    if not isinstance(fields, dict):
        return
    for name, value in data.items():
        field = fields.get(name) if isinstance(name, str) else None
        if field is None:
            if node.get("unknown", "raise") == "raise":
                out.append((_at(key, name), s.messages["unknown"]))
            continue
        _field(value, field, _at(key, name), s, out, depth + 1)
    for name, field in sorted(fields.items()):
        if isinstance(field, dict) and field.get("required") and name not in data:
            out.append((_at(key, name), s.messages["required"]))


def _field(
    value: Any, field: Any, key: str, s: SrtSchema, out: list[tuple[str, str]], depth: int
) -> None:
    if len(out) >= MAX_ERRORS or depth > MAX_DEPTH or not isinstance(field, dict):
        return
    if value is None:
        if not field.get("null", True):
            out.append((key, s.messages["null"]))
        return
    kind = field.get("type")
    if kind == "object":
        _object(value, field, key, s, out, depth)
    elif kind == "by-type":
        chosen = field.get("of", {}).get(value.get("type")) if isinstance(value, dict) else None
        if isinstance(chosen, dict):  # no `type`, or one no backend has: srt-slurm's to say
            _object(value, chosen, key, s, out, depth)
    elif kind in ("list", "mapping"):
        _container(value, field, key, s, out, depth)
    elif kind in ("string", "integer", "number", "boolean") and not _scalar_ok(kind, value, s):
        out.append((key, s.messages[kind]))
    elif isinstance(field.get("choices"), list) and value not in field["choices"]:
        shown = ", ".join(str(c) for c in field["choices"])
        out.append((key, s.messages["choices"].replace("{choices}", shown)))


def _container(
    value: Any, field: Mapping[str, Any], key: str, s: SrtSchema, out: list[tuple[str, str]],
    depth: int,
) -> None:  # fmt: skip
    if field["type"] == "list":
        if not isinstance(value, list):
            out.append((key, s.messages["list"]))
        elif isinstance(field.get("items"), dict):
            for i, item in enumerate(value):
                _field(item, field["items"], f"{key}.{i}", s, out, depth + 1)
        return
    if not isinstance(value, dict):
        out.append((key, s.messages["mapping"]))
    elif isinstance(field.get("values"), dict):
        for name, item in value.items():
            _field(item, field["values"], _at(key, name), s, out, depth + 1)


def _scalar_ok(kind: str, value: Any, s: SrtSchema) -> bool:
    """Whether marshmallow's field of ``kind`` takes ``value`` as YAML gave it (not strict:
    an integer field takes "8" and 8.0; never a boolean)."""
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":  # marshmallow asks `value in truthy` (so True is 1, as in Python)
        try:
            return value in {*s.truthy, *s.falsy}
        except TypeError:  # unhashable: a list or a mapping
            return False
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return False
    try:
        int(value) if kind == "integer" else float(value)
    except ValueError:
        return False
    return True
