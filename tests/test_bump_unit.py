"""One lock state judged over the in-memory engine: patch fates, verify, preflight errors."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from k3env.bump.body import SBOM_DIFF, body
from k3env.bump.evaluate import Outcome, PatchFate, evaluate
from k3env.checks.probe_run import MARK
from k3env.checks.verdicts import ImageReport
from k3env.config.cluster import load_cluster
from k3env.config.lock import load_lock
from k3env.config.lock_edit import Change
from k3env.engine.protocol import RunResult
from k3env.image.records import Facts, read
from k3env.log import Log

from .conftest import REPO, TEST_BASE_REPOSITORY
from .fake_engine import FakeEngine, python_base
from .project import BUGGY, FIXED, REWRITTEN, PatchPin, Project, write_project

QUIET = Log(quiet=True)
ANCHOR_GONE = (
    "edit 1: anchor not found, and the replacement is not there either: the file does not look "
    "as the patch expects (expected a line like 'index_fill_(0, idx_mapping,')"
)


def serve_profile(name: str, *extra: str) -> str:
    argv = ", ".join(f'"{a}"' for a in ("vllm", "serve", "/model", *extra))
    return (
        f'\n[profiles.{name}]\n[[profiles.{name}.commands]]\nrole = "vllm-serve"\nargv = [{argv}]\n'
    )


class Bump:
    """Three tags of one base in the fake registry (the anchor, the fix upstream, neither), a
    project over them, and its state judged under the repository's cluster (2 nodes x 8 B200)."""

    def __init__(self, engine: FakeEngine, root: Path) -> None:
        self.engine, self.root = engine, root
        self.bases = {
            name: engine.publish(TEST_BASE_REPOSITORY, python_base(text), tag)
            for name, text, tag in [("testbase", BUGGY, "1"), ("fixedbase", FIXED, "2"),
                                    ("otherbase", REWRITTEN, "3")]
        }  # fmt: skip
        self.cluster = load_cluster(REPO / "clusters/b200-dgxc.toml")

    def project(self, *patch_bases: str, **kw: Any) -> Project:
        patches = {"int64": PatchPin(bases=patch_bases)}
        return write_project(self.root, self.bases, patches=patches, **kw)

    def judge(self, project: Project, *, verify: bool) -> Outcome:
        lock = project.lock()
        return evaluate(lock, [project.spec(lock)], engine=self.engine, state=project.state,
                        log=QUIET, cluster=self.cluster, run_verify=verify)  # fmt: skip


@pytest.fixture
def bump(fake_engine: FakeEngine, tmp_path: Path) -> Bump:
    return Bump(fake_engine, tmp_path)


def test_patch_fates_applies_upstream_conflicts_and_no_verify(bump: Bump) -> None:
    direct = serve_profile("direct", "--tensor-parallel-size", "8")
    project = bump.project("testbase", "fixedbase", "otherbase", spec_tail=direct)
    outcome = bump.judge(project, verify=False)
    assert list(outcome.patches) == [
        PatchFate(name="int64", base="testbase", status="applies", detail="1 edit(s) applied"),
        PatchFate(
            name="int64",
            base="fixedbase",
            status="upstream",
            detail="all 1 edit(s) already present: not applied twice",
        ),
        PatchFate(name="int64", base="otherbase", status="conflicts", detail=ANCHOR_GONE),
    ]
    # Every base was pulled by digest to be judged.
    assert [args[0] for verb, args in bump.engine.calls if verb == "pull"] == [
        bump.bases[b].reference for b in ("testbase", "fixedbase", "otherbase")
    ]
    # The image was built (over testbase), but no probe ran.
    assert bump.engine.tags("k3env-test/probe") != []
    assert not any("/k3env-probe/probe" in args[1] for v, args in bump.engine.calls if v == "run")
    assert outcome.reports == [] and outcome.error is None
    assert outcome.preflight_errors == {"probe": 0}
    assert outcome.failed  # a conflicting patch fails the state


def test_a_clean_state_passes(bump: Bump) -> None:
    direct = serve_profile("direct", "--tensor-parallel-size", "8")
    outcome = bump.judge(bump.project("testbase", "fixedbase", spec_tail=direct), verify=False)
    assert [p.status for p in outcome.patches] == ["applies", "upstream"]
    assert outcome.preflight_errors == {"probe": 0}
    assert not outcome.failed
    # The state in the one verdict model (verify did not run: no gate, the body says so).
    assert [(g.name, g.status, g.detail) for g in outcome.gates] == [
        ("preflight probe", "passed", "0 error(s)"),
        ("patch int64 on testbase", "passed", f"applies: {outcome.patches[0].detail}"),
        ("patch int64 on fixedbase", "passed", f"upstream: {outcome.patches[1].detail}"),
    ]


def test_preflight_errors_are_counted_per_image(bump: Bump) -> None:
    profiles = serve_profile("wide", "--tensor-parallel-size", "32") + serve_profile(
        "nodes", "--tensor-parallel-size", "8", "--nnodes", "3"
    )
    outcome = bump.judge(bump.project("testbase", spec_tail=profiles), verify=False)
    assert [p.status for p in outcome.patches] == ["applies"]
    assert outcome.preflight_errors == {"probe": 2}  # 32 ranks > 16 GPUs; 3 nodes != 2
    assert outcome.failed


def test_a_build_that_fails_outright_is_the_outcomes_error(bump: Bump) -> None:
    project = bump.project("testbase", "otherbase", spec_base="otherbase")
    outcome = bump.judge(project, verify=True)
    assert [p.status for p in outcome.patches] == ["applies", "conflicts"]
    assert outcome.error is not None
    assert "container patch int64" in outcome.error and "anchor not found" in outcome.error
    assert "\n" not in outcome.error
    assert outcome.reports == () and outcome.preflight_errors == {}
    assert outcome.failed
    assert bump.engine.tags("k3env-test/probe") == []


def probe_answer(rows: list[dict[str, object]], facts: dict[str, object]) -> RunResult:
    payload = {"plans": [{"results": rows, "facts": facts, "patch_targets": {}}]}
    return RunResult(exit_code=0, stdout=MARK + json.dumps(payload) + "\n", stderr="")


FRONTEND = """
[profiles.agg]
tokenizer_model_type = "kimi_k3"
[[profiles.agg.commands]]
role = "dynamo-frontend"
argv = ["python3", "-m", "dynamo.frontend", "--http-port", "8000"]
"""


def test_verify_runs_on_each_built_image_and_a_failing_check_fails_the_state(bump: Bump) -> None:
    project = bump.project("testbase", spec_tail=FRONTEND)
    row: dict[str, object] = {
        "check": "tokenizer", "subject": "model_type kimi_k3", "status": "fail",
        "component": "dynamo-runtime", "version": "1.2.1", "profile": "agg",
        "output": "Failed to load tiktoken tokenizer",
    }  # fmt: skip
    probed: list[str] = []

    def probe(
        image: str, argv: list[str], env: dict[str, str], mounts: dict[str, str]
    ) -> RunResult | None:
        if "/k3env-probe/probe" not in argv:
            return None  # the builder's module lookup: the fake answers it
        probed.append(image)
        return probe_answer([row], {"versions": {"dynamo-runtime": "1.2.1"}})

    bump.engine.on_run(probe)
    outcome = bump.judge(project, verify=True)
    (report,) = outcome.reports
    assert probed == [report.image_id]
    assert bump.engine.resolve(report.reference) == report.image_id
    assert outcome.matrix()["probe"]["tokenizer"] == "failed"
    # The patch row comes from the host's own judgement: the probe sent no target text.
    assert outcome.matrix()["probe"]["patches"] == "failed"
    assert outcome.failed and outcome.error is None


def test_preflight_in_a_bump_uses_the_facts_verify_just_learned(bump: Bump) -> None:
    project = bump.project("testbase", spec_tail=FRONTEND)
    facts = {"versions": {"dynamo": "1.2.1"}, "dynamo": {"tiktoken_model_types": ["kimi_k2"]}}
    bump.engine.on_run(
        lambda image, argv, env, mounts: (
            probe_answer([], facts) if "/k3env-probe/probe" in argv else None
        )
    )
    outcome = bump.judge(project, verify=True)
    (report,) = outcome.reports
    # The probe's facts, and dpkg's packages verify read from the image (none in this base).
    recorded = read(project.state, Facts, report.image_id)
    assert recorded == Facts(facts={**facts, "debian_packages": []})
    # With the facts: K3-TOKENIZER-MODEL-TYPE is an error (kimi_k3 not loaded by this Dynamo).
    # Without them (what happens): only the warning "the Dynamo version is unknown".
    assert outcome.preflight_errors == {"probe": 1}


def test_the_body_never_says_all_checks_pass_over_checks_that_did_not_run() -> None:
    skipped = Outcome(reports=(), preflight_errors={"x": 0}, patches=())
    text = body(
        load_lock(REPO / "pins/k3.lock.toml"),
        "dynamo",
        [Change(key="dynamo.commit", old="a" * 40, new="b" * 40)],
        skipped,
        skipped,
    )
    assert "All checks pass" not in text
    assert "verify did not run (--skip-verify)" in text


def test_the_body_lists_the_sbom_diff_of_each_image() -> None:
    """Added, removed and changed Python distributions and Debian packages, from what verify
    found before and after; said as not compared when verify did not run on both, and when
    one side's facts have no Debian packages (never "no change")."""

    def report(dists: dict[str, str], debs: list[tuple[str, str, str]] | None) -> ImageReport:
        facts: dict[str, object] = {
            "distributions": [{"name": n, "version": v} for n, v in dists.items()]
        }
        if debs is not None:
            facts["debian_packages"] = [{"name": n, "version": v, "arch": a} for n, v, a in debs]
        return ImageReport(image="kimi-k3-dynamo", reference="r", image_id="sha256:1",
                           results=(), facts=facts, seconds=0.0)  # fmt: skip

    old = {"ai-dynamo": "1.2.1", "ai_dynamo_runtime": "1.2.1", "nats-py": "2.6", "six": "1"}
    new = {"ai-dynamo": "1.6.1", "ai-dynamo-runtime": "1.6.1", "msgspec": "0.19", "six": "1"}
    old_debs = [("libc6", "2.36-9", "amd64"), ("libc6", "2.36-9", "i386"), ("gone", "1", "all"),
                ("bash", "5.2-15", "amd64")]  # fmt: skip
    new_debs = [("libc6", "2.36-9+deb12u8", "amd64"), ("libc6", "2.36-9", "i386"),
                ("zstd", "1.5.4", "amd64"), ("bash", "5.2-15", "amd64")]  # fmt: skip
    before = Outcome(reports=(report(old, old_debs),), preflight_errors={}, patches=())
    after = Outcome(reports=(report(new, new_debs),), preflight_errors={}, patches=())
    lock = load_lock(REPO / "pins/k3.lock.toml")
    change = [Change(key="dynamo.commit", old="a" * 40, new="b" * 40)]
    text = body(lock, "dynamo", change, before, after)
    section = text.split(f"### {SBOM_DIFF}\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert section == [
        "**`kimi-k3-dynamo`**: + msgspec 0.19; - nats-py 2.6; ai-dynamo 1.2.1 → 1.6.1; "
        "ai-dynamo-runtime 1.2.1 → 1.6.1",
        "**`kimi-k3-dynamo`** Debian packages: + zstd 1.5.4; - gone 1; "
        "libc6:amd64 2.36-9 → 2.36-9+deb12u8",
    ]
    assert "No installed Python distribution or Debian package changed." in body(
        lock, "dynamo", change, after, after
    )
    # Facts verify recorded before it read dpkg's status: not compared, said, not "no change".
    older = Outcome(reports=(report(new, None),), preflight_errors={}, patches=())
    text = body(lock, "dynamo", change, older, after)
    assert (
        "**`kimi-k3-dynamo`** Debian packages: not compared: before the bump its facts were "
        "recorded before verify read dpkg's status (run verify again)."
    ) in text
    assert "No installed Python distribution changed." in text
    assert "Debian package changed" not in text
    unread = dataclasses.replace(report(new, None), facts={
        **report(new, None).facts,
        "debian_packages_unread": "/var/lib/dpkg/status is 70000000 bytes, over"})  # fmt: skip
    text = body(lock, "dynamo", change, after, Outcome(reports=(unread,), preflight_errors={},
                                                       patches=()))  # fmt: skip
    assert "after the bump dpkg's status was not read (/var/lib/dpkg/status is 70000000" in text
    # A base bump that moves hundreds of packages: 60 listed, the rest counted.
    many = [(f"lib{i}", "2", "amd64") for i in range(100)]
    text = body(lock, "dynamo", change, after, Outcome(
        reports=(report(new, many),), preflight_errors={}, patches=()))  # fmt: skip
    (line,) = [x for x in text.splitlines() if x.startswith("**`kimi-k3-dynamo`** Debian")]
    assert line.count(";") == 60 and line.endswith("; and 44 more (k3env verify --json: facts)")
    skipped = Outcome(reports=(), preflight_errors={}, patches=())
    assert "Not compared: verify did not run on both locks." in body(
        lock, "dynamo", change, skipped, after
    )


def test_a_lock_whose_patch_file_was_edited_since_is_an_outcome_not_a_crash(bump: Bump) -> None:
    """`bump container_patches.NAME` after editing the file: the lock before the bump pins
    bytes that are gone. Its state is "did not build", with the reason; the bump goes on."""
    project = bump.project("testbase")
    patch = project.root / "patches/container/int64.toml"
    patch.write_text(patch.read_text() + "# reviewed again\n")
    before = bump.judge(project, verify=False)
    assert before.error is not None and "the lock pins" in before.error
    assert before.failed and before.reports == ()
    text = body(project.lock(), "container_patches.int64", [], before, before)
    assert "**The lock before the bump did not build:**" in text
