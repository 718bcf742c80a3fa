"""Cluster profiles (``clusters/*.toml``): the machines a serve profile will run on."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from k3env.config.reader import COMMIT_RE, MAX_COUNT, Table, load_toml
from k3env.config.shapes import DEFAULT_PLATFORM, MACHINES, PLATFORM_FIX
from k3env.errors import ConfigError

# The platforms k3env builds for, as an image index names them (no variant: one per machine).
CLUSTER_PLATFORM_RE = re.compile("^(" + "|".join(map(re.escape, MACHINES)) + ")$")

DEFAULT_CLUSTER = Path("clusters/b200-dgxc.toml")
# Memory in GiB or GB per GPU or node: finite, positive, and below a petabyte.
MAX_GIB = 1e6


@dataclass(frozen=True, kw_only=True)
class RuntimePin:
    """One part of the nodes' container runtime, by release and source commit."""

    name: str
    version: str
    commit: str | None = None


RUNTIME_PARTS = ("enroot", "pyxis")


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
    # The container runtime the nodes run (``[runtime.enroot]``, ``[runtime.pyxis]``): its
    # release and source commit. Rules read the versions (enroot 3.5 refuses an image named by
    # digest); None: the profile does not say.
    runtime: Mapping[str, RuntimePin] = field(default_factory=dict)

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
    if t.has("runtime"):
        cluster = replace(cluster, runtime=_runtime(t.table("runtime")))
    t.done()
    for key in ("gpus_per_node", "nodes", "nvlink_domain_gpus"):
        if getattr(cluster, key) <= 0:
            raise t.fail(key, f"{key} must be greater than 0", "write the machine's real figure")
    return cluster


def _runtime(t: Table) -> dict[str, RuntimePin]:
    """``[runtime.enroot]`` / ``[runtime.pyxis]``: ``version`` (PEP 440) and ``commit``."""
    from k3env.versions import InvalidVersion, Version

    out = {}
    for name in t.keys():
        if name not in RUNTIME_PARTS:
            raise t.fail(name, f"{name!r} is not a runtime part k3env knows",
                         f"use one of {list(RUNTIME_PARTS)}")  # fmt: skip
        part = t.table(name)
        version = part.string("version")
        try:
            Version(version)
        except InvalidVersion as e:
            raise part.fail("version", f"{version!r} is not a version", "e.g. 4.1.2") from e
        commit = part.matching("commit", COMMIT_RE, "40 hex digits", required=False)
        part.done()
        out[name] = RuntimePin(name=name, version=version, commit=commit)
    t.done()
    return out
