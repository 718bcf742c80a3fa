"""Pin bumps on the real engine and registry: tag -> digest, patch fate, a failing verify."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest

from k3env.bump.body import SBOM_DIFF
from k3env.cli import main
from k3env.engine.dockerd import DockerEngine
from k3env.engine.registry import resolve_digest

from .conftest import REGISTRY, BaseFixture

pytestmark = [pytest.mark.engine, pytest.mark.registry]

LOCK = "pins/test.lock.toml"
CLUSTER = (
    'gpu = "B200"\ngpu_memory_gib = 178\ngpus_per_node = 8\ndram_per_node_gb = 2000\nnodes = 1\n'
)


@pytest.fixture
def second_tag(engine: DockerEngine, fixed_base: BaseFixture) -> str:
    """The fixed image as tag "2" of the test base's repository (the fix went upstream)."""
    repository = f"{REGISTRY}/k3env-test/base"
    engine.tag(fixed_base.image_id, repository, "2")
    return engine.push(repository, "2", lambda _: None).digest


def test_tag_bump_resolves_the_digest_and_reports_the_patch_upstream(
    project: Path,
    second_tag: str,
    capsys: pytest.CaptureFixture[str],
    clean_probe_images: None,
    tmp_path: Path,
) -> None:
    (project / "clusters").mkdir()
    (project / "clusters/c.toml").write_text(CLUSTER)
    lock_before = (project / LOCK).read_text()
    code = main(["bump", "bases.testbase", "2", "--lock", LOCK, "--cluster", "clusters/c.toml",
                 "--skip-verify", "--json", "-q"])  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    assert second_tag == resolve_digest(f"{REGISTRY}/k3env-test/base", "2")
    assert {c["key"]: c["new"] for c in out["changes"]} == {
        "bases.testbase.tag": "2",
        "bases.testbase.digest": second_tag,
    }
    assert out["after"]["patches"] == [
        {"name": "int64", "base": "testbase", "status": "upstream",
         "detail": "all 1 edit(s) already present: not applied twice"}
    ]  # fmt: skip
    assert out["lock_written"] is True
    lock_after = (project / LOCK).read_text()
    changed = [
        (a, b)
        for a, b in zip(lock_before.splitlines(), lock_after.splitlines(), strict=True)
        if a != b
    ]
    assert [b for _, b in changed] == ['tag = "2"', f'digest = "{second_tag}"']
    assert "⬆️ upstream: drop it" in out["body"]


def test_tag_missing_from_the_registry_is_refused(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = (project / LOCK).read_bytes()
    assert main(["bump", "bases.testbase", "no-such-tag", "--lock", LOCK, "--skip-verify"]) == 2
    assert "tag 'no-such-tag' not found" in capsys.readouterr().err
    assert (project / LOCK).read_bytes() == before


@pytest.fixture
def twin_project(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    engine: DockerEngine,
    twin_image: str,
    dynamo_161_image: str,
    old_dynamo_image: str,
) -> Path:
    """A lock pinning the twin with Dynamo 1.6.1 as a registry base; the twin with Dynamo
    1.2.1 as tag dynamo-1.2.1."""
    repository = twin_image.rsplit(":", 1)[0]
    tag = "dynamo-1.6.1"
    engine.tag(dynamo_161_image, repository, tag)
    digest = engine.push(repository, tag, lambda _: None).digest
    engine.tag(old_dynamo_image, repository, "dynamo-1.2.1")
    engine.push(repository, "dynamo-1.2.1", lambda _: None)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("K3ENV_STATE_DIR", str(tmp_path / "state"))
    for d in ("pins", "images", "clusters"):
        (tmp_path / d).mkdir()
    (tmp_path / LOCK).write_text(
        f'# test\nversion = 1\n[bases.serving]\nrepository = "{repository}"\ntag = "{tag}"\n'
        f'digest = "{digest}"\n'
    )
    (tmp_path / "images/frontend.toml").write_text(
        textwrap.dedent(
            """\
            base = "serving"
            repository = "k3env-test/probe"
            [profiles.agg]
            tokenizer_model_type = "kimi_k3"
            [[profiles.agg.commands]]
            role = "dynamo-frontend"
            argv = ["python3", "-m", "dynamo.frontend", "--http-port", "8000"]
            """
        )
    )
    (tmp_path / "clusters/c.toml").write_text(CLUSTER)
    return tmp_path


@pytest.mark.twin
def test_bump_whose_image_fails_verify_keeps_the_lock_and_shows_the_check(
    twin_project: Path, capsys: pytest.CaptureFixture[str], clean_probe_images: None
) -> None:
    argv = ["bump", "bases.serving", "dynamo-1.2.1", "--lock", LOCK, "--cluster", "clusters/c.toml",
            "--body", "body.md", "-q"]  # fmt: skip
    before = (twin_project / LOCK).read_bytes()
    assert main(argv) == 4
    err = capsys.readouterr().err
    assert "the lock is unchanged" in err
    assert (twin_project / LOCK).read_bytes() == before
    text = (twin_project / "body.md").read_text()
    assert "**passed → failed**" in text  # the tokenizer check changed state
    assert "model_type kimi_k3" in text and "dynamo-runtime 1.2.1" in text
    # The SBOM diff: what verify found installed in the image before and after the bump.
    sbom = text.split(f"### {SBOM_DIFF}", 1)[1]
    assert re.search(r"ai-dynamo-runtime \S+ → 1\.2\.1", sbom.split("###", 1)[0]), sbom
    # The user's choice: write it anyway.
    assert main([*argv, "--keep-failing"]) == 4
    assert 'tag = "dynamo-1.2.1"' in (twin_project / LOCK).read_text()


@pytest.mark.twin
def test_a_bump_runs_over_the_cpu_twin_on_the_offline_default(
    repo: Path,
    engine: DockerEngine,
    twin_image: str,
    dynamo_source: tuple[Path, dict[str, str]],
    dynamo_wheels: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The committed lock's vLLM base is not resolvable here; with --twin the bump builds and
    verifies over the twin, and the body says so. The container patch, written for the real
    base, is not judged on the twin (its vLLM is another release): skipped, never a conflict."""
    import shutil

    from ..conftest import REPO

    shutil.copytree(REPO / "clusters", repo / "clusters")
    images = repo / "only-d"
    images.mkdir()
    shutil.copy(repo / "images/kimi-k3-direct-d.toml", images)
    body = repo / "body.md"
    code = main(["bump", "dynamo", "v1.5.1", "--source", str(dynamo_source[0]),
                 "--wheels-from", str(dynamo_wheels), "--twin", "--images", str(images),
                 "--body", str(body), "--json", "-q"])  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    text = body.read_text()
    assert out["twin"] is True and "Built and verified over each base's CPU twin" in text
    fates = {(p["name"], p["status"]) for p in out["after"]["patches"]}
    assert ("mamba-hybrid-index-int64", "skipped") in fates, out["after"]["patches"]
    # Verify ran in the twin image (not "did not run"), as a twin image (the twin's version
    # pins and waivers): no check fails; the committed lock's srt-slurm patches are pinned, so
    # preflight passes the 2-node recipe, and the patches are judged on the pinned srt-slurm
    # (the lock's URL; --source named Dynamo's source, not srt-slurm's).
    matrix = out["after"]["matrix"]["kimi-k3-direct-d"]
    assert matrix["args"] == "passed" and not {"failed", "not run"} & {*matrix.values()}, matrix
    assert code == 0 and "All checks pass." in text, text
    srt = [p for p in out["after"]["patches"] if p["name"] == "srt-slurm patches"]
    assert not srt or "reference is not a tree" not in str(srt), srt
