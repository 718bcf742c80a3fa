"""What a smoke run starts and sends, from a serve profile (pure: no engine, no files).

Each command of the profile is started as the job would start it, with what a 2-core CPU
host cannot run reduced, and every reduction said: the parallel layout to one process, GPU
memory settings dropped, the checkpoint replaced by random weights of a small model k3env
writes, CUDA graphs and torch.compile off, CUDA-only KV connectors dropped. What that leaves
unseen is listed per profile as not checked; nothing is dropped silently.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from k3env import jsontext
from k3env.checks.argv import parse_options
from k3env.config.spec import ImageSpec, ServeProfile
from k3env.smoke.model import STEER, SmokeModel, thinks

# Where the run's files are inside the container.
ROOT = "/k3env-smoke"
MODEL = f"{ROOT}/model"
ENGINE = f"{ROOT}/engine"  # the CPU engine: site/ (Python) and lib/ (shared libraries)
BIN = f"{ROOT}/bin"  # driver.py and plan.json
OUT = f"{ROOT}/out"

# (flags, why): flags whose value is dropped, with the reason the report gives.
PARALLEL = (
    "--tensor-parallel-size", "-tp", "--pipeline-parallel-size", "-pp",
    "--data-parallel-size", "-dp", "--data-parallel-size-local", "--nnodes", "--node-rank",
    "--master-addr", "--master-port", "--data-parallel-address", "--data-parallel-rpc-port",
)  # fmt: skip
MEMORY = ("--gpu-memory-utilization", "--kv-cache-memory-bytes", "--cpu-offload-gb")
CONNECTORS = ("--kv-transfer-config", "--kv-events-config")
# Switches of CUDA-only parts the CPU platform refuses at start (vLLM 0.31.0 on a CPU:
# "cumem allocator is not supported on current platform").
CUDA_ONLY = ("--enable-cumem-allocator",)
PREPENDED = ("PYTHONPATH", "LD_LIBRARY_PATH")  # the CPU engine's, before the image's
REPLACED = {"--load-format": "dummy", "--dtype": "float32"}
ADDED = (("--load-format", "dummy"), ("--dtype", "float32"), ("--enforce-eager", None))
# Without etcd and NATS (none on a build host): file discovery, TCP requests, ZMQ events.
DYNAMO_PLANES = ("--discovery-backend", "file", "--request-plane", "tcp", "--event-plane", "zmq")

BENCH_REQUESTS = 5
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}

NOT_CHECKED = (
    "GPU kernels and attention backends (the CPU build's kernels ran)",
    "CUDA graph capture (--enforce-eager) and torch.compile",
    "memory sizing: weights, KV cache and activations on the GPU",
    "the parallel layout: tensor / pipeline parallel ranks and multi-node start",
    "the model's own architecture and checkpoint (random weights of a 2-layer Llama)",
)


@dataclass(frozen=True, kw_only=True)
class Role:
    role: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    prepend: Mapping[str, str] = field(default_factory=dict)  # PATH-like: value first
    unset: tuple[str, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return jsontext.plain(self)


def battery_gates(plan: Mapping[str, Any]) -> tuple[str, ...]:
    """The gates the driver runs for its plan (``SmokePlan.as_json`` or a cluster battery), in
    order: planned before anything runs, so a gate that never reports is ``not run``. The
    env gate comes first: a process's environment is fixed at its start, so a wrong value
    is found in seconds, not after the engine's load."""
    return (
        *(("env",) if plan.get("env") else ()),
        "listed",
        "chat",
        *(("reasoning",) if plan.get("reasoning_parser") else ()),
        *(("tool-calls",) if plan.get("tools") else ()),
        *(("benchmark",) if plan.get("bench") else ()),
        "stop",
    )


@dataclass(frozen=True, kw_only=True)
class SmokePlan:
    image: str
    profile: str
    roles: tuple[Role, ...]
    url: str
    served: str
    chat: Mapping[str, Any]
    tools: Mapping[str, Any] | None
    bias_probe: Mapping[str, Any] | None
    reasoning_parser: str | None
    bench: Mapping[str, Any] | None
    reductions: tuple[str, ...]
    not_checked: tuple[str, ...]
    timeouts: Mapping[str, float]
    # The image's baked env as each engine process must see it (/proc/PID/environ): the
    # names the plan sets for the CPU engine are left out (said in the reductions).
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def gates(self) -> tuple[str, ...]:
        """The gates the driver runs, in order."""
        return battery_gates(self.as_json())

    def as_json(self) -> dict[str, Any]:
        """The driver's input (and, hashed, what a record of this run is keyed by)."""
        return {**jsontext.plain(self, leave=("reductions", "not_checked")), "out": OUT}

    def identity(self) -> str:
        """What a record of this run is keyed by: the plan without its time bounds."""
        data = self.as_json()
        del data["timeouts"]
        return jsontext.dumps(data)

    def dumps(self) -> str:
        return jsontext.dumps(self.as_json(), indent=1) + "\n"


def _value(argv: Sequence[str], flag: str) -> str | None:
    """A flag's value on a command line (``--flag v`` or ``--flag=v``); None for a switch."""
    value = parse_options(argv).get(flag)
    return value if isinstance(value, str) else None


def connector(value: str | None) -> str:
    """A KV connector's name from its JSON config (the value itself when it is not JSON)."""
    try:
        data = json.loads(value or "")
    except ValueError:
        return str(value)
    name = data.get("kv_connector") if isinstance(data, dict) else None
    return str(name) if name else str(value)[:80]


def takes_value(argv: Sequence[str], i: int) -> bool:
    return i + 1 < len(argv) and not argv[i + 1].startswith("-")


def reduce_engine_argv(
    argv: Sequence[str], *, model_flag: str | None
) -> tuple[tuple[str, ...], list[str]]:
    """The engine's command line as a CPU host can run it, and what was changed (one line
    each). ``model_flag``: ``--model`` for Dynamo's worker; None for ``vllm serve MODEL``."""
    out: list[str] = []
    said: list[str] = []
    i = 0
    positional_model = model_flag is None
    while i < len(argv):
        arg = argv[i]
        flag = arg.split("=", 1)[0]
        inline = "=" in arg
        has_value = inline or takes_value(argv, i)
        value = arg.split("=", 1)[1] if inline else (argv[i + 1] if has_value else None)
        step = 1 if inline or not has_value else 2
        if flag in PARALLEL:
            said.append(f"{flag} {value}: dropped (one CPU process)")
        elif flag in MEMORY:
            said.append(f"{flag} {value}: dropped (no GPU memory to size)")
        elif flag in CONNECTORS:
            said.append(f"{flag} {connector(value)}: dropped (not checkable on a CPU)")
        elif flag in REPLACED:
            said.append(f"{flag} {value}: {REPLACED[flag]} here")
        elif flag == "--model" and flag == model_flag:
            out += [flag, MODEL]
        elif flag == "--tokenizer":
            said.append(f"{flag} {value}: the small model's tokenizer")
        elif flag == "--max-model-len":
            said.append(f"{flag} {value}: the small model's 2048")
        elif flag in CUDA_ONLY:
            said.append(f"{flag}: dropped (a CUDA-only part, refused on a CPU)")
            step = 1
        elif flag == "--headless":
            said.append("--headless: dropped (the one process serves)")
            step = 1
        elif positional_model and not arg.startswith("-") and out[-1:] == ["serve"]:
            out.append(MODEL)
            positional_model = False
            step = 1
        else:
            out.append(arg)
            step = 1
        i += step
    for flag, value in ADDED:
        out += [flag] + ([value] if value else [])
    said.append("--enforce-eager: added (no CUDA graphs on a CPU)")
    said.append("--load-format dummy: random weights of a small model k3env writes")
    return tuple(out), said


def behind_dynamo(profile: ServeProfile) -> bool:
    """Whether the profile is served by Dynamo's frontend (its roles say so)."""
    return any(c.role == "dynamo-frontend" for c in profile.commands)


def _port(argv: Sequence[str], flag: str) -> int:
    value = _value(argv, flag)
    return int(value) if value and value.isdigit() else 8000


def plan_profile(
    spec: ImageSpec,
    profile: ServeProfile,
    model: SmokeModel,
    *,
    ready_timeout: float = 300.0,
    absent: Sequence[str] = (),
    baked: Mapping[str, str] | None = None,
) -> SmokePlan:
    """The smoke plan of one profile of one image. ``absent``: packages the twin omits by
    design, stood in for when a role imports them (each is reported); ``baked``: the image's
    baked env, checked as the engine's processes see it."""
    engine_env, reductions = _engine_env(absent)
    roles = _plan_roles(profile, model, engine_env)
    reductions += roles.reductions
    env, said = _expected_env(baked or {}, engine_env)
    reductions += said
    not_checked = [*NOT_CHECKED, *roles.not_checked]
    if any(c.role.startswith("dynamo-") for c in profile.commands):
        reductions.append(
            "dynamo: --discovery-backend file --request-plane tcp --event-plane zmq "
            "(no etcd or NATS on a build host)"
        )
        not_checked.append("etcd / NATS discovery and request planes (file, TCP and ZMQ here)")
    reductions.append("env: TORCH_COMPILE_DISABLE=1 (the twin has no C++ compiler for inductor)")
    chat = {
        "model": roles.served,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 8,
    }
    tools, bias_probe, said = _tool_requests(profile, model, roles.served)
    reductions += said
    bench, said = _bench(spec, profile, roles.served, roles.url)
    reductions += said
    return SmokePlan(
        image=spec.name,
        profile=profile.name,
        roles=roles.roles,
        url=roles.url,
        served=roles.served,
        chat=chat,
        tools=tools,
        bias_probe=bias_probe,
        reasoning_parser=profile.reasoning_parser,
        bench=bench,
        reductions=tuple(reductions),
        not_checked=tuple(not_checked),
        timeouts={"ready": ready_timeout, "request": 120.0, "bench": 300.0, "stop": 30.0},
        env=env,
    )


def _expected_env(
    baked: Mapping[str, str], engine_env: Mapping[str, str]
) -> tuple[dict[str, str], list[str]]:
    """The baked env each engine process must see, and each baked name the CPU engine's
    environment sets otherwise (said: its value here is not the image's)."""
    mine = {*engine_env, *PREPENDED}
    said = [
        f"env: {name} is set for the CPU engine here; the image bakes {baked[name]!r}"
        for name in sorted(baked)
        if name in mine
    ]
    return {k: v for k, v in sorted(baked.items()) if k not in mine}, said


def _engine_env(absent: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """The environment every role runs with (the CPU engine, offline), and what it reduces."""
    engine_env = {
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "TORCH_COMPILE_DISABLE": "1",
        "HF_HUB_OFFLINE": "1",
        "DYN_FILE_KV": "/tmp/k3env-dynamo-kv",
    }
    reductions = []
    if absent:
        engine_env["K3ENV_SMOKE_ABSENT"] = ",".join(sorted(absent))
        reductions.append(
            f"{', '.join(sorted(absent))}: a stand-in answers the import when the image lacks "
            "it (the twin omits it; [smoke].absent)"
        )
    return engine_env, reductions


@dataclass(frozen=True, kw_only=True)
class _Roles:
    """The roles as started here, where the server answers, and what was reduced or unseen."""

    roles: tuple[Role, ...]
    url: str
    served: str
    reductions: tuple[str, ...]
    not_checked: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class _EngineRole:
    """One engine role (vllm serve or Dynamo's worker) as started here."""

    role: Role
    served: str | None  # its --served-model-name
    port: int | None  # where it answers (None: Dynamo's worker, behind the frontend)
    reductions: tuple[str, ...]
    not_checked: tuple[str, ...]


def _plan_roles(profile: ServeProfile, model: SmokeModel, engine_env: Mapping[str, str]) -> _Roles:
    """Each command of the profile as a role, in order; the last to say so names the URL and
    the served model."""
    # BIN first: its sitecustomize stands in for what the twin omits; then the CPU engine.
    prepend = dict(zip(PREPENDED, (f"{BIN}:{ENGINE}/site", f"{ENGINE}/lib"), strict=True))
    roles: list[Role] = []
    reductions: list[str] = []
    not_checked: list[str] = []
    url = "http://127.0.0.1:8000"
    served = "k3env-smoke"
    for cmd in profile.commands:
        argv = list(cmd.argv)
        if cmd.role in ("vllm-serve", "dynamo-worker"):
            engine = _engine_role(cmd.role, argv, model, engine_env, prepend)
            reductions += engine.reductions
            served = engine.served or served
            if engine.port is not None:
                url = f"http://127.0.0.1:{engine.port}"
            not_checked += engine.not_checked
            roles.append(engine.role)
        elif cmd.role == "dynamo-frontend":
            url = f"http://127.0.0.1:{_port(argv, '--http-port')}"
            roles.append(
                Role(role=cmd.role, argv=(*argv, *DYNAMO_PLANES), env=engine_env, prepend=prepend)
            )
        else:
            roles.append(Role(role=cmd.role, argv=tuple(argv), env=engine_env, prepend=prepend))
    return _Roles(
        roles=tuple(roles),
        url=url,
        served=served,
        reductions=tuple(reductions),
        not_checked=tuple(not_checked),
    )


def _engine_role(
    role: str,
    argv: Sequence[str],
    model: SmokeModel,
    engine_env: Mapping[str, str],
    prepend: Mapping[str, str],
) -> _EngineRole:
    """The engine's command line reduced for this host, the small model's config and
    tokenizer in place of the checkpoint's, and Dynamo's planes for its worker."""
    worker = role == "dynamo-worker"
    reduced, said = reduce_engine_argv(argv, model_flag="--model" if worker else None)
    if model.engine_config:
        llama = f"{MODEL}/{model.engine_config}"
        reduced = (*reduced, "--hf-config-path", llama, "--tokenizer", llama)
        said.append(
            f"--hf-config-path, --tokenizer: a 2-layer Llama's config and the same "
            f"vocabulary as tokenizer.json (config.json keeps the tokenizer's model_type "
            f"{model.model_type!r} and tiktoken.model for the frontend)"
        )
    if worker:
        reduced = (*reduced, *DYNAMO_PLANES)
    not_checked = [f"{role}: {f}" for f in CUDA_ONLY if f in argv]
    for flag in CONNECTORS:
        if _value(argv, flag):
            not_checked.append(f"{role}: {flag} {connector(_value(argv, flag))}")
    return _EngineRole(
        role=Role(role=role, argv=reduced, env=engine_env, prepend=prepend),
        served=_value(argv, "--served-model-name"),
        port=None if worker else _port(argv, "--port"),
        reductions=tuple(f"{role}: {s}" for s in said),
        not_checked=tuple(not_checked),
    )


def _tool_requests(
    profile: ServeProfile, model: SmokeModel, served: str
) -> tuple[dict[str, Any] | None, dict[str, Any] | None, list[str]]:
    """The tool-call request and the logit-bias probe before it (None without a tool-call
    parser, or without a bias to steer by), and what they reduce."""
    if not profile.tool_call_parser:
        return None, None, []
    reductions = []
    bias_probe: dict[str, Any] | None = None
    tools: dict[str, Any] = {
        "model": served,
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [TOOL],
        "tool_choice": "required",
        # Markers are spelled out token by token by the grammar: room for the envelope.
        "max_tokens": 300,
    }
    steer = STEER.get(profile.tool_call_parser)
    if steer:
        # Random weights never choose to close a channel: a bias toward the parser's
        # markers stands in for a trained model's choice (the grammar keeps it valid).
        tools["logit_bias"] = {str(model.token_id(t)): b for t, b in steer.items()}
        reductions.append(
            f"tool-calls: logit_bias toward {sorted(steer)} (random weights never close "
            "a channel on their own)"
        )
    if profile.reasoning_parser and thinks(profile.reasoning_parser):
        tools["chat_template_kwargs"] = {"thinking": False}
    if steer:  # after chat_template_kwargs: the probe asks as the tool request will
        # First ask whether the server applies a bias at all (a frontend may drop it).
        bias_probe = {
            "request": {
                "model": served,
                "messages": [{"role": "user", "content": "Say A."}],
                "max_tokens": 4,
                "logit_bias": {str(model.token_id("A")): 100},
                **({"chat_template_kwargs": tools["chat_template_kwargs"]}
                   if "chat_template_kwargs" in tools else {}),
            },
            "expect": "AAAA",
        }  # fmt: skip
    return tools, bias_probe, reductions


def _bench(
    spec: ImageSpec, profile: ServeProfile, served: str, url: str
) -> tuple[dict[str, Any] | None, list[str]]:
    """aiperf's short synthetic benchmark when the image carries aiperf, and what it reduces."""
    if "aiperf" not in spec.components:
        return None, []
    artifacts = f"{OUT}/aiperf"
    bench = {
        "argv": [
            "aiperf", "profile", "--model", served, "--url", url, "--endpoint-type", "chat",
            "--request-count", str(BENCH_REQUESTS), "--concurrency", "1",
            "--tokenizer", MODEL, "--artifact-dir", artifacts,
        ],
        "artifacts": artifacts,
        # aiperf 0.13.0 reads a local tokenizer path as a hub repo id under HF_HUB_OFFLINE=1.
        "unset": ["HF_HUB_OFFLINE"],
    }  # fmt: skip
    kind = profile.benchmark.get("type") if profile.benchmark else None
    return bench, [
        f"benchmark: {BENCH_REQUESTS} synthetic chat requests at concurrency 1"
        + (f" (the profile's {kind!r} workload is not run)" if kind else "")
    ]
