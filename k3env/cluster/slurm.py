"""A job on Slurm, through Slurm's own commands (run by ``k3env.runner``): submit it, follow it
to its end with progress lines, cancel it.

``follow`` never hangs: a job still there after ``timeout`` is cancelled (and said as timed
out by k3env), Ctrl-C cancels it too, and every Slurm command has its own deadline. The
final state is ``sacct``'s; where accounting is off (``sacct`` refuses), ``scontrol show
job``'s, which Slurm keeps for ``MinJobAge`` (300 s by default) after the end.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from k3env.cluster.collect import JobState
from k3env.errors import ToolError
from k3env.log import Log
from k3env.runner import poll, require_tool, run

COMMAND_SECONDS = 30.0  # each squeue / sacct / scontrol / scancel call
GONE_SECONDS = 60.0  # for a cancelled job to leave the queue
_JOB_ID = re.compile(r"^\d+(?:_\d+)?$")


@dataclass(frozen=True, kw_only=True)
class Clock:
    """Time, injectable (tests)."""

    now: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


def submit(script: str, log: Log) -> str:
    """``sbatch --parsable SCRIPT``: the job ID."""
    require_tool("sbatch", "slurm-client")
    out = run(["sbatch", "--parsable", script], log, capture=True, what="sbatch").strip()
    job = out.splitlines()[-1].split(";")[0].strip() if out else ""
    if not _JOB_ID.match(job):
        raise ToolError(
            f"sbatch answered no job ID: {out[-400:]!r}",
            where="sbatch",
            fix="check the Slurm configuration (sbatch --parsable)",
        )
    return job


def queued(job: str) -> str | None:
    """The job's state while Slurm lists it (``PENDING``, ``RUNNING``, ...); None once gone.
    A question ``squeue`` cannot answer is said as ``?``."""
    code, out = poll(["squeue", "-h", "-j", job, "-o", "%T"], timeout=COMMAND_SECONDS)
    if code != 0:
        # squeue exits 1 with "Invalid job id specified" for a job that already left.
        return None if "Invalid job id" in out else "?"
    state = out.strip().splitlines()[0].strip() if out.strip() else ""
    return state or None


def final_state(job: str) -> tuple[str, str, str]:
    """(state, exit code, elapsed) of a finished job: ``sacct``'s, else ``scontrol``'s."""
    code, out = poll(
        ["sacct", "-n", "-P", "-X", "-j", job, "-o", "State,ExitCode,Elapsed"],
        timeout=COMMAND_SECONDS,
    )
    rows = [r.split("|") for r in out.strip().splitlines() if r.count("|") == 2]
    if code == 0 and rows:
        state, exit_code, elapsed = rows[0]
        return state.split()[0] if state.strip() else "UNKNOWN", exit_code, elapsed
    code, out = poll(["scontrol", "show", "job", "-o", job], timeout=COMMAND_SECONDS)
    fields = dict(re.findall(r"(\w+)=(\S*)", out)) if code == 0 else {}
    return (
        fields.get("JobState", "UNKNOWN"),
        fields.get("ExitCode", ""),
        fields.get("RunTime", ""),
    )


def cancel(job: str, log: Log, *, clock: Clock | None = None) -> None:
    """``scancel JOB``, then wait (bounded) for Slurm to stop listing it."""
    clock = clock or Clock()
    log.command(["scancel", job])
    poll(["scancel", job], timeout=COMMAND_SECONDS)
    deadline = clock.now() + GONE_SECONDS
    while clock.now() < deadline and queued(job) not in (None, "?"):
        clock.sleep(1.0)


def follow(
    job: str, log: Log, *, timeout: float, interval: float = 2.0, clock: Clock | None = None
) -> JobState:
    """Wait for ``job`` to end, one progress line per state; cancel it past ``timeout`` (its
    state then ``TIMEOUT``, said as k3env's) or on Ctrl-C (then re-raised)."""
    clock = clock or Clock()
    start = clock.now()
    log.info(f"+ squeue -h -j {job} -o %T  (every {interval:g} s, at most {timeout:.0f} s)")
    last = None
    timed_out = False
    try:
        while (state := queued(job)) is not None:
            if state != last:
                log.info(f"    slurm job {job}: {state} ({clock.now() - start:.0f} s)")
                last = state
            if clock.now() - start > timeout:
                log.info(
                    f"    slurm job {job}: still {state} after --job-timeout "
                    f"{timeout:.0f} s: cancelling it"
                )
                cancel(job, log, clock=clock)
                timed_out = True
                break
            clock.sleep(interval)
    except KeyboardInterrupt:
        log.info(f"    interrupted: cancelling slurm job {job}")
        cancel(job, log, clock=clock)
        raise
    state, exit_code, elapsed = final_state(job)
    if timed_out:
        state = f"TIMEOUT (k3env --job-timeout {timeout:.0f} s; Slurm: {state})"
    log.info(f"    slurm job {job}: {state} (exit {exit_code}, {clock.now() - start:.0f} s)")
    return JobState(job_id=job, state=state, exit_code=exit_code, elapsed=elapsed)
