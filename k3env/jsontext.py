"""JSON in and out: the one encoder of every document k3env emits, and the one bounded reader of
every document someone else wrote (an ``entry.json`` in a shared cache, an in-toto statement, an
SBOM, a registry's answer, a provenance file).

Out: strict JSON only. ``NaN`` and ``Infinity`` are not JSON (RFC 8259 has no such numbers; a
strict parser, jq or Go's encoding/json, refuses the whole document), so a non-finite number is
refused here, naming where it sits, instead of printed (``json.dumps``' default).

In: a size budget in bytes, checked before parsing; a nesting budget, checked on the parsed
value without recursion (a 10,000-deep statement is refused, never a RecursionError); the
non-finite constants refused at their source; and the top-level type checked. Fields are then
read through ``field``, which names the document and key when a type is wrong.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Collection, Mapping
from typing import Any, TypeVar

from k3env.errors import K3envError, StateError

MAX_BYTES = 16 << 20  # a record, an entry, a statement: far below this
MAX_DEPTH = 64  # the deepest document k3env reads (an SBOM, a manifest) nests under 10
T = TypeVar("T")


class NotFinite(ValueError):
    """A NaN or an infinity where a JSON number must be finite."""


def _refuse_constant(name: str) -> float:
    raise NotFinite(f"{name} is not a finite number: JSON has no {name}")


def _check_finite(value: Any, path: str = "$") -> None:
    """Refuse a non-finite float anywhere in ``value`` (iteratively: no recursion limit)."""
    stack: list[tuple[Any, str]] = [(value, path)]
    seen: set[int] = set()  # a container met twice is walked once (and a cycle ends)
    while stack:
        node, where = stack.pop()
        if isinstance(node, float) and not math.isfinite(node):
            raise NotFinite(f"{where} is {node!r}, not a finite number: JSON has no {node!r}")
        if isinstance(node, (dict, list, tuple)):
            if id(node) in seen:
                continue
            seen.add(id(node))
        if isinstance(node, dict):
            for k in node:  # json.dumps spells a float key as a number
                if isinstance(k, float) and not math.isfinite(k):
                    raise NotFinite(f"a key of {where} is {k!r}: JSON has no {k!r}")
            stack += [(v, f"{where}.{k}") for k, v in node.items()]
        elif isinstance(node, (list, tuple)):
            stack += [(v, f"{where}[{i}]") for i, v in enumerate(node)]


def dumps(
    value: Any,
    *,
    indent: int | None = None,
    compact: bool = False,
    sort_keys: bool = True,
    ensure_ascii: bool = True,
    default: Callable[[Any], Any] | None = None,
) -> str:
    """``value`` as strict JSON; a NaN or an infinity anywhere in it raises ``NotFinite``
    (a ValueError) naming its path. ``compact``: no spaces (a canonical form);
    ``ensure_ascii`` and ``default`` as ``json.dumps`` takes them."""
    separators = (",", ":") if compact else None
    try:
        return json.dumps(value, indent=indent, sort_keys=sort_keys, allow_nan=False,
                          separators=separators, ensure_ascii=ensure_ascii,
                          default=default)  # fmt: skip
    except ValueError as e:
        if "JSON compliant" not in str(e):  # a circular reference: not ours to rename
            raise
        _check_finite(value)  # names where the number sits
        raise NotFinite(f"a number in it is not finite ({e}): JSON has none") from e


def canonical(value: Any) -> bytes:
    """``value`` in the one byte form k3env hashes and sends: sorted keys, no spaces."""
    return dumps(value, compact=True).encode()


def plain(record: Any, *, leave: Collection[str] = ()) -> dict[str, Any]:
    """A dataclass record's fields (but ``leave``) as JSON values: a tuple or list a list, a
    mapping a dict, what has ``as_json`` its own."""
    fields = (f.name for f in dataclasses.fields(record) if f.name not in leave)
    return {name: _plain(getattr(record, name)) for name in fields}


def _plain(value: Any) -> Any:
    if hasattr(value, "as_json"):
        return value.as_json()
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return dict(value) if isinstance(value, Mapping) else value


def depth(value: Any, *, finite: bool = False) -> int:
    """How deep ``value`` nests (a scalar 0, ``[]`` 1), found without recursion; ``finite``:
    a non-finite float anywhere in it (``1e999`` parses as one) raises ``NotFinite``."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict):
            stack += [(v, level + 1) for v in node.values()]
        elif isinstance(node, list):
            stack += [(v, level + 1) for v in node]
        else:
            if finite and isinstance(node, float) and not math.isfinite(node):
                _check_finite(value)  # names where it sits
            continue
        deepest = max(deepest, level + 1)
    return deepest


def loads(
    data: bytes | str,
    *,
    where: str,
    limit: int = MAX_BYTES,
    max_depth: int = MAX_DEPTH,
    expect: type = dict,
    error: type[K3envError] = StateError,
    fix: str = "the file is not one k3env wrote; remove it, or write it again with k3env",
) -> Any:
    """``data`` parsed as one JSON document of type ``expect`` (``object`` for any), within
    ``limit`` bytes and ``max_depth`` levels, with no NaN or infinity; else ``error`` naming
    ``where``."""
    size = len(data)
    if size > limit:
        raise error(f"{size} bytes of JSON, over the limit of {limit} for it; not read",
                    where=where, fix=fix)  # fmt: skip
    try:
        value = json.loads(data, parse_constant=_refuse_constant)
        levels = depth(value, finite=True)  # 1e999 parses as inf
    except RecursionError as e:
        raise error(f"JSON nested deeper than {max_depth} levels; not read", where=where,
                    fix=fix) from e  # fmt: skip
    except NotFinite as e:
        raise error(f"not strict JSON: {e}", where=where, fix=fix) from e
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise error(f"not JSON: {str(e)[:200]}", where=where, fix=fix) from e
    if levels > max_depth:
        raise error(f"JSON nested {levels} levels deep, over the limit of {max_depth}; not read",
                    where=where, fix=fix)  # fmt: skip
    if expect is not object and not isinstance(value, expect):
        raise error(f"a JSON {_name(type(value))} where a JSON {_name(expect)} belongs",
                    where=where, fix=fix)  # fmt: skip
    return value


def _name(t: type) -> str:
    return {dict: "object", list: "array", str: "string", int: "integer", float: "number",
            bool: "boolean", type(None): "null"}.get(t, t.__name__)  # fmt: skip


def field(
    doc: dict[str, Any],
    key: str,
    kind: type[T] | tuple[type, ...],
    *,
    where: str,
    default: Any = ...,
    error: type[K3envError] = StateError,
) -> T:
    """``doc[key]`` checked to be of ``kind`` (a bool is not an int, an int is a float);
    missing: ``default`` if given, else ``error`` naming ``where`` and the key."""
    if key not in doc:
        if default is not ...:
            return default  # type: ignore[no-any-return]
        raise error(f"{key!r} is missing", where=where,
                    fix="the document is not the shape k3env expects there")  # fmt: skip
    value = doc[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if float in kinds and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
    if not ok:
        names = " or ".join(_name(k) for k in kinds)
        article = "an" if names[0] in "aeiou" else "a"
        raise error(f"{key!r} is a JSON {_name(type(value))}, not {article} {names}", where=where,
                    fix="the document is not the shape k3env expects there")  # fmt: skip
    return value  # type: ignore[no-any-return]


def parse(data: bytes | str, *, limit: int = MAX_BYTES, max_depth: int = MAX_DEPTH) -> Any:
    """``loads`` for a caller that answers any bad document one way: every refusal (too large,
    too deep, NaN, not JSON) is a ``ValueError`` (a drop-in for ``json.loads`` in an
    ``except ValueError``; a RecursionError never escapes)."""
    try:
        return loads(data, where="JSON", limit=limit, max_depth=max_depth, expect=object)
    except K3envError as e:
        raise ValueError(e.message) from e
