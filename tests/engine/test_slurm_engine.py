"""The cluster smoke on a real Slurm: Debian's slurm-wlm (slurmctld + slurmd) and munge,
started on localhost in a temporary directory; `k3env smoke --cluster ... --submit` submits a
passing and a failing smoke job with sbatch, follows them with squeue, collects and reports.

There is no pyxis and no GPU here, so the jobs run with `--runtime none` (the steps on the
node itself), and the image's `vllm` and `aiperf` are stand-ins from
tests/engine/slurm_standin/ (a stdlib HTTP server answering /v1/models and chat completions,
and a client writing aiperf's export). The stand-ins are used ONLY at this boundary, where the
container would be; the sbatch script, Slurm, the driver's battery, --collect and the records
are the real ones. They stay for one thing the real stack cannot give on a build host: the
GPU mode's per-rank `srun` serve steps (the GPU build of vLLM needs GPUs). The real image,
pyxis, enroot and the CPU engine run in test_pyxis_engine.py's CPU partition job.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from k3env.cli import main

from ..conftest import REPO, replace_in
from .conftest import _require

STANDIN = Path(__file__).parent / "slurm_standin"
TOOLS = ("slurmctld", "slurmd", "munged", "sbatch", "squeue", "scontrol", "scancel", "sinfo")
MUNGE_KEY = Path("/etc/munge/munge.key")
RETENTION = (REPO / "tests/data/cluster_logs/retention-interval.log").read_text().strip()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


SLURM_CONF = """\
ClusterName=k3envtest
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
AuthInfo=socket={root}/munge.sock
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
ReturnToService=2
InactiveLimit=0
KillWait=5
MinJobAge=300
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


@pytest.fixture
def local_slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """munged, slurmctld and slurmd on localhost (one node, its own ports, socket and spool),
    stopped after the test; the environment that points Slurm's commands at it."""
    with running_slurm(Path(tmp_path_factory.mktemp("slurm"))) as env:
        yield env


@contextlib.contextmanager
def running_slurm(
    root: Path, *, plugstack: str | None = None, slurmd_path: str | None = None
) -> Iterator[dict[str, str]]:
    """A throwaway Slurm in ``root``: ``plugstack`` the SPANK plugin lines (pyxis), and
    ``slurmd_path`` the PATH slurmd (and so each step's slurmstepd) runs with."""
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing or not MUNGE_KEY.exists() or os.geteuid() != 0:
        _require(f"Slurm and munge as root ({', '.join(missing) or 'munge.key or root'} missing; "
                 "scripts/host-setup.sh installs slurm-wlm and munge)")  # fmt: skip
    for d in ("state", "spool"):
        (root / d).mkdir()
    host = socket.gethostname().split(".")[0]
    conf = root / "slurm.conf"
    ports = {"ctld_port": _free_port(), "slurmd_port": _free_port()}
    text = SLURM_CONF.format(host=host, root=root, cpus=os.cpu_count() or 1, **ports)
    if plugstack is not None:
        (root / "plugstack.conf").write_text(plugstack)
        text = f"PlugStackConfig={root}/plugstack.conf\n" + text
    conf.write_text(text)
    env = {**os.environ, "SLURM_CONF": str(conf)}
    daemons = [
        ["munged", "--foreground", "--force", f"--socket={root}/munge.sock",
         f"--pid-file={root}/munged.pid", f"--log-file={root}/munged.log",
         f"--seed-file={root}/munge.seed", f"--key-file={MUNGE_KEY}"],
        ["slurmctld", "-D", "-f", str(conf)],
        ["slurmd", "-D", "-f", str(conf), "-N", host],
    ]  # fmt: skip
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for name, *args in daemons:
            daemon_env = {**env, "PATH": slurmd_path} if name == "slurmd" and slurmd_path else env
            # Found on this PATH, not slurmd's: a newer Slurm's wrappers (scripts/slurm-root.sh).
            argv = [shutil.which(name) or name, *args]
            with (root / f"{name}.out").open("wb") as out:
                procs.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                              env=daemon_env))  # fmt: skip
            if name == "munged":
                for _ in range(50):
                    if (root / "munge.sock").exists():
                        break
                    time.sleep(0.1)
        deadline = time.monotonic() + 30
        state = ""
        while time.monotonic() < deadline:
            state = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True,
                                   text=True).stdout.strip()  # fmt: skip
            if state == "idle":
                break
            time.sleep(0.5)
        assert state == "idle", f"slurmd did not register: {state!r}; see {root}"
        yield {"SLURM_CONF": str(conf)}
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _processes_mentioning(text: str) -> list[str]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if text in cmdline:
                out.append(f"{entry.name}: {cmdline}")
    return out


def _submit(out: Path, digest: str) -> int:
    container = f"reg.example/k3env/kimi-k3-direct-f@sha256:{digest}"
    return main(["smoke", "--cluster", "clusters/b200-dgxc.toml", "kimi-k3-direct-f",
                 "--layers", "2", "--runtime", "none", "--out", str(out), "--container",
                 container, "--job-timeout", "120", "--submit", "--json", "-q"])  # fmt: skip


def test_local_slurm_runs_a_passing_and_a_failing_smoke_job(
    repo: Path,
    local_slurm: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    shutil.copytree(REPO / "clusters", repo / "clusters")
    # Its own port: the host's 8000 may be taken.
    replace_in(repo / "images/kimi-k3-direct-f.toml", '"--served-model-name", "Kimi-K3",',
               f'"--served-model-name", "Kimi-K3", "--port", "{_free_port()}",')  # fmt: skip
    monkeypatch.setenv("SLURM_CONF", local_slurm["SLURM_CONF"])
    monkeypatch.setenv("PATH", f"{STANDIN}:{os.environ['PATH']}")
    start = time.monotonic()

    passing = repo / "passing"
    code = _submit(passing, "1" * 64)
    ok = json.loads(capsys.readouterr().out)["collected"]
    assert code == 0, ok
    assert ok["ok"] is True and ok["job"]["state"] == "COMPLETED"
    assert [(g["gate"], g["status"]) for g in ok["gates"]] == [
        ("listed", "passed"), ("chat", "passed"), ("reasoning", "passed"),
        ("benchmark", "passed"), ("stop", "not checked"),
    ]  # fmt: skip
    # The job started the servers: the driver has none to stop, and says so (never "passed").
    assert "no process to stop" in ok["gates"][-1]["detail"]

    monkeypatch.setenv("K3ENV_STANDIN_FAILS", RETENTION)
    failing = repo / "failing"
    code = _submit(failing, "2" * 64)
    bad = json.loads(capsys.readouterr().out)["collected"]
    assert code == 4
    assert bad["ok"] is False and bad["job"]["state"] == "FAILED"
    (failure,) = bad["failures"]
    assert failure["stage"] == "init" and failure["line"] == RETENTION
    assert failure["file"] == "logs/vllm-serve-0.log"
    seconds = time.monotonic() - start
    print(f"\nlocal Slurm: a passing and a failing smoke job in {seconds:.1f} s")

    # Both verdicts recorded by digest and cluster profile.
    state = repo / "state/smoke/cluster"
    assert sorted(p.name for p in state.iterdir()) == ["1" * 64, "2" * 64]
    # Nothing left behind: no job, no process, no file outside the job directories.
    env = {**os.environ, "SLURM_CONF": local_slurm["SLURM_CONF"]}
    queue = subprocess.run(["squeue", "-h"], env=env, capture_output=True, text=True)
    assert queue.stdout.strip() == ""
    assert _processes_mentioning(str(STANDIN)) == []
    assert _processes_mentioning(str(repo / "passing")) == []
    for out, job in ((passing, ok), (failing, bad)):
        job_id = job["job"]["job_id"]
        top = sorted(p.name for p in out.iterdir())
        assert top == sorted(["bin", "recipe.yaml", "smoke.sbatch", f"job-{job_id}",
                              f"slurm-{job_id}.out"])  # fmt: skip
        assert not list(out.rglob("*.partial"))
