"""Cluster profiles (``clusters/*.toml``): the machines a serve profile will run on."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from k3env.config.reader import MAX_COUNT, Table, load_toml
from k3env.config.shapes import DEFAULT_PLATFORM, MACHINES, PLATFORM_FIX
from k3env.errors import ConfigError

# The platforms k3env builds for, as an image index names them (no variant: one per machine).
CLUSTER_PLATFORM_RE = re.compile("^(" + "|".join(map(re.escape, MACHINES)) + ")$")

DEFAULT_CLUSTER = Path("clusters/b200-dgxc.toml")
# Memory in GiB or GB per GPU or node: finite, positive, and below a petabyte.
MAX_GIB = 1e6


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
    # The nodes' platform: which of an image index's manifests their enroot imports.
    platform: str = DEFAULT_PLATFORM
    cpu: str = ""
    # GPUs that share one NVLink domain (8 in a DGX B200; 72 in a GB200/GB300 NVL72 rack):
    # a tensor-parallel group larger than this all-reduces over the network.
    nvlink_domain_gpus: int = 0

    @property
    def machine(self) -> str:
        """``uname -m`` on the nodes."""
        return MACHINES[self.platform]


def load_cluster(path: Path) -> Cluster:
    t = Table(load_toml(path), file=path, path="", error=ConfigError)
    # Not written: the node's own GPUs (NVLink inside one box).
    domain = t.integer("nvlink_domain_gpus", required=False, maximum=MAX_COUNT)
    cluster = Cluster(
        name=path.stem,
        path=path,
        description=t.string("description", required=False, default=""),
        gpu=t.string("gpu"),
        gpu_memory_gib=t.number("gpu_memory_gib", maximum=MAX_GIB),
        gpus_per_node=t.integer("gpus_per_node", maximum=MAX_COUNT),
        dram_per_node_gb=t.number("dram_per_node_gb", maximum=MAX_GIB),
        nodes=t.integer("nodes", maximum=MAX_COUNT),
        outside_pool_overhead_gib=t.number(
            "outside_pool_overhead_gib", required=False, default=0.0, zero=True, maximum=MAX_GIB
        ),
        model_path=t.string("model_path", required=False),
        platform=t.matching("platform", CLUSTER_PLATFORM_RE, PLATFORM_FIX, required=False)
        or DEFAULT_PLATFORM,
        cpu=t.string("cpu", required=False, default=""),
        nvlink_domain_gpus=t.integer("gpus_per_node", maximum=MAX_COUNT)
        if domain is None
        else domain,
    )
    t.done()
    for key in ("gpus_per_node", "nodes", "nvlink_domain_gpus"):
        if getattr(cluster, key) <= 0:
            raise t.fail(key, f"{key} must be greater than 0", "write the machine's real figure")
    return cluster
