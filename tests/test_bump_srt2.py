"""`k3env bump srt-slurm TAG` across srt-slurm's 1.x -> 2.x break, on the fake upstream
(tests/fake_srt) with a 2.x release made at test time from srt-slurm 2.x's real partial source
(../shared/upstream, sha256 checked): nothing of upstream is committed here."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml  # type: ignore[import-untyped]

from k3env.bump import srt
from k3env.bump.evaluate import Outcome
from k3env.bump.pins import candidate_lock
from k3env.cli import Terminated, main
from k3env.commands import bump as command
from k3env.commands.app import App
from k3env.config.lock import load_lock
from k3env.hashing import file_sha256
from k3env.log import Log

from .conftest import REPO, upstream_dir
from .fake_srt.upstream import Upstream, commit, git
from .srt2_upstream import ARCHIVE, ARCHIVE_SHA256, Srt2, srt2

__all__ = ["srt2"]  # the session fixture, used by name

pytestmark = pytest.mark.srt

LOCK = Path("pins/k3.lock.toml")
REQUIREMENTS = Path("pins/srtctl.requirements.txt")
SCHEMA = Path("schemas/srt-slurm.schema.json")
USER = REPO / "tests/data/recipes/d1-mem-095.yaml"


def overlay(repo: Path, partial: Path) -> None:
    """The release's tree: srt-slurm 2.x's source over the fake 1.x package."""
    shutil.copytree(partial / "src/srtctl", repo / "src/srtctl", dirs_exist_ok=True)
    shutil.copy(partial / "pyproject.toml", repo / "pyproject.toml")


@pytest.fixture(scope="module")
def release(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clone of the fake upstream with two 2.x-shaped tags: v2.0.0 on top of v1.0.38 (both
    PR patches in its history), v2.0.1 on v1.0.36 alone (PR #278's schema hunks conflict)."""
    where = upstream_dir(ARCHIVE)
    if where is None:
        pytest.skip(f"../shared/upstream/{ARCHIVE} (srt-slurm 2.x's real code)")
    assert file_sha256(where / ARCHIVE) == ARCHIVE_SHA256
    root = tmp_path_factory.mktemp("srt2-release")
    with tarfile.open(where / ARCHIVE) as tar:
        tar.extractall(root / "partial", filter="data")
    (partial,) = (root / "partial").iterdir()
    repo = root / "srt-slurm"
    git(root, "clone", "-q", str(upstream.path), str(repo))
    overlay(repo, partial)
    commit(repo, "srt-slurm 2.0.0: recipes are schema 2 (#407, #456)")
    git(repo, "tag", "v2.0.0")
    git(repo, "checkout", "-q", "-b", "other", "v1.0.36")
    overlay(repo, partial)
    commit(repo, "srt-slurm 2.0.1 without PR #278")
    git(repo, "tag", "v2.0.1")
    return repo


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The release's requirements as wheels, fetched once: every bump resolves from here."""
    d = tmp_path_factory.mktemp("srt2-wheels")
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary", ":all:",
                    "-d", str(d), "pyyaml>=6.0", "ruamel.yaml>=0.18.0", "setuptools>=61"],
                   check=True)  # fmt: skip
    return d


@pytest.fixture
def offline(wheels: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """pip (srtctl's venv) and the bump's uv both read ``wheels`` only."""
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    return wheels


def files() -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in (LOCK, REQUIREMENTS, SCHEMA)}


def bump(release: Path, wheels: Path, tag: str, *extra: str) -> list[str]:
    return ["bump", "srt-slurm", tag, "--source", str(release), "--wheels-from", str(wheels),
            "--edit-only", "--json", "-q", *extra]  # fmt: skip


def test_the_bump_to_2x_drops_patches_regenerates_requirements_and_renders_schema_2(
    srt_repo: Path, release: Path, offline: Path, srt2: Srt2, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    before = files()
    user = tmp_path / "mine.yaml"
    shutil.copy(USER, user)
    commit_2 = git(release, "rev-parse", "v2.0.0")
    code = main(bump(release, offline, "v2.0.0", "--recipes", str(user), "--body", "pr.md"))
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    crossing = out["srt_slurm"]
    # 1. Both PR patches are in v2.0.0: dropped, entries and comments, every other byte kept.
    old = before[LOCK].decode()
    head, rest = old.split("\n\n[[srt_slurm.patches]]", 1)
    tail = rest[rest.index("\n\n# ----") :]
    above, srt = head.split("\n[srt_slurm]\n")
    old_commit = srt.split('commit = "')[1][:40]
    old_req = srt.split('requirements_sha256 = "')[1][:64]
    expected = above + "\n[srt_slurm]\n" + (
        srt.replace('version = "v1.0.36"', 'version = "v2.0.0"')
        .replace(f'commit = "{old_commit}"', f'commit = "{commit_2}"')
        .replace(old_req, file_sha256(REQUIREMENTS))) + tail  # fmt: skip
    assert LOCK.read_text() == expected
    assert [d["label"] for d in crossing["dropped"]] == [
        "PR #278", "direct vllm frontend: vLLM-native multi-node serve"]  # fmt: skip
    body = Path("pr.md").read_text()
    assert body.count("upstream: drop it") == 2
    # 2. srtctl's requirements from v2.0.0's own pyproject.toml, with hashes.
    text = REQUIREMENTS.read_text()
    assert "# from:\n#   pyyaml>=6.0 ruamel.yaml>=0.18.0 setuptools>=61\n" in text
    pinned = {line.split("==")[0] for line in text.splitlines() if "==" in line}
    assert pinned == {"pyyaml", "ruamel-yaml", "setuptools"}
    assert all(f"--hash=sha256:{file_sha256(w)}" in text for w in offline.iterdir())
    assert crossing["requirements"]["status"] == "passed"
    # 3. Its loader has no typed schema to record (no marshmallow, no SrtConfig): not checked,
    # why, and the old file kept.
    assert crossing["schema"]["status"] == "not checked"
    assert "No module named 'marshmallow'" in crossing["schema"]["detail"]
    assert SCHEMA.read_bytes() == before[SCHEMA]
    # 4. k3env's recipes as schema 2, passing k3env's gate model and v2.0.0's own gate and
    # role expansion; the YAML in the body.
    assert crossing["recipes"]
    for r in crossing["recipes"]:
        data = yaml.safe_load(r["yaml"])
        assert data["schema"] == 2 and "backend" not in data, r["name"]
        assert srt2.gate(data) is None
        assert (r["k3env"]["status"], r["release"]["status"]) == ("passed", "passed"), r
        assert r["yaml"].rstrip("\n") in body
    # 5. The user's recipe: migrate's own notes, the file untouched.
    (mine,) = crossing["user_recipes"]
    notes = srt2.migrate.migrate_recipe_text(USER.read_text()).notes
    assert mine["status"] == "passed" and mine["notes"] == list(notes) and notes
    assert all(f"  - {n}" in body for n in notes)
    assert user.read_bytes() == USER.read_bytes()
    # The new pin materializes with what the bump wrote; its own gate, as the bump asks it,
    # refuses a schema-1 recipe in its own words (a verdict that can fail).
    from k3env.bump.srt import _release_gate
    from k3env.config.lock import load_lock
    from k3env.log import Log
    from k3env.srt.materialize import materialize
    from k3env.state import State

    m = materialize(load_lock(LOCK), State(), Log(quiet=True), source=str(release))
    one, two = _release_gate(m, [USER.read_text(), crossing["recipes"][0]["yaml"]], Log(quiet=True))
    assert one == ("failed", f"ValueError: {srt2.gate(yaml.safe_load(USER.read_text()))}")
    assert two == ("passed", "passes its gate and role expansion")


def test_a_patch_that_conflicts_refuses_the_bump_and_keeps_every_file(
    srt_repo: Path, release: Path, offline: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = files()
    assert main(bump(release, offline, "v2.0.1")) == 2
    err = json.loads(capsys.readouterr().out)["error"]["message"]
    assert "conflict with v2.0.1" in err and "PR #278" in err
    assert files() == before


def test_bad_recipes_exit_2_with_file_and_line_and_nothing_is_written(
    srt_repo: Path, release: Path, offline: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = files()
    bad = srt_repo / "bad.yaml"
    bad.write_text("name: x\nbackend: [\n")
    assert main(bump(release, offline, "v2.0.0", "--recipes", str(bad))) == 2
    assert f"{bad}:3:1" in json.loads(capsys.readouterr().out)["error"]["where"]
    assert files() == before


@pytest.mark.parametrize(("stop", "code"), [(KeyboardInterrupt, 130), (Terminated, 143),
                                            (OSError, 3)])  # fmt: skip
def test_whatever_ends_the_bump_puts_lock_requirements_and_schema_back(
    srt_repo: Path, release: Path, offline: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], stop: type[BaseException], code: int,
) -> None:  # fmt: skip
    """Ctrl-C, SIGTERM (raised as Terminated) or a failure while the recipes are judged:
    the lock, srtctl's requirements and the schema as they were."""
    before = files()
    written: list[bytes] = []

    def interrupted(*args: object, **kw: object) -> list[object]:
        written.append(REQUIREMENTS.read_bytes())  # the bump had written it by now
        raise stop("stopped")

    monkeypatch.setattr(srt, "_render", interrupted)
    assert main(bump(release, offline, "v2.0.0")) == code
    assert written and written[0] != before[REQUIREMENTS]
    assert files() == before


def test_where_the_release_does_not_materialize_its_checks_are_not_checked_never_passed(
    srt_repo: Path, release: Path, offline: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """CI's case: no 2.x can be installed here (pip finds none of its wheels). The schema,
    the release's own gate and migrate are said not checked, with why; the old schema kept."""
    before = files()
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    monkeypatch.setenv("PIP_FIND_LINKS", str(empty))
    monkeypatch.setenv("K3ENV_STATE_DIR", str(tmp_path / "state"))  # no cached 2.x either
    code = main(bump(release, offline, "v2.0.0", "--recipes", str(USER)))
    crossing = json.loads(capsys.readouterr().out)["srt_slurm"]
    assert code == 0
    why = "srt-slurm does not materialize here: "
    assert crossing["schema"]["status"] == "not checked"
    assert crossing["schema"]["detail"].startswith(why)
    assert {r["release"]["status"] for r in crossing["recipes"]} == {"not checked"}
    assert {r["k3env"]["status"] for r in crossing["recipes"]} == {"passed"}
    (mine,) = crossing["user_recipes"]
    assert mine["status"] == "not checked" and mine["detail"].startswith(why)
    assert SCHEMA.read_bytes() == before[SCHEMA]
    assert LOCK.read_bytes() != before[LOCK]  # the pin and its requirements did move


@pytest.mark.parametrize("images_fail", [True, False])
def test_the_full_bump_keeps_what_moved_only_when_the_bumped_images_pass(
    srt_repo: Path, release: Path, offline: Path, images_fail: bool
) -> None:
    """Without --edit-only the images are built, verified and preflighted on the bumped lock
    (here a stand-in for that judging: the engine path is tests/engine's): the lock,
    requirements and schema are what the judging sees, and put back when it fails."""
    before = files()
    lock = load_lock(LOCK)
    leaves = {"srt_slurm.version": "v2.0.0",
              "srt_slurm.commit": git(release, "rev-parse", "v2.0.0")}  # fmt: skip
    args = argparse.Namespace(
        lock=LOCK, pin="srt-slurm", source=str(release), wheels_from=[str(offline)],
        twin_index_url=None, recipes=[], images=Path("images"),
        cluster=Path("clusters/b200-dgxc.toml"), keep_failing=False,
    )  # fmt: skip
    regenerate = command._crossing(args, App(log=Log(quiet=True)), lock, leaves)
    assert regenerate is not None
    judged: list[int] = []

    def judge(bumped: object) -> Outcome:
        judged.append(len(load_lock(LOCK).srt_slurm.patches))  # type: ignore[union-attr]
        return Outcome(reports=(), preflight_errors={"x": int(images_fail)}, patches=())

    new_lock, changes = candidate_lock(lock, leaves)
    before_outcome = Outcome(reports=(), preflight_errors={"x": 0}, patches=())
    _, _, _, text, written, crossing = command._after(
        args, lock, new_lock, changes, leaves, regenerate, judge, before_outcome
    )
    assert judged == [0]  # the judging saw the lock without the dropped patches
    assert crossing is not None and "### srt-slurm, across the schema break" in text
    assert written is not images_fail
    if images_fail:
        assert files() == before
    else:
        assert 'version = "v2.0.0"' in LOCK.read_text() and "[[srt_slurm.patches]]" not in (
            LOCK.read_text()
        )
