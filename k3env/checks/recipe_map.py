"""An srt-slurm recipe as the preflight rules read a spec's serve profile: the commands and
the environment srt-slurm will start, with its defaults applied, and each rule's key mapped
back to the recipe's own key.

The command lines follow srt-slurm's ``backends/vllm.py: build_worker_command`` (pinned
v1.0.36 + PR #278): ``vllm serve /model`` for ``frontend.type: vllm`` (with the multi-node
patch's leader flags on more than one node), else ``python3 -m dynamo.vllm`` with the
connector srt-slurm turns into ``--kv-transfer-config`` (``nixl`` unless the recipe says
otherwise), ``--device-ids``, the data-parallel or multi-node flags, ``--request-plane``,
``--dump-config-to`` and ``--kv-events-config``, then ``vllm_config.aggregated`` as flags
(sorted, ``_`` -> ``-``, ``true`` a bare flag, ``false`` dropped): the first worker's leader.
The environment is the image's baked env, then
``backend.aggregated_environment``, then ``environment`` (srt-slurm exports both inside the
container, after it starts: they win); the benchmark client's is the image's and the top-level
``environment`` only. When srt-slurm installs Dynamo at job start, the rules
judge that Dynamo, and the image's facts about its own Dynamo are dropped, and said.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from k3env import jsontext
from k3env.checks.argv import ParsedCommand, parse_options
from k3env.checks.known import (
    DYNAMO_COMMITS,
    MODELS,
    SRT_CONNECTORS,
    SRT_DEFAULTS,
    SRT_DP_RPC_PORT,
    SRT_KV_EVENTS_PORT,
)
from k3env.checks.preflight import Context, Finding
from k3env.config.cluster import Cluster
from k3env.config.pins import Lock
from k3env.config.spec import Command, ImageSpec, ServeProfile
from k3env.config.srtrecipe import BENCH_ENV_KEY, ENGINE_KEY, FRONTEND_ENV_KEY, Recipe, job_shape
from k3env.errors import ConfigError
from k3env.image.envpolicy import merged_env
from k3env.versions import in_range

PROFILE = "aggregated"
# Stand-ins for what exists on the cluster only: the leader node's IP, and the config dump
# srt-slurm's worker_stage.start_worker always asks for (`<its log dir>/<node>_config.json`).
LEADER = "node-0"
DUMP_CONFIG = f"/outputs/JOB_ID/logs/{LEADER}_config.json"
# Where srt-slurm's vllm frontend binds (srt-slurm allocates the port; any stands in).
DIRECT_PREFIX = ("vllm", "serve", "/model", "--host", "0.0.0.0", "--port", "8000")
FRONTEND_ARGV = ("python3", "-m", "dynamo.frontend", "--http-port", "8000")
# srt-slurm's loader on a direct vLLM frontend over prefill/decode workers (PR #278's schema).
DIRECT_DISAGG = "frontend.type: vllm supports aggregate jobs only, not disaggregated layouts"
_FLAG = re.compile(r"--[a-z0-9][a-z0-9-]*")
_KV_WORDS = (
    "kv_connector",
    "cpu_bytes_to_use_per_rank",
    "enable_cross_layers_blocks",
    "SimpleCPUOffloadConnector",
)


@dataclass(frozen=True, kw_only=True)
class ImageOf:
    """What a recipe's ``model.container`` is, as far as this host knows."""

    container: str
    base: str  # the lock base it is (or is taken as)
    how: str  # one line: how k3env knows (a push or export record, or that it does not)
    known: bool  # an image k3env built, pushed or exported
    spec: ImageSpec | None = None  # the spec that built it
    image_id: str | None = None
    facts: Mapping[str, Any] | None = None
    facts_source: str | None = None
    # False: neither an image k3env knows nor a lock base; its base is a stand-in for the
    # mapping, and the rules that need its contents (patches, baked env) are not checked.
    placed: bool = True


@dataclass(frozen=True, kw_only=True)
class EnvEntry:
    name: str
    value: str
    key: str  # the recipe key that sets it, or "image" (baked)
    baked: str | None  # the image's baked value, when it has one

    @property
    def changed(self) -> bool:
        return self.key != "image" and self.baked is not None and self.baked != self.value

    def as_json(self) -> dict[str, Any]:
        return {**self.__dict__, "changed": self.changed}


@dataclass(frozen=True, kw_only=True)
class Mapped:
    context: Context
    env: tuple[EnvEntry, ...]
    notes: tuple[str, ...]  # srt-slurm defaults applied, facts dropped, inferences
    model_type_key: str  # the recipe key the tokenizer model_type was taken from


def flag_args(flags: Mapping[str, Any]) -> list[str]:
    """srt-slurm's ``_config_to_cli_args``: sorted, ``_`` -> ``-``, ``true`` a bare flag,
    ``false`` and null dropped, a list its items. A mapping becomes JSON here (srt-slurm
    passes ``str()`` of it)."""
    out: list[str] = []
    for key, value in sorted(flags.items()):
        flag = "--" + str(key).replace("_", "-")
        if isinstance(value, bool):
            if value:
                out.append(flag)
        elif isinstance(value, list):
            out += [flag, *(str(v) for v in value)]
        elif isinstance(value, dict):
            out += [flag, json_flag(flag, value)]
        elif value is not None:
            out += [flag, str(value)]
    return out


def json_flag(flag: str, value: Mapping[str, Any], *, compact: bool = True) -> str:
    """A mapping as the JSON word of ``flag``; a NaN or an infinity in it is refused (it has
    no JSON spelling a server could read)."""
    try:
        return jsontext.dumps(value, compact=compact, sort_keys=False)
    except jsontext.NotFinite as e:
        raise ConfigError(f"{flag}: {e}", where="the recipe's flags",
                          fix="write a finite number there") from e  # fmt: skip


def _multinode(nodes: int) -> list[str]:
    """The leader's flags the multi-node patch adds (``--master-addr/--nnodes/--node-rank``)."""
    return (
        ["--master-addr", LEADER, "--nnodes", str(nodes), "--node-rank", "0"] if nodes > 1 else []
    )


def _local_gpus(recipe: Recipe) -> int:
    """The GPUs a worker of the recipe's mode gets on its leader's node."""
    shape = job_shape(recipe.doc)
    role = shape.role("agg" if recipe.mode == "aggregated" else recipe.mode)
    return min(role.gpus if role else shape.gpus_per_node, shape.gpus_per_node)


def _device_ids(recipe: Recipe, count: int) -> list[str]:
    """``--device-ids`` of the leader's first ``count`` GPUs, unless the recipe sets
    ``backend.set_cuda_visible_devices`` (srt-slurm then sets CUDA_VISIBLE_DEVICES)."""
    default = SRT_DEFAULTS["backend.set_cuda_visible_devices"]
    if recipe.backend.get("set_cuda_visible_devices", default) or count < 1:
        return []
    return ["--device-ids", ",".join(str(i) for i in range(count))]


def _placement(recipe: Recipe, flags: dict[str, Any], nodes: int) -> list[str]:
    """build_worker_command's flags for where the Dynamo leader runs: ``--device-ids``, then
    with ``data-parallel-size`` the data-parallel flags (by ``backend.dp_launch_mode``), else
    the multi-node ones; the flags it derives leave ``flags``."""
    local = _local_gpus(recipe)
    if all(flags.get(k) is None for k in ("data-parallel-size", "data_parallel_size")):
        return [*_device_ids(recipe, local), *_multinode(nodes)]
    per_node = (
        recipe.backend.get("dp_launch_mode", SRT_DEFAULTS["backend.dp_launch_mode"]) == "per_node"
    )
    derived = ("rpc-port", "size-local", "start-rank", "hybrid-lb") if per_node else ("rpc-port",)
    for key in [f"data-parallel-{k}" for k in derived] + (["headless"] if per_node else []):
        flags.pop(key, None)
        flags.pop(key.replace("-", "_"), None)
    where = ["--data-parallel-address", LEADER, "--data-parallel-rpc-port", str(SRT_DP_RPC_PORT)]
    if per_node:
        return [*_device_ids(recipe, local), "--data-parallel-size-local", str(local),
                "--data-parallel-start-rank", "0", *where, "--data-parallel-hybrid-lb"]  # fmt: skip
    return [*_device_ids(recipe, 1), "--data-parallel-rank", "0", *where]  # a GPU per process


def _kv_events(recipe: Recipe) -> list[str]:
    """``--kv-events-config`` where ``backend.kv_events_config`` enables it for this mode."""
    given = recipe.backend.get("kv_events_config")
    if isinstance(given, Mapping):
        mine = given.get(recipe.mode)
    else:
        mine = given is True and recipe.mode != "aggregated"
    if mine is not True and not isinstance(mine, Mapping):
        return []
    payload = {"publisher": "zmq", "topic": "kv-events", "enable_kv_cache_events": True,
               **(mine if isinstance(mine, Mapping) else {}),
               "endpoint": f"tcp://*:{SRT_KV_EVENTS_PORT}"}  # fmt: skip
    return ["--kv-events-config", json_flag("--kv-events-config", payload, compact=False)]


def _nodes(recipe: Recipe) -> int:
    """The nodes one worker of the recipe's mode spans (srt-slurm: the role's nodes over its
    workers; a decode role on the prefill role's nodes, ``decode_nodes: 0``, spans one)."""
    role = "agg" if recipe.mode == "aggregated" else recipe.mode
    nodes, workers = (recipe.resources.get(f"{role}_{k}") for k in ("nodes", "workers"))
    nodes = nodes if isinstance(nodes, int) and not isinstance(nodes, bool) and nodes > 0 else 1
    if isinstance(workers, int) and not isinstance(workers, bool) and workers > 0:
        return max(1, nodes // workers)
    return nodes


def frontend_type(recipe: Recipe) -> str:
    return str(recipe.frontend.get("type", SRT_DEFAULTS["frontend.type"]))


def commands(recipe: Recipe, notes: list[str]) -> tuple[Command, ...]:
    """The command lines srt-slurm starts for the recipe's aggregate worker (the leader's)."""
    backend = recipe.backend.get("type", SRT_DEFAULTS["backend.type"])
    if backend != "vllm":
        where = "backend.type" if "type" in recipe.backend else "backend"
        said = recipe.own("backend.type")
        raise recipe.fail(
            where,
            f"{said} is {backend!r}"
            + ("" if "type" in recipe.backend else " (srt-slurm's default: the recipe sets none)")
            + ": k3env's rules read vLLM recipes",
            f"set {said}: vllm (a recipe for another engine is not checked here)",
        )
    flags = dict(recipe.engine_flags)
    nodes = _nodes(recipe)
    name = str(flags.get("served-model-name") or Path(recipe.model_path).name)
    disagg = recipe.mode != "aggregated"
    if frontend_type(recipe) == "vllm" and disagg:
        raise recipe.fail(
            "frontend.type",
            f"{recipe.own('frontend.type')}: vllm over {recipe.mode} workers: srt-slurm's "
            f"loader refuses it ({DIRECT_DISAGG!r}, PR #278)",
            "use frontend.type: dynamo for a prefill/decode job, or make it one aggregate role",
        )
    if frontend_type(recipe) == "vllm":
        for key in ("host", "port", "connector"):
            flags.pop(key, None)
        flags.setdefault("served-model-name", name)
        argv = [
            *DIRECT_PREFIX,
            *_multinode(nodes),
            *_device_ids(recipe, _local_gpus(recipe)),
            *flag_args(flags),
        ]
        return (Command(role="vllm-serve", argv=tuple(argv)),)
    worker = ["python3", "-m", "dynamo.vllm", "--model", "/model", "--served-model-name", name]
    if disagg:  # build_worker_command: `--disaggregation-mode` for a prefill or decode worker
        worker += ["--disaggregation-mode", recipe.mode]
    connector = flags.pop("connector", None)
    if connector is None:
        connector = recipe.backend.get("connector", SRT_DEFAULTS["backend.connector"])
        if "connector" not in recipe.backend and connector:
            given = jsontext.dumps(SRT_CONNECTORS.get(connector, connector), sort_keys=False)
            key = recipe.own("backend.connector")
            notes.append(
                f"srt-slurm default {key}: {connector} gives the Dynamo worker "
                f"--kv-transfer-config {given} (set {key}: null for none)"
            )
    if connector and str(connector).lower() not in ("null", "none"):
        preset = SRT_CONNECTORS.get(str(connector).lower())
        worker += [
            "--kv-transfer-config",
            jsontext.dumps(dict(preset), sort_keys=False) if preset else str(connector),
        ]
    plane = (recipe.dynamo or {}).get("request_plane", SRT_DEFAULTS["dynamo.request_plane"])
    worker += [*_placement(recipe, flags, nodes), "--request-plane", str(plane)]
    worker += ["--dump-config-to", DUMP_CONFIG, *_kv_events(recipe), *flag_args(flags)]
    return (
        Command(role="dynamo-frontend", argv=FRONTEND_ARGV),
        Command(role="dynamo-worker", argv=tuple(worker)),
    )


def model_type(recipe: Recipe, given: str | None) -> tuple[str | None, str]:
    """The tokenizer ``model_type`` (``--model-type``, else a parser named for a model k3env
    knows, else the model directory's name) and the recipe key it came from."""
    if given:
        return given, "model.path"
    for key in (
        "tool-call-parser",
        "reasoning-parser",
        "dyn-tool-call-parser",
        "dyn-reasoning-parser",
    ):
        value = recipe.engine_flags.get(key)
        if isinstance(value, str) and value in MODELS:
            return value, recipe.own(f"{ENGINE_KEY}.{key}")
    guess = Path(recipe.model_path).name.lower().replace("-", "_")
    return (guess, "model.path") if guess in MODELS else (None, "model.path")


def _parser(flags: Mapping[str, Any], *names: str) -> str | None:
    for n in names:
        if isinstance(flags.get(n), str):
            return str(flags[n])
    return None


def _dynamo_version(recipe: Recipe, notes: list[str]) -> str | None:
    """The Dynamo srt-slurm installs at job start (``None``: none, or the image's)."""
    section = recipe.dynamo if recipe.dynamo is not None else {}
    if not section.get("install", SRT_DEFAULTS["dynamo.install"]):
        return None
    where = "dynamo" if recipe.dynamo is not None else "(no dynamo: section)"
    if section.get("wheel"):
        version = str(section["wheel"])
    elif section.get("hash"):
        version = DYNAMO_COMMITS.get(str(section["hash"]), "")
        if not version:
            notes.append(
                f"{recipe.own('dynamo.hash')} {section['hash']}: no version known for that "
                "commit; the rules judge the lock's Dynamo instead"
            )
            return None
    elif section.get("top_of_tree"):
        notes.append("dynamo.top_of_tree: whatever Dynamo's main is at job start; not judged")
        return None
    else:
        version = str(section.get("version", SRT_DEFAULTS["dynamo.version"]))
    try:
        in_range(version, ">=0")
    except ValueError:
        notes.append(f"dynamo: {version!r} is not a version; the rules judge the lock's Dynamo")
        return None
    said = any(k in section for k in ("version", "wheel", "hash"))
    default = "" if said else " (srt-slurm's default)"
    notes.append(
        f"srt-slurm installs Dynamo {version} at every job start{default} [{where}]: "
        "the rules judge that Dynamo, not the image's"
    )
    return version


def baked_env(lock: Lock, image: ImageOf) -> dict[str, str]:
    """The env the image carries as k3env bakes it (the spec that built it), else the lock's
    and its base's (what k3env would bake over that base)."""
    if image.spec is not None:
        return merged_env(lock, image.spec)
    base = lock.bases.get(image.base)
    return {**lock.env, **(base.env if base else {})}


def effective_env(recipe: Recipe, baked: Mapping[str, str]) -> tuple[EnvEntry, ...]:
    """Each name the worker sees: the recipe's exports over the image's baked env."""
    set_by = recipe.env()
    entries = [
        EnvEntry(name=n, value=v, key=recipe.env_key(n), baked=baked.get(n))
        for n, v in set_by.items()
    ]
    entries += [
        EnvEntry(name=n, value=v, key="image", baked=v) for n, v in baked.items() if n not in set_by
    ]
    return tuple(sorted(entries, key=lambda e: e.name))


def map_recipe(
    recipe: Recipe, lock: Lock, cluster: Cluster, image: ImageOf, *, model_type_given: str | None
) -> Mapped:
    """The Context the rules judge for ``recipe`` run in ``image`` on ``cluster``."""
    if image.base not in lock.bases:
        raise ConfigError(
            f"base {image.base!r} is not pinned in {lock.path}",
            where="--base",
            fix=f"use one of {sorted(lock.bases)}",
        )
    notes: list[str] = _env_notes(recipe)
    cmds = commands(recipe, notes)
    mtype, mtype_key = model_type(recipe, model_type_given)
    if mtype is None:
        notes.append(
            "no tokenizer model_type: none of the parsers or the model directory name a "
            "model k3env knows (pass --model-type)"
        )
    elif not model_type_given:
        notes.append(
            f"tokenizer model_type {mtype!r} taken from {mtype_key} (the model's "
            "config.json is on the cluster; --model-type to say otherwise)"
        )
    flags = recipe.engine_flags
    profile = ServeProfile(
        name=PROFILE,
        description=recipe.name,
        tokenizer_model_type=mtype,
        tool_call_parser=_parser(flags, "tool-call-parser", "dyn-tool-call-parser"),
        reasoning_parser=_parser(flags, "reasoning-parser", "dyn-reasoning-parser"),
        commands=cmds,
        benchmark=dict(recipe.benchmark),
    )
    baked = baked_env(lock, image) if image.placed else {}
    if not image.placed:
        notes.append(
            f"not checked: what {image.container} carries (its container patches, its baked "
            "env): k3env cannot place it (`--base NAME` to judge it as that lock base)"
        )
    env = effective_env(recipe, baked)
    spec = ImageSpec(
        name=recipe.name,
        path=recipe.path,
        sha256="",
        description=recipe.name,
        base=image.base,
        repository="",
        patches=image.spec.patches if image.spec else (),
        components=image.spec.components if image.spec else (),
        env=recipe.env(),
        env_readers={},
        allow_credentials=(),
        profiles={PROFILE: profile},
    )
    facts = _job_facts(recipe, image, notes)
    ctx = Context(
        spec=spec,
        profile=profile,
        lock=lock,
        cluster=cluster,
        env={e.name: e.value for e in env},
        facts=facts,
        commands=tuple(
            ParsedCommand(role=c.role, index=i, argv=c.argv, options=parse_options(c.argv))
            for i, c in enumerate(cmds)
        ),
        facts_source=image.facts_source,
        command_key=lambda c: "frontend" if c.role == "dynamo-frontend" else ENGINE_KEY,
        # srt-slurm's benchmark step gets the top-level `environment` (v1.0.36 + PR #278
        # src/srtctl/cli/mixins/benchmark_stage.py `_get_benchmark_env`), not the backend's.
        client_env={**baked, **recipe.client_env()},
        client_env_key=recipe.client_env_key,
        setup_script=recipe.setup_script,
        base_known=image.placed,
    )
    return Mapped(context=ctx, env=env, notes=tuple(notes), model_type_key=mtype_key)


def _env_notes(recipe: Recipe) -> list[str]:
    """Where the env a recipe sets outside the worker's goes (said, not judged)."""
    notes = []
    if recipe.frontend_env:
        names = ", ".join(sorted(recipe.frontend_env))
        notes.append(
            f"{FRONTEND_ENV_KEY} ({names}) reaches the frontend only: not the engine, not the "
            "benchmark client"
        )
    if recipe.benchmark_env and not recipe.benchmark_env_read:
        names = ", ".join(sorted(recipe.benchmark_env))
        notes.append(
            f"{BENCH_ENV_KEY} ({names}) does not reach a {recipe.benchmark.get('type')!r} "
            "benchmark's client: srt-slurm v1.0.36 passes it to a `custom` benchmark only"
        )
    return notes


def _job_facts(recipe: Recipe, image: ImageOf, notes: list[str]) -> dict[str, Any] | None:
    """verify's facts about the image, as the job will run it: a Dynamo the job installs
    replaces the image's own (said)."""
    facts = dict(image.facts) if image.facts is not None else None
    if frontend_type(recipe) != "dynamo":
        return facts
    version = _dynamo_version(recipe, notes)
    if version is None:
        return facts
    if facts and facts.get("dynamo"):
        notes.append(
            "verify's facts about the image's own Dynamo (its tokenizer model "
            "types, parsers) no longer hold: the job installs another"
        )
        facts.pop("dynamo")
    return {**(facts or {}), "versions": {**(facts or {}).get("versions", {}), "dynamo": version}}


def recipe_key(recipe: Recipe, mapped: Mapped, finding: Finding) -> str:
    """The recipe key a finding is about, as the recipe spells it in its own schema (findings
    on the lock keep the lock's key)."""
    if finding.file != str(recipe.path):
        return finding.key
    key = finding.key
    if key.startswith("env."):
        return recipe.env_key(key.removeprefix("env."))
    if key.endswith(".tokenizer_model_type"):
        return mapped.model_type_key
    return recipe.own(_schema1_key(recipe, key, finding.message))


def _schema1_key(recipe: Recipe, key: str, message: str) -> str:
    """A rule's key as a schema-1 recipe names it (``Recipe.own`` then says it in the
    recipe's own schema)."""
    if key == "patches":
        return "model.container"
    if key == ENGINE_KEY:
        return _flag_key(recipe, message)
    if key.startswith("profiles."):
        return "backend"
    return key


def _flag_key(recipe: Recipe, message: str) -> str:
    """The engine flag a message is about, as the recipe spells its key (the first one the
    message names that the recipe sets), else the engine flags' section."""
    spelled = {str(k).replace("_", "-"): str(k) for k in recipe.engine_flags}
    # Flags srt-slurm derives from another key: that key (`request_plane` where it is written).
    derived = {"nnodes": "resources.agg_nodes", "device-ids": "backend.set_cuda_visible_devices"}
    if "request_plane" in (recipe.dynamo or {}):
        derived["request-plane"] = "dynamo.request_plane"
    for m in _FLAG.finditer(message):
        flag = m.group(0)[2:]
        if flag in derived:
            return derived[flag]
        if flag in spelled:
            return f"{ENGINE_KEY}.{spelled[flag]}"
    if "kv-transfer-config" in spelled and any(w in message for w in _KV_WORDS):
        return f"{ENGINE_KEY}.{spelled['kv-transfer-config']}"
    if message.startswith("TP x PP") and "tensor-parallel-size" in spelled:
        return f"{ENGINE_KEY}.{spelled['tensor-parallel-size']}"
    return ENGINE_KEY
