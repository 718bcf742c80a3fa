"""Shared fixtures: a throwaway copy of the repository's pins/, images/ and patches/."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the real lock, specs and patches; cwd is set to it."""
    for d in ("pins", "images", "patches"):
        shutil.copytree(REPO / d, tmp_path / d)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("K3ENV_STATE_DIR", str(tmp_path / "state"))
    return tmp_path


def replace_in(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


# --- unit tests over the in-memory engine (tests/fake_engine.py) -------------------------------
from .fake_engine import BUGGY, FakeEngine, Project, python_base, write_project  # noqa: E402

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
