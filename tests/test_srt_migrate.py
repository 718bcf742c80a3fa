"""`k3env srt migrate`: srt-slurm 2.x's own `srtctl migrate` rewrites a recipe (comments and key
order kept), then the recipe is judged; refused, saying why, where there is no 2.x to run."""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
from pathlib import Path

import pytest
import yaml  # type: ignore[import-untyped]

from k3env.cli import main
from k3env.srt import migrate as srt_migrate
from k3env.srt.materialize import Materialized

from .conftest import REPO
from .srt2_upstream import Srt2, srt2

__all__ = ["srt2"]  # the session fixture, used by name

RECIPES = REPO / "tests/data/recipes"
LOCK = Path("pins/k3.lock.toml")


def as_materialized(srt2: Srt2, where: Path) -> Materialized:
    """srt-slurm 2.x as `k3env srt materialize` leaves it, for what `srt migrate` runs: its
    venv's `srtctl` (here: upstream's migrate, from the archive, on this interpreter)."""
    bin_dir = where / "venv/bin"
    bin_dir.mkdir(parents=True)
    script = bin_dir / "srtctl"
    script.write_text(f'#!/bin/sh\nPYTHONPATH="{srt2.root / "src"}" exec "{sys.executable}" '
                      '-m srtctl.cli.submit "$@"\n')  # fmt: skip
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return Materialized(path=where, source="../shared/upstream", version="v2.18.0",
                        commit="0" * 40, head="0" * 40, patches=(), python=bin_dir / "python",
                        reused=True)  # fmt: skip


def test_a_recipe_is_rewritten_by_srt_slurm_2x_itself_then_judged(
    repo: Path, srt2: Srt2, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copytree(REPO / "clusters", repo / "clusters")
    LOCK.write_text(LOCK.read_text().replace('version = "v1.0.36"', 'version = "v2.18.0"'))
    m = as_materialized(srt2, repo / "srt")
    monkeypatch.setattr(srt_migrate, "migrator", lambda *_: m)
    source = RECIPES / "d1-mem-095.yaml"
    code = main(["srt", "migrate", str(source), "--out", "v2", "--json", "-q"])
    out = json.loads(capsys.readouterr().out)
    written = Path("v2/d1-mem-095.yaml")
    # Exactly what srt-slurm's own migrate makes of it (comments and key order kept).
    assert written.read_text() == srt2.migrated(source.read_text())
    assert written.read_text().startswith(source.read_text().split("\nname:")[0])  # comments
    (moved,) = out["migrated"]
    assert moved["changed"] and "folded agg fields into roles.agg" in moved["notes"]
    # Then judged: the schema-2 recipe gets its schema-1 form's finding, on its own key.
    assert code == 4
    (mem,) = [f for f in out["recipes"][0]["findings"] if f["rule"] == "K3-GPU-MEM-HEADROOM"]
    assert mem["key"] == "roles.agg.args.gpu-memory-utilization" and mem["file"] == str(written)
    # In place: the file itself, once (a second run changes nothing).
    copy = Path("d.yaml")
    shutil.copy(RECIPES / "d.yaml", copy)
    assert main(["srt", "migrate", str(copy), "--in-place", "-q"]) == 0
    text = copy.read_text()
    assert yaml.safe_load(text)["schema"] == 2
    assert "srtctl migrate (srt-slurm v2.18.0): rewritten -> d.yaml" in capsys.readouterr().out
    assert main(["srt", "migrate", str(copy), "--in-place", "-q"]) == 0
    assert copy.read_text() == text and "unchanged" in capsys.readouterr().out
    assert not [p for p in os.listdir(".") if p.endswith(".partial")]


def test_srt_migrate_refuses_where_no_srt_slurm_2x_can_run(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = str(RECIPES / "f.yaml")
    # The lock pins srt-slurm 1.x: nothing to migrate to.
    assert main(["srt", "migrate", recipe, "--out", "v2"]) == 2
    err = capsys.readouterr().err
    assert "the pinned srt-slurm v1.0.36 loads schema-1 recipes" in err
    assert "pin srt-slurm 2.x first" in err
    # srt-slurm 2.x pinned but not materialized here (CI): its own migrate cannot run, and
    # k3env carries no copy of it.
    LOCK.write_text(LOCK.read_text().replace('version = "v1.0.36"', 'version = "v2.18.0"'))
    assert main(["srt", "migrate", recipe, "--out", "v2"]) == 3
    err = capsys.readouterr().err
    assert "srt-slurm v2.18.0 is not materialized on this host" in err
    assert "k3env srt materialize" in err
    assert not Path("v2").exists()
