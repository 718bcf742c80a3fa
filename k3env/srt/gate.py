"""The recipe schema the pinned srt-slurm loads, and its refusal of the other, in its words.

srt-slurm 1.x reads schema-1 recipes only: its marshmallow loader refuses ``schema``,
``engine`` and ``roles`` as unknown fields (``Unknown field.``, as the recorded schema or the
materialized loader says it). srt-slurm 2.x (PR #407; PR #456 on) loads ``schema: 2`` only: its
gate (``core/config.py`` ``require_current_schema``) refuses a recipe with no ``schema:`` key,
or another value, before anything else runs, and points at ``srtctl migrate``. The rules judge a
recipe of either schema all the same (``config.srtrecipe``): this says only whether the pinned
srt-slurm would load it at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from k3env.checks.known import (
    SRT2_GATE_LEGACY,
    SRT2_GATE_NO_SCHEMA,
    SRT2_GATE_UNSUPPORTED,
    SRT2_LEGACY_KEYS,
    SRT_SCHEMA2_FROM,
)
from k3env.config.pins import SrtSlurmPin
from k3env.versions import in_range

GATE = "gate"  # the stage a refusal is said in (srt-slurm's loader stages: load, lookup, ...)


def loads_schema(srt: SrtSlurmPin) -> int:
    """The recipe schema ``srt`` loads: 2 from srt-slurm 2.x, else 1 (an unreadable version:
    1, the lock's own)."""
    try:
        two = in_range(srt.version.removeprefix("v"), f">={SRT_SCHEMA2_FROM}")
    except ValueError:
        return 1
    return 2 if two else 1


def _has(data: Mapping[str, Any], key: str) -> bool:
    section, _, name = key.partition(".")
    if not name:
        return section in data
    block = data.get(section)
    return isinstance(block, Mapping) and name in block


def refusal(srt: SrtSlurmPin, data: Any) -> tuple[str, str] | None:
    """(key, message) of the pinned srt-slurm's refusal of a recipe of the other schema, in its
    own words; None when it loads this schema."""
    written = data.get("schema", 1) if isinstance(data, Mapping) else 1  # 1: none, pre-2.0
    if loads_schema(srt) == 2:
        if written == 2 and not isinstance(written, bool):
            legacy = [key for key in SRT2_LEGACY_KEYS if _has(data, key)]
            if not legacy:
                return None
            return legacy[0], SRT2_GATE_LEGACY.format(keys=", ".join(legacy))
        if not isinstance(data, Mapping) or "schema" not in data:
            return "schema", SRT2_GATE_NO_SCHEMA
        return "schema", SRT2_GATE_UNSUPPORTED.format(value=written)
    if written == 1 and not (isinstance(data, Mapping) and "schema" in data):
        return None
    return "schema", (
        f"srt-slurm {srt.version} loads schema-1 recipes only (no `schema:` key): `schema`, "
        "`engine`, `roles` and `dynamo.source` are srt-slurm 2.x's layout"
    )


def fix(srt: SrtSlurmPin, path: str) -> str:
    """What to do about a refusal: migrate to 2.x's schema, or pin the srt-slurm it needs."""
    if loads_schema(srt) == 2:
        return (
            f"k3env srt migrate {path} (srt-slurm 2.x's own `srtctl migrate`: comments and key "
            "order kept), then check it again"
        )
    return (
        f"pin srt-slurm 2.x for a schema-2 recipe (`k3env bump srt-slurm`), or write it as "
        f"srt-slurm {srt.version} reads it (no schema:, backend:, resources.<role>_*)"
    )
