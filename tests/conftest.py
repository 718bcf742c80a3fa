"""Shared fixtures: a throwaway copy of the repository's pins/, images/ and patches/."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from k3env.cli import main

from .fake_srt.upstream import Upstream, build

REPO = Path(__file__).resolve().parent.parent
LOCK = Path("pins/k3.lock.toml")


def upstream_dir(holding: str) -> Path | None:
    """The ../shared/upstream (or $K3ENV_UPSTREAM) that holds the file ``holding``, if any."""
    for candidate in (os.environ.get("K3ENV_UPSTREAM"), REPO.parent / "shared/upstream",
                      Path("/work/shared/upstream")):  # fmt: skip
        if candidate and (Path(candidate) / holding).is_file():
            return Path(candidate)
    return None


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the real lock, specs and patches; cwd is set to it."""
    for d in ("pins", "images", "patches", "schemas"):
        shutil.copytree(REPO / d, tmp_path / d)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("K3ENV_STATE_DIR", str(tmp_path / "state"))
    return tmp_path


@pytest.fixture
def repo_with_clusters(repo: Path) -> Path:
    shutil.copytree(REPO / "clusters", repo / "clusters")
    return repo


@pytest.fixture
def resolved(repo_with_clusters: Path) -> Path:
    """The lock's srt-slurm PR patches pinned and its base's manifests resolved (as on a host
    that reaches GitHub and Docker Hub), so verdicts are about the recipes: without them the
    committed lock's 2-node direct profiles fail K3-SRT-FRONTEND and warn K3-IMAGE-PLATFORM."""
    text = LOCK.read_text()
    for platform, digit in (("linux/amd64", "a"), ("linux/arm64", "b")):
        text = text.replace(f'"{platform}" = "unresolved"', f'"{platform}" = "sha256:{digit * 64}"')
    LOCK.write_text(text)
    assert main(["lock", "--update-hashes", "-q"]) == 0
    return repo_with_clusters


def replace_in(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


# --- unit tests over the in-memory engine (tests/fake_engine.py) -------------------------------
from .fake_engine import FakeEngine, python_base  # noqa: E402
from .project import BUGGY, Project, write_project  # noqa: E402

TEST_BASE_REPOSITORY = "127.0.0.1:5000/k3env-test/base"


@pytest.fixture
def fake_engine() -> FakeEngine:
    """An empty in-memory engine (and registry)."""
    return FakeEngine()


@pytest.fixture
def fake_project(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_engine: FakeEngine
) -> Project:
    """A lock + spec + container patch (tests/fake_engine.write_project) pinning, by digest, a
    base with the patch's anchor, published in ``fake_engine``'s registry; cwd is set to it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("K3ENV_STATE_DIR", str(tmp_path / "state"))
    base = fake_engine.publish(TEST_BASE_REPOSITORY, python_base(BUGGY))
    return write_project(tmp_path, {"testbase": base})


@pytest.fixture(scope="session")
def dynamo_source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A local stand-in of the Dynamo repository: one commit per release tag; (path, tag ->
    commit)."""
    import subprocess

    repo = tmp_path_factory.mktemp("dynamo-source")
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "HOME": str(repo)}  # fmt: skip
    git = ["git", "-C", str(repo)]
    subprocess.run([*git, "init", "-q"], check=True, env=env)
    tags = {}
    for tag in ("v1.4.0-kimi-k3-dev.1", "v1.4.2", *(f"v1.5.{i}" for i in range(8)), "v1.6.1"):
        (repo / "VERSION").write_text(tag)
        subprocess.run([*git, "add", "-A"], check=True, env=env)
        subprocess.run([*git, "commit", "-qm", tag], check=True, env=env)
        subprocess.run([*git, "tag", "-a", "-m", tag, tag], check=True, env=env)
        tags[tag] = subprocess.run(
            [*git, "rev-parse", "HEAD"], check=True, env=env, capture_output=True, text=True
        ).stdout.strip()
    return repo, tags


def make_wheel(directory: Path, dist: str, version: str, requires: Sequence[str] = ()) -> Path:
    """A minimal valid pure-Python wheel (metadata only, with ``requires`` as its
    Requires-Dist): what pip and uv need to download and resolve it."""
    import zipfile

    stem = f"{dist.replace('-', '_')}-{version}"
    path = directory / f"{stem}-py3-none-any.whl"
    needs = "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{stem}.dist-info/METADATA",
                   f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n{needs}")  # fmt: skip
        z.writestr(f"{stem}.dist-info/WHEEL",
                   "Wheel-Version: 1.0\nGenerator: k3env-tests\nRoot-Is-Purelib: true\n"
                   "Tag: py3-none-any\n")  # fmt: skip
        z.writestr(f"{stem}.dist-info/RECORD", "")
    return path


@pytest.fixture(scope="session")
def dynamo_wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local wheel index (find-links) with ai-dynamo and ai-dynamo-runtime wheels for each
    release tag of ``dynamo_source``: a bump moves the baked wheels with the tag."""
    d = tmp_path_factory.mktemp("dynamo-wheels")
    for version in ("1.4.2", *(f"1.5.{i}" for i in range(8)), "1.6.1"):
        for dist in ("ai-dynamo", "ai-dynamo-runtime"):
            make_wheel(d, dist, version)
    return d


# --- srt-slurm: a local git upstream and srtctl's pinned closure, shared by every module ---
@pytest.fixture(scope="session")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Upstream:
    return build(tmp_path_factory.mktemp("upstream"))


@pytest.fixture(scope="session")
def srtctl_requirements(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The stand-in srtctl's closure (pyyaml, and setuptools, its build backend) pinned with
    hashes, as the lock's requirements file pins the real one's."""
    out = tmp_path_factory.mktemp("srtctl-req") / "requirements.txt"
    src = out.with_name("requirements.in")
    src.write_text("pyyaml>=6\nsetuptools>=61\n")
    subprocess.run(
        [sys.executable, "-m", "uv", "pip", "compile", str(src), "--generate-hashes",
         "--quiet", "--no-header", "--python-version", "3.11", "-o", str(out)],
        check=True,
    )  # fmt: skip
    return out.read_text()


@pytest.fixture(scope="session")
def srt_state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One k3env state dir for the session (per worker): every module's tests share the
    materialized cache, as a build host does."""
    return tmp_path_factory.mktemp("srt-state")


@pytest.fixture
def srt_repo(
    repo: Path,
    upstream: Upstream,
    srt_state: Path,
    srtctl_requirements: str,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Path]:
    """The real lock with [srt_slurm] pointed at the local upstream and its format-patches."""
    monkeypatch.setenv("K3ENV_STATE_DIR", str(srt_state))
    shutil.copytree(REPO / "clusters", repo / "clusters")
    (repo / "patches/srt-slurm").mkdir(parents=True, exist_ok=True)
    for name in ("pr278-direct-aggregate-serving.patch", "pr278-direct-vllm-multinode.patch"):
        src = upstream.patches / ("pr278.patch" if "serving" in name else "multinode.patch")
        shutil.copy(src, repo / "patches/srt-slurm" / name)
    text = LOCK.read_text()
    text = text.replace("https://github.com/NVIDIA/srt-slurm.git", str(upstream.path))
    text = text.replace("cb651682117df129162cd276cf567ec70dc57b36", upstream.v1036)
    text = text.replace("6fd6000035c8d698d08a2807fcc93b462f658dd6", upstream.pr278)
    LOCK.write_text(text)
    (repo / "pins/srtctl.requirements.txt").write_text(srtctl_requirements)
    assert main(["lock", "--update-hashes", "-q"]) == 0
    yield repo
