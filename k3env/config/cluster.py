"""Cluster profiles (``clusters/*.toml``): the machines a serve profile will run on."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from k3env.config.reader import Table, load_toml
from k3env.errors import ConfigError

DEFAULT_CLUSTER = Path("clusters/b200-dgxc.toml")


@dataclass(frozen=True, kw_only=True)
class Cluster:
    name: str
    path: Path
    description: str
    gpu: str
    gpu_memory_gib: float
    gpus_per_node: int
    dram_per_node_gb: float
    nodes: int
    outside_pool_overhead_gib: float
    model_path: str | None = None


def load_cluster(path: Path) -> Cluster:
    t = Table(load_toml(path), file=path, path="", error=ConfigError)

    cluster = Cluster(
        name=path.stem,
        path=path,
        description=t.string("description", required=False, default=""),
        gpu=t.string("gpu"),
        gpu_memory_gib=t.number("gpu_memory_gib"),
        gpus_per_node=t.integer("gpus_per_node"),
        dram_per_node_gb=t.number("dram_per_node_gb"),
        nodes=t.integer("nodes"),
        outside_pool_overhead_gib=t.number(
            "outside_pool_overhead_gib", required=False, default=0.0
        ),
        model_path=t.string("model_path", required=False),
    )
    t.done()
    for key in ("gpu_memory_gib", "gpus_per_node", "dram_per_node_gb", "nodes"):
        if getattr(cluster, key) <= 0:
            raise t.fail(key, f"{key} must be greater than 0", "write the machine's real figure")
    return cluster
