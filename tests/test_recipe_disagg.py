"""Disaggregated recipes (prefill and decode workers, srt-slurm's ``vllm_config.prefill`` /
``decode`` or 2.x's ``roles.prefill`` / ``roles.decode``): each worker mode judged by the same
rules as an aggregate worker, its findings on the keys and lines where the recipe writes that
mode's flags and env, in either schema; srt-slurm 2.x's own example recipe among them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml  # type: ignore[import-untyped]

from k3env.checks.recipe_map import DIRECT_DISAGG, commands
from k3env.cli import main
from k3env.config.srtrecipe import load_recipe
from k3env.config.srtrecipe2 import UNKNOWN_ROLE
from k3env.config.yamlread import load_yaml

from .conftest import REPO
from .srt2_upstream import Srt2, srt2
from .test_srt_schema2 import SRT2, findings, lookup, pin, preflight

__all__ = ["srt2"]  # the session fixture, used by name

# Kimi-K3 over one prefill and one decode worker, TP 8 each, behind the Dynamo frontend; the
# prefill worker leaves too little memory outside vLLM's pool and lacks PYTHONHASHSEED (which
# the decode worker sets): findings on prefill's keys only.
DISAGG = """\
name: kimi-k3-disagg
model:
  path: /lustre/fsw/models/Kimi-K3
  container: vllm/vllm-openai:kimi-k3
  precision: fp4
resources:
  gpu_type: b200
  gpus_per_node: 8
  prefill_nodes: 1
  prefill_workers: 1
  decode_nodes: 1
  decode_workers: 1
frontend:
  type: dynamo
backend:
  type: vllm
  prefill_environment:
    PYTORCH_CUDA_ALLOC_CONF: expandable_segments:True
  decode_environment:
    PYTORCH_CUDA_ALLOC_CONF: expandable_segments:True
    PYTHONHASHSEED: "42"
  vllm_config:
    prefill:
      served-model-name: Kimi-K3
      tensor-parallel-size: 8
      gpu-memory-utilization: 0.95
    decode:
      served-model-name: Kimi-K3
      tensor-parallel-size: 8
      gpu-memory-utilization: 0.90
benchmark:
  type: sa-bench
"""


def test_each_worker_mode_is_started_as_srt_slurm_starts_it(tmp_path: Path) -> None:
    path = tmp_path / "disagg.yaml"
    path.write_text(DISAGG)
    recipe = load_recipe(path)
    views = recipe.workers()
    assert [v.mode for v in views] == ["prefill", "decode"]
    for view in views:
        argv = commands(view, [])[-1].argv
        # build_worker_command (v1.0.36): `--disaggregation-mode <mode>` after the model name.
        assert argv[7:9] == ("--disaggregation-mode", view.mode)
        gmu = argv[argv.index("--gpu-memory-utilization") + 1]
        assert gmu == {"prefill": "0.95", "decode": "0.9"}[view.mode]
        assert view.own("backend.vllm_config.aggregated.x") == f"backend.vllm_config.{view.mode}.x"
    assert views[0].env() == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert views[1].env()["PYTHONHASHSEED"] == "42"
    # An aggregate recipe is its own one view.
    agg = load_recipe(REPO / "tests/data/recipes/f.yaml")
    assert agg.workers() == (agg,)


def test_a_disaggregated_recipe_is_judged_on_each_modes_own_keys(
    resolved: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = resolved / "disagg.yaml"
    path.write_text(DISAGG)
    code, result = preflight(capsys, "--recipe", str(path))
    assert code == 4
    got = {(f["rule"], f["key"]): f["line"] for f in result["findings"]}
    doc = load_yaml(path)
    gmu = "backend.vllm_config.prefill.gpu-memory-utilization"
    assert got[("K3-GPU-MEM-HEADROOM", gmu)] == doc.line(gmu)
    assert ("K3-PYTHONHASHSEED", "backend.prefill_environment.PYTHONHASHSEED") in got
    assert not [
        k for k in got if "decode" in k[1] and k[0] in ("K3-GPU-MEM-HEADROOM", "K3-PYTHONHASHSEED")
    ]
    assert len(got) == len(result["findings"])  # what both modes share is said once


def test_a_disaggregated_recipe_migrated_to_schema_2_is_judged_alike(
    resolved: Path, srt2: Srt2, capsys: pytest.CaptureFixture[str]
) -> None:
    v1, v2 = resolved / "disagg.yaml", resolved / "disagg2.yaml"
    v1.write_text(DISAGG)
    v2.write_text(srt2.migrated(DISAGG))
    assert srt2.gate(yaml.safe_load(v2.read_text())) is None  # 2.x's own gate loads it
    code1, r1 = preflight(capsys, "--recipe", str(v1))
    pin(SRT2)
    code2, r2 = preflight(capsys, "--recipe", str(v2))
    assert code2 == code1 == 4
    one, two = findings(r1), findings(r2)
    assert [f[:2] for f in two] == [f[:2] for f in one]
    data1, data2 = yaml.safe_load(v1.read_text()), yaml.safe_load(v2.read_text())
    keys2 = {f[2] for f in two}
    assert "roles.prefill.args.gpu-memory-utilization" in keys2
    assert "roles.prefill.env.PYTHONHASHSEED" in keys2
    for (_, _, key1, _, file1), (_, _, key2, line2, _) in zip(one, two, strict=True):
        if file1 != str(v1):
            continue
        assert lookup(data2, key2) == lookup(data1, key1), (key1, key2)
        assert line2 == load_yaml(v2).line(key2)


def test_srt_slurm_2xs_own_disaggregated_example_is_judged(
    resolved: Path, srt2: Srt2, capsys: pytest.CaptureFixture[str]
) -> None:
    example = resolved / "dynamo-disagg.yaml"
    shutil.copy(srt2.root / "examples/vllm/dynamo-disagg.yaml", example)
    pin(SRT2)
    code, result = preflight(capsys, "--recipe", str(example))
    assert code in (0, 4)  # judged, not refused as a recipe k3env cannot read
    keys = [f["key"] for f in result["findings"] if f["file"] == str(example)]
    assert keys and not [k for k in keys if k.startswith(("backend", "resources.prefill"))]
    workers = [n["what"] for n in result["not_checked"] if "dynamo-worker" in n["what"]]
    assert any("--disaggregation-mode prefill" in w for w in workers), workers
    assert any("--disaggregation-mode decode" in w for w in workers), workers


def test_a_direct_vllm_frontend_over_prefill_and_decode_is_refused_in_srt_slurms_words(
    resolved: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    patch = REPO / "patches/srt-slurm/pr278-direct-aggregate-serving.patch"
    assert DIRECT_DISAGG in patch.read_text()  # the pinned loader's own message
    path = resolved / "direct.yaml"
    path.write_text(DISAGG.replace("type: dynamo", "type: vllm"))
    capsys.readouterr()
    assert main(["preflight", "-q", "--recipe", str(path)]) == 2
    err = capsys.readouterr().err
    assert DIRECT_DISAGG in err and f"{path}:14" in err


def test_adopt_refuses_a_disaggregated_recipe_and_writes_nothing(
    resolved: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = resolved / "disagg.yaml"
    path.write_text(DISAGG)
    before = sorted(p for p in resolved.rglob("*") if p.is_file())
    assert main(["adopt", str(path)]) == 2
    assert "disaggregated" in capsys.readouterr().err
    assert sorted(p for p in resolved.rglob("*") if p.is_file()) == before


def test_a_schema_2_role_srt_slurm_does_not_start_is_refused_on_its_line_in_its_words(
    resolved: Path, srt2: Srt2, capsys: pytest.CaptureFixture[str]
) -> None:
    text = srt2.migrated(DISAGG).replace("  prefill:\n", "  prefil:\n", 1)
    with pytest.raises(ValueError) as said:  # 2.x's own expansion refuses it
        srt2.roles.expand_roles(yaml.safe_load(text))
    assert str(said.value) == UNKNOWN_ROLE.format(role="prefil")
    path = resolved / "typo.yaml"
    path.write_text(text)
    pin(SRT2)
    capsys.readouterr()
    assert main(["preflight", "-q", "--recipe", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:{load_yaml(path).line('roles.prefil')}" in err and str(said.value) in err
