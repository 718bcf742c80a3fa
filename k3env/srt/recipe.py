"""srt-slurm recipes from an image spec's serve profile and the lock. Pure rendering.

The recipe names the derived image by registry digest (or its enroot .sqsh), carries the
engine flags and the environment, picks the frontend type from the profile's commands, asks
for no Dynamo install when Dynamo is baked into the image and for no ``setup_script`` (the
container patches are baked in).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from k3env.checks.argv import parse_options
from k3env.checks.known import MODELS
from k3env.config.cluster import Cluster
from k3env.config.pins import SrtSlurmPin
from k3env.config.spec import ImageSpec, ServeProfile
from k3env.config.srtrecipe2 import as_schema2
from k3env.errors import SpecError
from k3env.quoting import one_line, yaml_scalar, yaml_string
from k3env.srt.gate import loads_schema

# Launcher-owned topology flags: srt-slurm sets them per node (its vllm frontend strips them).
TOPOLOGY_FLAGS = {"nnodes", "node-rank", "master-addr", "master-port", "headless", "host", "port"}


def engine_flags(argv: tuple[str, ...]) -> dict[str, Any]:
    """``--flag value`` -> ``{"flag": value}`` in srt-slurm's ``vllm_config`` form."""
    out: dict[str, Any] = {}
    for flag, value in parse_options(argv).items():
        key = flag.removeprefix("--")
        if key in TOPOLOGY_FLAGS or key == "model":
            continue
        out[key] = _scalar(value)
    return out


def _scalar(value: str | bool) -> Any:
    if isinstance(value, bool):
        return value
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            continue
    return value


def precision_of(model_type: str | None) -> str:
    """The recipe's precision for a model type: ``fp4`` for a model whose experts the rules'
    model facts say are MXFP4 (Kimi-K3), else ``bf16``."""
    return "fp4" if MODELS.get(model_type or "", {}).get("moe_quant") == "mxfp4" else "bf16"


def recipe(
    spec: ImageSpec,
    profile: ServeProfile,
    cluster: Cluster,
    env: Mapping[str, str],
    *,
    container: str,
    model_path: str,
    precision: str,
    dynamo_baked: bool,
    dynamo_commit: str | None,
    aiperf_version: str | None = None,
) -> dict[str, Any]:
    roles = {c.role for c in profile.commands}
    engine = next((c for c in profile.commands if c.role in ("vllm-serve", "dynamo-worker")), None)
    if engine is None:
        raise SpecError(
            f"profile {profile.name} has no engine command (vllm-serve or dynamo-worker)",
            where=f"{spec.path}: profiles.{profile.name}",
            fix="add the engine's command line",
        )
    frontend = "vllm" if "vllm-serve" in roles else "dynamo"
    out: dict[str, Any] = {
        "name": f"{spec.name}-{profile.name}",
        "model": {"path": model_path, "container": container, "precision": precision},
        "resources": {
            "gpu_type": cluster.gpu.lower(),
            "gpus_per_node": cluster.gpus_per_node,
            "agg_nodes": cluster.nodes,
            "agg_workers": 1,
        },
        "frontend": {"type": frontend, "enable_multiple_frontends": False},
        "backend": {
            "type": "vllm",
            "aggregated_environment": dict(sorted(env.items())),
            "vllm_config": {"aggregated": engine_flags(engine.argv)},
        },
    }
    if frontend == "dynamo":
        out["dynamo"] = _dynamo_install(spec, dynamo_baked, dynamo_commit)
        # Left out, srt-slurm gives the aggregate Dynamo worker `--kv-transfer-config` for its
        # default connector (nixl: NixlConnector); the profile's own flags carry any it uses.
        out["backend"]["connector"] = None
    if profile.benchmark:
        out["benchmark"] = _benchmark(spec, profile, aiperf_version)
    out.update(profile.job)  # keys k3env writes are refused in [job] when the spec loads
    return out


def as_pinned(data: Mapping[str, Any], srt: SrtSlurmPin | None) -> dict[str, Any]:
    """A rendered recipe as the pinned srt-slurm loads it: ``schema: 2`` for srt-slurm 2.x
    (what its ``srtctl migrate`` makes of the schema-1 form), else schema 1 as rendered."""
    if srt is not None and loads_schema(srt) == 2:
        return as_schema2(data)
    return dict(data)


def _benchmark(spec: ImageSpec, profile: ServeProfile, aiperf: str | None) -> dict[str, Any]:
    """The profile's benchmark with its client: the lock's aiperf, baked in the image (srt-
    slurm's AIPerf runners install ``aiperf_package``, which is then already there). A
    benchmark whose image has no aiperf would install one at every job start, by version
    only: an error, unless the profile names its own ``aiperf_package``."""
    bench = dict(profile.benchmark)
    if "aiperf_package" in bench:
        return bench
    if "aiperf" not in spec.components or aiperf is None:
        raise SpecError(
            f"{spec.name} profile {profile.name} runs a benchmark, but its image carries no "
            "aiperf: srt-slurm would install one at every job start",
            where=f"{spec.path}: components",
            fix='bake the lock\'s aiperf (components = ["aiperf"]), or set '
            "benchmark.aiperf_package in the profile",
        )
    bench["aiperf_package"] = f"aiperf=={aiperf}"
    return bench


def _dynamo_install(spec: ImageSpec, baked: bool, commit: str | None) -> dict[str, Any]:
    """srt-slurm's ``dynamo:`` section: no install when Dynamo is baked; a build of the lock's
    commit at job start only when the spec asks for it (``dynamo_install = "from-commit"``)."""
    if spec.dynamo_install == "from-commit":
        if commit is None:
            raise SpecError(
                f"{spec.name} asks for Dynamo built from the lock's commit at job start, but "
                "the lock's Dynamo commit is unresolved",
                where=f"{spec.path}: dynamo_install",
                fix="resolve it (`k3env bump dynamo TAG`), or bake Dynamo "
                '(components = ["dynamo"], dynamo_install = "baked")',
            )
        return {"hash": commit}
    if not baked:
        raise SpecError(
            f"{spec.name} runs the Dynamo frontend but verify found no Dynamo in its image; "
            "srt-slurm would install one at every job start, which happens only when the spec "
            'asks for it (dynamo_install = "from-commit")',
            where=f"{spec.path}: components",
            fix='bake it (components = ["dynamo"], then `k3env verify` the image), or set '
            'dynamo_install = "from-commit"',
        )
    return {"install": False}


def to_yaml(data: Mapping[str, Any], indent: int = 0) -> str:
    """Block-style YAML, every key and value serialized (``k3env.quoting``): a key from a
    profile or an env name can add no line or key of its own."""
    lines = []
    pad = "  " * indent
    for key, value in data.items():
        name = yaml_string(str(key))
        if isinstance(value, Mapping):
            if value:
                lines.append(f"{pad}{name}:")
                lines.append(to_yaml(value, indent + 1).rstrip("\n"))
            else:
                lines.append(f"{pad}{name}: {{}}")
        else:  # a scalar or a list, in flow style
            lines.append(f"{pad}{name}: {yaml_scalar(value)}")
    return "\n".join(lines) + "\n"


def header(
    image: str, spec_path: Path, lock_path: Path, cluster: Cluster, *, by_platform: bool
) -> str:
    """The recipe's comment lines: where it came from and for which nodes, each name on its
    comment's line (a newline in a file name would otherwise start a key of the recipe)."""
    return (
        f"# Generated by `k3env srt recipe {one_line(image)}` from {one_line(str(spec_path))} "
        f"and {one_line(str(lock_path))}:\n"
        "# edit those and regenerate. Container patches and env are baked into the image.\n"
        f"# For {one_line(cluster.name)}: {one_line(cluster.platform)} nodes "
        f"({one_line(cluster.machine)})"
        + ("; the container is that platform's image" if by_platform else "")
        + ".\n"
    )
