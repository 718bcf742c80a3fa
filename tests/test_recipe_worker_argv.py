"""The worker command line k3env maps a recipe to (``checks.recipe_map.commands``) against the
one srt-slurm builds itself: its own ``build_worker_command`` at the pinned tag (the lock's
commit, cloned from ../shared/upstream/srt-slurm.bundle, the lock's patches applied), run in a
subprocess (tests/srt_v1_worker.py) for the leader of each mode's first worker. Nothing of
srt-slurm is committed here: every flag compared is what its code returns when it runs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

from k3env.checks.preflight import Finding
from k3env.checks.recipe_map import LEADER, Mapped, commands, recipe_key
from k3env.config.lock import load_lock
from k3env.config.srtrecipe import load_recipe
from k3env.hashing import file_sha256

from .conftest import REPO, upstream_dir

BUNDLE = "srt-slurm.bundle"
# ../shared/upstream/README.md records it by this sha256.
BUNDLE_SHA256 = "ea462bf504bb12f31467c8b411444337c00dedf49e146740911a945ffb150ba9"
HELPER = Path(__file__).with_name("srt_v1_worker.py")
HISTORY = REPO / "tests/data/recipes"
ENGINE = "backend.vllm_config.aggregated"
LOG_DIR = "/outputs/JOB_ID/logs"  # srt-slurm's log dir exists on the cluster only: a stand-in


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], check=True, capture_output=True, text=True)
    return done.stdout.strip()


@pytest.fixture(scope="module")
def srt_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """srt-slurm's ``src/`` at the lock's tag and commit, with the lock's patches applied."""
    where = upstream_dir(BUNDLE)
    if where is None:
        pytest.skip(f"../shared/upstream/{BUNDLE} (srt-slurm's real code)")
    assert file_sha256(where / BUNDLE) == BUNDLE_SHA256, f"{where / BUNDLE} is not the recorded one"
    pin = load_lock(REPO / "pins/k3.lock.toml").srt_slurm
    assert pin is not None
    dest = tmp_path_factory.mktemp("srt-v1") / "srt-slurm"
    _git("clone", "-q", "--branch", pin.version, str(where / BUNDLE), str(dest))
    assert _git("-C", str(dest), "rev-parse", "HEAD") == pin.commit
    _git("-C", str(dest), "apply", *(str(REPO / p.file) for p in pin.patches))
    return dest / "src"


def srt_argv(
    src: Path, recipe: dict[str, Any], mode: str, workers: dict[str, list[int]]
) -> list[str]:
    """srt-slurm's leader argv for ``mode`` (``workers``: mode -> [workers, GPUs each], as its
    ResourceConfig derives them, schema.py:556-599 at v1.0.36). A node's name stands in for its
    IP: every node is said as k3env's stand-in, and the kv-events port as the first one's."""
    backend = recipe["backend"]
    case = {
        "mode": mode, "backend": backend, "workers": workers, "log_dir": LOG_DIR,
        "gpus_per_node": recipe["resources"].get("gpus_per_node", 4),
        "model": recipe["model"]["path"],
        "request_plane": (recipe.get("dynamo") or {}).get("request_plane"),
        "frontend": (recipe.get("frontend") or {}).get("type", "dynamo"),
    }  # fmt: skip
    done = subprocess.run([sys.executable, str(HELPER), str(src)], input=json.dumps([case]),
                          check=True, capture_output=True, text=True)  # fmt: skip
    (argv,) = json.loads(done.stdout)
    return [re.sub(r"tcp://\*:\d+", "tcp://*:5200", re.sub(r"node-\d+", LEADER, a)) for a in argv]


def k3env_argv(path: Path, mode: str) -> list[str]:
    view = next(v for v in load_recipe(path).workers() if v.mode == mode)
    (engine,) = [c for c in commands(view, []) if c.role in ("dynamo-worker", "vllm-serve")]
    return list(engine.argv)


def write(tmp_path: Path, text: str) -> tuple[Path, dict[str, Any]]:
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return path, yaml.safe_load(text)


HEAD = "name: r\nmodel: {path: /models/Kimi-K3, container: vllm/vllm-openai:kimi-k3}\n"
AGG = (
    HEAD
    + """\
resources: {gpus_per_node: 4, agg_nodes: 1, agg_workers: 1}
dynamo: {version: 1.4.2, request_plane: nats}
backend:
  type: vllm
  kv_events_config: {aggregated: {topic: agg-events}}
  vllm_config: {aggregated: {tensor-parallel-size: 4}}
"""
)
PD = (
    HEAD
    + """\
resources: {gpus_per_node: 4, prefill_nodes: 1, decode_nodes: 2, prefill_workers: 1,
            decode_workers: 1}
backend:
  type: vllm
  kv_events_config: true
  dp_launch_mode: per_node
  vllm_config:
    prefill: {tensor-parallel-size: 4}
    decode: {data-parallel-size: 8, enable-expert-parallel: true, data_parallel_hybrid_lb: true,
             data-parallel-rpc-port: 9999}
"""
)
DP_PER_GPU = (
    HEAD
    + """\
resources: {gpus_per_node: 4, agg_nodes: 1, agg_workers: 1}
backend:
  type: vllm
  connector: lmcache
  set_cuda_visible_devices: true
  vllm_config: {aggregated: {data-parallel-size: 4, data_parallel_rpc_port: 9000}}
"""
)
CASES = {
    "aggregate": (AGG, {"aggregated": {"agg": [1, 4]}}),
    "prefill/decode, DP per node": (PD, {"prefill": {"prefill": [1, 4], "decode": [1, 8]},
                                         "decode": {"prefill": [1, 4], "decode": [1, 8]}}),
    "DP per GPU, CUDA_VISIBLE_DEVICES": (DP_PER_GPU, {"aggregated": {"agg": [1, 4]}}),
}  # fmt: skip
SRT_MODE = {"aggregated": "agg", "prefill": "prefill", "decode": "decode"}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_worker_argv_is_the_one_srt_slurm_builds(
    srt_src: Path, tmp_path: Path, case: str
) -> None:
    text, modes = CASES[case]
    path, recipe = write(tmp_path, text)
    for mode, workers in modes.items():
        theirs = srt_argv(srt_src, recipe, SRT_MODE[mode], workers)
        assert k3env_argv(path, mode) == theirs, mode


@pytest.mark.parametrize(
    ("name", "workers"),
    [
        ("c.yaml", {"agg": [1, 16]}),
        ("a4-mamba.yaml", {"agg": [1, 16]}),
        ("f.yaml", {"agg": [1, 16]}),
    ],
)
def test_the_bring_ups_multi_node_recipes_map_as_srt_slurm_starts_them(
    srt_src: Path, name: str, workers: dict[str, list[int]]
) -> None:
    recipe = yaml.safe_load((HISTORY / name).read_text())
    theirs = srt_argv(srt_src, recipe, "agg", workers)
    assert k3env_argv(HISTORY / name, "aggregated") == theirs
    if recipe["frontend"]["type"] == "dynamo":  # what an older Dynamo worker would refuse
        said = {"--request-plane", "--dump-config-to", "--device-ids", "--master-addr"}
        assert said <= set(theirs)


def test_a_finding_on_a_flag_srt_slurm_derives_names_the_key_that_decides_it(
    tmp_path: Path,
) -> None:
    mapped: Any = Mapped(context=None, env=(), notes=(), model_type_key="model.path")  # type: ignore[arg-type]

    def key(text: str, message: str) -> str:
        path, _ = write(tmp_path, text)
        finding = Finding(rule="R", severity="error", image="", profile="", file=str(path),
                          key=ENGINE, message=message, fix="")  # fmt: skip
        return recipe_key(load_recipe(path), mapped, finding)

    refused = "unrecognized arguments: --request-plane nats"
    assert key(AGG, refused) == "dynamo.request_plane"
    assert key(AGG.replace(", request_plane: nats", ""), refused) == ENGINE  # srt-slurm's default
    assert key(AGG, "unrecognized arguments: --device-ids 0") == "backend.set_cuda_visible_devices"
