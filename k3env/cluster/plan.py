"""What a smoke job on the cluster starts and sends, from a serve profile (pure: no files).

The GPU engine runs as a full attempt would start it: the image, the profile's env and every
flag, except the checkpoint: ``--load-format dummy`` gives random weights, so init, KV-cache
sizing, CUDA-graph capture and the first decode run at the same size, layout and memory use
without reading a byte of weights (sgl-project/sglang#20512 runs its CI that way).

With ``--layers N`` the model is cut to N layers (``--hf-overrides '{"num_hidden_layers":
N}'``) and sized to fit: the tensor-parallel group stays as it is (each layer's shards, its
all-reduce group and its kernels are the per-GPU work of the full run) and the pipeline
collapses to one stage, so the job takes TP GPUs, ``ceil(TP / gpus_per_node)`` nodes. What
depends on the pipeline (PP ranks, layers per stage) is then not exercised, and is said.

The battery is the CPU smoke's driver (``k3env/probes/smoke_driver.py``) with no processes of
its own: the job starts the servers, the driver waits for the served model and sends the
requests the CPU smoke sends. Random weights over the real tokenizer cannot be steered into a
tool call (k3env does not know that tokenizer's marker ids), so the tool-call gate stays with
the CPU smoke, which is said.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from k3env import jsontext
from k3env.checks.argv import parse_options
from k3env.config.cluster import Cluster
from k3env.config.spec import ImageSpec, ServeProfile
from k3env.errors import SpecError
from k3env.smoke.plan import takes_value

# Set per node by the launcher (srt-slurm, or the sbatch script): never taken from the profile.
LAUNCHER_FLAGS = ("--nnodes", "--node-rank", "--master-addr", "--master-port", "--headless")
SWITCHES = ("--headless",)
TP_FLAGS = ("--tensor-parallel-size", "-tp")
PP_FLAGS = ("--pipeline-parallel-size", "-pp")
# Where the driver keeps its files: moved to the job's own directory when it starts
# (K3ENV_SMOKE_OUT), the battery's ``out`` in the plan.
OUT = "/k3env-smoke/out"
BIN = "/k3env-smoke/bin"
DRIVER = f"{BIN}/driver.py"
PLAN = f"{BIN}/plan.json"
BENCH_REQUESTS = 5
# The first request on a fresh GPU engine can wait on compilation: bounds for the cluster.
READY_TIMEOUT = 1200.0
TIMEOUTS = {"request": 300.0, "bench": 600.0, "stop": 60.0}

NOT_CHECKED = (
    "tool-calls: random weights over the real tokenizer cannot be steered into a tool call "
    "(its marker ids are unknown to k3env); the CPU smoke checks the parser",
    "the checkpoint itself: weights are random (--load-format dummy), none is read",
    "the profile's own benchmark workload (the battery's 5 requests run instead)",
)


@dataclass(frozen=True, kw_only=True)
class Topology:
    tp: int
    pp: int
    nodes: int
    gpus_per_node: int

    @property
    def gpus(self) -> int:
        return self.tp * self.pp

    def said(self) -> str:
        return f"TP{self.tp} x PP{self.pp} on {self.nodes} node(s) of {self.gpus_per_node} GPUs"

    def as_json(self) -> dict[str, int]:
        return {**self.__dict__, "gpus": self.gpus}


@dataclass(frozen=True, kw_only=True)
class ClusterSmoke:
    image: str
    profile: str
    cluster: str
    layers: int | None
    role: str  # the engine's role: vllm-serve
    argv: tuple[str, ...]  # the engine's command line, without the launcher's flags
    full: Topology  # the profile's
    topology: Topology  # the smoke job's
    model_dir: str  # the model path the command line names (the cluster's model_path there)
    port: int
    served: str
    env: Mapping[str, str]
    battery: Mapping[str, Any]  # the driver's plan
    changes: tuple[str, ...]  # what differs from a full attempt
    not_checked: tuple[str, ...]

    def as_json(self) -> dict[str, Any]:
        return jsontext.plain(self, leave=("role", "model_dir", "env", "battery"))


def _int(options: Mapping[str, str | bool], flags: Sequence[str], default: int) -> int:
    for flag in flags:
        value = options.get(flag)
        if isinstance(value, str) and value.isdigit() and int(value) > 0:
            return int(value)
    return default


def full_topology(argv: Sequence[str], cluster: Cluster) -> Topology:
    """The profile's own layout: TP x PP, on ``--nnodes`` nodes (or as many as it needs)."""
    options = parse_options(argv)
    for flag in ("-tp", "-pp"):  # parse_options reads long flags only
        if flag in argv and argv.index(flag) + 1 < len(argv):
            options[flag] = argv[argv.index(flag) + 1]
    tp, pp = _int(options, TP_FLAGS, 1), _int(options, PP_FLAGS, 1)
    need = math.ceil(tp * pp / cluster.gpus_per_node)
    return Topology(
        tp=tp, pp=pp, nodes=_int(options, ("--nnodes",), need), gpus_per_node=cluster.gpus_per_node
    )


def sized(full: Topology, layers: int | None) -> Topology:
    """The smoke job's layout: the profile's, or with ``layers`` its TP group on one stage."""
    if layers is None:
        return full
    return Topology(
        tp=full.tp,
        pp=1,
        nodes=math.ceil(full.tp / full.gpus_per_node),
        gpus_per_node=full.gpus_per_node,
    )


def smoke_argv(
    argv: Sequence[str], topology: Topology, layers: int | None
) -> tuple[tuple[str, ...], list[str]]:
    """The engine's command line for the smoke job, and each change (one line each): random
    weights, the launcher's flags left to the launcher, and with ``layers`` the overrides and
    the pipeline size."""
    out: list[str] = []
    said: list[str] = []
    overrides: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        flag, inline, rest = arg.partition("=")
        has_value = bool(inline) or (flag not in SWITCHES and takes_value(argv, i))
        value = rest if inline else (argv[i + 1] if has_value else None)
        step = 1 if inline or not has_value else 2
        if flag in LAUNCHER_FLAGS:
            pass  # set per node by the launcher
        elif flag == "--load-format":
            out += [flag, "dummy"]
            said.append(f"--load-format {value} -> dummy: random weights, no checkpoint read")
        elif flag in PP_FLAGS and value and int(value or 0) != topology.pp:
            out += [flag, str(topology.pp)]
            said.append(f"{flag} {value} -> {topology.pp}: the {layers} layers on one stage")
        elif flag == "--hf-overrides" and layers is not None:
            # Strict: a NaN or 1e999 here could not be written back as JSON.
            given = jsontext.loads(value or "{}", where="serve profile: --hf-overrides",
                                   expect=object, error=SpecError,
                                   fix="write the overrides as a JSON object")  # fmt: skip
            overrides = given if isinstance(given, dict) else {}
        else:
            out += argv[i : i + step]
        i += step
    if "--load-format" not in parse_options(argv):
        out += ["--load-format", "dummy"]
        said.append("--load-format dummy: added (random weights, no checkpoint read)")
    if layers is not None:
        out += [
            "--hf-overrides",
            jsontext.dumps({**overrides, "num_hidden_layers": layers}, sort_keys=False),
        ]
        said.append(
            f'--hf-overrides {{"num_hidden_layers": {layers}}}: the model cut to {layers} layers'
        )
    return tuple(out), said


def _model_dir(argv: Sequence[str]) -> str:
    """The model path of ``vllm serve MODEL`` (or ``--model``)."""
    model = parse_options(argv).get("--model")
    if isinstance(model, str):
        return model
    for before, word in itertools.pairwise(argv):
        if before == "serve" and not word.startswith("-"):
            return word
    return "/model"


def battery(
    spec: ImageSpec, profile: ServeProfile, served: str, port: int, model_dir: str, ready: float
) -> dict[str, Any]:
    """The driver's plan: no roles (the job started them), the CPU smoke's requests."""
    url = f"http://127.0.0.1:{port}"
    bench = None
    if "aiperf" in spec.components:
        artifacts = f"{OUT}/aiperf"
        bench = {
            "argv": [
                "aiperf",
                "profile",
                "--model",
                served,
                "--url",
                url,
                "--endpoint-type",
                "chat",
                "--request-count",
                str(BENCH_REQUESTS),
                "--concurrency",
                "1",
                "--tokenizer",
                model_dir,
                "--artifact-dir",
                artifacts,
            ],
            "artifacts": artifacts,
            "unset": [],
        }
    return {
        "image": spec.name,
        "profile": profile.name,
        "roles": [],
        "url": url,
        "served": served,
        "chat": {
            "model": served,
            "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 8,
        },
        "tools": None,
        "bias_probe": None,
        "reasoning_parser": profile.reasoning_parser,
        "bench": bench,
        "timeouts": {"ready": ready, **TIMEOUTS},
        "out": OUT,
    }


def plan_cluster(
    spec: ImageSpec,
    profile: ServeProfile,
    cluster: Cluster,
    env: Mapping[str, str],
    *,
    layers: int | None = None,
    ready_timeout: float = READY_TIMEOUT,
) -> ClusterSmoke:
    """The smoke job of one profile on one cluster (``env``: the image's baked env)."""
    engines = [c for c in profile.commands if c.role == "vllm-serve"]
    if len(engines) != 1 or len(profile.commands) != 1:
        raise SpecError(
            f"profile {profile.name} is not one `vllm serve` command: the cluster smoke "
            "starts direct vLLM profiles (a Dynamo profile's frontend and worker are not "
            "launched by it yet)",
            where=f"{spec.path}: profiles.{profile.name}",
            fix="smoke a direct profile, or its Dynamo roles on the CPU (`k3env smoke --twin`)",
        )
    if layers is not None and layers < 1:
        raise SpecError("--layers must be 1 or more", where="--layers", fix="pass N >= 1")
    argv = engines[0].argv
    full = full_topology(argv, cluster)
    topology = sized(full, layers)
    out, changes = smoke_argv(argv, topology, layers)
    if topology != full:
        changes.append(f"topology: {full.said()} -> {topology.said()} (the TP group kept)")
    served = parse_options(argv).get("--served-model-name")
    served = served if isinstance(served, str) else _model_dir(argv)
    port = parse_options(argv).get("--port")
    port_n = int(port) if isinstance(port, str) and port.isdigit() else 8000
    model_dir = _model_dir(argv)
    not_checked = list(NOT_CHECKED)
    if topology.pp != full.pp:
        not_checked.append(
            f"the pipeline: PP{full.pp} ranks and the layers per stage (a failure that depends "
            "on them, e.g. the cross-layer block fold of 12 MLA layers per PP2 stage, needs the "
            "full-size smoke: drop --layers)"
        )
    return ClusterSmoke(
        image=spec.name,
        profile=profile.name,
        cluster=cluster.name,
        layers=layers,
        role=engines[0].role,
        argv=out,
        full=full,
        topology=topology,
        model_dir=model_dir,
        port=port_n,
        served=served,
        env=dict(sorted(env.items())),
        battery=battery(spec, profile, served, port_n, model_dir, ready_timeout),
        changes=tuple(changes),
        not_checked=tuple(not_checked),
    )
