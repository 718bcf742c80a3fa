"""A recipe's own numbers, judged with no image: each worker's TP x PP x DP against the GPUs
srt-slurm gives it (``<role>_nodes x gpus_per_node / <role>_workers``, or as written), the
recipe's ``gpu_type`` / ``gpus_per_node`` / nodes against the cluster profile, TP within the
NVLink domain the job's nodes give it, and an ``nnodes`` flag against a worker's nodes. Each
mutation of the bring-up's final recipe F exits 4 with its finding on its own key and line;
the runs that served (D and F as they were) get no new finding."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from k3env.config.srtrecipe import job_shape
from k3env.config.yamlread import load_yaml

from .test_recipes_in import RECIPES, line_of, preflight

F = RECIPES / "f.yaml"


def findings(out: dict[str, Any], rule: str) -> list[dict[str, Any]]:
    (result,) = out["recipes"]
    return [f for f in result["findings"] if f["rule"] == rule]


@dataclass(frozen=True)
class Judge:
    """``preflight --recipe`` in the resolved repository: of a recipe as written, or of a copy
    of one (F unless told) with ``old`` replaced by ``new``."""

    root: Path
    capsys: pytest.CaptureFixture[str]

    def __call__(self, path: Path) -> tuple[int, dict[str, Any]]:
        return preflight(self.capsys, "--recipe", str(path))

    def mutated(
        self, name: str, old: str, new: str, source: Path = F
    ) -> tuple[Path, int, dict[str, Any]]:
        text = source.read_text()
        assert old in text, old
        path = self.root / name
        path.write_text(text.replace(old, new, 1))
        return (path, *self(path))


@pytest.fixture
def judge(resolved: Path, capsys: pytest.CaptureFixture[str]) -> Judge:
    return Judge(resolved, capsys)


@pytest.mark.parametrize("name", ["d.yaml", "f.yaml"])
def test_the_runs_that_served_get_no_finding_on_their_numbers(judge: Judge, name: str) -> None:
    code, out = judge(RECIPES / name)
    assert code == 0
    for rule in ("K3-JOB-RANKS", "K3-JOB-CLUSTER", "K3-TP-NVLINK", "K3-TOPOLOGY"):
        assert findings(out, rule) == []


def test_sixteen_ranks_on_one_node_of_eight_gpus(judge: Judge) -> None:
    path, code, out = judge.mutated("agg-nodes-1.yaml", "agg_nodes: 2", "agg_nodes: 1")
    assert code == 4
    (f,) = findings(out, "K3-JOB-RANKS")
    assert (f["severity"], f["key"], f["line"]) == ("error", "resources.agg_nodes",
                                                    line_of(path, "agg_nodes:"))  # fmt: skip
    assert f["message"] == (
        "TP 8 x PP 2 x DP 1 = 16 ranks in each agg worker, but srt-slurm gives it 8 GPUs "
        "(1 node(s) x 8 GPUs / 1 worker(s)): vLLM cannot place 16 ranks on 8 GPUs, the worker "
        "never starts"
    )
    assert "resources.agg_nodes: 2 with gpus_per_node: 8" in f["fix"]


def test_four_gpus_a_node_on_a_cluster_of_eight(judge: Judge) -> None:
    path, code, out = judge.mutated("gpn-4.yaml", "gpus_per_node: 8", "gpus_per_node: 4")
    assert code == 4
    line = line_of(path, "gpus_per_node:")
    (cluster,) = findings(out, "K3-JOB-CLUSTER")
    assert (cluster["severity"], cluster["key"], cluster["line"]) == (
        "error", "resources.gpus_per_node", line)  # fmt: skip
    assert "gpus_per_node 4, but a b200-dgxc node has 8 B200 GPUs" in cluster["message"]
    (ranks,) = findings(out, "K3-JOB-RANKS")
    assert (ranks["key"], ranks["line"]) == ("resources.gpus_per_node", line)
    assert (
        "16 ranks in each agg worker, but srt-slurm gives it 8 GPUs (2 node(s) x 4 GPUs"
        in (ranks["message"])
    )
    # TP 8 on nodes of 4: the TP group leaves the node (a warning, as K3-TP-NVLINK is).
    (tp,) = findings(out, "K3-TP-NVLINK")
    assert tp["key"] == "backend.vllm_config.aggregated.tensor-parallel-size"
    assert "one node's 4 GPUs (gpus_per_node 4)" in tp["message"]


def test_a_recipe_for_another_gpu_is_named(judge: Judge) -> None:
    path, code, out = judge.mutated("gb200.yaml", "gpu_type: b200", "gpu_type: gb200")
    assert code == 4
    (f,) = findings(out, "K3-JOB-CLUSTER")
    assert (f["key"], f["line"]) == ("resources.gpu_type", line_of(path, "gpu_type:"))
    assert f["message"].startswith("gpu_type gb200, but the cluster profile b200-dgxc has B200")


def test_more_nodes_than_the_cluster_and_more_workers_than_gpus(judge: Judge) -> None:
    _, code, out = judge.mutated("nodes-3.yaml", "agg_nodes: 2", "agg_nodes: 3")
    assert code == 4
    messages = {f["message"] for f in findings(out, "K3-JOB-CLUSTER")}
    assert "the recipe asks for 3 nodes, but b200-dgxc has 2" in messages
    (ranks,) = findings(out, "K3-JOB-RANKS")  # 24 GPUs for 16 ranks: 8 idle, a warning
    assert ranks["severity"] == "warning" and "8 of them sit idle" in ranks["message"]

    _, code, out = judge.mutated(
        "gpus-per-agg.yaml", "agg_workers: 1", "agg_workers: 2\n  gpus_per_agg: 16"
    )
    assert code == 4
    (fits,) = findings(out, "K3-JOB-RANKS")
    assert fits["key"] == "resources.agg_workers"
    assert fits["message"] == (
        "2 agg x 16 GPUs = 32 GPUs, but resources.agg_nodes 2 x gpus_per_node 8 = 16: "
        "srt-slurm cannot place the workers"
    )


def test_no_agg_workers_starts_no_worker(judge: Judge) -> None:
    _, code, out = judge.mutated("no-workers.yaml", "  agg_workers: 1\n", "")
    assert code == 4
    (f,) = findings(out, "K3-JOB-RANKS")
    assert f["key"] == "resources.agg_workers"
    assert "starts no agg worker: resources.agg_workers is not written" in f["message"]


def test_an_nnodes_flag_against_a_workers_nodes(judge: Judge) -> None:
    # The direct vLLM frontend: srt-slurm sets --nnodes itself and drops the recipe's.
    path, _, out = judge.mutated(
        "nnodes.yaml",
        "      tensor-parallel-size: 8\n",
        "      tensor-parallel-size: 8\n      nnodes: 2\n",
    )
    (f,) = findings(out, "K3-JOB-RANKS")
    assert (f["severity"], f["key"]) == ("warning", "backend.vllm_config.aggregated.nnodes")
    assert "srt-slurm sets --nnodes itself (2, the nodes of one agg worker)" in f["message"]
    # The Dynamo worker: the recipe's --nnodes follows srt-slurm's, and argparse keeps it.
    path, _, out = judge.mutated(
        "nnodes-dynamo.yaml",
        "      tensor-parallel-size: 8\n",
        "      tensor-parallel-size: 8\n      nnodes: 3\n",
        RECIPES / "c.yaml",
    )
    (f,) = findings(out, "K3-JOB-RANKS")
    assert (f["severity"], f["key"]) == ("error", "backend.vllm_config.aggregated.nnodes")
    assert f["message"].startswith("--nnodes 3, but each agg worker spans 2 node(s)")
    assert f["line"] == line_of(path, "nnodes: 3")


def test_a_parallel_size_that_is_not_a_number_is_said(judge: Judge) -> None:
    _, _, out = judge.mutated(
        "tp-word.yaml", "tensor-parallel-size: 8", "tensor-parallel-size: eight"
    )
    (f,) = findings(out, "K3-JOB-RANKS")
    assert f["key"] == "backend.vllm_config.aggregated.tensor-parallel-size"
    assert "is not a whole number" in f["message"]


# --- both schemas: what the job asks, read as srt-slurm reads it --------------------------------
def shape(tmp_path: Path, text: str) -> Any:
    path = tmp_path / "r.yaml"
    path.write_text(text)
    return job_shape(load_yaml(path))


def test_schema_2_roles_are_read_as_srt_slurm_expands_them(tmp_path: Path) -> None:
    job = shape(tmp_path, """schema: 2
resources: {gpu_type: b200, gpus_per_node: 8}
roles:
  prefill: {nodes: 1, workers: 2, gpus: 4, args: {tensor-parallel-size: 4}}
  decode: {nodes: colocate, workers: 1, gpus: 2, args: {tensor_parallel_size: 2}}
""")  # fmt: skip
    prefill, decode = job.roles
    assert (job.schema, job.gpus_per_node, job.gpu_type) == (2, 8, "b200")
    assert (prefill.nodes, prefill.workers, prefill.gpus, prefill.ranks) == (1, 2, 4, 4)
    assert (decode.nodes, decode.gpus, decode.ranks) == (None, 2, 2)  # on the prefill's nodes
    assert decode.parallel_keys["tensor"] == "roles.decode.args.tensor_parallel_size"
    assert prefill.key("nodes") == "roles.prefill.nodes"


def test_schema_1_derives_gpus_per_worker_as_srt_slurm_does(tmp_path: Path) -> None:
    job = shape(tmp_path, """name: x
resources: {gpu_type: h100, prefill_nodes: 2, prefill_workers: 4, decode_nodes: 0,
            decode_workers: 2}
backend: {type: vllm, vllm_config: {prefill: {tensor-parallel-size: 4},
                                    decode: {tensor-parallel-size: 4}}}
""")  # fmt: skip
    prefill, decode = job.roles
    # gpus_per_node not written: srt-slurm's default 4.
    assert (job.gpus_per_node, job.gpus_per_node_written) == (4, False)
    assert (prefill.gpus, prefill.gpus_said) == (2, "2 node(s) x 4 GPUs / 4 worker(s)")
    assert (decode.nodes, decode.gpus) == (None, 2)  # decode_nodes 0: the prefill's nodes
    assert prefill.key("gpus") == "resources.gpus_per_prefill"


def test_colocated_decode_shares_the_prefill_nodes_gpus(tmp_path: Path) -> None:
    from dataclasses import replace

    from k3env.checks.jobrules import job_ranks

    from .rules_context import context

    job = shape(tmp_path, """schema: 2
resources: {gpu_type: b200, gpus_per_node: 8}
roles:
  prefill: {nodes: 1, workers: 2, gpus: 4, args: {tensor-parallel-size: 4}}
  decode: {nodes: colocate, workers: 1, gpus: 4, args: {tensor-parallel-size: 4}}
""")  # fmt: skip
    ctx = replace(context(), job=job)
    (hit,) = job_ranks(ctx)
    assert hit.key == "roles.decode.workers"
    assert hit.message == (
        "2 prefill x 4 + 1 decode x 4 GPUs = 12 GPUs, but roles.prefill.nodes 1 x "
        "gpus_per_node 8 = 8: srt-slurm cannot place the workers"
    )
    ok = shape(tmp_path, """schema: 2
resources: {gpu_type: b200, gpus_per_node: 8}
roles:
  prefill: {nodes: 1, workers: 1, gpus: 4, args: {tensor-parallel-size: 4}}
  decode: {nodes: colocate, workers: 1, gpus: 4, args: {tensor-parallel-size: 4}}
""")  # fmt: skip
    assert list(job_ranks(replace(context(), job=ok))) == []
