"""`k3env smoke --cluster` where the pinned srt-slurm is materialized (the local stand-in of
tests/fake_srt, with PR #278 and the multi-node patch): the smoke recipe is validated by its
own loader, job-time lookups (the `custom` benchmark type) and dry-run before it is written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from k3env.cli import main

from .test_cluster_smoke import CONTAINER

pytestmark = pytest.mark.srt


@pytest.mark.parametrize("layers", [(), ("--layers", "2")], ids=["full", "layers"])
def test_variant_f_smoke_recipe_validates_with_the_pinned_srt_slurm(
    srt_repo: Path,
    capsys: pytest.CaptureFixture[str],
    layers: tuple[str, ...],
) -> None:
    assert main(["srt", "materialize", "-q"]) == 0
    capsys.readouterr()
    out = srt_repo / "smoke"
    rc = main(["smoke", "--cluster", "clusters/b200-dgxc.toml", "kimi-k3-direct-f", "--container",
               CONTAINER, "--out", str(out), "--json", "-q", *layers])  # fmt: skip
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    validation = json.loads(captured.out)["written"]["validation"]
    assert validation["status"] == "passed", validation
    assert "srt-slurm v1.0.36 + ['PR #278'" in validation["detail"]
    assert (out / "recipe.yaml").is_file()


def test_a_recipe_srt_slurm_refuses_is_not_written(
    srt_repo: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fake upstream refuses frontend.type vllm with more than one worker: a smoke of a
    cluster profile it cannot take fails with srt-slurm's words, and writes nothing."""
    assert main(["srt", "materialize", "-q"]) == 0
    capsys.readouterr()
    from k3env.cluster import job as cluster_job
    from k3env.cluster import smoke as cluster_smoke

    real = cluster_smoke.smoke_recipe

    def two_workers(*args: Any, **kwargs: Any) -> dict[str, Any]:
        recipe = real(*args, **kwargs)
        recipe["resources"]["agg_workers"] = 2
        return recipe

    monkeypatch.setattr(cluster_job, "smoke_recipe", two_workers)
    out = srt_repo / "smoke"
    rc = main(["smoke", "--cluster", "clusters/b200-dgxc.toml", "kimi-k3-direct-f",
               "--container", CONTAINER, "--out", str(out), "-q"])  # fmt: skip
    assert rc == 4
    assert "exactly one aggregate worker" in capsys.readouterr().err
    assert not out.exists()
