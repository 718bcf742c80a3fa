"""The one verdict model (k3env.verdict): a gate the plan named and nobody reported is not
run; only evidence passes; what others wrote is read bounded."""

from __future__ import annotations

import pytest

from k3env.errors import CheckFailed
from k3env.verdict import (
    FAILED,
    NOT_CHECKED,
    NOT_RUN,
    PASSED,
    PLANNED_NOT_REPORTED,
    STATUSES,
    Gate,
    bad,
    exit_code,
    ok,
    planned,
    read_status,
    summary,
    unchecked,
)


def gate(name: str, status: str, detail: str = "") -> Gate:
    return Gate(name=name, status=status, detail=detail)


def test_the_four_words_are_the_only_statuses() -> None:
    assert STATUSES == ("passed", "failed", "not checked", "not run")
    with pytest.raises(ValueError, match="status 'ok' is not one of"):
        Gate(name="chat", status="ok")


def test_a_result_is_ok_only_with_evidence_and_nothing_bad() -> None:
    assert not ok(())  # nothing ran
    assert not ok([gate("stop", NOT_CHECKED, "no process of its own")])  # no evidence
    assert ok([gate("listed", PASSED), gate("stop", NOT_CHECKED, "why")])
    assert ok([gate("listed", PASSED)])
    assert not ok([gate("listed", PASSED), gate("chat", FAILED)])
    assert not ok([gate("listed", PASSED), gate("chat", NOT_RUN)])
    assert not ok([gate("chat", NOT_RUN), gate("listed", PASSED)])


def test_bad_is_failed_or_not_run_and_unchecked_says_why() -> None:
    gates = [
        gate("env", PASSED),
        gate("listed", FAILED, "refused"),
        gate("tool-calls", NOT_CHECKED, "no parser"),
        gate("chat", NOT_RUN),
    ]
    assert [g.name for g in bad(gates)] == ["listed", "chat"]
    assert [g.bad for g in gates] == [False, True, False, True]
    assert unchecked(gates) == ["tool-calls: no parser"]


def test_the_plan_orders_the_gates_and_a_missing_one_is_not_run() -> None:
    reported = [gate("stop", PASSED), gate("listed", PASSED), gate("extra", FAILED, "x")]
    got = planned(("listed", "chat", "stop"), reported)
    assert [(g.name, g.status) for g in got] == [
        ("listed", PASSED),
        ("chat", NOT_RUN),
        ("stop", PASSED),
        ("extra", FAILED),  # reported beyond the plan: still evidence, still fails
    ]
    assert got[1].detail == PLANNED_NOT_REPORTED
    assert not ok(got)
    # A gate reported twice counts once, as first reported; a plan naming it twice, once.
    twice = planned(("chat", "chat"), [gate("chat", FAILED, "first"), gate("chat", PASSED)])
    assert [(g.name, g.status, g.detail) for g in twice] == [("chat", FAILED, "first")]
    assert planned((), ()) == ()


def test_a_gate_others_wrote_is_read_bounded() -> None:
    assert Gate.read(["not", "a", "gate"]) is None
    assert Gate.read("passed") is None
    odd = Gate.read({"gate": "listed\nINJECTED", "status": "ok!", "seconds": "9", "detail": 7})
    assert odd == Gate(name="listed\\nINJECTED", status=FAILED, seconds=0.0,
                       detail="status 'ok!' is not a verdict: read as failed; 7")  # fmt: skip
    assert Gate.read({"status": "passed", "seconds": True}) == Gate(name="?", status=PASSED)
    assert Gate.read({"gate": "g", "status": ["passed"]}) == Gate(
        name="g", status=FAILED, detail="status ['passed'] is not a verdict: read as failed"
    )
    long = Gate.read(
        {"gate": "n" * 99, "status": "passed", "seconds": 2, "detail": "d" * 99, "output": "ab"},
        detail=10,
        output=1,
    )
    assert long == Gate(name="n" * 40, status=PASSED, seconds=2.0, detail="d" * 10, output="b")
    assert Gate.read({"gate": "g", "status": "passed", "output": "abc"}, output=0) == Gate(
        name="g", status=PASSED
    )
    assert Gate.read({"gate": "g", "status": "not run", "seconds": 1.5}) == Gate(
        name="g", status=NOT_RUN, seconds=1.5
    )
    # Not checked says why, or it is failed: what a check cannot see is never a silent pass.
    assert Gate.read({"gate": "g", "status": "not checked", "detail": " "}) == Gate(
        name="g", status=FAILED, detail="not checked, and no reason given: read as failed"
    )
    full = Gate.read({"gate": "g", "status": "failed", "detail": "x" * 3000, "output": "y" * 20000})
    assert full is not None and len(full.detail) == 2000 and len(full.output) == 16000


def test_one_json_shape_and_one_table_row() -> None:
    g = Gate(name="chat", status=FAILED, seconds=1.25, detail="HTTP 500", output="tail")
    assert g.as_json() == {
        "gate": "chat",
        "status": "failed",
        "seconds": 1.25,
        "detail": "HTTP 500",
        "output": "tail",
    }
    assert "output" not in Gate(name="chat", status=PASSED).as_json()
    assert Gate.read(g.as_json()) == g  # a record reads back as written
    assert g.row() == "failed      chat           1.2 s  HTTP 500"
    assert Gate(name="benchmark", status=NOT_CHECKED, seconds=12.0, detail="why").row() == (
        "not checked benchmark     12.0 s  why"
    )


def test_one_status_of_several_is_the_worst_and_nothing_is_not_run() -> None:
    assert summary(()) == NOT_RUN  # nothing ran
    assert summary([gate("a", NOT_CHECKED, "why")]) == NOT_CHECKED
    assert summary([gate("a", NOT_CHECKED, "why"), gate("b", PASSED)]) == PASSED
    assert summary([gate("a", NOT_RUN), gate("b", PASSED)]) == NOT_RUN
    assert summary([gate("a", NOT_RUN), gate("b", FAILED)]) == FAILED
    for gates in ([], [gate("a", NOT_CHECKED, "w")], [gate("a", PASSED), gate("b", NOT_RUN)]):
        assert ok(gates) == (summary(gates) == PASSED)


def test_a_status_read_is_one_of_the_four_words_or_failed_naming_it() -> None:
    assert read_status("passed", "seen") == ("passed", "seen")
    assert read_status("not checked", "no GPU") == ("not checked", "no GPU")
    assert read_status("pass", "") == (FAILED, "status 'pass' is not a verdict: read as failed")
    assert read_status(None, "x") == (FAILED, "status None is not a verdict: read as failed; x")
    assert read_status("x" * 99, "")[1].startswith("status 'xxxx")
    assert len(read_status("x" * 99, "")[1]) < 90


def test_one_function_turns_a_result_into_an_exit_code() -> None:
    passed = gate("listed", PASSED)
    assert exit_code([passed, gate("gpu", NOT_CHECKED, "no GPU")], what="w", where="here",
                     fix="f") == 0  # fmt: skip
    with pytest.raises(CheckFailed) as e:
        exit_code([passed, gate("chat", FAILED, "HTTP 500"), gate("stop", NOT_RUN)],
                  what="the job did not serve", where="d", fix="read it")  # fmt: skip
    assert e.value.return_code == 4 and (e.value.where, e.value.fix) == ("d", "read it")
    assert e.value.message == (
        "the job did not serve: 2 of 3 failed or did not run: chat failed: HTTP 500; stop not run"
    )
    with pytest.raises(CheckFailed, match=r"^x: w: nothing passed$"):
        exit_code([gate("gpu", NOT_CHECKED, "no GPU")], what="w", where="x", fix="")
    with pytest.raises(CheckFailed, match=r"^x: w: nothing passed$"):
        exit_code([], what="w", where="x", fix="")
    many = [gate(f"g{i}", FAILED) for i in range(8)]
    with pytest.raises(CheckFailed, match="g4 failed; and 3 more"):
        exit_code(many, what="w", where="x", fix="")
