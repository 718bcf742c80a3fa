"""Pin bumps without an engine: in-place lock edits, bad input, the PR body."""

from __future__ import annotations

from pathlib import Path

import pytest

from k3env.bump.body import body
from k3env.bump.evaluate import Outcome, PatchFate
from k3env.bump.pins import leaf_changes
from k3env.checks.verdicts import CheckResult, ImageReport
from k3env.cli import main
from k3env.config.lock import load_lock
from k3env.config.lock_edit import Change

LOCK = Path("pins/k3.lock.toml")
NEW = "1234567890abcdef1234567890abcdef12345678"


def test_dynamo_bump_resolves_the_tag_and_moves_name_version_commit_and_wheels_together(
    repo: Path, dynamo_source: tuple[Path, dict[str, str]], dynamo_wheels: Path
) -> None:
    from k3env.hashing import file_sha256

    source, tags = dynamo_source
    before = LOCK.read_text().splitlines()
    assert main(["bump", "dynamo", "v1.4.2", "--source", str(source),
                 "--wheels-from", str(dynamo_wheels), "--edit-only", "-q"]) == 0  # fmt: skip
    after = LOCK.read_text().splitlines()
    diff = [(a, b) for a, b in zip(before, after, strict=True) if a != b]
    sha = {d: file_sha256(dynamo_wheels / f"{d}-1.4.2-py3-none-any.whl")
           for d in ("ai_dynamo", "ai_dynamo_runtime")}  # fmt: skip
    assert [b for _, b in diff] == [
        'name = "v1.4.2"',
        'version = "1.4.2"',
        f'commit = "{tags["v1.4.2"]}"',
        f'  {{ name = "ai-dynamo", version = "1.4.2", sha256 = "{sha["ai_dynamo"]}" }},',
        # The arm64 file moves with the version (here the same pure wheel): never stale.
        f'  {{ name = "ai-dynamo-runtime", version = "1.4.2", '
        f'sha256 = "{sha["ai_dynamo_runtime"]}", platforms = {{ "linux/arm64" = '
        f'"{sha["ai_dynamo_runtime"]}" }} }},',
    ]  # comments and every other line kept
    # A commit works too when a tag names it; the tag becomes the name.
    assert main(["bump", "dynamo", tags["v1.6.1"], "--source", str(source),
                 "--wheels-from", str(dynamo_wheels), "--edit-only", "-q"]) == 0  # fmt: skip
    dynamo = load_lock(LOCK).dynamo
    assert dynamo is not None and (dynamo.name, dynamo.version) == ("v1.6.1", "1.6.1")
    assert dynamo.component is not None
    assert {w.version for w in dynamo.component.wheels} == {"1.6.1"}


def test_a_bump_to_a_release_without_wheels_is_refused_and_the_lock_kept(
    repo: Path, dynamo_source: tuple[Path, dict[str, str]], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    source, _ = dynamo_source
    before = LOCK.read_bytes()
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    assert main(["bump", "dynamo", "v1.4.2", "--source", str(source),
                 "--wheels-from", str(empty), "--edit-only"]) == 2  # fmt: skip
    assert "ai-dynamo==1.4.2" in capsys.readouterr().err
    assert LOCK.read_bytes() == before


def test_a_made_up_dynamo_commit_is_refused(
    repo: Path, dynamo_source: tuple[Path, dict[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    source, _ = dynamo_source
    before = LOCK.read_bytes()
    assert main(["bump", "dynamo", NEW, "--source", str(source), "--edit-only"]) == 2
    assert "is not named by any tag" in capsys.readouterr().err
    assert LOCK.read_bytes() == before


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bump", "nope", "x"], "unknown pin 'nope'"),
        (["bump", "dynamo"], "which tag or commit?"),
        (["bump", "bases.nope", "t"], "no registry base 'nope'"),
        (["bump", "bases.vllm-kimi-k3", "kimi-k3@sha256:12"], "is not sha256:<64 hex>"),
        (["bump", "container_patches.mamba-hybrid-index-int64"], "nothing to bump"),
    ],
)
def test_bad_bumps_are_refused_and_leave_the_lock(
    repo: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    before = LOCK.read_bytes()
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert LOCK.read_bytes() == before
    assert not list(Path("pins").glob(".*candidate"))


def test_srt_tag_bump_resolves_the_commit_through_the_resolver(repo: Path) -> None:
    lock = load_lock(LOCK)
    changes = leaf_changes(
        lock,
        "srt-slurm",
        "v1.0.49",
        resolve_digest=lambda r, t: "",
        resolve_tag_commit=lambda url, tag: "e32e591067fa90cae3641f46d8ff5e0f4c6e82c8",
    )
    assert changes == {
        "srt_slurm.version": "v1.0.49",
        "srt_slurm.commit": "e32e591067fa90cae3641f46d8ff5e0f4c6e82c8",
    }


def _report(image: str, status: str) -> ImageReport:
    result = CheckResult(
        image=image, profile="agg", check="tokenizer", subject="model_type kimi_k3",
        status=status, component="dynamo-runtime", version="1.2.1",
        output="the frontend stopped: Failed to load tiktoken tokenizer",
    )  # fmt: skip
    return ImageReport(
        image=image,
        reference="r",
        image_id="i",
        results=(result,),
        facts={},
        seconds=1.0,
    )


def test_body_shows_pins_patch_fates_and_the_changed_checks() -> None:
    from .conftest import REPO

    lock = load_lock(REPO / "pins/k3.lock.toml")
    before = Outcome(reports=[_report("dyn", "passed")], preflight_errors={"dyn": 0}, patches=[])
    after = Outcome(
        reports=[_report("dyn", "failed")],
        preflight_errors={"dyn": 1},
        patches=[PatchFate(name="mamba", base="vllm-kimi-k3", status="upstream", detail="present")],
    )
    text = body(
        lock, "dynamo", [Change(key="dynamo.commit", old="a" * 40, new="b" * 40)], before, after
    )
    assert "| `dynamo.commit` |" in text
    assert "https://github.com/ai-dynamo/dynamo/compare/aaaaaaaaaaaa...bbbbbbbbbbbb" in text
    assert "⬆️ upstream: drop it" in text
    assert "**passed → failed**" in text and "**0 → 1 errors**" in text
    assert "Failed to load tiktoken tokenizer" in text and "Not mergeable" in text
    assert "### Changelog" in text
