"""`k3env outdated`: what moved upstream, from local stand-ins of each kind of source (a git
repository with tags, a wheel directory; the registry is asked through a seam here and for
real in tests/engine/test_outdated_engine.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from k3env.bump.outdated import outdated
from k3env.cli import main
from k3env.config.lock import load_lock
from k3env.errors import EngineError
from k3env.log import Log
from k3env.versions import newer_than

from .conftest import replace_in
from .fake_srt.upstream import build

LOCK = Path("pins/k3.lock.toml")
GIT_ENV = {
    "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@t", "HOME": "/tmp",
}  # fmt: skip


def test_newer_than_orders_versions_and_skips_what_is_not_one() -> None:
    assert newer_than("v1.0.36", ["v1.0.35", "v1.0.38", "v1.0.37", "nightly", "v1.0.40rc1"]) == [
        "v1.0.38",
        "v1.0.37",
    ]
    # A pinned pre-release (a day-zero dev tag) is newer-than'd by releases and pre-releases.
    assert newer_than("1.4.0.dev1", ["v1.4.0-kimi-k3-dev.1", "v1.4.2", "v1.6.1"]) == [
        "v1.6.1",
        "v1.4.2",
    ]
    assert newer_than("kimi-k3", ["kimi-k3", "latest"]) == []


def _dynamo_source(root: Path) -> Path:
    repo = root / "dynamo"
    repo.mkdir()
    git = ["git", "-C", str(repo)]
    subprocess.run([*git, "init", "-q"], check=True, env=GIT_ENV)
    for tag in ("v1.4.0-kimi-k3-dev.1", "v1.4.2", "v1.6.1", "v1.7.0rc1", "v1.7.0", "v1.8.0"):
        (repo / "VERSION").write_text(tag)
        subprocess.run([*git, "add", "-A"], check=True, env=GIT_ENV)
        subprocess.run([*git, "commit", "-qm", tag], check=True, env=GIT_ENV)
        subprocess.run([*git, "tag", tag], check=True, env=GIT_ENV)
    return repo


def test_outdated_lists_newer_tags_and_releases_with_the_bump_that_takes_them(
    repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    upstream = build(tmp_path / "srt")  # tags v1.0.36, v1.0.37, v1.0.38
    dynamo = _dynamo_source(tmp_path)
    replace_in(LOCK, "https://github.com/NVIDIA/srt-slurm.git", str(upstream.path))
    replace_in(LOCK, "https://github.com/ai-dynamo/dynamo.git", str(dynamo))
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for version in ("0.13.0", "0.14.1"):
        (wheels / f"aiperf-{version}-py3-none-any.whl").write_bytes(b"")

    def tags(repository: str) -> list[str]:
        assert repository == "docker.io/vllm/vllm-openai"
        return ["kimi-k3", "latest"]

    def digest(repository: str, tag: str) -> str:
        return "sha256:" + "1" * 64

    found = {
        o.pin: o
        for o in outdated(
            load_lock(LOCK),
            Log(quiet=True),
            index_args=["--no-index", "--find-links", str(wheels)],
            tags_of=tags,
            digest_of=digest,
        )
    }
    assert found["srt-slurm"].newer == ("v1.0.38", "v1.0.37")
    assert found["srt-slurm"].bump[0] == "k3env bump srt-slurm v1.0.38"
    assert found["dynamo"].newer == ("v1.8.0", "v1.7.0")  # the lock pins v1.6.1; no rc
    assert found["aiperf"].newer == ("0.14.1",)
    assert found["aiperf"].bump == ("k3env bump aiperf 0.14.1",)  # its wheel follows, by sha256
    base = found["bases.vllm-kimi-k3"]
    assert base.newer == () and base.moved is None  # the pin is unresolved: nothing moved
    # The command, as the workflow reads it.
    assert main(["outdated", "--json", "--find-links", str(wheels)]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert {"srt-slurm", "dynamo", "aiperf"} <= set(payload["outdated"])


def test_a_source_that_cannot_be_asked_is_never_up_to_date(repo: Path) -> None:
    replace_in(LOCK, "https://github.com/NVIDIA/srt-slurm.git", str(repo / "no-such-repo"))

    def unreachable(repository: str) -> list[str]:
        raise EngineError("cannot list tags: refused", where=repository)

    found = {o.pin: o for o in outdated(load_lock(LOCK), Log(quiet=True), tags_of=unreachable,
                                        index_args=["--no-index"])}  # fmt: skip
    assert found["srt-slurm"].error and not found["srt-slurm"].outdated
    assert found["bases.vllm-kimi-k3"].error == "cannot list tags: refused"
    assert found["aiperf"].error


def test_a_tag_name_that_is_not_utf8_is_skipped_not_a_traceback(tmp_path: Path) -> None:
    """`git ls-remote` printed a tag of raw bytes: the decode raised (a traceback in
    `outdated` and `bump`). Now it is read with replacement characters and never offered."""
    from k3env.bump.pins import git_tags

    repo = tmp_path / "up"
    repo.mkdir()
    git = ["git", "-C", str(repo)]
    subprocess.run([*git, "init", "-q"], check=True, env=GIT_ENV)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "x"], check=True, env=GIT_ENV)
    subprocess.run([*git, "tag", b"v1.\xff".decode("latin-1").encode("latin-1")], check=True,
                   env=GIT_ENV)  # fmt: skip
    subprocess.run([*git, "tag", "v1.0.0"], check=True, env=GIT_ENV)
    tags = git_tags(str(repo))
    assert "v1.0.0" in tags and "v1.\ufffd" in tags
    assert newer_than("0.9.0", list(tags)) == ["v1.0.0"]
