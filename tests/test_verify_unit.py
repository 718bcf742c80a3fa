"""Verify's host side over the in-memory engine: the plan, patch verdicts, the probe's output."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from k3env.checks.preflight import load_facts
from k3env.checks.probe_plan import (
    ENV_DEFAULT_SOURCES,
    ENV_FAMILIES,
    TOKENIZER_CANDIDATES,
    plan_for,
    planned_checks,
)
from k3env.checks.probe_run import MARK, PROBE_ENV
from k3env.checks.verdicts import (
    COMPONENTS,
    NOT_REPORTED,
    CheckResult,
    expected_versions,
    patch_rows,
)
from k3env.checks.verify import verify_image, verify_images
from k3env.config.lock import load_lock
from k3env.config.pins import Lock
from k3env.config.spec import ImageSpec, load_spec
from k3env.engine.protocol import RunResult
from k3env.errors import EngineError, StateError
from k3env.image.build import BuildResult, build_all, make_builder
from k3env.image.records import Facts, read
from k3env.log import Log
from k3env.state import State
from k3env.verdict import NOT_RUN

from .conftest import TEST_BASE_REPOSITORY, replace_in
from .fake_engine import FakeEngine, python_base
from .project import BUGGY, FIXED, MODULE_FILE, REWRITTEN, PatchPin, Project, write_project

QUIET = Log(quiet=True)
NOT_FOUND = "target module k3test.mod not found in the image"
SKIP_DETAIL = "written for base(s) ['otherbase'], not testbase"
PROFILES = """
[env_readers]
MY_SETTING = "the launcher script"

[profiles.agg]
description = "frontend + worker"
tokenizer_model_type = "kimi_k3"
tool_call_parser = "kimi_k3"
reasoning_parser = "kimi_k3"

[[profiles.agg.commands]]
role = "dynamo-frontend"
argv = ["python3", "-m", "dynamo.frontend", "--http-port", "8000"]

[[profiles.agg.commands]]
role = "dynamo-worker"
argv = ["python3", "-m", "dynamo.vllm", "--model", "/model"]
"""
SERVE_ONLY = """\
base = "testbase"
[profiles.direct]
[[profiles.direct.commands]]
role = "vllm-serve"
argv = ["vllm", "serve", "/model"]
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_engine: FakeEngine) -> Project:
    """Two bases; ``int64`` is written for the spec's base, ``other`` only for another one."""
    monkeypatch.setenv("K3ENV_STATE_DIR", str(tmp_path / "state"))
    bases = {
        "testbase": fake_engine.publish(TEST_BASE_REPOSITORY, python_base(BUGGY)),
        "otherbase": fake_engine.publish("127.0.0.1:5000/k3env-test/other", python_base(BUGGY)),
    }
    patches = {
        "int64": PatchPin(),
        "other": PatchPin(
            text='[[edits]]\nanchor = "a = 1"\nreplacement = "a = 2"\n',
            bases=("otherbase",),
            module=None,
            path="/opt/other/settings.py",
        ),
    }
    return write_project(
        tmp_path,
        bases,
        env={"A": "1", "MY_SETTING": "x"},
        patches=patches,
        spec_tail=PROFILES,
    )


def built(engine: FakeEngine, project: Project) -> tuple[Lock, ImageSpec, BuildResult]:
    """The project's lock and spec, and the spec built."""
    lock = project.lock()
    spec = project.spec(lock)
    return lock, spec, make_builder(lock, engine, project.state, QUIET, False).build(spec)


def test_plan_carries_profiles_env_components_versions_and_patch_skips(
    fake_engine: FakeEngine, project: Project
) -> None:
    lock, spec, build = built(fake_engine, project)
    assert [(p.name, p.status) for p in build.patches] == [
        ("int64", "applied"),
        ("other", "skipped"),
    ]

    plan = plan_for(lock, spec, build, lock.bases["testbase"], False)
    assert plan == {
        "image": "probe",
        "absent_by_design": [],  # only the twin leaves modules out by design
        "stand_ins": [],  # the twin's CPU stand-ins: none over a registry base
        "profiles": [
            {
                "name": "agg",
                "tokenizer_model_type": "kimi_k3",
                "tool_call_parser": "kimi_k3",
                "reasoning_parser": "kimi_k3",
                "commands": [
                    {
                        "role": "dynamo-frontend",
                        "argv": ["python3", "-m", "dynamo.frontend", "--http-port", "8000"],
                    },
                    {
                        "role": "dynamo-worker",
                        "argv": ["python3", "-m", "dynamo.vllm", "--model", "/model"],
                    },
                ],
            }
        ],
        "patches": [
            {"name": "int64", "module": "k3test.mod", "path": None},
            {"name": "other", "skip": SKIP_DETAIL},
        ],
        # Each role's entrypoint modules, as the process imports them first.
        "imports": ["dynamo.frontend.main", "dynamo.vllm.main"],
        # Every baked variable, with what reads it when the spec says so.
        "env": {"STACK_WIDE": None, "A": None, "MY_SETTING": "the launcher script"},
        "env_families": {k: list(v) for k, v in ENV_FAMILIES.items()},
        "env_default_sources": list(ENV_DEFAULT_SOURCES),
        # A registry base, no components baked: the lock pins no installed versions.
        "versions": {c: None for c in COMPONENTS},
        "components": COMPONENTS,
        "tokenizer_candidates": list(TOKENIZER_CANDIDATES),
    }
    json.dumps(plan)  # it travels as JSON
    # The verdicts the probe owes for it: each one it does not report is not run.
    assert planned_checks(plan) == [
        *(("versions", None, c) for c in COMPONENTS),
        ("imports", None, "dynamo.frontend.main"), ("imports", None, "dynamo.vllm.main"),
        ("args", "agg", "commands[0] dynamo-frontend"),
        ("args", "agg", "commands[1] dynamo-worker"),
        ("parsers", "agg", "tool_call_parser kimi_k3"),
        ("parsers", "agg", "reasoning_parser kimi_k3"),
        ("tokenizer", "agg", "model_type kimi_k3"),
        ("env", None, "STACK_WIDE"), ("env", None, "A"), ("env", None, "MY_SETTING"),
    ]  # fmt: skip


def test_plan_without_a_dynamo_frontend_asks_for_no_tokenizers(
    fake_engine: FakeEngine, project: Project
) -> None:
    lock = project.lock()
    (project.root / "images/serve.toml").write_text(SERVE_ONLY)
    spec = load_spec(project.root / "images/serve.toml", lock)
    build = BuildResult(
        image="serve", reference="r:t", image_id="sha256:" + "0" * 64, inputs="i", cached=False,
        base="b", base_id="sha256:" + "1" * 64, twin=False, patches=(), env=(),
        engine_id="sha256:" + "0" * 64, base_engine_id="sha256:" + "1" * 64,
    )  # fmt: skip
    plan = plan_for(lock, spec, build, lock.bases["testbase"], False)
    assert plan["tokenizer_candidates"] == [] and plan["patches"] == []
    assert plan["profiles"][0]["commands"] == [
        {"role": "vllm-serve", "argv": ["vllm", "serve", "/model"]}
    ]


def test_the_plan_expects_the_baked_components_and_over_the_twin_its_pinned_wheels(
    repo: Path,
) -> None:
    lock = load_lock(repo / "pins/k3.lock.toml")
    dynamo = load_spec(repo / "images/kimi-k3-dynamo.toml", lock)
    direct = load_spec(repo / "images/kimi-k3-direct-f.toml", lock)
    assert expected_versions(lock, dynamo, twin=True) == {
        "vllm": "0.31.0",
        "dynamo": "1.6.1",
        "dynamo-runtime": "1.6.1",
        "torch": "2.13.0+cpu",
        "aiperf": "0.13.0",
    }
    # Over the GPU base only the baked wheels are pinned; F bakes aiperf alone.
    assert expected_versions(lock, direct, twin=False) == {
        "vllm": None, "dynamo": None, "dynamo-runtime": None, "torch": None, "aiperf": "0.13.0",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("targets", "status", "output"),
    [
        (
            {"int64": {"path": MODULE_FILE, "text": FIXED}},
            "passed",
            f"{MODULE_FILE}: every edit present",
        ),
        (
            {"int64": {"path": MODULE_FILE, "text": BUGGY}},
            "failed",
            f"{MODULE_FILE}: edit 1: not applied (its anchor is still at line 2)",
        ),
        (
            {"int64": {"path": MODULE_FILE, "text": REWRITTEN}},
            "failed",
            f"{MODULE_FILE}: edit 1: neither the replacement nor the anchor is there",
        ),
        ({"int64": {"path": None, "text": None}}, "failed", NOT_FOUND),
        ({}, "failed", NOT_FOUND),
    ],
    ids=["present", "not-applied", "neither", "no-file", "not-probed"],
)  # fmt: skip
def test_patch_rows_judge_the_images_copy_of_each_target(
    fake_engine: FakeEngine,
    project: Project,
    targets: dict[str, Any],
    status: str,
    output: str,
) -> None:
    lock, spec, build = built(fake_engine, project)
    rows = patch_rows(lock, spec, build, targets)
    assert rows == [
        CheckResult(
            image="probe", profile=None, check="patches", subject="int64", status=status,
            component="image", version=None, output=output,
        ),
        CheckResult(
            image="probe", profile=None, check="patches", subject="other", status="not checked",
            component="image", version=None, output=SKIP_DETAIL,
        ),
    ]  # fmt: skip


ROWS = [
    {"check": "versions", "subject": "vllm", "status": "skip", "component": "vllm",
     "version": "0.33.0", "output": "installed 0.33.0; lock pins none", "profile": None},
    {"check": "args", "subject": "commands[1] dynamo-worker", "status": "fail",
     "component": "dynamo", "version": "1.6.1", "output": "unrecognized arguments: --x",
     "profile": "agg"},
]  # fmt: skip
FACTS = {
    "versions": {"vllm": "0.33.0", "dynamo": "1.6.1"},
    "dynamo": {"tiktoken_model_types": ["kimi_k2", "kimi_k3"]},
    "distributions": [
        {"name": "vllm", "version": "0.33.0", "requires": ["torch==2.14.0"], "path": "/v"},
        {"name": "torch", "version": "2.14.0", "requires": [], "path": "/t"},
    ],
    "marker_environment": {"python_version": "3.12", "sys_platform": "linux"},
}


def answering(fake_engine: FakeEngine, seen: dict[str, Any]) -> None:
    """The engine's probe run: what it was given kept in ``seen``; ``ROWS`` and ``FACTS`` its
    answer, among other lines the image printed."""

    def probe(
        image: str, argv: list[str], env: dict[str, str], mounts: dict[str, str]
    ) -> RunResult:
        (host,) = mounts
        seen.update(image=image, argv=argv, env=env, mounts=mounts, host=Path(host))
        seen["plan"] = json.loads((Path(host) / "plan.json").read_text())["plans"][0]
        seen["probe"] = {f.name: f.read_text() for f in sorted((Path(host) / "probe").iterdir())}
        # What the probe would read in the image: the patch targets it was asked for.
        targets = {
            p["name"]: {"path": MODULE_FILE, "text": fake_engine.text(image, MODULE_FILE)}
            for p in seen["plan"]["patches"]
            if not p.get("skip")
        }
        payload = {"plans": [{"results": ROWS, "facts": FACTS, "patch_targets": targets}]}
        noise = "WARNING some import chatter\n" + MARK + '{"stale": true}\n'
        return RunResult(
            exit_code=0, stdout=noise + "done\n" + MARK + json.dumps(payload) + "\n", stderr=""
        )

    fake_engine.on_run(probe)


def test_verify_image_runs_the_probe_once_and_records_facts_by_image_id(
    fake_engine: FakeEngine, project: Project, tmp_path: Path
) -> None:
    lock, spec, build = built(fake_engine, project)
    seen: dict[str, Any] = {}
    answering(fake_engine, seen)
    state = State(tmp_path)
    report = verify_image(fake_engine, state, lock, spec, build, twin=False)

    assert seen["image"] == build.image_id
    assert seen["argv"] == ["python3", "/k3env-probe/probe", "/k3env-probe/plan.json"]
    assert seen["env"] == PROBE_ENV
    assert list(seen["mounts"].values()) == ["/k3env-probe"]
    assert seen["plan"] == plan_for(lock, spec, build, lock.bases["testbase"], False)
    # The whole probe package is carried in, every module as the package has it.
    package = resources.files("k3env.probes.probe")
    sources = {f.name: f.read_text() for f in package.iterdir() if f.name.endswith(".py")}
    assert seen["probe"] == sources and "__main__.py" in sources
    assert not seen["host"].exists()  # the mounted plan directory is gone
    assert [v for v, args in fake_engine.calls if v == "run" and "/k3env-probe/probe" in args[1]]

    assert [(r.check, r.subject, r.status) for r in report.results if r.status != NOT_RUN] == [
        ("versions", "vllm", "not checked"),
        ("args", "commands[1] dynamo-worker", "failed"),
        ("patches", "int64", "passed"),  # the built image carries the patch
        ("patches", "other", "not checked"),
        ("versions", "requirements", "passed"),  # every Requires-Dist holds
    ]
    assert report.results[1].profile == "agg" and report.results[1].version == "1.6.1"
    assert report.image_id == build.image_id and report.reference == build.reference
    # What the probe said, and dpkg's packages read from the image (this base has no dpkg).
    assert report.facts == {**FACTS, "debian_packages": []}
    assert read(state, Facts, build.image_id) == Facts(facts=dict(report.facts))
    assert (tmp_path / "facts" / (build.image_id.removeprefix("sha256:") + ".json")).is_file()
    assert report.cached is False

    # The same image, plan and probe again: answered from the record, no container started.
    runs = len([v for v, _ in fake_engine.calls if v == "run"])
    again = verify_image(fake_engine, state, lock, spec, build, twin=False)
    assert again.cached is True and again.results == report.results
    assert len([v for v, _ in fake_engine.calls if v == "run"]) == runs
    # A changed plan (another env value baked) is asked afresh.
    replace_in(project.spec_path, 'A = "1"', 'A = "2"')
    fresh = verify_image(fake_engine, state, *built(fake_engine, project), twin=False)
    assert fresh.cached is False
    assert len([v for v, _ in fake_engine.calls if v == "run"]) > runs


def test_each_check_the_plan_asked_for_and_the_probe_did_not_report_is_not_run(
    fake_engine: FakeEngine, project: Project, tmp_path: Path
) -> None:
    """The probe answers two of the fifteen checks its plan asks for: the thirteen others are
    not run (never skipped, never passed), and so is every check of an unreadable record."""
    lock, spec, build = built(fake_engine, project)
    seen: dict[str, Any] = {}
    answering(fake_engine, seen)
    state = State(tmp_path)
    report = verify_image(fake_engine, state, lock, spec, build, twin=False)
    not_run = [r for r in report.results if r.status == NOT_RUN]
    assert [(r.check, r.profile, r.subject) for r in not_run] == [
        c
        for c in planned_checks(seen["plan"])
        if c not in (("versions", None, "vllm"), ("args", "agg", "commands[1] dynamo-worker"))
    ]
    assert {r.output for r in not_run} == {NOT_REPORTED} and len(not_run) == 13
    assert report.failed == [report.results[1], *not_run]
    assert report.as_json()["matrix"] == {
        "versions": "not run", "imports": "not run", "args": "failed", "parsers": "not run",
        "tokenizer": "not run", "patches": "passed", "env": "not run",
    }  # fmt: skip
    # A record that is not one (damaged, or of another shape) is an error naming it.
    (record,) = (tmp_path / "verify").glob("*.json")
    record.write_text('{"rows": "all passed", "facts": {}, "patch_targets": {}}')
    with pytest.raises(StateError, match="'rows' is a JSON string, not an array") as e:
        verify_image(fake_engine, state, lock, spec, build, twin=False)
    assert e.value.where == str(record)


def test_preflight_finds_the_facts_of_the_recorded_build(
    fake_engine: FakeEngine, project: Project
) -> None:
    lock = project.lock()
    spec = project.spec(lock)
    state = project.state
    (build,) = build_all(make_builder(lock, fake_engine, state, QUIET, False), [spec])
    payload = {"plans": [{"results": [], "facts": FACTS, "patch_targets": {}}]}
    fake_engine.on_run(
        lambda image, argv, env, mounts: RunResult(
            exit_code=0, stdout=MARK + json.dumps(payload), stderr=""
        )
    )
    assert load_facts(state, lock, spec) == (None, None)
    verify_image(fake_engine, state, lock, spec, build, twin=False)
    facts = {**FACTS, "debian_packages": []}
    assert load_facts(state, lock, spec) == (facts, f"{build.reference} (linux/amd64)")


@pytest.mark.parametrize(
    ("exit_code", "stdout", "stderr", "said"),
    [
        (1, "Traceback (most recent call last):\n",
         "ModuleNotFoundError: No module named 'argparse'\n",
         ["the probe printed no verdict: it exited 1", "No module named 'argparse'"]),
        (-9, MARK + '{"plans": [{"results": [{"check": "ver', "killed after 300 s", []),
    ],
    ids=["no-verdict-line", "truncated-verdict-line"],
)  # fmt: skip
def test_a_probe_that_prints_no_whole_verdict_is_an_engine_error(
    fake_engine: FakeEngine,
    project: Project,
    tmp_path: Path,
    exit_code: int,
    stdout: str,
    stderr: str,
    said: list[str],
) -> None:
    lock, spec, build = built(fake_engine, project)
    fake_engine.on_run(lambda *a: RunResult(exit_code=exit_code, stdout=stdout, stderr=stderr))
    state = State(tmp_path)
    with pytest.raises(EngineError) as e:
        verify_image(fake_engine, state, lock, spec, build, twin=False)
    assert all(line in str(e.value) for line in said), str(e.value)
    assert e.value.where == build.image_id
    assert read(state, Facts, build.image_id) is None


def test_images_with_the_same_files_share_one_container_and_an_unshared_one_runs_alone(
    fake_engine: FakeEngine, project: Project, tmp_path: Path
) -> None:
    lock = project.lock()
    first = project.spec(lock)
    second_path = project.spec_path.with_name("probe2.toml")
    second_path.write_text(project.spec_path.read_text().replace('A = "1"', 'A = "2"'))
    second = load_spec(second_path, lock)
    builder = make_builder(lock, fake_engine, project.state, QUIET, False)
    pairs = [(first, builder.build(first)), (second, builder.build(second))]
    assert pairs[0][1].image_id != pairs[1][1].image_id  # two images, same files
    runs: list[tuple[str, list[str], list[str | None]]] = []

    def probe(
        image: str, argv: list[str], env: dict[str, str], mounts: dict[str, str]
    ) -> RunResult:
        (host,) = mounts
        payload = json.loads((Path(host) / "plan.json").read_text())
        runs.append((image, [p["image"] for p in payload["plans"]],
                     [e.get("A") for e in payload["envs"]]))  # fmt: skip
        answers: list[dict[str, Any]] = [
            {"unshared": "the shared import looked up A, which this image sets differently"}
            if i > 0
            else {"results": [], "facts": {"versions": {}}, "patch_targets": {}}
            for i in range(len(payload["plans"]))
        ]
        return RunResult(exit_code=0, stdout=MARK + json.dumps({"plans": answers}), stderr="")

    def probe_shared(
        image: str, argv: list[str], env: dict[str, str], mounts: dict[str, str]
    ) -> RunResult:
        facts = {"versions": {}, "shared_import": {"images": ["x", "y"]}}
        one = {"results": [], "facts": facts, "patch_targets": {}}
        return RunResult(exit_code=0, stdout=MARK + json.dumps({"plans": [one]}), stderr="")

    fake_engine.on_run(probe)
    reports = verify_images(fake_engine, State(tmp_path / "a"), lock, pairs, twin=False, workers=1)
    # One container of the first image for both plans, each with its own environment; the
    # image that could not share is then probed in its own container.
    assert runs == [
        (pairs[0][1].image_id, [first.name, second.name], ["1", "2"]),
        (pairs[1][1].image_id, [second.name], ["2"]),
    ]
    assert [r.image for r in reports] == [first.name, second.name]
    assert not any(r.cached for r in reports)

    runs.clear()  # --isolated: one container each, never a group
    verify_images(fake_engine, State(tmp_path / "b"), lock, pairs, twin=False, workers=1,
                  share=False)  # fmt: skip
    assert sorted(r[1] for r in runs) == [[first.name], [second.name]]
    # A verdict recorded from a shared import does not answer --isolated; its own does.
    shared = State(tmp_path / "c")
    fake_engine.on_run(probe_shared)
    verify_images(fake_engine, shared, lock, pairs[:1], twin=False, workers=1)
    runs.clear()
    fake_engine.on_run(probe)
    verify_images(fake_engine, shared, lock, pairs[:1], twin=False, workers=1, share=False)
    assert [r[1] for r in runs] == [[first.name]]
    runs.clear()
    verify_images(fake_engine, shared, lock, pairs[:1], twin=False, workers=1, share=False)
    assert runs == []  # its own verdict, recorded, answers


def test_the_verify_matrix_has_a_row_per_image_and_platform() -> None:
    from k3env.checks.report import markdown, table
    from k3env.checks.verdicts import CheckResult, ImageReport

    def report(platform: str, status: str) -> ImageReport:
        row = CheckResult(image="kimi-k3-dynamo", profile="agg", check="parsers",
                          subject="tool-call parser kimi_k3", status=status, component="vllm",
                          version="0.31.0", output=f"registered: {status}")  # fmt: skip
        return ImageReport(image="kimi-k3-dynamo", reference="r", image_id=platform,
                           results=(row,), facts={}, seconds=1.0, platform=platform)  # fmt: skip

    reports = [report("linux/amd64", "passed"), report("linux/arm64", "failed")]
    md = markdown(reports)
    assert "| image | platform | versions |" in md
    assert "| `kimi-k3-dynamo` | linux/amd64 | not checked | not checked | not checked | ✅ |" in md
    assert "| `kimi-k3-dynamo` | linux/arm64 | not checked | not checked | not checked | ❌ |" in md
    assert "**kimi-k3-dynamo/agg (linux/arm64)**: `parsers`" in md
    text = table(reports)
    assert text.splitlines()[0].split()[:2] == ["image", "platform"]
    assert "failed kimi-k3-dynamo/agg (linux/arm64) parsers: tool-call parser kimi_k3" in text
    assert "kimi-k3-dynamo/agg (linux/amd64)" not in text
    assert report("linux/arm64", "passed").as_json()["platform"] == "linux/arm64"


def test_verify_records_dpkgs_installed_packages_as_the_sbom_parses_them(
    fake_engine: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """dpkg's status read from the image's files through the engine (no container start),
    parsed by the SBOM's parser: installed ones only, names of Debian's shape, fields one line
    and bounded; a status over the size limit is not read, said."""
    from k3env import installed
    from k3env.checks.verify import debian_facts

    from .fake_engine import make_image

    status = (
        "Package: libc6\nStatus: install ok installed\nArchitecture: amd64\n"
        "Version: 2.36-9+deb12u8\n\n"
        "Package: gone\nStatus: deinstall ok config-files\nVersion: 1\n\n"
        "Package: ../evil\nStatus: install ok installed\nVersion: 1\n\n"
        "Package: libc6\nStatus: install ok installed\nArchitecture: i386\n"
        "Version: " + "9" * 500 + "\n\n"
        "Package: bash\nStatus: install ok installed\nVersion: 5.2-15\n"
    )
    image = make_image({"/var/lib/dpkg/status": status})
    fake_engine.add(image, "t:1")
    runs = len([v for v, _ in fake_engine.calls if v == "run"])
    assert debian_facts(fake_engine, image.id) == {"debian_packages": [
        {"name": "libc6", "version": "2.36-9+deb12u8", "arch": "amd64"},
        {"name": "libc6", "version": "9" * 200, "arch": "i386"},  # a field: 200 characters
        {"name": "bash", "version": "5.2-15", "arch": ""},
    ]}  # fmt: skip
    assert len([v for v, _ in fake_engine.calls if v == "run"]) == runs
    # No dpkg in the image: none installed.
    bare = make_image({"/etc/os-release": "ID=distroless\n"})
    fake_engine.add(bare, "t:2")
    assert debian_facts(fake_engine, bare.id) == {"debian_packages": []}
    # Over the limit: not parsed, said (the limit made small here: 64 MiB in use).
    monkeypatch.setattr("k3env.checks.verify.STATUS_LIMIT", 100)
    assert debian_facts(fake_engine, image.id) == {
        "debian_packages_unread": f"/var/lib/dpkg/status is {len(status)} bytes, over the 100 "
        "k3env reads"
    }
    assert installed.STATUS_LIMIT == 64 << 20


def test_a_record_from_before_dpkg_was_read_is_filled_in_without_the_probe(
    fake_engine: FakeEngine, project: Project, tmp_path: Path
) -> None:
    lock, spec, build = built(fake_engine, project)
    payload = {"plans": [{"results": ROWS, "facts": FACTS, "patch_targets": {}}]}
    fake_engine.on_run(
        lambda *a: RunResult(exit_code=0, stdout=MARK + json.dumps(payload) + "\n", stderr="")
    )
    state = State(tmp_path)
    report = verify_image(fake_engine, state, lock, spec, build, twin=False)
    runs = len([v for v, _ in fake_engine.calls if v == "run"])
    (record,) = (tmp_path / "verify").glob("*.json")
    older = json.loads(record.read_text())
    del older["facts"]["debian_packages"]
    record.write_text(json.dumps(older))
    assert verify_image(fake_engine, state, lock, spec, build, twin=False).facts == report.facts
    assert json.loads(record.read_text())["facts"]["debian_packages"] == []
    assert len([v for v, _ in fake_engine.calls if v == "run"]) == runs
