"""The host's verdict rows as the user reads them (k3env.checks.verdicts): an image report's
JSON, the versions the lock expects under a variant, the requirement rows (each subject and
message whole) and the patch rows (order, every missing edit named)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from k3env.checks.verdicts import (
    NOT_REPORTED,
    CheckResult,
    ImageReport,
    expected_versions,
    patch_rows,
    requirement_rows,
    with_unreported,
)
from k3env.config.lock import load_lock
from k3env.config.spec import load_spec
from k3env.image.build import BuildResult
from k3env.image.patches import SKIPPED, PatchResult
from k3env.verdict import Gate

from .conftest import TEST_BASE_REPOSITORY, replace_in
from .fake_engine import FakeEngine, python_base
from .project import BUGGY, MODULE_FILE, PATCH, PatchPin, Project, write_project
from .test_requirements import DYNAMO, ENV, RUNTIME, TORCH, UVLOOP, vllm

LOCK = Path("pins/k3.lock.toml")
DYNAMO_PATH = DYNAMO["path"]
# What the CPU twin (linux/amd64) leaves out or stands in for, among the dynamo image's needs.
WAIVED = (
    "2 requirement(s) on 2 distribution(s) the CPU twin leaves out or stands in for, not "
    "checked here: flashinfer-python, torch"
)


def versions_row(
    subject: str, status: str, output: str, image: str = "kimi-k3-dynamo"
) -> CheckResult:
    return CheckResult(image=image, profile=None, check="versions", subject=subject,
                       status=status, component="image", version=None, output=output)  # fmt: skip


def rows_of(
    repo: Path,
    distributions: list[dict[str, Any]],
    *,
    twin: bool = True,
    environment: dict[str, str] = ENV,
    image: str = "kimi-k3-dynamo",
) -> list[CheckResult]:
    lock = load_lock(repo / LOCK)
    spec = load_spec(repo / f"images/{image}.toml", lock)
    facts = {"distributions": distributions, "marker_environment": environment}
    return requirement_rows(lock, spec, facts, twin)


# --- an image's report --------------------------------------------------------------------------
def test_an_image_report_in_json_names_every_field_and_rounds_seconds_to_milliseconds() -> None:
    rows = (
        CheckResult(image="kimi-k3-dynamo", profile="agg", check="args",
                    subject="commands[1] dynamo-worker", status="failed", component="dynamo",
                    version="1.6.1", output="unrecognized arguments: --x"),
        CheckResult(image="kimi-k3-dynamo", profile=None, check="args", subject="serve",
                    status="passed", component="vllm", version="0.31.0", output="ok"),
        CheckResult(image="kimi-k3-dynamo", profile=None, check="imports", subject="vllm",
                    status="passed", component="vllm", version="0.31.0", output="imported"),
        CheckResult(image="kimi-k3-dynamo", profile=None, check="imports", subject="x",
                    status="not checked", component="image", version=None, output="not checked"),
    )  # fmt: skip
    report = ImageReport(image="kimi-k3-dynamo", reference="reg/kimi:t", image_id="sha256:ab",
                         results=rows, facts={"versions": {"vllm": "0.31.0"}},
                         seconds=1.23456, cached=True, platform="linux/arm64")  # fmt: skip
    assert report.as_json() == {
        "image": "kimi-k3-dynamo",
        "reference": "reg/kimi:t",
        "image_id": "sha256:ab",
        "platform": "linux/arm64",
        "seconds": 1.235,
        "cached": True,
        "matrix": {
            "versions": "not checked",
            "imports": "passed",
            "args": "failed",
            "parsers": "not checked",
            "tokenizer": "not checked",
            "patches": "not checked",
            "env": "not checked",
        },
        "results": [r.__dict__ for r in rows],
        "facts": {"versions": {"vllm": "0.31.0"}},
    }
    assert rows[0].as_json() == {
        "image": "kimi-k3-dynamo", "profile": "agg", "check": "args",
        "subject": "commands[1] dynamo-worker", "status": "failed", "component": "dynamo",
        "version": "1.6.1", "output": "unrecognized arguments: --x",
    }  # fmt: skip
    assert report.failed == [rows[0]]


def probe_row(status: object, output: str = "said") -> CheckResult:
    row = {"check": "env", "subject": "A", "status": status, "profile": None,
           "component": "image", "version": None, "output": output}  # fmt: skip
    return CheckResult.read(row, "img")


def test_the_probes_words_are_read_as_verdicts_and_an_unknown_one_fails_naming_it() -> None:
    """pass / fail / skip are the in-image probe's words (and those of every verify record an
    earlier k3env wrote): read at the edge, as records of this one are."""
    assert [probe_row(w).status for w in ("pass", "fail", "skip")] == [
        "passed", "failed", "not checked"
    ]  # fmt: skip
    assert probe_row("skip", "no GPU here").output == "no GPU here"  # why it was not checked
    assert [probe_row(w).status for w in ("passed", "not run")] == ["passed", "not run"]
    odd = probe_row("ok")
    assert (odd.status, odd.output) == (
        "failed",
        "status 'ok' is not a verdict: read as failed; said",
    )
    assert probe_row(None).status == probe_row(["pass"]).status == "failed"
    blind = probe_row("skip", "")  # not checked, and no why: never a silent pass
    assert (blind.status, blind.output) == (
        "failed", "not checked, and no reason given: read as failed"
    )  # fmt: skip
    junk = CheckResult.read(["pass"], "img")
    assert (junk.status, junk.check, junk.subject) == ("failed", "?", "?")
    assert "not a row: ['pass']" in junk.output
    assert probe_row("fail", "first\nsecond").gate == Gate(
        name="img env A", status="failed", detail="first"
    )
    with pytest.raises(ValueError, match="status 'pass' is not a verdict"):
        CheckResult(image="i", profile=None, check="env", subject="A", status="pass",
                    component="image", version=None, output="")  # fmt: skip


def test_a_planned_check_nobody_reported_is_not_run_and_a_report_beyond_the_plan_stays() -> None:
    reported = [probe_row("pass"), dataclasses.replace(probe_row("fail"), subject="EXTRA")]
    plan = [("env", None, "A"), ("env", None, "B"), ("env", None, "B"), ("args", "agg", "c")]
    got = with_unreported("img", plan, reported)
    assert [(r.check, r.profile, r.subject, r.status) for r in got] == [
        ("env", None, "A", "passed"),
        ("env", None, "EXTRA", "failed"),  # beyond the plan: still evidence, still fails
        ("env", None, "B", "not run"),  # planned twice: once
        ("args", "agg", "c", "not run"),
    ]
    assert got[2].output == NOT_REPORTED
    report = ImageReport(image="img", reference="r", image_id="i", results=got, facts={},
                         seconds=0.0)  # fmt: skip
    assert report.failed == list(got[1:])
    assert (report.status("env"), report.status("args"), report.status("imports")) == (
        "failed", "not run", "not checked"
    )  # fmt: skip


# --- what the lock expects the image to hold ----------------------------------------------------
def test_a_variants_closure_and_release_set_the_versions_expected_over_the_twin(
    repo: Path,
) -> None:
    """dynamo-1.5.1 lays vLLM 0.28.0 over the twin; a closure that moves torch (as a release
    built on another torch would) moves the torch the image is held to."""
    closure = repo / "pins/variants/dynamo-1.5.1.requirements.txt"
    closure.write_text(closure.read_text() + "torch==2.12.0+cpu --hash=sha256:" + "a" * 64 + "\n")
    lock = load_lock(repo / LOCK)
    variant = lock.with_variant(lock.variants["dynamo-1.5.1"])
    spec = load_spec(repo / "images/kimi-k3-dynamo.toml", variant)
    assert expected_versions(variant, spec, twin=True) == {
        "vllm": "0.28.0",  # the variant's own wheel, over the twin's 0.31.0
        "dynamo": "1.5.1",
        "dynamo-runtime": "1.5.1",
        "torch": "2.12.0+cpu",  # the closure's, over the twin's 2.13.0+cpu
        "aiperf": "0.13.0",
    }
    # Not over the twin: only the baked wheels are pinned.
    assert expected_versions(variant, spec, twin=False) == {
        "vllm": None, "dynamo": "1.5.1", "dynamo-runtime": "1.5.1", "torch": None,
        "aiperf": "0.13.0",
    }  # fmt: skip


# --- requirement rows ---------------------------------------------------------------------------
def test_no_distribution_list_is_one_failed_requirements_row(repo: Path) -> None:
    expected = [
        versions_row("requirements", "failed", "the probe listed no installed distributions")
    ]
    lock = load_lock(repo / LOCK)
    spec = load_spec(repo / "images/kimi-k3-dynamo.toml", lock)
    assert requirement_rows(lock, spec, {}, twin=True) == expected
    assert requirement_rows(lock, spec, {"distributions": "vllm"}, twin=True) == expected


def test_a_distribution_listed_twice_from_one_place_is_one_install(repo: Path) -> None:
    """The probe reads one dist-info twice when its directory is twice on sys.path."""
    out = rows_of(repo, [DYNAMO, dict(DYNAMO), RUNTIME, UVLOOP, TORCH, vllm("0.31.0")])
    assert out == [
        versions_row("requirements waived in the twin", "not checked", WAIVED),
        versions_row("requirements", "passed", "every Requires-Dist of 5 installed distributions "
                     "holds (extras in use: ai-dynamo[vllm])"),
    ]  # fmt: skip


def test_a_distribution_installed_in_two_places_fails_naming_both_and_nothing_passes(
    repo: Path,
) -> None:
    old = {**DYNAMO, "version": "1.4.2", "requires": [], "path": "/usr/lib/python3/dist-packages"}
    out = rows_of(repo, [DYNAMO, old, RUNTIME, UVLOOP, TORCH, vllm("0.31.0")])
    assert out == [
        versions_row("installed ai-dynamo", "failed",
                     f"ai-dynamo is installed twice: 1.6.1 ({DYNAMO_PATH}) and 1.4.2 "
                     "(/usr/lib/python3/dist-packages); Python imports one of them"),
        versions_row("requirements waived in the twin", "not checked", WAIVED),
    ]  # fmt: skip
    # A second listing with no path at all is another install too.
    unplaced = {k: v for k, v in old.items() if k != "path"}
    (twice, _) = rows_of(repo, [DYNAMO, unplaced, RUNTIME, UVLOOP, TORCH, vllm("0.31.0")])
    assert twice.output == (
        f"ai-dynamo is installed twice: 1.6.1 ({DYNAMO_PATH}) and 1.4.2 (None); "
        "Python imports one of them"
    )


def test_requirements_are_judged_with_the_images_marker_environment(repo: Path) -> None:
    """A requirement whose marker holds in the image (not on this host) is required."""
    winonly = {"name": "winonly", "version": "1.0", "path": "/w",
               "requires": ["pywin32>=300; sys_platform == 'win32'"]}  # fmt: skip
    windows = {**ENV, "sys_platform": "win32", "platform_system": "Windows", "os_name": "nt"}
    out = rows_of(repo, [winonly], twin=False, environment=windows, image="kimi-k3-direct-f")
    assert out == [
        versions_row("requires winonly", "failed",
                     "winonly 1.0 requires pywin32>=300; not installed", image="kimi-k3-direct-f"),
    ]  # fmt: skip
    # In a Linux image the same requirement does not apply.
    out = rows_of(repo, [winonly], twin=False, image="kimi-k3-direct-f")
    assert out == [
        versions_row("requirements", "passed",
                     "every Requires-Dist of 1 installed distributions holds",
                     image="kimi-k3-direct-f"),
    ]  # fmt: skip


def test_unmet_requirements_each_fail_under_their_distribution_in_order_and_nothing_passes(
    repo: Path,
) -> None:
    out = rows_of(repo, [DYNAMO, RUNTIME, UVLOOP, TORCH, vllm("0.31.0")], twin=False)
    # Its own requirements first, then its extras'.
    assert out == [
        versions_row("requires vllm", "failed",
                     "vllm 0.31.0 requires torch==2.14.0; installed torch 2.13.0+cpu"),
        versions_row("requires vllm", "failed",
                     "vllm 0.31.0 requires flashinfer-python==0.7.0 (extra flashinfer); "
                     "not installed"),
    ]  # fmt: skip


def test_the_pass_row_names_every_extra_in_use_of_every_component(repo: Path) -> None:
    replace_in(LOCK, 'extras = ["vllm"]', 'extras = ["vllm", "otel"]')
    replace_in(LOCK, 'version = "0.13.0"\nwheels', 'version = "0.13.0"\nextras = ["dev"]\nwheels')
    aiperf = {"name": "aiperf", "version": "0.13.0", "requires": [], "path": "/a"}
    out = rows_of(repo, [DYNAMO, RUNTIME, UVLOOP, TORCH, vllm("0.31.0"), aiperf])
    assert out[-1] == versions_row(
        "requirements", "passed", "every Requires-Dist of 6 installed distributions holds "
        "(extras in use: ai-dynamo[vllm,otel], aiperf[dev])",
    )  # fmt: skip


# --- patch rows ---------------------------------------------------------------------------------
TWO_EDITS = (
    PATCH + '[[edits]]\nanchor = "max(num_sampled, 1)"\nreplacement = "max(num_sampled, 2)"\n'
)


def patch_project(tmp_path: Path, engine: FakeEngine, patches: dict[str, PatchPin]) -> Project:
    bases = {
        "testbase": engine.publish(TEST_BASE_REPOSITORY, python_base(BUGGY)),
        "otherbase": engine.publish("127.0.0.1:5000/k3env-test/other", python_base(BUGGY)),
    }
    return write_project(tmp_path, bases, patches=patches)


def build_of(patches: tuple[PatchResult, ...]) -> BuildResult:
    return BuildResult(
        image="probe", reference="r:t", image_id="sha256:" + "0" * 64, inputs="i", cached=False,
        base="testbase", base_id="sha256:" + "1" * 64, twin=False, patches=patches, env=(),
        engine_id="sha256:" + "0" * 64, base_engine_id="sha256:" + "1" * 64,
    )  # fmt: skip


def patch_row(subject: str, status: str, output: str) -> CheckResult:
    return CheckResult(image="probe", profile=None, check="patches", subject=subject,
                       status=status, component="image", version=None, output=output)  # fmt: skip


def test_a_skipped_patch_does_not_end_the_patch_rows(
    tmp_path: Path, fake_engine: FakeEngine
) -> None:
    other = PatchPin(text='[[edits]]\nanchor = "a = 1"\nreplacement = "a = 2"\n',
                     bases=("otherbase",), module=None, path="/opt/other/settings.py")  # fmt: skip
    project = patch_project(tmp_path, fake_engine, {"other": other, "int64": PatchPin()})
    lock = project.lock()
    skipped = PatchResult(name="other", target="/opt/other/settings.py", status=SKIPPED,
                          detail="written for another base", new_text=None)  # fmt: skip
    targets = {"int64": {"path": MODULE_FILE, "text": BUGGY}}
    assert patch_rows(lock, project.spec(lock), build_of((skipped,)), targets) == [
        patch_row("other", "not checked", "written for another base"),
        patch_row("int64", "failed",
                  f"{MODULE_FILE}: edit 1: not applied (its anchor is still at line 2)"),
    ]  # fmt: skip


def test_every_missing_edit_of_a_patch_is_named_in_its_row(
    tmp_path: Path, fake_engine: FakeEngine
) -> None:
    project = patch_project(tmp_path, fake_engine, {"int64": PatchPin(text=TWO_EDITS)})
    lock = project.lock()
    targets = {"int64": {"path": MODULE_FILE, "text": BUGGY}}
    assert patch_rows(lock, project.spec(lock), build_of(()), targets) == [
        patch_row("int64", "failed",
                  f"{MODULE_FILE}: edit 1: not applied (its anchor is still at line 2); "
                  "edit 2: not applied (its anchor is still at line 2)"),
    ]  # fmt: skip
