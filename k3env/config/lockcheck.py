"""The verdict of ``k3env lock --check``: every pinned file against its sha256, the twin's
requirements against the lock's pins, and (when asked) every pin resolved. Computed once,
rendered as JSON or for a person, and raised as one ``CheckFailed`` naming the first kind
of problem found."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from k3env import jsontext
from k3env.config.pinned_files import FileCheck, check_files
from k3env.config.pins import Lock
from k3env.config.srtschema import load_srt_schema
from k3env.config.twinreq import twin_disagreements
from k3env.errors import CheckFailed


@dataclass(frozen=True, kw_only=True)
class LockReport:
    path: Path
    lock: Lock
    files: tuple[FileCheck, ...]
    disagree: tuple[str, ...]
    require_resolved: bool
    # srt-slurm's recorded schema read from another srt-slurm than the lock pins (None: not so)
    schema_stale: str | None = None

    @property
    def stale(self) -> list[FileCheck]:
        return [f for f in self.files if f.expected is not None and f.actual != f.expected]

    @property
    def ok(self) -> bool:
        unresolved = self.require_resolved and bool(self.lock.unresolved)
        return not self.stale and not self.disagree and not unresolved and not self.schema_stale

    def as_json(self) -> dict[str, Any]:
        lock = self.lock
        return {
            "lock": str(self.path),
            "version": lock.version,
            "sha256": lock.sha256,
            "pins": lock.pins_summary(),
            "unresolved": [{"key": u.key, "hint": u.hint} for u in lock.unresolved],
            "files": [{**jsontext.plain(f), "ok": f.ok} for f in self.files],
            "stale": [f.key for f in self.stale],
            "twin_disagreements": list(self.disagree),
            "srt_schema_stale": self.schema_stale,
            "ok": self.ok,
        }

    def lines(self) -> list[str]:
        lock = self.lock
        out = [f"{self.path}: version {lock.version}, content sha256 {lock.sha256[:16]}"]
        out += [f"  {key:34} {value}" for key, value in lock.pins_summary().items()]
        out += [f"  UNRESOLVED {u.key}  (resolve: {u.hint})" for u in lock.unresolved]
        for f in self.files:
            if f.expected is not None:
                state = "ok" if f.ok else ("MISSING" if f.actual is None else "SHA256 DIFFERS")
                out.append(f"  {state:14} {f.file}  ({f.key})")
        out += [f"  TWIN DISAGREES {d}" for d in self.disagree]
        out += [f"  SRT SCHEMA STALE {self.schema_stale}"] if self.schema_stale else []
        out.append(
            f"{len(lock.unresolved)} unresolved pin(s), {len(self.stale)} stale file hash(es)"
        )
        return out

    def raise_for_problems(self) -> None:
        where = str(self.path)
        if self.stale:
            raise CheckFailed(
                f"{len(self.stale)} pinned file(s) differ from the lock: "
                f"{[f.key for f in self.stale]}",
                where=where,
                fix="restore the files, or record deliberate edits with "
                "`k3env lock --update-hashes`",
            )
        if self.disagree:
            raise CheckFailed(
                f"the twin's requirements and the lock disagree ({len(self.disagree)}): "
                f"{self.disagree[0]}",
                where=where,
                fix="regenerate them from the lock with `k3env twin --resolve`",
            )
        if self.schema_stale:
            raise CheckFailed(
                self.schema_stale,
                where=where,
                fix="record it from the pinned srt-slurm: `k3env srt schema`, then "
                "`k3env lock --update-hashes`",
            )
        unresolved = self.lock.unresolved
        if self.require_resolved and unresolved:
            raise CheckFailed(
                f"{len(unresolved)} pin(s) unresolved: {[u.key for u in unresolved]}",
                where=where,
                fix="resolve them on a host that reaches their source (hints above)",
            )


def check_lock(lock: Lock, path: Path, *, require_resolved: bool) -> LockReport:
    files = tuple(check_files(lock))
    return LockReport(path=path, lock=lock, files=files,
                      disagree=tuple(twin_disagreements(lock)),
                      require_resolved=require_resolved,
                      schema_stale=_schema_stale(lock, files))  # fmt: skip


def _schema_stale(lock: Lock, files: tuple[FileCheck, ...]) -> str | None:
    """Whether srt-slurm's recorded schema (its file as pinned) was read from another
    srt-slurm than the lock pins: a bump moved srt-slurm and not the schema."""
    srt = lock.srt_slurm
    pinned = {f.key: f for f in files}.get("srt_slurm.schema_sha256")
    if srt is None or srt.schema is None or pinned is None or not pinned.ok:
        return None  # none, or its file is stale already (said as such)
    schema = load_srt_schema(lock.resolve_path(srt.schema, key="srt_slurm.schema"))
    if schema.of(srt):
        return None
    return (
        f"{srt.schema} was recorded from srt-slurm {schema.version} ({schema.commit[:12]}, "
        f"{len(schema.patches)} patch(es)); the lock pins {srt.version} ({srt.commit[:12]}, "
        f"{len(srt.patches)} patch(es))"
    )
