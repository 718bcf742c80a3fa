"""The one verdict model of every command that judges by running something (the CPU smoke,
the cluster job's battery and ``--collect``, srt-slurm's loader on a recipe, the matrix).

A plan names its gates before anything runs. Each gate ends ``passed`` (with its evidence),
``failed`` (with the process's or file's own words), ``not checked`` (with why this host
cannot see it) or ``not run``. A gate the plan named and nobody reported is ``not run``, never
read as passed; a result is ok only when every gate passed or was not checked, said why, and
at least one passed (a result with no evidence at all is not a pass).

Gates read back from a file others wrote (a job's ``result.json``, a record, the in-image
probe's rows) are untrusted: ``Gate.read`` bounds every field, and every reader takes a status
through ``read_status``: an unknown word is ``failed`` (the word named), and so is ``not
checked`` that does not say why. ``exit_code`` is the one way a result becomes an exit code.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from k3env.errors import CheckFailed
from k3env.quoting import one_line

PASSED = "passed"
FAILED = "failed"
NOT_CHECKED = "not checked"
NOT_RUN = "not run"
STATUSES = (PASSED, FAILED, NOT_CHECKED, NOT_RUN)
NAME_CHARS = 40
PLANNED_NOT_REPORTED = "planned, and the battery reported no verdict for it"
SHOWN = 5  # gates an exit code's message names


@dataclass(frozen=True, kw_only=True)
class Gate:
    name: str
    status: str  # one of STATUSES
    seconds: float = 0.0
    detail: str = ""  # the evidence, the words of the failure, or why it was not checked
    output: str = ""  # the process's output, where it was kept

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"gate {self.name!r}: status {self.status!r} is not one of {STATUSES}")

    @property
    def bad(self) -> bool:
        """Failed, or never ran: either way nothing passed."""
        return self.status in (FAILED, NOT_RUN)

    def as_json(self) -> dict[str, Any]:
        return {
            "gate": self.name,
            "status": self.status,
            "seconds": self.seconds,
            "detail": self.detail,
            **({"output": self.output} if self.output else {}),
        }

    def row(self) -> str:
        """One line of a table: status, gate, seconds, what was seen."""
        return f"{self.status:<11} {self.name:<11} {self.seconds:6.1f} s  {self.detail}"

    @classmethod
    def read(cls, data: object, *, detail: int = 2000, output: int = 16000) -> Gate | None:
        """A gate as others wrote it (JSON), bounded; ``None``: not a gate at all. An unknown
        status is ``failed``: only the four words are verdicts."""
        if not isinstance(data, Mapping):
            return None
        status, said = read_status(data.get("status"), one_line(str(data.get("detail") or "")))
        seconds = data.get("seconds")
        return cls(
            name=one_line(str(data.get("gate", "?")))[:NAME_CHARS],
            status=status,
            seconds=float(seconds)
            if isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
            else 0.0,
            detail=said[:detail],
            output=str(data.get("output") or "")[-output:] if output else "",
        )


def read_status(word: object, detail: str) -> tuple[str, str]:
    """A status others wrote, and its detail: one of the four words is itself; any other word
    is ``failed``, named in the detail; ``not checked`` that does not say why is ``failed``
    too (what a check cannot see is said, never passed in silence)."""
    if not isinstance(word, str) or word not in STATUSES:
        named = f"status {one_line(repr(word))[:NAME_CHARS]} is not a verdict: read as failed"
        return FAILED, named + (f"; {detail}" if detail else "")
    if word == NOT_CHECKED and not detail.strip():
        return FAILED, "not checked, and no reason given: read as failed"
    return word, detail


def planned(plan: Sequence[str], reported: Iterable[Gate]) -> tuple[Gate, ...]:
    """The plan's gates in its order, each as reported or ``not run``; then any reported gate
    the plan did not name (it is evidence too: a failure there still fails)."""
    got: dict[str, Gate] = {}
    for g in reported:
        got.setdefault(g.name, g)
    out = [got.pop(name) if name in got else Gate(name=name, status=NOT_RUN,
                                                  detail=PLANNED_NOT_REPORTED)
           for name in dict.fromkeys(plan)]  # fmt: skip
    return (*out, *got.values())


def summary(gates: Iterable[Gate]) -> str:
    """Several gates as one status: ``failed`` if one failed, else ``not run`` if one never
    ran (or there is none: nothing ran), else ``passed`` if one passed, else ``not checked``."""
    statuses = {g.status for g in gates} or {NOT_RUN}
    return next(s for s in (FAILED, NOT_RUN, PASSED, NOT_CHECKED) if s in statuses)


def ok(gates: Iterable[Gate]) -> bool:
    """Every gate passed or was not checked (said why), and at least one passed."""
    return summary(gates) == PASSED


def exit_code(gates: Sequence[Gate], *, what: str, where: str, fix: str) -> int:
    """The one way a result becomes an exit code: 0 when ``ok``; else ``CheckFailed`` (exit
    4, said by ``cli.main``) naming the gates that failed or never ran, or that none passed."""
    if ok(gates):
        return 0
    wrong = bad(gates)
    said = "; ".join(f"{g.name} {g.status}" + (f": {g.detail[:200]}" if g.detail else "")
                     for g in wrong[:SHOWN])  # fmt: skip
    more = f"; and {len(wrong) - SHOWN} more" if len(wrong) > SHOWN else ""
    counted = f"{len(wrong)} of {len(gates)} failed or did not run: " if wrong else ""
    raise CheckFailed(f"{what}: {counted}{said or 'nothing passed'}{more}", where=where, fix=fix)


def bad(gates: Iterable[Gate]) -> list[Gate]:
    """The gates that failed or never ran."""
    return [g for g in gates if g.bad]


def unchecked(gates: Iterable[Gate]) -> list[str]:
    """``name: why`` of each gate this host could not check."""
    return [f"{g.name}: {g.detail}" for g in gates if g.status == NOT_CHECKED]
