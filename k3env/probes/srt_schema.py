"""The materialized srt-slurm's recipe and cluster-config schema, read from its own classes.

Runs with the isolated environment's Python where srtctl is installed (never imported by k3env
on the host). It walks the marshmallow schemas srt-slurm loads with (``SrtConfig.Schema`` for a
recipe, ``ClusterConfig.Schema`` for ``srtslurm.yaml``): each field's name, type, whether it
is required, its choices where a validator or an enum names them, and for a mapping or a list
what it holds. A field of srt-slurm's own kind is recorded by its class name; the backend's
(chosen by its ``type`` key) as each backend protocol's schema, keyed by that protocol's
``type`` default. Prints one JSON document.
"""

from __future__ import annotations

import enum
import importlib
import json
import sys
from typing import Any

DEPTH = 12  # nesting bound (srt-slurm's deepest is ~5)


def _module(name: str) -> Any:
    """A module of the environment this runs in (srt-slurm's, not k3env's)."""
    return importlib.import_module(name)


def _choices(field: Any) -> list[Any] | None:
    for v in getattr(field, "validators", []) or []:
        got = getattr(v, "choices", None)
        if got is not None:
            return [c.value if isinstance(c, enum.Enum) else c for c in got]
    enum_cls = getattr(field, "enum", None)
    if isinstance(enum_cls, type) and issubclass(enum_cls, enum.Enum):
        by_value = getattr(field, "by_value", False)
        return [m.value if by_value else m.name for m in enum_cls]
    return None


def describe(field: Any, depth: int = 0) -> dict[str, Any]:
    """One marshmallow field as JSON."""
    fields = _module("marshmallow.fields")
    out: dict[str, Any] = {
        "required": bool(getattr(field, "required", False)),
        "null": bool(getattr(field, "allow_none", False)),
    }
    if depth > DEPTH:
        return {**out, "type": "any", "field": "nested too deep"}
    union = getattr(field, "union_fields", None)
    if union is not None:  # marshmallow_dataclass's Union
        return {**out, "type": "union", "of": [describe(f, depth + 1) for _, f in union]}
    if type(field).__name__ == "BackendConfigField":
        return {**out, "type": "by-type", "of": _backends(depth)}
    if isinstance(field, fields.Nested):
        nested = field.schema
        return {**out, "type": "object", **schema(nested, depth + 1)}
    if isinstance(field, fields.List):
        return {**out, "type": "list", "items": describe(field.inner, depth + 1)}
    if isinstance(field, fields.Tuple):
        return {**out, "type": "list"}
    if isinstance(field, fields.Mapping):
        values = getattr(field, "value_field", None)
        items = describe(values, depth + 1) if values is not None else {"type": "any"}
        return {**out, "type": "mapping", "values": items}
    kinds = (
        (fields.Boolean, "boolean"),
        (fields.Integer, "integer"),
        (fields.Number, "number"),
        (fields.String, "string"),
    )
    for cls, name in kinds:
        if isinstance(field, cls):
            out["type"] = name
            break
    else:
        out["type"] = "any"
        out["field"] = type(field).__name__
    choices = _choices(field)
    if choices is not None:
        out["choices"] = choices
    return out


def schema(s: Any, depth: int = 0) -> dict[str, Any]:
    """A marshmallow schema (instance) as JSON: its fields and how it treats unknown keys."""
    return {
        "unknown": str(getattr(s, "unknown", "raise")),
        "fields": {
            (f.data_key or name): describe(f, depth) for name, f in sorted(s.fields.items())
        },
    }


def _backends(depth: int) -> dict[str, Any]:
    """Each backend protocol srt-slurm exports, keyed by its ``type`` field's default."""
    backends = _module("srtctl.backends")
    out = {}
    for name in sorted(dir(backends)):
        cls = getattr(backends, name)
        schema_cls = getattr(cls, "Schema", None)
        if not name.endswith("Protocol") or schema_cls is None:
            continue
        s = schema_cls()
        kind = s.fields.get("type")
        default = getattr(kind, "load_default", None) if kind is not None else None
        if isinstance(default, str):
            out[default] = schema(s, depth + 1)
    return out


def messages() -> dict[str, str]:
    """marshmallow's own words for what the schema refuses (the installed release's)."""
    fields, validate = _module("marshmallow.fields"), _module("marshmallow.validate")
    Schema = _module("marshmallow").Schema
    field = fields.Field()
    out = {
        "unknown": Schema().error_messages["unknown"],
        "type": Schema().error_messages["type"],
        "required": field.error_messages["required"],
        "null": field.error_messages["null"],
        "choices": validate.OneOf.default_message,
    }
    kinds = {
        "string": fields.String(),
        "integer": fields.Integer(),
        "number": fields.Float(),
        "boolean": fields.Boolean(),
        "list": fields.List(fields.Raw()),
        "mapping": fields.Dict(),
    }
    out.update({name: f.error_messages["invalid"] for name, f in kinds.items()})
    return out


def main() -> None:
    srt = _module("srtctl.core.schema")
    fields = _module("marshmallow.fields")
    booleans = {
        "truthy": sorted(fields.Boolean.truthy, key=repr),
        "falsy": sorted(fields.Boolean.falsy, key=repr),
    }
    doc = {
        "booleans": booleans,
        "messages": messages(),
        "recipe": schema(srt.SrtConfig.Schema()),
        "cluster": schema(srt.ClusterConfig.Schema()),
    }
    sys.stdout.write(json.dumps(doc, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
