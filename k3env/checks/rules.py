"""Preflight rules: each a small function with the metadata a reviewer needs.

Every rule names the failure it prevents as a user saw it in the Kimi-K3 bring-up
(../shared/context), the components and versions it applies to, its severity and the fix.
Known model and hardware numbers live in ``known``'s tables, each with where it came from;
facts learned by ``k3env verify`` about the image override them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from k3env.checks.argv import ParsedCommand, kv_transfer_config
from k3env.checks.engine_rules import engine_args
from k3env.checks.jobrules import job_cluster, job_ranks, job_tp_nvlink
from k3env.checks.known import (
    DYNAMO_TIKTOKEN,
    DYNAMO_TIKTOKEN_KNOWN_UNTIL,
    FRONTEND_ONLY_FLAGS,
    MODELS,
    OFFLOAD_DRAM_BUDGET_PERCENT,
    OUT_OF_POOL_WORKSPACE_GIB,
    SRT_FEATURES,
    VLLM_DEFAULT_GPU_MEMORY_UTILIZATION,
)
from k3env.checks.preflight import ERROR, WARNING, Context, Hit
from k3env.versions import in_range


@dataclass(frozen=True, kw_only=True)
class Rule:
    id: str
    title: str
    symptom: str
    components: str
    severity: str
    fix: str
    source: str
    check: Callable[[Context], Iterable[Hit]]
    applies_to: Mapping[str, str] = field(default_factory=dict)  # component -> version range

    def applies(self, ctx: Context) -> bool:
        """False only when a pinned version is known and outside the rule's range."""
        for component, spec in self.applies_to.items():
            if in_range(component_version(ctx, component), spec) is False:
                return False
        return True

    def explain(self) -> str:
        lines = [
            f"{self.id} ({self.severity}): {self.title}",
            f"  prevents:   {self.symptom}",
            f"  components: {self.components}",
            f"  fix:        {self.fix}",
            f"  source:     {self.source}",
        ]
        if self.applies_to:
            lines.insert(3, f"  versions:   {dict(self.applies_to)}")
        return "\n".join(lines)


def component_version(ctx: Context, component: str) -> str | None:
    """A component's version: verify's facts about the image first, then the lock."""
    fact = (ctx.facts or {}).get("versions", {}).get(component)
    if fact:
        return str(fact)
    if component == "dynamo" and ctx.lock.dynamo:
        return ctx.lock.dynamo.version
    if component == "srt-slurm" and ctx.lock.srt_slurm:
        return ctx.lock.srt_slurm.version.removeprefix("v")
    if component == "aiperf" and ctx.lock.aiperf:
        return ctx.lock.aiperf.version
    return None


def _model(ctx: Context) -> Mapping[str, Any]:
    return MODELS.get(ctx.profile.tokenizer_model_type or "", {})


def _float(value: str | bool | None, default: float) -> float:
    """A flag's number; the default where it is absent or not a number (vLLM's own parser,
    run by `k3env verify`, rejects the latter)."""
    try:
        return float(value) if isinstance(value, str) else default
    except ValueError:
        return default


def _int(value: str | bool | None, default: int) -> int:
    try:
        return int(value) if isinstance(value, str) else default
    except ValueError:
        return default


def _flag(cmd: ParsedCommand, name: str, alias: str) -> str | bool | None:
    """A flag's value by its name, else by vLLM's short alias (``-tp``, ``-pp``), which
    ``parse_options`` (long flags only) leaves in argv: read as the smoke plan reads it."""
    value = cmd.opt(name)
    if value is None and alias in cmd.argv[:-1]:
        return cmd.argv[cmd.argv.index(alias) + 1]
    return value


def _tp(cmd: ParsedCommand) -> int:
    return _int(_flag(cmd, "--tensor-parallel-size", "-tp"), 1)


def _ranks(cmd: ParsedCommand) -> int:
    return _tp(cmd) * _int(_flag(cmd, "--pipeline-parallel-size", "-pp"), 1)


def _expandable(ctx: Context) -> bool:
    conf = ctx.env.get("PYTORCH_CUDA_ALLOC_CONF", "")
    return "expandable_segments:true" in conf.replace(" ", "").lower()


def _connector(cmd: ParsedCommand) -> str | None:
    cfg = kv_transfer_config(cmd)
    return str(cfg.get("kv_connector")) if cfg and cfg.get("kv_connector") else None


# --- Rules ---------------------------------------------------------------------------------------
def parser_flag_spelling(ctx: Context) -> Iterable[Hit]:
    for cmd in ctx.commands:
        if cmd.role == "dynamo-worker":
            for flag in FRONTEND_ONLY_FLAGS:
                if cmd.has(flag):
                    yield Hit(
                        key=ctx.key(cmd),
                        message=(
                            f"`python -m dynamo.vllm` rejects the vLLM frontend-only flag {flag} "
                            "(unrecognized arguments): it is not an engine arg"
                        ),
                    )
            if ctx.profile.tool_call_parser and not cmd.has("--dyn-tool-call-parser"):
                yield Hit(
                    key=ctx.key(cmd),
                    severity=WARNING,
                    message=(
                        f"profile declares tool_call_parser {ctx.profile.tool_call_parser!r} "
                        "but the worker has no --dyn-tool-call-parser: tool calls stay unparsed"
                    ),
                )
        if cmd.role == "vllm-serve":
            for flag in cmd.options:
                if flag.startswith("--dyn-"):
                    yield Hit(
                        key=ctx.key(cmd),
                        message=f"`vllm serve` does not know the Dynamo flag {flag}",
                        fix=f"use the vLLM spelling ({flag.replace('--dyn-', '--')})",
                    )


def tokenizer_model_type(ctx: Context) -> Iterable[Hit]:
    model_type = ctx.profile.tokenizer_model_type
    if "dynamo-frontend" not in ctx.roles() or not model_type:
        return
    key = f"profiles.{ctx.profile.name}.tokenizer_model_type"
    known = ctx.fact("dynamo", "tiktoken_model_types", lacking="dynamo.tiktoken_model_types")
    if isinstance(known, list):
        if model_type not in known:
            yield Hit(
                key=key,
                message=(
                    f"the image's Dynamo frontend does not load tiktoken model_type {model_type!r} "
                    f"(it knows {sorted(known)}): the model never registers, every request 404s"
                ),
            )
        return
    version = component_version(ctx, "dynamo")
    needed = DYNAMO_TIKTOKEN.get(model_type)
    if version is None:
        yield Hit(key=key, severity=WARNING, message="the Dynamo version is unknown: run verify")
        return
    if needed is not None and in_range(version, needed):
        return
    if in_range(version, f"<={DYNAMO_TIKTOKEN_KNOWN_UNTIL}") or needed is not None:
        yield Hit(
            key=key,
            message=(
                f"Dynamo {version} (pinned) does not load tiktoken model_type {model_type!r}"
                + (f" (needs Dynamo {needed})" if needed else "")
                + ": the model never registers, every chat completion returns 404"
            ),
        )
        return
    yield Hit(
        key=key,
        severity=WARNING,
        message=f"no record of model_type {model_type!r} in Dynamo {version}: run k3env verify",
    )


def aiperf_session_control(ctx: Context) -> Iterable[Hit]:
    if "dynamo-frontend" not in ctx.roles() or ctx.lock.aiperf is None:
        return
    name = "AIPERF_USE_DYNAMO_CONV_AWARE_ROUTING"
    if ctx.bench_env.get(name) == "0":
        return
    where = ""
    if ctx.env.get(name) == "0":  # set, but where only the engine reads it
        where = (
            f" ({name}=0 is set for the engine only: the benchmark client's environment "
            "does not carry it)"
        )
    yield Hit(
        key=ctx.bench_key(name),
        message=(
            f"aiperf {ctx.lock.aiperf.version} sends nvext.session_control (conversation-aware "
            f"routing); the pinned Dynamo ({component_version(ctx, 'dynamo')}) removed that POC "
            f"field: every warmup request gets 400{where}"
        ),
    )


def gpu_memory_headroom(ctx: Context) -> Iterable[Hit]:
    model = _model(ctx)
    quant = model.get("moe_quant")
    if quant is None:
        return
    workspace = OUT_OF_POOL_WORKSPACE_GIB.get((ctx.cluster.gpu, str(quant)))
    if workspace is None:  # unmeasured is said, never passed as fine
        for cmd in ctx.engine_commands():
            yield Hit(
                key=ctx.key(cmd),
                severity=WARNING,
                message=(
                    f"no measured out-of-pool workspace for {quant} MoE on {ctx.cluster.gpu} "
                    f"(known: {', '.join(f'{g}/{q}' for g, q in OUT_OF_POOL_WORKSPACE_GIB)}): "
                    "the --gpu-memory-utilization headroom is unchecked on this cluster"
                ),
                fix="measure the first forward's free memory on this GPU and add it to "
                "OUT_OF_POOL_WORKSPACE_GIB (k3env/checks/known.py)",
            )
            return
        return
    need, what = workspace
    for cmd in ctx.engine_commands():
        raw = cmd.opt("--gpu-memory-utilization")
        util = _float(raw, VLLM_DEFAULT_GPU_MEMORY_UTILIZATION)
        if not (math.isfinite(util) and 0 < util <= 1):  # NaN would compare false: no hit
            yield Hit(
                key=ctx.key(cmd),
                message=f"--gpu-memory-utilization {raw} is not a fraction in (0, 1]",
                fix="write the share of GPU memory vLLM may use, e.g. 0.90",
            )
            continue
        free = (1 - util) * ctx.cluster.gpu_memory_gib - ctx.cluster.outside_pool_overhead_gib
        if free < need:
            overhead = need + ctx.cluster.outside_pool_overhead_gib
            ceiling = math.floor((1 - overhead / ctx.cluster.gpu_memory_gib) * 100) / 100
            yield Hit(
                key=ctx.key(cmd),
                message=(
                    f"--gpu-memory-utilization {util} leaves ~{free:.2f} GiB outside vLLM's pool "
                    f"on a {ctx.cluster.gpu_memory_gib:g} GiB {ctx.cluster.gpu}; the {what} needs "
                    f"~{need} GiB: CUDA OOM on the first forward"
                ),
                fix=f"lower --gpu-memory-utilization to at most {ceiling:.2f}",
            )


def allocator_fragmentation(ctx: Context) -> Iterable[Hit]:
    if not _model(ctx).get("mla") or _expandable(ctx):
        return
    # As the bring-up saw it: the Dynamo worker (#2355/#2358, 2.92 GiB at 0.90) and SimpleCPU
    # offload (#2370, 2.36 GiB) died of it; direct `vllm serve` with no connector served 24
    # minutes without it (#2359): a warning there, an error where it crashed.
    for cmd in ctx.engine_commands():
        connector = _connector(cmd)
        seen = (
            f" (seen with {connector}, #2370)"
            if connector
            else " (seen with the Dynamo worker at 0.90: a 2.92 GiB transient, #2355/#2358)"
            if cmd.role == "dynamo-worker"
            else ""
        )
        yield Hit(
            key="env.PYTORCH_CUDA_ALLOC_CONF",
            severity=ERROR if seen else WARNING,
            message=(
                "no PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: long-context MLA prefill "
                f"transients (2-3 GiB) can OOM with as much reserved-but-unallocated memory{seen}"
            ),
        )
        return


def retention_interval(ctx: Context) -> Iterable[Hit]:
    raw = ctx.env.get("VLLM_PREFIX_CACHE_RETENTION_INTERVAL")
    if raw is None:
        return
    block = ctx.fact("vllm", "scheduler_block_size", lacking="vllm.scheduler_block_size")
    if block is None:
        block = _model(ctx).get("scheduler_block_size")
    key = "env.VLLM_PREFIX_CACHE_RETENTION_INTERVAL"
    try:
        value = int(raw)
    except ValueError:
        yield Hit(key=key, message=f"{raw!r} is not an integer", fix="write an integer")
        return
    if block is None:
        yield Hit(
            key=key,
            severity=WARNING,
            message="the model's scheduler_block_size is unknown: the interval cannot be checked",
        )
        return
    if value < 0 or value % int(block):
        yield Hit(
            key=key,
            message=(
                f"VLLM_PREFIX_CACHE_RETENTION_INTERVAL ({value}) must be non-negative and a "
                f"multiple of scheduler_block_size ({block}): engine init hard-fails"
            ),
            fix=f"use 0 or a multiple of {block}",
        )


def cross_layer_blocks(ctx: Context) -> Iterable[Hit]:
    if not _model(ctx).get("hybrid"):
        return
    for cmd in ctx.engine_commands():
        cfg = kv_transfer_config(cmd) or {}
        extra = cfg.get("kv_connector_extra_config") or {}
        if extra.get("enable_cross_layers_blocks") is True:
            yield Hit(
                key=ctx.key(cmd),
                message=(
                    "enable_cross_layers_blocks on a hybrid (KDA + MLA) model: KV-cache init "
                    "crashes (\"shape '[64980, 64, 576]' is invalid for input of size 199618560\")"
                ),
            )


def simplecpu_needs_cumem(ctx: Context) -> Iterable[Hit]:
    if not _expandable(ctx):
        return
    for cmd in ctx.engine_commands():
        if _connector(cmd) == "SimpleCPUOffloadConnector" and not cmd.has(
            "--enable-cumem-allocator"
        ):
            yield Hit(
                key=ctx.key(cmd),
                message=(
                    "SimpleCPUOffloadConnector is incompatible with "
                    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True unless "
                    "enable_cumem_allocator is also enabled: vLLM refuses to start"
                ),
            )


def cumem_needs_no_custom_allreduce(ctx: Context) -> Iterable[Hit]:
    for cmd in ctx.engine_commands():
        tp = _tp(cmd)
        if (
            cmd.has("--enable-cumem-allocator")
            and tp > 1
            and not cmd.has("--disable-custom-all-reduce")
        ):
            yield Hit(
                key=ctx.key(cmd),
                message=(
                    "--enable-cumem-allocator with custom all-reduce (TP "
                    f"{tp}): CUDA-graph capture dies with custom_all_reduce.cuh:164 "
                    "'invalid argument' (the VMM allocator invalidates its IPC buffers)"
                ),
            )


def cpu_offload_dram(ctx: Context) -> Iterable[Hit]:
    for cmd in ctx.engine_commands():
        cfg = kv_transfer_config(cmd) or {}
        extra = cfg.get("kv_connector_extra_config") or {}
        per_rank = extra.get("cpu_bytes_to_use_per_rank")
        if not isinstance(per_rank, int | float) or isinstance(per_rank, bool):
            continue
        finite = isinstance(per_rank, int) or math.isfinite(per_rank)  # JSON allows NaN
        if not (finite and 0 <= per_rank < 2**63):
            yield Hit(
                key=ctx.key(cmd),
                message=f"cpu_bytes_to_use_per_rank {per_rank!r:.40} is not a finite byte count",
                fix="write the bytes of DRAM each rank may pin, e.g. 299875000000",
            )
            continue
        ranks = _ranks(cmd)
        nodes = max(1, math.ceil(ranks / ctx.cluster.gpus_per_node))
        per_node = math.ceil(ranks / nodes)
        total = int(per_rank) * per_node
        dram = round(ctx.cluster.dram_per_node_gb * 1e9)
        budget = dram * OFFLOAD_DRAM_BUDGET_PERCENT // 100  # integer bytes: no float edge
        if total > budget:
            yield Hit(
                key=ctx.key(cmd),
                severity=ERROR if total > dram else WARNING,
                message=(
                    f"cpu_bytes_to_use_per_rank {per_rank:,.0f} x {per_node} ranks/node = "
                    f"{total / 1e9:,.0f} GB of pinned DRAM; the node has "
                    f"{ctx.cluster.dram_per_node_gb:,.0f} GB (budget "
                    f"{OFFLOAD_DRAM_BUDGET_PERCENT}% = {budget / 1e9:,.0f} GB)"
                ),
                fix=f"use at most {math.floor(budget / per_node):,} bytes per rank",
            )


def pythonhashseed(ctx: Context) -> Iterable[Hit]:
    seed = ctx.env.get("PYTHONHASHSEED")
    if seed is not None and seed != "random":
        return
    for cmd in ctx.engine_commands():
        connector = _connector(cmd)
        if connector and _ranks(cmd) > 1:
            yield Hit(
                key="env.PYTHONHASHSEED",
                message=(
                    f"{connector} hashes KV block keys on every rank ({_ranks(cmd)} ranks): "
                    "without a fixed PYTHONHASHSEED the ranks disagree on block identity"
                ),
            )
            return


def srt_frontend(ctx: Context) -> Iterable[Hit]:
    if "vllm-serve" not in ctx.roles() or ctx.lock.srt_slurm is None:
        return
    srt = ctx.lock.srt_slurm
    version = srt.version.removeprefix("v")
    nodes = profile_nodes(ctx)
    needed = ["frontend.vllm"]
    if nodes > 1:
        needed.append("frontend.vllm.multinode")
    for feature in needed:
        if in_range(version, SRT_FEATURES[feature]):
            continue
        claims = [p for p in srt.patches if feature in p.provides]
        real = [
            p for p in claims if p.sha256 is not None and ctx.lock.resolve_path(p.file).is_file()
        ]
        if real:
            continue
        for p in claims:  # a patch that is not there provides nothing
            yield Hit(
                key=f"srt_slurm.patches[{p.index}]",
                file=str(ctx.lock.path),
                message=(
                    f"srt-slurm patch {p.label} ({p.file}) would provide {feature}, but it is "
                    f"{'unresolved (no sha256)' if p.sha256 is None else 'missing on disk'}: "
                    f"srt-slurm {srt.version} without it rejects this {nodes}-node profile"
                ),
                fix=(
                    f"write {p.file} ({'git format-patch ' + p.range if p.range else 'from its PR'}) "
                    "and record it with `k3env lock --update-hashes`; or pin srt-slurm "
                    f"{SRT_FEATURES[feature]}"
                ),
            )
        if not claims:
            yield Hit(
                key="srt_slurm.version",
                file=str(ctx.lock.path),
                message=(
                    f"srt-slurm {srt.version} has no {feature} (upstream {SRT_FEATURES[feature]}), "
                    f"and no pinned patch provides it; the profile runs on {nodes} node(s): "
                    "the recipe is rejected or runs single-node only"
                ),
            )


def dropped_patch(ctx: Context) -> Iterable[Hit]:
    """A container patch the lock pins for this image's base that the image does not carry:
    the code it fixes runs unfixed, so the crash is certain (the bring-up's first-decode crash
    came back so); a warning only where a job-start script k3env cannot see may apply it."""
    if not ctx.base_known:
        return
    for name, pin in ctx.lock.container_patches.items():
        if ctx.spec.base in pin.bases and name not in ctx.spec.patches:
            unseen = ""
            if ctx.setup_script:
                unseen = (
                    f" (unless the job's setup_script {ctx.setup_script}, run at every job "
                    "start, applies it: k3env cannot see what it does)"
                )
            yield Hit(
                key="patches",
                severity=WARNING if ctx.setup_script else None,
                message=(
                    f"container patch {name} is pinned for base {ctx.spec.base} but this image "
                    f"does not carry it: {pin.why}{unseen}"
                ),
                fix=f'add "{name}" to patches in {ctx.spec.path}, or drop the patch from the '
                "lock if the base no longer needs it",
            )


def profile_nodes(ctx: Context) -> int:
    """How many nodes the profile itself asks for: ``--nnodes`` where a command says so, else
    its ranks (TP x PP) over the cluster's GPUs per node."""
    nodes = 1
    for cmd in ctx.engine_commands():
        nnodes = cmd.opt("--nnodes")
        if isinstance(nnodes, str) and _int(nnodes, 0) > 0:
            nodes = max(nodes, _int(nnodes, 1))
        else:
            nodes = max(nodes, math.ceil(_ranks(cmd) / max(ctx.cluster.gpus_per_node, 1)))
    return nodes


def topology(ctx: Context) -> Iterable[Hit]:
    gpus = ctx.cluster.nodes * ctx.cluster.gpus_per_node
    for cmd in ctx.engine_commands():
        ranks = _ranks(cmd)
        nnodes = cmd.opt("--nnodes")
        if ranks > gpus:
            yield Hit(
                key=ctx.key(cmd),
                message=f"TP x PP = {ranks} ranks, but {ctx.cluster.name} has {gpus} GPUs",
            )
        n = _int(nnodes, 0) if isinstance(nnodes, str) else 0
        if n and n != ctx.cluster.nodes:
            yield Hit(key=ctx.key(cmd), message=_nodes_differ(ctx, ranks, n))


def _nodes_differ(ctx: Context, ranks: int, nnodes: int) -> str:
    """What differs when ``--nnodes`` is not the cluster's node count: the ranks each node
    must hold against its GPUs (a profile sized for another node), else the node count."""
    c = ctx.cluster
    per_node = math.ceil(ranks / nnodes)
    if per_node != c.gpus_per_node:
        need = math.ceil(ranks / max(c.gpus_per_node, 1))
        return (
            f"--nnodes {nnodes} puts TP x PP = {ranks} ranks {per_node} to a node, but a "
            f"{c.name} node has {c.gpus_per_node} {c.gpu} GPUs: the profile is sized for nodes "
            f"of {per_node} GPUs (on {c.name}: --nnodes {need}, {c.gpus_per_node} ranks a node)"
        )
    return f"--nnodes {nnodes}, but the cluster profile has {c.nodes} nodes of {c.gpus_per_node} {c.gpu} GPUs"


def image_platform(ctx: Context) -> Iterable[Hit]:
    """The image must exist for the cluster's platform: the base pins that platform's manifest
    (an aarch64 node importing an amd64 image fails at the first exec), and the lock has a
    twin to verify it on."""
    platform, name = ctx.cluster.platform, ctx.spec.base
    base = ctx.lock.bases.get(name)
    if base is not None and base.kind != "twin":
        # linux/arm64/v8 (a variant, as an index may name it) is the same machine.
        pinned = {"/".join(k.split("/")[:2]): v for k, v in base.platforms.items()}
        if platform not in pinned:
            yield Hit(
                key=f"bases.{name}.platforms",
                file=str(ctx.lock.path),
                message=(
                    f"{ctx.cluster.name} runs {platform} ({ctx.cluster.machine}), but base {name} "
                    f"pins only {', '.join(sorted(base.platforms))}: enroot would import an "
                    "image its nodes cannot execute (exec format error at job start)"
                ),
                fix=f'add [bases.{name}.platforms] "{platform}" = the digest of that manifest '
                f"(skopeo inspect --raw docker://{base.repository}:{base.tag})",
            )
        elif pinned[platform] is None:
            yield Hit(
                key=f"bases.{name}.platforms.{platform}",
                file=str(ctx.lock.path),
                severity=WARNING,
                message=(
                    f"base {name}'s {platform} manifest is unresolved: the {ctx.cluster.name} "
                    "image cannot be built or pulled by digest from this lock yet"
                ),
                fix=f"record it: skopeo inspect --raw docker://{base.repository}:{base.tag} (the "
                f"manifests[] entry whose platform is {platform})",
            )
    twin = ctx.lock.twin
    if twin is not None and platform not in twin.all_platforms:
        yield Hit(
            key="twin.platforms",
            file=str(ctx.lock.path),
            severity=WARNING,
            message=(
                f"the lock pins no CPU twin for {platform}: nothing verifies the "
                f"{ctx.cluster.name} image's parsers and registries before the run"
            ),
            fix=f'add [twin.platforms."{platform}"] and run `k3env twin --resolve --platform '
            f"{platform}`",
        )


def tp_nvlink(ctx: Context) -> Iterable[Hit]:
    if ctx.job is not None:  # a recipe: each role's TP, on the nodes the job asks for
        yield from job_tp_nvlink(ctx)
        return
    domain = ctx.cluster.nvlink_domain_gpus
    for cmd in ctx.engine_commands():
        tp = _tp(cmd)
        if tp > domain:
            yield Hit(
                key=ctx.key(cmd),
                message=(
                    f"--tensor-parallel-size {tp} spans more than one NVLink domain of "
                    f"{ctx.cluster.name} ({domain} GPUs): every layer's all-reduce crosses the "
                    "network"
                ),
                fix=f"keep TP within {domain} GPUs and span nodes with --pipeline-parallel-size",
            )


def enroot_digest(ctx: Context) -> Iterable[Hit]:
    """k3env names every image by its manifest digest (recipes, sbatch scripts): the nodes'
    enroot must take ``@sha256:`` references (3.5 does not: srt-slurm#385)."""
    enroot = ctx.cluster.runtime.get("enroot")
    if enroot is None:
        return
    if not in_range(enroot.version, ">=4.0"):
        yield Hit(
            key="runtime.enroot.version",
            message=(
                f"{ctx.cluster.name}'s enroot {enroot.version} rejects an image named by digest "
                "(`docker://REGISTRY#REPO@sha256:...`), the only way k3env names its images"
            ),
        )


RULES: tuple[Rule, ...] = (
    Rule(
        id="K3-PARSER-FLAGS",
        title="parser flags spelled for the process that reads them",
        symptom="dynamo-vllm worker exits: unrecognized arguments: --enable-auto-tool-choice --tool-call-parser",
        components="dynamo.vllm worker, vllm serve",
        severity=ERROR,
        fix="on the Dynamo worker use --dyn-tool-call-parser / --dyn-reasoning-parser; keep --tool-call-parser and --enable-auto-tool-choice for `vllm serve`",
        source="bring-up commit 2 (worker rejected the flags); commit 5 (dyn- spellings)",
        check=parser_flag_spelling,
    ),
    Rule(
        id="K3-TOKENIZER-MODEL-TYPE",
        title="the Dynamo frontend loads the tokenizer's model_type",
        symptom="engine serves, but the model never registers: every chat completion returns 404",
        components="Dynamo Rust frontend (tiktoken)",
        severity=ERROR,
        fix="pin a Dynamo that knows the model_type (kimi_k3: ba83080, v1.4.0-kimi-k3-dev.1), or serve with vllm serve",
        source="bring-up commit 3 (dynamo 1.2.1 rejects 'kimi_k3')",
        check=tokenizer_model_type,
    ),
    Rule(
        id="K3-AIPERF-SESSION-CONTROL",
        title="benchmark client options match the pinned Dynamo request schema",
        symptom="all warmup requests get 400 (nvext.session_control rejected)",
        components="aiperf, Dynamo frontend",
        severity=ERROR,
        fix="set AIPERF_USE_DYNAMO_CONV_AWARE_ROUTING=0 (the pinned Dynamo has no session_control field to bind a conversation to a worker)",
        source="bring-up commit 6 (fifth sweep)",
        check=aiperf_session_control,
        applies_to={"dynamo": ">=1.4.0.dev0"},
    ),
    Rule(
        id="K3-GPU-MEM-HEADROOM",
        title="gpu-memory-utilization leaves room for out-of-pool workspaces",
        symptom="CUDA OOM on the first forward (flashinfer trtllm MXFP4 MoE workspace ~1.6 GiB)",
        components="vLLM + flashinfer on the cluster's GPU",
        severity=ERROR,
        fix="lower --gpu-memory-utilization (0.90 on B200 for Kimi-K3)",
        source="bring-up: 0.95 -> 0.90 (#2359)",
        check=gpu_memory_headroom,
    ),
    Rule(
        id="K3-ALLOC-FRAGMENTATION",
        title="expandable_segments against allocator fragmentation",
        symptom="long-context MLA prefill OOMs on a 2-3 GiB transient while as much sits reserved-but-unallocated",
        components="PyTorch CUDA caching allocator",
        severity=WARNING,
        fix="set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (error when a KV offload connector is used)",
        source="dynamo-frontend variants (#2355/#2358), variant E (#2370)",
        check=allocator_fragmentation,
    ),
    Rule(
        id="K3-RETENTION-BLOCK",
        title="prefix-cache retention interval is a multiple of the scheduler block size",
        symptom="engine init hard-fails: VLLM_PREFIX_CACHE_RETENTION_INTERVAL (32768) must be ... a multiple of scheduler_block_size (3145728)",
        components="vLLM prefix cache, model scheduler_block_size",
        severity=ERROR,
        fix="use 0 or a multiple of the model's scheduler_block_size (Kimi-K3: 3145728)",
        source="bring-up #2359 (32768 rejected), #2372 (0)",
        check=retention_interval,
    ),
    Rule(
        id="K3-CROSS-LAYER-HYBRID",
        title="no cross-layer KV blocks on hybrid (KDA + MLA) models",
        symptom="KV-cache init crashes: shape '[64980, 64, 576]' is invalid for input of size 199618560",
        components="vLLM KV connector (cross-layer block folding)",
        severity=ERROR,
        fix='set "enable_cross_layers_blocks": false in kv_connector_extra_config',
        source="variant E (#2370)",
        check=cross_layer_blocks,
    ),
    Rule(
        id="K3-SIMPLECPU-CUMEM",
        title="SimpleCPUOffloadConnector + expandable_segments requires the cumem allocator",
        symptom="vLLM config validation refuses to start (torch's VMM allocator can remap KV under pinned connector memory)",
        components="vLLM SimpleCPUOffloadConnector, PyTorch allocator",
        severity=ERROR,
        fix="add --enable-cumem-allocator (and --disable-custom-all-reduce, K3-CUMEM-CUSTOM-AR)",
        source="variant F (#2372), eighth sweep",
        check=simplecpu_needs_cumem,
    ),
    Rule(
        id="K3-DROPPED-PATCH",
        title="every container patch pinned for the base is carried by the image",
        symptom="a fixed crash comes back: the first decode step dies in mamba_hybrid postprocess_state (IndexError: index_fill_ expects int64)",
        components="container patches (lock), image spec",
        severity=ERROR,
        fix="list the patch in the spec's patches, or drop it from the lock when the base has the fix",
        source="variant F (#2372), sixth sweep (the int64 index fix)",
        check=dropped_patch,
    ),
    Rule(
        id="K3-CUMEM-CUSTOM-AR",
        title="cumem allocator requires custom all-reduce off",
        symptom="CUDA-graph capture dies: custom_all_reduce.cuh:164 'invalid argument'",
        components="vLLM custom all-reduce, CuMemAllocator",
        severity=ERROR,
        fix="add --disable-custom-all-reduce (TP all-reduce falls back to NCCL)",
        source="variant F (#2372), ninth sweep",
        check=cumem_needs_no_custom_allreduce,
    ),
    Rule(
        id="K3-CPU-OFFLOAD-DRAM",
        title="CPU offload bytes per rank fit the node's DRAM",
        symptom="host OOM or pinned-memory allocation failure at KV-cache init",
        components="vLLM SimpleCPUOffloadConnector, node DRAM",
        severity=ERROR,
        fix="cpu_bytes_to_use_per_rank <= 0.80 x node DRAM / ranks per node (b200-dgxc: 299,875,000,000)",
        source="variant E (#2370)",
        check=cpu_offload_dram,
    ),
    Rule(
        id="K3-PYTHONHASHSEED",
        title="fixed PYTHONHASHSEED when KV blocks are hashed across ranks",
        symptom="ranks compute different block keys: offloaded/prefix blocks never hit, or mismatch across ranks",
        components="vLLM KV connector block hashing",
        severity=ERROR,
        fix="set PYTHONHASHSEED (e.g. 42) in the image env",
        source="variant E (#2370)",
        check=pythonhashseed,
    ),
    Rule(
        id="K3-SRT-FRONTEND",
        title="srt-slurm frontend type supported by the pinned srt-slurm and node count",
        symptom="srtctl rejects frontend.type: vllm, or PR #278 runs it single-node only",
        components="srt-slurm",
        severity=ERROR,
        fix="pin srt-slurm >= v1.0.49, or carry PR #278 plus the multi-node patch (provides = [...])",
        source="variant D (#2359)",
        check=srt_frontend,
    ),
    Rule(
        id="K3-TOPOLOGY",
        title="TP x PP and --nnodes fit the cluster profile",
        symptom="ranks wait forever for peers, or the launcher cannot place them",
        components="vLLM parallel config, cluster",
        severity=ERROR,
        fix="match --tensor-parallel-size x --pipeline-parallel-size and --nnodes to the cluster",
        source="TP8 x PP2 on 2 x 8 B200",
        check=topology,
    ),
    Rule(
        id="K3-ENGINE-ARGS",
        title="every flag, parser name and VLLM_ name is one the engine's own parser takes",
        symptom="vllm serve exits 2 (unrecognized arguments), or refuses at server setup "
        "(invalid tool call parser / reasoning parser not found)",
        components="vLLM's CLI parser, tool-call and reasoning parser registries, env registry",
        severity=ERROR,
        fix="spell each flag and name as the image's vLLM takes it (the finding quotes its words)",
        source="issue #53 (mutations of F that passed in silence); vLLM's own parser, recorded",
        check=engine_args,
    ),
    Rule(
        id="K3-JOB-RANKS",
        title="each worker's TP x PP x DP is the GPUs the recipe gives it",
        symptom="16 ranks on a node of 8 GPUs: the worker never starts (or GPUs sit idle)",
        components="srt-slurm resources (nodes, workers, gpus_per_node), vLLM parallel sizes",
        severity=ERROR,
        fix="size the role's nodes x gpus_per_node / workers to TP x PP x DP (or write "
        "gpus_per_<role>); leave --nnodes to srt-slurm",
        source="TP8 x PP2 on 2 x 8 B200 (the bring-up); srt-slurm ResourceConfig.gpus_per_<role>",
        check=job_ranks,
    ),
    Rule(
        id="K3-JOB-CLUSTER",
        title="the recipe's gpu_type, gpus_per_node and nodes are the cluster profile's",
        symptom="Slurm cannot give --gpus-per-node, or every verdict is for another machine",
        components="srt-slurm resources, cluster profile",
        severity=ERROR,
        fix="write the cluster's gpu_type and gpus_per_node, or judge with --cluster for the "
        "machine the recipe was written for",
        source="b200-dgxc (8 B200 a node) beside gb200-nvl72 (4 a node) recipes",
        check=job_cluster,
    ),
    Rule(
        id="K3-IMAGE-PLATFORM",
        title="the image exists, and is verified, for the cluster's platform",
        symptom="aarch64 (Grace) nodes import an amd64 image: exec format error at job start",
        components="lock bases (index + per-platform manifests), CPU twin, cluster profile",
        severity=ERROR,
        fix="pin the base's manifest for the cluster's platform, build and verify with "
        "--platform, and name that manifest's digest in the recipe (`k3env srt recipe` does)",
        source="GB200/GB300 paths beside B200 (the bring-up's AgentX recipes); issue #16",
        check=image_platform,
    ),
    Rule(
        id="K3-TP-NVLINK",
        title="the tensor-parallel group fits one NVLink domain",
        symptom="decode throughput collapses: every layer's TP all-reduce goes over InfiniBand",
        components="vLLM tensor parallel, NCCL, cluster NVLink domain",
        severity=WARNING,
        fix="TP within the NVLink domain (8 on DGX B200, 72 on GB200/GB300 NVL72); PP across",
        source="TP8 x PP2 chosen for 2 x 8 B200 (TP inside a node, PP across)",
        check=tp_nvlink,
    ),
    Rule(
        id="K3-ENROOT-DIGEST",
        title="the nodes' enroot imports an image by digest",
        symptom="pyxis: enroot import fails on `@sha256:` at job start (enroot 3.5)",
        components="enroot on the nodes (cluster profile [runtime.enroot]), k3env recipes",
        severity=ERROR,
        fix="run enroot >= 4.0 on the nodes (the cluster profiles pin 4.1.2), or stage the "
        "exported .sqsh and name it by path",
        source="srt-slurm#385 (enroot 3.5 and digest references)",
        check=enroot_digest,
    ),
)
RULES_BY_ID: Mapping[str, Rule] = {r.id: r for r in RULES}
