"""`k3env outdated` against the real local registry: its tags, and a pinned tag that moved."""

from __future__ import annotations

from pathlib import Path

import pytest

from k3env.bump.outdated import outdated
from k3env.config.lock import load_lock
from k3env.engine.dockerd import DockerEngine
from k3env.engine.registry import list_tags
from k3env.log import Log

from .conftest import BaseFixture, write_project

pytestmark = [pytest.mark.engine, pytest.mark.registry]


def test_registry_tags_and_a_moved_tag(
    engine: DockerEngine,
    test_base: BaseFixture,
    fixed_base: BaseFixture,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A newer release of the base under tag "2" (the fixed image) beside the pinned "1".
    engine.tag(fixed_base.image_id, test_base.repository, "2")
    engine.push(test_base.repository, "2", lambda _: None)
    assert {"1", "2"} <= set(list_tags(test_base.repository))
    # The lock pins tag 1 by a digest that is not what tag 1 names in the registry now.
    moved = BaseFixture(
        repository=test_base.repository, tag="1", digest=fixed_base.digest, image_id=""
    )
    monkeypatch.chdir(tmp_path)
    lock = load_lock(write_project(tmp_path, moved))
    (base,) = [o for o in outdated(lock, Log(quiet=True)) if o.pin == "bases.testbase"]
    assert base.newer == ("2",)
    assert base.moved == test_base.digest
    assert base.bump[:2] == ("k3env bump bases.testbase 1", "k3env bump bases.testbase 2")
