"""The preflight runner (``checks.preflight``): every rule over every context, findings said
one way (the linter's line, the JSON), sorted errors first; a rule that raises is a visible
error, never a silent pass; facts only from this lock's build for this platform."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from k3env.checks.preflight import Context, Finding, Hit, Report, contexts, load_facts, run_rules
from k3env.config.cluster import load_cluster
from k3env.config.lock import load_lock
from k3env.config.pins import Lock
from k3env.config.spec import ImageSpec, load_spec
from k3env.errors import StateError
from k3env.image.envpolicy import merged_env
from k3env.image.records import Build, Facts, build_key, write
from k3env.state import State

from .conftest import REPO
from .rules_context import FakeRule

LOCK = Path("pins/k3.lock.toml")
CLUSTER = Path("clusters/b200-dgxc.toml")
GB200 = Path("clusters/gb200-nvl72.toml")
F = Path("images/kimi-k3-direct-f.toml")
DYN = Path("images/kimi-k3-dynamo.toml")


@pytest.fixture
def project(repo: Path) -> Path:
    shutil.copytree(REPO / "clusters", repo / "clusters")
    return repo


def ctxs(*specs: Path, state: State | None = None, cluster: Path = CLUSTER) -> list[Context]:
    lock = load_lock(LOCK)
    return contexts(lock, [load_spec(s, lock) for s in specs], load_cluster(cluster), state)


def record_build(
    state: State, lock: Lock, spec: ImageSpec, image_id: str, *, twin: bool, platform: str
) -> None:
    key = build_key(lock, spec, twin=twin, platform=platform)
    write(state, Build(image_id=image_id, reference=f"k3env/{spec.name}:t", twin=twin), key)


# --- Finding and Report, as a person and as JSON read them ----------------------------------------
def test_a_finding_is_one_linter_line_with_its_fix_under_it() -> None:
    f = Finding(rule="K3-X", severity="error", image="img", profile="agg", file="a.toml",
                key="env.A", message="it breaks", fix="do this")  # fmt: skip
    assert f.text() == "a.toml: env.A: K3-X error: it breaks\n    fix: do this"
    at_line = Finding(**{**f.as_json(), "line": 7})
    assert at_line.text() == "a.toml:7: env.A: K3-X error: it breaks\n    fix: do this"
    assert f.as_json() == {"rule": "K3-X", "severity": "error", "image": "img", "profile": "agg",
                           "file": "a.toml", "key": "env.A", "message": "it breaks",
                           "fix": "do this", "line": None}  # fmt: skip
    assert at_line.as_json()["line"] == 7


def test_a_report_counts_errors_and_warnings_and_says_all_of_it_in_json() -> None:
    def finding(severity: str, key: str) -> Finding:
        return Finding(rule="R", severity=severity, image="i", profile="p", file="f", key=key,
                       message="m", fix="x")  # fmt: skip

    report = Report(
        findings=(finding("error", "a"), finding("warning", "b"), finding("warning", "c")),
        checked=("i/p",),
        lacked={"i/p": ("x.y", "z")},
        rules=3,
        facts_from={"i/p": "ref (linux/amd64)"},
    )
    assert (report.errors, report.warnings) == (1, 2)
    assert report.as_json() == {
        "findings": [f.as_json() for f in report.findings],
        "checked": ["i/p"],
        "lacked_facts": {"i/p": ["x.y", "z"]},
        "facts_from": {"i/p": "ref (linux/amd64)"},
        "not_checked": {},
        "rules": 3,
        "errors": 1,
        "warnings": 2,
    }
    bare = Report(findings=(), checked=(), lacked={}, rules=0)
    assert bare.facts_from == {} and (bare.errors, bare.warnings) == (0, 0)
    assert Hit(key="k", message="m") == Hit(key="k", message="m", severity=None, fix=None,
                                            file=None)  # fmt: skip


# --- the runner -----------------------------------------------------------------------------------
def test_each_finding_carries_its_rule_its_context_and_the_hits_own_words(project: Path) -> None:
    hits = (
        Hit(key="env.A", message="plain"),
        Hit(key="env.B", message="sharper", severity="error", fix="its own fix", file="x.yaml"),
    )
    rule = FakeRule(id="K3-FAKE", hits=hits)
    report = run_rules(ctxs(F), [rule])
    assert report.findings == (
        Finding(rule="K3-FAKE", severity="error", image="kimi-k3-direct-f", profile="agg",
                file="x.yaml", key="env.B", message="sharper", fix="its own fix"),
        Finding(rule="K3-FAKE", severity="warning", image="kimi-k3-direct-f", profile="agg",
                file=str(F), key="env.A", message="plain", fix="the rule's own fix"),
    )  # fmt: skip
    assert report.checked == ("kimi-k3-direct-f/agg",)
    assert report.rules == 1 and report.lacked == {} and report.facts_from == {}


def test_a_rule_that_does_not_apply_is_not_asked(project: Path) -> None:
    rule = FakeRule(id="K3-ONLY-DYN", hits=(Hit(key="k", message="m"),), only="kimi-k3-dynamo")
    every = FakeRule(id="K3-EVERY", hits=(Hit(key="k", message="m"),))
    report = run_rules(ctxs(F, DYN), [rule, every])
    assert rule.seen == ["kimi-k3-dynamo"]
    assert every.seen == ["kimi-k3-direct-f", "kimi-k3-dynamo"]  # the next rule is still asked
    assert [(f.image, f.rule) for f in report.findings] == [
        ("kimi-k3-direct-f", "K3-EVERY"), ("kimi-k3-dynamo", "K3-EVERY"),
        ("kimi-k3-dynamo", "K3-ONLY-DYN")
    ]  # fmt: skip
    assert report.checked == ("kimi-k3-direct-f/agg", "kimi-k3-dynamo/agg")
    assert report.rules == 2


def test_a_rule_that_raises_is_an_error_naming_the_rule_and_the_exception(project: Path) -> None:
    broken = FakeRule(id="K3-BROKEN", boom=KeyError("tp"), severity="warning", fix="unused")
    after = FakeRule(id="K3-AFTER", hits=(Hit(key="env.Z", message="still judged"),))
    report = run_rules(ctxs(F), [broken, after])
    assert report.findings == (
        Finding(
            rule="K3-BROKEN",
            severity="error",
            image="kimi-k3-direct-f",
            profile="agg",
            file=str(F),
            key="profiles.agg",
            message="rule K3-BROKEN could not judge this profile: KeyError: 'tp'",
            fix="check the values this rule reads; report it if they are right",
        ),
        Finding(rule="K3-AFTER", severity="warning", image="kimi-k3-direct-f", profile="agg",
                file=str(F), key="env.Z", message="still judged", fix="the rule's own fix"),
    )  # fmt: skip
    assert report.errors == 1 and report.warnings == 1 and report.rules == 2


def test_findings_sort_errors_first_then_by_file_key_and_rule(project: Path) -> None:
    def rule(rid: str, *hits: tuple[str, str, str]) -> FakeRule:
        return FakeRule(id=rid, hits=tuple(Hit(key=k, message="m", severity=s, file=f)
                                           for s, f, k in hits))  # fmt: skip

    rules = [
        rule("R-B", ("warning", "a", "k1"), ("error", "b", "k1")),
        rule("R-A", ("warning", "a", "k1"), ("warning", "a", "k0"), ("error", "b", "k1")),
        rule("R-C", ("error", "a", "k2"), ("warning", "0", "k9")),
    ]
    report = run_rules(ctxs(F), rules)
    assert [(f.severity, f.file, f.key, f.rule) for f in report.findings] == [
        ("error", "a", "k2", "R-C"),
        ("error", "b", "k1", "R-A"),
        ("error", "b", "k1", "R-B"),
        ("warning", "0", "k9", "R-C"),
        ("warning", "a", "k0", "R-A"),
        ("warning", "a", "k1", "R-A"),
        ("warning", "a", "k1", "R-B"),
    ]
    assert (report.errors, report.warnings) == (3, 4)


def test_the_facts_a_rule_lacked_are_said_sorted_per_context(project: Path) -> None:
    rules = [FakeRule(id="R1", lacks=("vllm.z",), only="kimi-k3-dynamo"),
             FakeRule(id="R2", lacks=("dynamo.b", "vllm.z"), only="kimi-k3-dynamo")]  # fmt: skip
    report = run_rules(ctxs(F, DYN), rules)
    assert report.lacked == {"kimi-k3-dynamo/agg": ("dynamo.b", "vllm.z")}
    assert report.as_json()["lacked_facts"] == {"kimi-k3-dynamo/agg": ["dynamo.b", "vllm.z"]}
    assert report.findings == () and report.rules == 2


# --- Context: what the rules read -----------------------------------------------------------------
def test_a_context_names_the_keys_and_commands_rules_point_at(project: Path) -> None:
    (f,) = ctxs(F)
    (dyn,) = ctxs(DYN)
    assert [(c.role, c.index) for c in dyn.commands] == [("dynamo-frontend", 0),
                                                         ("dynamo-worker", 1)]  # fmt: skip
    assert [c.role for c in dyn.engine_commands()] == ["dynamo-worker"]
    assert dyn.roles() == {"dynamo-frontend", "dynamo-worker"}
    assert [c.role for c in f.engine_commands()] == ["vllm-serve"] and f.roles() == {"vllm-serve"}
    worker = dyn.commands[1]
    assert dyn.key(worker) == "profiles.agg.commands[1].argv"
    assert f.key(f.commands[0]) == "profiles.agg.commands[0].argv"
    assert f.commands[0].options["--tensor-parallel-size"] == "8"
    assert f.commands[0].argv[:3] == ("vllm", "serve", "/model")
    dyn.command_key = lambda c: f"backend.{c.role}"
    assert dyn.key(worker) == "backend.dynamo-worker"
    # The benchmark client's env is the engine's unless told otherwise, keyed as the spec's.
    assert f.bench_env is f.env and f.env["PYTHONHASHSEED"] == "42"
    assert f.bench_key("X") == "env.X"
    f.client_env, f.client_env_key = {"X": "1"}, lambda n: f"environment.{n}"
    assert f.bench_env == {"X": "1"} and f.bench_key("X") == "environment.X"
    assert f.setup_script is None and f.base_known is True and f.lacked == set()


def test_a_fact_is_read_by_its_path_and_each_lack_is_recorded(project: Path) -> None:
    (ctx,) = ctxs(F)
    assert ctx.facts is None
    assert ctx.fact("vllm", "version", lacking="vllm.version") is None
    assert ctx.lacked == {"vllm.version"}
    ctx.facts = {"vllm": {"version": "0.31.0", "flags": ["a"]}, "n": 0}
    assert ctx.fact("vllm", "version", lacking="v") == "0.31.0"
    assert ctx.fact("n", lacking="n") == 0  # a falsy fact is a fact
    assert ctx.fact("vllm", lacking="whole") == {"version": "0.31.0", "flags": ["a"]}
    assert ctx.lacked == {"vllm.version"}
    assert ctx.fact("vllm", "version", "major", lacking="major") is None  # not a mapping
    assert ctx.fact("vllm", "missing", lacking="missing") is None
    assert ctx.fact("dynamo", "x", lacking="dynamo.x") is None
    assert ctx.lacked == {"vllm.version", "major", "missing", "dynamo.x"}


# --- facts: this lock's build, this platform ------------------------------------------------------
def test_facts_come_from_the_build_of_this_lock_and_say_which(project: Path) -> None:
    state, lock = State(), load_lock(LOCK)
    spec = load_spec(F, lock)
    assert load_facts(state, lock, spec) == (None, None)  # never built
    record_build(state, lock, spec, "sha256:" + "12" * 32, twin=False, platform="linux/amd64")
    assert load_facts(state, lock, spec) == (None, None)  # built, never verified
    state.write_json(["not", "facts"], "facts", "12" * 32 + ".json")
    with pytest.raises(StateError, match="'facts' is a JSON array, not an object") as e:
        load_facts(state, lock, spec)  # a record that is not a mapping: said, never skipped
    assert e.value.where == str(state.path("facts", "12" * 32 + ".json"))
    write(state, Facts(facts={"vllm": {"v": 1}}), "sha256:" + "12" * 32)
    # The default platform is amd64, and a real-base build is said as such.
    assert load_facts(state, lock, spec) == (
        {"vllm": {"v": 1}}, "k3env/kimi-k3-direct-f:t (linux/amd64)"
    )  # fmt: skip
    assert load_facts(state, lock, spec, "linux/arm64") == (None, None)
    record_build(state, lock, spec, "sha256:" + "34" * 32, twin=True, platform="linux/arm64")
    write(state, Facts(facts={"vllm": {"v": 2}}), "sha256:" + "34" * 32)
    assert load_facts(state, lock, spec, "linux/arm64") == (
        {"vllm": {"v": 2}}, "k3env/kimi-k3-direct-f:t (linux/arm64, built over the CPU twin)"
    )  # fmt: skip


def test_contexts_carry_the_facts_and_env_of_each_spec_on_the_clusters_platform(
    project: Path,
) -> None:
    state, lock = State(), load_lock(LOCK)
    spec = load_spec(DYN, lock)
    record_build(state, lock, spec, "sha256:" + "56" * 32, twin=True, platform="linux/arm64")
    write(state, Facts(facts={"dynamo": {"x": 1}}), "sha256:" + "56" * 32)
    (none,) = ctxs(DYN, state=state)  # amd64: no build
    assert none.facts is None and none.facts_source is None
    (ctx,) = ctxs(DYN, state=state, cluster=GB200)
    assert ctx.facts == {"dynamo": {"x": 1}}
    assert ctx.facts_source == "k3env/kimi-k3-dynamo:t (linux/arm64, built over the CPU twin)"
    assert ctx.spec.name == "kimi-k3-dynamo" and ctx.profile.name == "agg"
    assert ctx.lock.sha256 == lock.sha256 and ctx.cluster.name == "gb200-nvl72"
    assert ctx.env == merged_env(lock, spec) and set(spec.env) < set(ctx.env)
    (stateless,) = ctxs(DYN, state=None, cluster=GB200)
    assert stateless.facts is None and stateless.facts_source is None
    report = run_rules([ctx, stateless], [])
    assert report.facts_from == {
        "kimi-k3-dynamo/agg": "k3env/kimi-k3-dynamo:t (linux/arm64, built over the CPU twin)"
    }
    assert report.checked == ("kimi-k3-dynamo/agg", "kimi-k3-dynamo/agg") and report.rules == 0


def test_one_context_per_profile_in_the_specs_order(project: Path) -> None:
    text = F.read_text()
    F.write_text(text + '\n[profiles.solo]\n[[profiles.solo.commands]]\nrole = "vllm-serve"\n'
                 'argv = ["vllm", "serve", "/model", "--tensor-parallel-size", "8"]\n')  # fmt: skip
    found = ctxs(F, DYN)
    assert [(c.spec.name, c.profile.name) for c in found] == [
        ("kimi-k3-direct-f", "agg"), ("kimi-k3-direct-f", "solo"), ("kimi-k3-dynamo", "agg")
    ]  # fmt: skip
    solo = found[1]
    assert [(c.role, c.index, dict(c.options)) for c in solo.commands] == [
        ("vllm-serve", 0, {"--tensor-parallel-size": "8"})
    ]
    assert solo.env == found[0].env == merged_env(load_lock(LOCK), found[0].spec)
