"""`preflight --recipe` where the pinned srt-slurm is materialized (the local stand-in of
tests/fake_srt): srt-slurm's own loader, job-time lookups and dry-run judge each recipe too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k3env.cli import main

from .test_recipes_in import RECIPES, line_of

pytestmark = pytest.mark.srt


def test_srt_slurms_own_loader_runs_where_it_is_materialized(
    srt_repo: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["srt", "materialize", "-q"]) == 0
    capsys.readouterr()
    fork, final = RECIPES / "a1-fork.yaml", RECIPES / "f.yaml"
    code = main(["preflight", "--json", "-q", "--recipe", str(fork), "--recipe", str(final)])
    assert code == 4
    a1, f = json.loads(capsys.readouterr().out)["recipes"]
    # The first run's failure, in srt-slurm's words, on the recipe's key and line.
    (loader,) = [x for x in a1["findings"] if x["rule"] == "SRT-LOADER"]
    assert loader["key"] == "benchmark.aiperf_server_metrics"
    assert loader["line"] == line_of(fork, "aiperf_server_metrics:")
    assert "Unknown field." in loader["message"] and "srt-slurm's load" in loader["message"]
    assert a1["srt_slurm_loader"]["status"] == "failed"
    # The final recipe loads, passes the job-time lookups and dry-runs.
    assert f["srt_slurm_loader"]["status"] == "passed"
    assert "srt-slurm v1.0.36 + ['PR #278'" in f["srt_slurm_loader"]["detail"]
    assert not [x for x in f["findings"] if x["rule"] == "SRT-LOADER"]
