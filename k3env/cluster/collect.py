"""A finished cluster smoke job's output directory, turned into verdicts.

Two sources: the battery's own result (``result.json``, the driver's gates), and the engine's
logs, each line matched against the bring-up's failures (``stages.FACTS``): a match is that
failure, at its stage, with the line cited. A failed job whose logs no fact explains gets its
last error line, tied to the stage the log had reached.

The directory is the job's, written by processes on the cluster: untrusted. Files are read
through ``k3env.untrusted`` (regular files only, no link followed, every path checked under
the directory), each log's last ``TAIL_BYTES`` at most, at most ``MAX_FILES`` files.

A verdict is recorded by the image's digest (the one the job ran) and the cluster profile,
beside the CPU smoke's records (``smoke/cluster/``).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from k3env import jsontext
from k3env.errors import ConfigError, K3envError, UntrustedFileError
from k3env.hashing import digest_hex
from k3env.quoting import one_line
from k3env.smoke import stages
from k3env.state import State
from k3env.untrusted import read_tail
from k3env.verdict import FAILED, Gate, ok, planned

MANIFEST = "k3env-smoke.json"  # what the job ran: written by `k3env smoke --cluster`
RESULT = "result.json"  # the driver's gates
LOG_SUFFIXES = (".log", ".out", ".err", ".txt")
TAIL_BYTES = 4 << 20
MAX_FILES = 200
MAX_DEPTH = 4
LINE = 400  # characters of a cited line
MAX_GATES = 20
# What every battery runs (a manifest from before k3env wrote the plan's gates into it).
MINIMUM_GATES = ("listed", "chat", "stop")


@dataclass(frozen=True, kw_only=True)
class Failure:
    stage: str
    fact: str | None  # the fact's name; None: an error no fact knows
    file: str
    line_no: int | None  # None: the line is in a log's tail whose start was not read
    line: str
    meaning: str = ""
    fix: str = ""
    source: str = ""

    def cited(self) -> str:
        at = f"{self.file}:{self.line_no}" if self.line_no else f"{self.file} (tail)"
        return f"{at}: {self.line}"

    def as_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True, kw_only=True)
class JobState:
    """What Slurm said of the job (with ``--submit``)."""

    job_id: str
    state: str  # COMPLETED, FAILED, TIMEOUT, CANCELLED, ...
    exit_code: str = ""
    elapsed: str = ""
    tail: str = ""  # the end of the job's own output file

    @property
    def ok(self) -> bool:
        return self.state == "COMPLETED"


@dataclass(frozen=True, kw_only=True)
class ClusterVerdict:
    directory: str
    manifest: Mapping[str, Any]
    gates: tuple[Gate, ...]  # the plan's, each as the battery reported it or `not run`
    failures: tuple[Failure, ...]
    reached: str  # the stage the engine's logs reached
    job: JobState | None = None
    skipped: tuple[str, ...] = ()  # entries not read, and why
    recorded: str | None = None  # where the verdict was recorded (None: no digest to key by)
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def all_gates(self) -> tuple[Gate, ...]:
        """The job in the one verdict model: the battery's gates, then a failed gate for a
        Slurm job that did not complete and for each failure its logs show."""
        said = [Gate(name=f"stage {f.stage}", status=FAILED,
                     detail=f"{f.meaning or 'an error no fact names'}: {f.cited()}")
                for f in self.failures]  # fmt: skip
        if self.job is not None and not self.job.ok:
            job = f"{self.job.state} (exit {self.job.exit_code})"
            said.insert(0, Gate(name="slurm job", status=FAILED, detail=job))
        return (*self.gates, *said)

    @property
    def ok(self) -> bool:
        return ok(self.all_gates)

    def as_json(self) -> dict[str, Any]:
        return {
            **jsontext.plain(self, leave=("manifest", "job")),
            "ok": self.ok,
            **{k: self.manifest.get(k) for k in ("image", "container", "digest", "cluster")},
            "layers": self.manifest.get("layers"),
            "mode": self.manifest.get("mode") or "gpu",
            "job": None if self.job is None else dict(self.job.__dict__),
        }


def _entries(root: Path) -> tuple[list[str], list[str]]:
    """Files under ``root`` to read (relative paths, sorted), and what was skipped: links and
    special files are never followed or opened; depth and count are bounded."""
    files: list[str] = []
    skipped: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        depth = len(here.relative_to(root).parts)
        keep = []
        for name in sorted(dirnames):
            rel = (here / name).relative_to(root).as_posix()
            if os.path.islink(here / name):
                skipped.append(f"{one_line(rel)}: a symlink, not followed")
            elif depth + 1 > MAX_DEPTH:
                skipped.append(f"{one_line(rel)}: deeper than {MAX_DEPTH} levels, not read")
            else:
                keep.append(name)
        dirnames[:] = keep
        for name in sorted(filenames):
            rel = (here / name).relative_to(root).as_posix()
            mode = os.lstat(here / name).st_mode
            if not stat.S_ISREG(mode):
                skipped.append(f"{one_line(rel)}: not a regular file, not read")
            elif name in (MANIFEST, RESULT) or name.endswith(LOG_SUFFIXES):
                files.append(rel)
    files.sort()
    if len(files) > MAX_FILES:
        skipped.append(f"{len(files) - MAX_FILES} more files past the first {MAX_FILES}")
        files = files[:MAX_FILES]
    return files, skipped


def _read(root: Path, rel: str) -> tuple[str, bool]:
    """A file's text (its tail) and whether it was read whole."""
    got = read_tail(root, rel, limit=TAIL_BYTES)
    if got is None:
        return "", True
    data, size = got
    return data.decode(errors="replace"), size <= TAIL_BYTES


def _json(root: Path, rel: str) -> dict[str, Any] | None:
    text, whole = _read(root, rel)
    if not whole:
        return None
    try:  # a job's file: bounded, no NaN, no 10,000-deep nesting (never a RecursionError)
        data = jsontext.loads(text, where=rel, limit=TAIL_BYTES)
    except K3envError:
        return None
    return data if isinstance(data, dict) else None


def _gates(result: Mapping[str, Any] | None) -> tuple[Gate, ...]:
    """The driver's gates, bounded (its output is the job's logs, read apart)."""
    got = (result or {}).get("gates")
    if not isinstance(got, list):
        return ()
    reported = (Gate.read(g, detail=1000, output=0) for g in got[: 5 * MAX_GATES])
    return tuple(g for g in reported if g is not None)


def planned_gates(manifest: Mapping[str, Any]) -> tuple[str, ...]:
    """The gates the job was to run, as k3env planned them (the manifest's ``gates``), else
    the ones every battery runs."""
    got = manifest.get("gates")
    if isinstance(got, list) and got and all(isinstance(g, str) for g in got[:MAX_GATES]):
        return tuple(one_line(g)[:40] for g in got[:MAX_GATES])
    return MINIMUM_GATES


def _scan(rel: str, text: str, whole: bool) -> tuple[list[Failure], list[str], str | None]:
    """The facts one log's lines match (the first line of each), its lines, its last error."""
    found: dict[str, Failure] = {}
    last_error = None
    lines = text.splitlines()
    if not whole and lines:
        lines = lines[1:]  # the first line of a tail may be cut
    for i, raw in enumerate(lines, start=1):
        line = one_line(raw.strip())[:LINE]
        fact = stages.match(raw)
        if fact and fact.name not in found:
            found[fact.name] = Failure(
                stage=fact.stage,
                fact=fact.name,
                file=rel,
                line_no=i if whole else None,
                line=line,
                meaning=fact.meaning,
                fix=fact.fix,
                source=fact.source,
            )
        elif stages.ERROR.search(raw) and "[smoke]" not in raw:
            last_error = f"{i if whole else 0}\0{line}"
    return list(found.values()), lines, last_error


def collect(
    root: Path, *, job: JobState | None = None, manifest: Mapping[str, Any] | None = None
) -> ClusterVerdict:
    """The verdicts of the job whose output directory is ``root``. With ``job`` (what Slurm
    said of it) a directory the job never wrote is a verdict too; ``manifest``: what the job
    was to run, when its directory does not say."""
    if root.is_symlink() or ((root.exists() or job is None) and not root.is_dir()):
        raise ConfigError(
            "not a job output directory",
            where=str(root),
            fix="pass the directory the smoke job wrote (it holds k3env-smoke.json)",
        )
    files, skipped = _entries(root) if root.is_dir() else ([], [])
    given = dict(manifest or {})
    manifest = dict(given)
    result = None
    failures: dict[str, Failure] = {}
    all_lines: list[str] = []
    last_error: tuple[str, str] | None = None
    for rel in files:
        name = rel.rsplit("/", 1)[-1]
        try:
            if name == MANIFEST:
                manifest = _json(root, rel) or manifest
                continue
            if name == RESULT:
                result = _json(root, rel) or result
                continue
            text, whole = _read(root, rel)
        except UntrustedFileError as e:  # swapped for a link while we read: said, not read
            skipped.append(e.message)
            continue
        found, lines, error = _scan(rel, text, whole)
        for f in found:
            failures.setdefault(f.fact or "", f)
        all_lines += lines
        if error:
            last_error = (rel, error)
    # The plan k3env wrote for the job (the caller's) wins over the directory's copy.
    gates = planned(planned_gates(given or manifest), _gates(result))
    reached = stages.reached(all_lines)
    failed_job = (job is not None and not job.ok) or any(g.bad for g in gates)
    if job is not None and job.tail:
        found, lines, error = _scan("slurm job output", job.tail, False)
        for f in found:
            failures.setdefault(f.fact or "", f)
        if error and last_error is None:
            last_error = ("slurm job output", error)
    if failed_job and not failures and last_error:
        rel, error = last_error
        number, line = error.split("\0", 1)
        failures[""] = Failure(
            stage=reached, fact=None, file=rel, line_no=int(number) or None, line=line
        )
    notes = []
    if not root.is_dir():
        notes.append("the job wrote no output directory: it never started")
    elif result is None:
        notes.append("the battery wrote no result.json: it did not finish (or never started)")
    ordered = sorted(failures.values(), key=lambda f: stages.STAGES.index(f.stage))
    return ClusterVerdict(
        directory=str(root),
        manifest=manifest,
        gates=gates,
        failures=tuple(ordered),
        reached=reached,
        job=job,
        skipped=tuple(skipped),
        notes=tuple(notes),
    )


def record(state: State, verdict: ClusterVerdict) -> ClusterVerdict:
    """Record ``verdict`` by the image digest and cluster profile the job ran (its manifest);
    without a digest nothing is recorded, and the verdict says so."""
    digest = verdict.manifest.get("digest")
    cluster = verdict.manifest.get("cluster")
    if (
        not isinstance(digest, str)
        or not digest.startswith("sha256:")
        or not isinstance(cluster, str)
    ):
        return _with(
            verdict,
            notes=(
                *verdict.notes,
                "not recorded: the job directory names "
                "no image digest and cluster (k3env-smoke.json)",
            ),
        )
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in cluster)[:100]
    if verdict.manifest.get("mode") == "cpu-partition":  # never read as the GPU job's verdict
        name += ".cpu-partition"
    parts = ("smoke", "cluster", digest_hex(digest), f"{name}.json")
    out = _with(verdict, recorded=str(state.path(*parts)))
    state.write_json(out.as_json(), *parts)
    return out


def _with(verdict: ClusterVerdict, **changes: Any) -> ClusterVerdict:
    from dataclasses import replace

    return replace(verdict, **changes)


def table(verdict: ClusterVerdict) -> str:
    """The verdict for a person: one line per gate, one per failure with its cited line."""
    m = verdict.manifest
    what = f"{m.get('image', '?')} on {m.get('cluster', '?')}"
    if m.get("layers"):
        what += f" ({m['layers']} layers)"
    if m.get("mode") == "cpu-partition":
        what += f" (CPU partition mode: {one_line(str(m.get('stand_in', '?')))})"
    lines = [f"{what}: {'SERVES' if verdict.ok else 'FAILS'} ({verdict.directory})"]
    if verdict.job is not None:
        j = verdict.job
        lines.append(f"  slurm job {j.job_id}: {j.state} (exit {j.exit_code}, {j.elapsed})")
    for g in verdict.gates:
        lines.append(f"  {g.row()}")
    for f in verdict.failures:
        lines.append(f"  failed at {f.stage}: {f.meaning or 'an error no fact names'}")
        lines.append(f"    | {f.cited()}")
        if f.fix:
            lines.append(f"    fix: {f.fix}  [{f.source}]")
    if not verdict.gates and not verdict.failures:
        lines.append(
            f"  no battery result and no known failure; the logs reached {verdict.reached}"
        )
    if verdict.job is not None and not verdict.job.ok and verdict.job.tail:
        lines.append("  job output (tail):")
        lines += [f"    | {one_line(x)[:LINE]}" for x in verdict.job.tail.splitlines()[-10:]]
    lines += [f"  note: {n}" for n in verdict.notes]
    lines += [f"  skipped: {s}" for s in verdict.skipped]
    return "\n".join(lines)
