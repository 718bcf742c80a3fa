"""Moving users' recipes to schema 2 (``k3env srt migrate``): srt-slurm 2.x's own
``srtctl migrate``, run from the pinned srt-slurm where it is materialized on this host.

The rewrite is upstream's (``src/srtctl/core/migrate.py``: a ruamel round trip, so comments,
key order and quoting survive; its notes say what moved and what it could not decide). k3env
carries no copy of it: where the pinned srt-slurm is 1.x (nothing to migrate to) or 2.x is not
materialized here, the command refuses, saying why and what to run; it never writes a recipe it
did not get from srt-slurm itself.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from k3env.config.pins import Lock
from k3env.errors import ConfigError, StateError, ToolError
from k3env.log import Log
from k3env.runner import attempt
from k3env.srt.gate import loads_schema
from k3env.srt.materialize import Materialized, cache_key, materialize, pinned_srt
from k3env.state import State

REFUSAL_1X = (
    "the pinned srt-slurm {version} loads schema-1 recipes: there is no schema 2 to migrate to"
)
REFUSAL_UNMATERIALIZED = (
    "srt-slurm {version} is not materialized on this host: the rewrite is its own `srtctl "
    "migrate`, and k3env carries no copy of it"
)


@dataclass(frozen=True, kw_only=True)
class Migrated:
    """One recipe through ``srtctl migrate``: where it was written, and what srt-slurm said."""

    source: Path
    written: Path
    changed: bool
    notes: tuple[str, ...]  # srtctl migrate's own lines (what moved, what to set by hand)

    def as_json(self) -> dict[str, object]:
        return {"source": str(self.source), "written": str(self.written),
                "changed": self.changed, "notes": list(self.notes)}  # fmt: skip


def migrator(lock: Lock, state: State, log: Log) -> Materialized:
    """The pinned srt-slurm 2.x, materialized on this host (checked unchanged), or a refusal
    saying why there is none to run."""
    srt = pinned_srt(lock)
    if loads_schema(srt) != 2:
        raise ConfigError(
            REFUSAL_1X.format(version=srt.version),
            where=f"{lock.path} [srt_slurm]",
            fix="pin srt-slurm 2.x first (`k3env bump srt-slurm vX.Y.Z`); until then a recipe "
            "is written as srt-slurm 1.x reads it (schema 1)",
        )
    if not state.path("srt", cache_key(srt)[:20]).is_dir():
        raise StateError(
            REFUSAL_UNMATERIALIZED.format(version=srt.version),
            where=str(state.path("srt")),
            fix="run `k3env srt materialize` (on a host that reaches srt-slurm's git or a "
            "mirror: --source), then this again",
        )
    return materialize(lock, state, log)


def srtctl(m: Materialized) -> Path:
    """The materialized srt-slurm's own ``srtctl`` (its venv's console script)."""
    return m.python.parent / "srtctl"


def migrate(m: Materialized, recipes: Sequence[Path], out: Path | None, log: Log) -> list[Migrated]:
    """Each recipe through ``srtctl migrate -f RECIPE --output FILE``: written to ``out``
    (a directory, same file name) or in place (``out`` None), atomically, never half."""
    done = []
    for recipe in recipes:
        dest = recipe if out is None else out / recipe.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".partial", dir=dest.parent)
        os.close(fd)
        try:
            argv = [str(srtctl(m)), "migrate", "-f", str(recipe), "--output", tmp]
            code, text = attempt(argv, log)
            if code != 0:
                raise ToolError(
                    f"srtctl migrate (srt-slurm {m.version}) refused it (exit {code}): "
                    f"{text.strip()[-1500:]}",
                    where=str(recipe),
                    fix="fix the recipe as srt-slurm's own message says, then migrate again",
                )
            written = Path(tmp).read_text(encoding="utf-8")
            changed = written != recipe.read_text(encoding="utf-8")
            os.replace(tmp, dest)
        finally:
            Path(tmp).unlink(missing_ok=True)
        # srtctl's own lines: what it moved, what it left for a person to set.
        notes = tuple(line.strip().removeprefix("- ") for line in text.splitlines()
                      if line.strip())  # fmt: skip
        done.append(Migrated(source=recipe, written=dest, changed=changed, notes=notes))
    return done
