"""What others wrote, printed for a person: an error's parts, a progress line, a result on
stdout and a finding show a control character (an escape sequence, a carriage return, a line
break) as its escape, so a name from a file, a registry or a recipe cannot clear the screen or
forge a line of its own; and the one JSON document of ``--json`` is strict or not printed."""

from __future__ import annotations

import argparse
import json

import pytest

from k3env.checks.preflight import Finding
from k3env.cli import main
from k3env.commands import schema
from k3env.commands.app import App
from k3env.errors import ConfigError, SpecError, ToolError
from k3env.log import Log

FORGED = "bad\x1b[2J\nall good"  # clears the screen, then a line of its own
SHOWN = "bad\\x1b[2J\\nall good"


def test_an_error_renders_each_part_on_one_line_with_its_escapes_visible() -> None:
    e = ConfigError(FORGED, where="images/x\r.toml", fix="do\x07 this\nall good")
    assert e.render().split("\n") == [
        f"images/x\\r.toml: {SHOWN}",
        "  fix: do\\x07 this\\nall good",
    ]
    assert str(e) == e.render()
    assert e.message == FORGED  # the data itself is kept: --json carries it exactly
    assert e.as_json()["where"] == "images/x\r.toml"


def test_another_programs_output_is_quoted_a_line_each_under_the_message() -> None:
    e = ToolError("`pip download x ...` exited 1:", where="pip", fix="read the output above",
                  output="Collecting x\n\x1b[31mERROR\x1b[0m: none\rall good\n")  # fmt: skip
    assert e.render().split("\n") == [
        "pip: `pip download x ...` exited 1:",
        "  | Collecting x",
        "  | \\x1b[31mERROR\\x1b[0m: none",
        "  | all good",
        "  fix: read the output above",
    ]
    assert e.said == "`pip download x ...` exited 1: all good"
    assert e.as_json()["output"] == "Collecting x\n\x1b[31mERROR\x1b[0m: none\rall good\n"
    assert ConfigError("plain").as_json()["output"] is None


def test_said_keeps_the_line_that_says_why_after_a_long_message() -> None:
    command = "`python -m pip install " + "x " * 400 + "` exited 1:"
    e = ToolError(command, where="pip", fix="-", output="noise\nERROR: No matching distribution\n")
    said = e.said
    assert said.endswith(" ERROR: No matching distribution") and len(said) < 600
    assert said.startswith("`python -m pip install x") and "..." in said


def test_the_cli_says_such_an_error_on_stderr_with_no_raw_escape(
    capsys: pytest.CaptureFixture[str],
) -> None:
    lock = f"/nonexistent/{FORGED}.toml"
    assert main(["lock", "--check", "--lock", lock]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\r" not in err
    assert err.splitlines() == [
        f"k3env: error: /nonexistent/{SHOWN}.toml: file not found",
        "  fix: check the path, or create the file",
    ]
    assert main(["lock", "--check", "--json", "--lock", lock]) == 2
    captured = capsys.readouterr()
    assert "\x1b" not in captured.err and len(captured.err.splitlines()) == 2
    assert json.loads(captured.out)["error"]["where"] == lock  # JSON escapes it its own way


def test_a_progress_message_is_one_line_whatever_it_carries(
    capsys: pytest.CaptureFixture[str],
) -> None:
    log = Log(tty=False)
    log.info(FORGED)
    log.detail(FORGED)
    log.command(["echo", FORGED])
    log.live(FORGED)
    assert capsys.readouterr().err.splitlines() == [
        SHOWN,
        f"    {SHOWN}",
        f"+ echo {SHOWN}",
        f"    {SHOWN}",
    ]
    tty = Log(tty=True)
    tty.live(FORGED)
    tty.live("")
    # Only k3env's own redraw sequence reaches the terminal raw.
    assert capsys.readouterr().err == f"\r\x1b[K    {SHOWN}\n"


def test_a_result_printed_for_a_person_keeps_its_lines_and_escapes_the_rest(
    capsys: pytest.CaptureFixture[str],
) -> None:
    app = App(log=Log(quiet=True))
    app.emit({"x": 1}, lambda: print(f"one\t{FORGED}\rdone"))
    assert capsys.readouterr().out == "one\\tbad\\x1b[2J\nall good\\rdone\n"
    print("\x1b[0m")  # outside emit, stdout is the stream it was
    assert capsys.readouterr().out == "\x1b[0m\n"


def test_a_finding_on_a_recipe_key_is_two_lines_whatever_the_key_holds() -> None:
    finding = Finding(rule="r1", severity="error", image="i", profile="p", file="recipe.yaml",
                      key=f"backend.{FORGED}", message="m\x1b]0;title\x07", fix="f\nall good",
                      line=3)  # fmt: skip
    assert finding.text().split("\n") == [
        f"recipe.yaml:3: backend.{SHOWN}: r1 error: m\\x1b]0;title\\x07",
        "    fix: f\\nall good",
    ]


def _emits(value: object, *, then: Exception | None = None) -> object:
    def run(args: argparse.Namespace, app: App) -> int:
        app.emit({"images": [{"size": value}]}, lambda: print("for a person"))
        if then is not None:
            raise then
        return 0

    return run


def test_a_non_finite_number_in_the_json_result_is_an_error_not_half_a_document(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(schema, "run", _emits(float("nan")))
    assert main(["schema", "lock", "--json"]) == 3
    out, err = capsys.readouterr()
    document = json.loads(out)  # one whole, strict document: the error alone
    assert list(document) == ["error"] and document["error"]["error"] == "StateError"
    assert "$.images[0].size is nan" in document["error"]["message"]
    assert err.startswith("k3env: error: schema: the JSON result cannot be written: $.images[0]")
    assert "Traceback" not in err and "NaN" not in out
    # Without --json the person's rendering is printed and nothing refuses it.
    assert main(["schema", "lock"]) == 0
    assert capsys.readouterr().out == "for a person\n"


def test_an_error_after_a_non_finite_result_is_printed_alone(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    failed = SpecError("the spec is wrong", where="images/x.toml", fix="fix it")
    monkeypatch.setattr(schema, "run", _emits(float("-inf"), then=failed))
    assert main(["schema", "lock", "--json"]) == 2
    out, err = capsys.readouterr()
    assert json.loads(out) == {"error": failed.as_json()}
    assert err == "k3env: error: images/x.toml: the spec is wrong\n  fix: fix it\n"


def test_a_non_finite_number_raised_on_its_way_into_a_document_is_an_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from k3env import jsontext

    def run(args: argparse.Namespace, app: App) -> int:
        jsontext.dumps({"ratio": float("inf")})
        return 0

    monkeypatch.setattr(schema, "run", run)
    assert main(["schema", "lock"]) == 3
    err = capsys.readouterr().err
    assert err.startswith("k3env: error: schema: a JSON document cannot be written: $.ratio is inf")
