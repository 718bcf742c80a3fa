"""Each preflight rule's verdict, hit by hit: the key it points at, its severity, the message
and fix the user reads, its boundaries (the first value that trips, the last that passes) and
which commands it judges. Contexts are the committed lock, specs and clusters with one thing
changed (tests/rules_context.py)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

import pytest

from k3env.checks import rules
from k3env.checks.preflight import ERROR, WARNING, Context, Hit
from k3env.checks.rules import RULES_BY_ID, Rule, component_version
from k3env.config.cluster import RuntimePin
from k3env.config.pins import Lock, TwinPin

from .rules_context import FRONTEND, committed_lock, context, key, kv, serve, worker

DYN = "kimi-k3-dynamo"
OFFLOAD = "SimpleCPUOffloadConnector"
GPU_UTIL = "--gpu-memory-utilization"
TP, PP = "--tensor-parallel-size", "--pipeline-parallel-size"


def hits(check: Callable[[Context], Iterable[Hit]], ctx: Context) -> list[Hit]:
    return list(check(ctx))


# --- Rule --------------------------------------------------------------------------------------
def probe_rule(**applies_to: str) -> Rule:
    return Rule(
        id="K3-PROBE",
        title="a title",
        symptom="a symptom",
        components="a component",
        severity=WARNING,
        fix="a fix",
        source="a source",
        check=lambda ctx: (),
        applies_to=applies_to,
    )


def test_a_rule_applies_unless_a_known_version_is_outside_its_range() -> None:
    aiperf = RULES_BY_ID["K3-AIPERF-SESSION-CONTROL"]  # dynamo >=1.4.0.dev0
    assert aiperf.applies(context()) is True  # the lock's 1.6.1
    assert aiperf.applies(context(facts={"versions": {"dynamo": "1.4.0.dev0"}})) is True
    assert aiperf.applies(context(facts={"versions": {"dynamo": "1.2.1"}})) is False
    # Unknown is not outside: the rule runs.
    assert aiperf.applies(context(lock=replace(committed_lock(), dynamo=None))) is True
    assert RULES_BY_ID["K3-TOPOLOGY"].applies(context(facts={"versions": {"dynamo": "0.1"}}))
    # Every range must hold, whichever comes first.
    ctx = context()  # dynamo 1.6.1, aiperf 0.13.0
    assert probe_rule(dynamo=">=1.0", aiperf=">=0.13").applies(ctx) is True
    assert probe_rule(dynamo=">=1.0", aiperf="<0.13").applies(ctx) is False
    assert probe_rule(aiperf="<0.13", dynamo=">=1.0").applies(ctx) is False
    assert probe_rule(vllm="<0.1", dynamo=">=1.0").applies(ctx) is True


def test_explain_names_the_versions_only_where_the_rule_has_a_range() -> None:
    assert probe_rule().explain() == (
        "K3-PROBE (warning): a title\n"
        "  prevents:   a symptom\n"
        "  components: a component\n"
        "  fix:        a fix\n"
        "  source:     a source"
    )
    assert probe_rule(dynamo=">=1.4").explain() == (
        "K3-PROBE (warning): a title\n"
        "  prevents:   a symptom\n"
        "  components: a component\n"
        "  versions:   {'dynamo': '>=1.4'}\n"
        "  fix:        a fix\n"
        "  source:     a source"
    )


def test_component_versions_come_from_verify_facts_then_the_lock() -> None:
    no_facts: tuple[dict[str, Any] | None, ...] = (
        None,
        {},
        {"dynamo": {}},
        {"versions": {"srt-slurm": ""}},
    )
    for facts in no_facts:
        ctx = context(facts=facts)
        assert component_version(ctx, "dynamo") == "1.6.1"
        assert component_version(ctx, "srt-slurm") == "1.0.36"  # the tag's v dropped
        assert component_version(ctx, "aiperf") == "0.13.0"
        assert component_version(ctx, "vllm") is None
    ctx = context(facts={"versions": {"dynamo": "1.5.0", "aiperf": 0.14, "vllm": "0.31.0"}})
    assert component_version(ctx, "dynamo") == "1.5.0"
    assert component_version(ctx, "aiperf") == "0.14"
    assert component_version(ctx, "vllm") == "0.31.0"
    bare = context(lock=replace(committed_lock(), dynamo=None, srt_slurm=None, aiperf=None))
    assert [component_version(bare, c) for c in ("dynamo", "srt-slurm", "aiperf")] == [None] * 3


# --- K3-PARSER-FLAGS ---------------------------------------------------------------------------
def test_a_dynamo_worker_given_frontend_parser_flags_fails_each() -> None:
    bad = worker("--enable-auto-tool-choice", "--tool-call-parser", "kimi_k3")
    assert hits(rules.parser_flag_spelling, context(FRONTEND, bad, spec=DYN)) == [
        Hit(
            key=key(1),
            message=f"`python -m dynamo.vllm` rejects the vLLM frontend-only flag {flag} "
            "(unrecognized arguments): it is not an engine arg",
        )
        for flag in ("--tool-call-parser", "--enable-auto-tool-choice")
    ] + [
        Hit(
            key=key(1),
            severity=WARNING,
            message="profile declares tool_call_parser 'kimi_k3' but the worker has no "
            "--dyn-tool-call-parser: tool calls stay unparsed",
        )
    ]
    good = worker("--dyn-tool-call-parser", "kimi_k3")
    assert hits(rules.parser_flag_spelling, context(FRONTEND, good, spec=DYN)) == []
    unparsed = context(worker(), spec=DYN, profile={"tool_call_parser": None})
    assert hits(rules.parser_flag_spelling, unparsed) == []


def test_vllm_serve_given_dynamo_parser_flags_fails_each_with_its_spelling() -> None:
    cmd = serve("--dyn-tool-call-parser", "a", "--dynamo", "--dyn-reasoning-parser", "b")
    assert hits(rules.parser_flag_spelling, context(cmd)) == [
        Hit(
            key=key(0),
            message="`vllm serve` does not know the Dynamo flag --dyn-tool-call-parser",
            fix="use the vLLM spelling (--tool-call-parser)",
        ),
        Hit(
            key=key(0),
            message="`vllm serve` does not know the Dynamo flag --dyn-reasoning-parser",
            fix="use the vLLM spelling (--reasoning-parser)",
        ),
    ]
    # The frontend-only flags are vllm serve's own; the tool-parser warning is the worker's.
    assert hits(rules.parser_flag_spelling, context(serve("--tool-call-parser", "x"))) == []


# --- K3-TOKENIZER-MODEL-TYPE -------------------------------------------------------------------
TOKENIZER_KEY = "profiles.agg.tokenizer_model_type"


def tokenizer(
    model_type: str | None = "kimi_k3", dynamo: str | None = None, **facts: object
) -> list[Hit]:
    """The rule's hits on the Dynamo spec with ``model_type``, the lock's Dynamo (or verify's
    fact ``dynamo``), and ``facts`` (verify's ``dynamo`` facts)."""
    learned: dict[str, object] = {"dynamo": facts} if facts else {}
    if dynamo is not None:
        learned["versions"] = {"dynamo": dynamo}
    ctx = context(
        FRONTEND, worker(), spec=DYN, facts=learned, profile={"tokenizer_model_type": model_type}
    )
    return hits(rules.tokenizer_model_type, ctx)


def test_the_frontend_loads_the_model_type_the_pinned_dynamo_knows() -> None:
    assert tokenizer() == []  # 1.6.1
    assert tokenizer(dynamo="1.4.0") == []
    assert tokenizer(model_type=None, dynamo="1.2.1") == []
    no_frontend = context(worker(), spec=DYN, facts={"versions": {"dynamo": "1.2.1"}})
    assert hits(rules.tokenizer_model_type, no_frontend) == []
    ctx = context(FRONTEND, spec=DYN)
    assert hits(rules.tokenizer_model_type, ctx) == []
    assert ctx.lacked == {"dynamo.tiktoken_model_types"}


def test_a_dynamo_too_old_for_the_model_type_is_an_error_naming_the_one_needed() -> None:
    def pinned(version: str, model_type: str, needs: str) -> Hit:
        return Hit(
            key=TOKENIZER_KEY,
            message=f"Dynamo {version} (pinned) does not load tiktoken model_type "
            f"{model_type!r}{needs}: the model never registers, every chat completion returns 404",
        )

    needs = " (needs Dynamo >=1.4.0.dev1)"
    assert tokenizer(dynamo="1.2.1") == [pinned("1.2.1", "kimi_k3", needs)]
    assert tokenizer(dynamo="1.4.0.dev0") == [pinned("1.4.0.dev0", "kimi_k3", needs)]
    # A model_type no table knows: an error where the table is complete (<= 1.2.1) ...
    assert tokenizer("mystery", dynamo="1.2.1") == [pinned("1.2.1", "mystery", "")]
    # ... above it, only that nothing is known.
    assert tokenizer("mystery", dynamo="1.2.2") == [
        Hit(
            key=TOKENIZER_KEY,
            severity=WARNING,
            message="no record of model_type 'mystery' in Dynamo 1.2.2: run k3env verify",
        )
    ]
    unknown = context(FRONTEND, spec=DYN, lock=replace(committed_lock(), dynamo=None))
    assert hits(rules.tokenizer_model_type, unknown) == [
        Hit(
            key=TOKENIZER_KEY, severity=WARNING, message="the Dynamo version is unknown: run verify"
        )
    ]


def test_the_images_own_tiktoken_list_outranks_the_version_tables() -> None:
    assert tokenizer(dynamo="1.2.1", tiktoken_model_types=["kimi_k3"]) == []
    assert tokenizer(tiktoken_model_types=["kimi_k2", "kimi"]) == [
        Hit(
            key=TOKENIZER_KEY,
            message="the image's Dynamo frontend does not load tiktoken model_type 'kimi_k3' "
            "(it knows ['kimi', 'kimi_k2']): the model never registers, every request 404s",
        )
    ]
    # Not a list: the versions judge.
    assert tokenizer(dynamo="1.6.1", tiktoken_model_types="kimi") == []


# --- K3-AIPERF-SESSION-CONTROL -----------------------------------------------------------------
ROUTING = "AIPERF_USE_DYNAMO_CONV_AWARE_ROUTING"
SESSION_CONTROL = (
    "aiperf 0.13.0 sends nvext.session_control (conversation-aware routing); the pinned Dynamo "
    "(1.6.1) removed that POC field: every warmup request gets 400"
)


def test_aiperf_session_control_needs_the_routing_off_in_the_clients_env() -> None:
    def judge(env: dict[str, str], **fields: Any) -> list[Hit]:
        return hits(
            rules.aiperf_session_control, context(FRONTEND, worker(), spec=DYN, env=env, **fields)
        )

    assert judge({ROUTING: "0"}) == []
    for env in ({}, {ROUTING: "1"}):
        assert judge(env) == [Hit(key=f"env.{ROUTING}", message=SESSION_CONTROL)]
    # A recipe: the client's env is its own, and so is the key that sets it.
    recipe = {"client_env_key": lambda name: f"benchmark.env.{name}"}
    assert judge({}, client_env={ROUTING: "0"}, **recipe) == []
    assert judge({ROUTING: "0"}, client_env={}, **recipe) == [
        Hit(
            key=f"benchmark.env.{ROUTING}",
            message=SESSION_CONTROL + f" ({ROUTING}=0 is set for the engine only: the benchmark "
            "client's environment does not carry it)",
        )
    ]
    assert judge({}, lock=replace(committed_lock(), aiperf=None)) == []
    assert hits(rules.aiperf_session_control, context(worker(), spec=DYN)) == []


# --- K3-GPU-MEM-HEADROOM -----------------------------------------------------------------------
def oom(util: str, free: str, ceiling: str, memory: str = "178") -> Hit:
    return Hit(
        key=key(0),
        message=f"--gpu-memory-utilization {util} leaves ~{free} GiB outside vLLM's pool on a "
        f"{memory} GiB B200; the flashinfer trtllm MXFP4 MoE runtime workspace needs ~1.6 GiB: "
        "CUDA OOM on the first forward",
        fix=f"lower --gpu-memory-utilization to at most {ceiling}",
    )


def test_gpu_memory_utilization_must_leave_the_moe_workspace_free() -> None:
    # b200-dgxc: 178 GiB, 7.55 GiB outside the pool whatever the utilization.
    assert hits(rules.gpu_memory_headroom, context(serve(GPU_UTIL, "0.90"))) == []
    assert hits(rules.gpu_memory_headroom, context(serve(GPU_UTIL, "0.95"))) == [
        oom("0.95", "1.35", "0.94")
    ]
    assert hits(rules.gpu_memory_headroom, context(serve(GPU_UTIL, "1"))) == [
        oom("1.0", "-7.55", "0.94")
    ]
    # Exactly the workspace free passes: 0.5 x 3.2 GiB, nothing else outside the pool.
    exact = {"gpu_memory_gib": 3.2, "outside_pool_overhead_gib": 0.0}
    assert hits(rules.gpu_memory_headroom, context(serve(GPU_UTIL, "0.5"),
                                                   cluster_fields=exact)) == []  # fmt: skip
    # No flag (or no number): vLLM's default 0.9, which an 8 GiB GPU cannot spare.
    small = {"gpu_memory_gib": 8, "outside_pool_overhead_gib": 0.0}
    for cmd in (serve(), serve(GPU_UTIL, "most"), serve(GPU_UTIL, "--enforce-eager")):
        assert hits(rules.gpu_memory_headroom, context(cmd, cluster_fields=small)) == [
            oom("0.9", "0.80", "0.80", memory="8")
        ]
    assert hits(rules.gpu_memory_headroom, context(serve(GPU_UTIL, "most"))) == []
    # A model without a MoE quantization has nothing to check.
    for model_type in (None, "kimi"):
        ctx = context(serve(GPU_UTIL, "0.99"), profile={"tokenizer_model_type": model_type})
        assert hits(rules.gpu_memory_headroom, ctx) == []


def test_a_gpu_memory_utilization_outside_zero_to_one_is_named_and_the_next_still_judged() -> None:
    for raw in ("0", "-0.5", "1.01", "nan", "inf"):
        ctx = context(serve(GPU_UTIL, raw), serve(GPU_UTIL, "0.95"))
        assert hits(rules.gpu_memory_headroom, ctx) == [
            Hit(
                key=key(0),
                message=f"--gpu-memory-utilization {raw} is not a fraction in (0, 1]",
                fix="write the share of GPU memory vLLM may use, e.g. 0.90",
            ),
            replace(oom("0.95", "1.35", "0.94"), key=key(1)),
        ]


def test_an_unmeasured_gpu_is_said_once_never_passed() -> None:
    ctx = context(FRONTEND, serve(GPU_UTIL, "0.5"), serve(), cluster="gb200-nvl72")
    assert hits(rules.gpu_memory_headroom, ctx) == [
        Hit(
            key=key(1),
            severity=WARNING,
            message="no measured out-of-pool workspace for mxfp4 MoE on GB200 (known: "
            "B200/mxfp4): the --gpu-memory-utilization headroom is unchecked on this cluster",
            fix="measure the first forward's free memory on this GPU and add it to "
            "OUT_OF_POOL_WORKSPACE_GIB (k3env/checks/known.py)",
        )
    ]
    assert hits(rules.gpu_memory_headroom, context(FRONTEND, cluster="gb200-nvl72")) == []


def test_an_unmeasured_gpu_names_every_measured_one(monkeypatch: pytest.MonkeyPatch) -> None:
    measured = {("B200", "mxfp4"): (1.6, "a"), ("H200", "mxfp4"): (1.2, "b")}
    monkeypatch.setattr(rules, "OUT_OF_POOL_WORKSPACE_GIB", measured)
    (hit,) = hits(rules.gpu_memory_headroom, context(serve(), cluster="gb200-nvl72"))
    assert "on GB200 (known: B200/mxfp4, H200/mxfp4): the" in hit.message


# --- K3-ALLOC-FRAGMENTATION --------------------------------------------------------------------
FRAGMENTATION = (
    "no PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: long-context MLA prefill transients "
    "(2-3 GiB) can OOM with as much reserved-but-unallocated memory"
)


def test_fragmentation_is_an_error_where_it_crashed_and_a_warning_elsewhere() -> None:
    def judge(*commands: tuple[str, tuple[str, ...]], **fields: Any) -> list[Hit]:
        return hits(rules.allocator_fragmentation, context(*commands, **fields))

    alloc = "env.PYTORCH_CUDA_ALLOC_CONF"
    assert judge(serve(), serve("--kv-transfer-config", kv(OFFLOAD))) == [
        Hit(key=alloc, severity=WARNING, message=FRAGMENTATION)  # once, for the first
    ]
    assert judge(serve("--kv-transfer-config", kv(OFFLOAD)), serve()) == [
        Hit(key=alloc, severity=ERROR, message=FRAGMENTATION + f" (seen with {OFFLOAD}, #2370)")
    ]
    assert judge(FRONTEND, worker(), spec=DYN) == [
        Hit(
            key=alloc,
            severity=ERROR,
            message=FRAGMENTATION + " (seen with the Dynamo worker at 0.90: a 2.92 GiB "
            "transient, #2355/#2358)",
        )
    ]
    assert judge(FRONTEND) == []
    assert judge(serve(), profile={"tokenizer_model_type": None}) == []  # no MLA known


def test_expandable_segments_is_read_as_pytorch_reads_it() -> None:
    for conf in ("expandable_segments:True", "max_split_size_mb:512, Expandable_Segments : TRUE"):
        ctx = context(serve(), env={"PYTORCH_CUDA_ALLOC_CONF": conf})
        assert hits(rules.allocator_fragmentation, ctx) == []
    ctx = context(serve(), env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"})
    assert len(hits(rules.allocator_fragmentation, ctx)) == 1


# --- K3-RETENTION-BLOCK ------------------------------------------------------------------------
RETENTION = "VLLM_PREFIX_CACHE_RETENTION_INTERVAL"


def retention(raw: str | None, **fields: Any) -> tuple[list[Hit], set[str]]:
    ctx = context(serve(), env={} if raw is None else {RETENTION: raw}, **fields)
    return hits(rules.retention_interval, ctx), ctx.lacked


def not_a_multiple(value: int, block: int) -> Hit:
    return Hit(
        key=f"env.{RETENTION}",
        message=f"VLLM_PREFIX_CACHE_RETENTION_INTERVAL ({value}) must be non-negative and a "
        f"multiple of scheduler_block_size ({block}): engine init hard-fails",
        fix=f"use 0 or a multiple of {block}",
    )


def test_the_retention_interval_is_zero_or_a_multiple_of_the_block() -> None:
    assert retention(None) == ([], set())
    for ok in ("0", "3145728", "6291456"):
        assert retention(ok) == ([], {"vllm.scheduler_block_size"})
    for bad in (32768, -3145728, -1):
        assert retention(str(bad)) == ([not_a_multiple(bad, 3145728)],
                                       {"vllm.scheduler_block_size"})  # fmt: skip
    # verify's fact about the image outranks the model table.
    learned = {"facts": {"vllm": {"scheduler_block_size": 64}}}
    assert retention("32768", **learned) == ([], set())
    assert retention("100", **learned) == ([not_a_multiple(100, 64)], set())


def test_a_retention_interval_that_cannot_be_checked_is_said() -> None:
    key_ = f"env.{RETENTION}"
    assert retention("32k")[0] == [
        Hit(key=key_, message="'32k' is not an integer", fix="write an integer")
    ]
    unknown = {"profile": {"tokenizer_model_type": None}}
    assert retention("32768", **unknown)[0] == [
        Hit(
            key=key_,
            severity=WARNING,
            message="the model's scheduler_block_size is unknown: the interval cannot be checked",
        )
    ]
    assert retention("32k", **unknown)[0][0].message == "'32k' is not an integer"


# --- K3-CROSS-LAYER-HYBRID ---------------------------------------------------------------------
def test_cross_layer_blocks_on_a_hybrid_model_fail_each_command() -> None:
    on = serve("--kv-transfer-config", kv(OFFLOAD, enable_cross_layers_blocks=True))
    crash = (
        "enable_cross_layers_blocks on a hybrid (KDA + MLA) model: KV-cache init crashes "
        "(\"shape '[64980, 64, 576]' is invalid for input of size 199618560\")"
    )
    assert hits(rules.cross_layer_blocks, context(on, on)) == [
        Hit(key=key(0), message=crash),
        Hit(key=key(1), message=crash),
    ]
    for value in (False, "true", 1):
        off = serve("--kv-transfer-config", kv(OFFLOAD, enable_cross_layers_blocks=value))
        assert hits(rules.cross_layer_blocks, context(off)) == []
    null = serve("--kv-transfer-config", '{"kv_connector_extra_config": null}')
    assert hits(rules.cross_layer_blocks, context(null, serve())) == []
    assert hits(rules.cross_layer_blocks,
                context(on, profile={"tokenizer_model_type": None})) == []  # fmt: skip


# --- K3-SIMPLECPU-CUMEM / K3-CUMEM-CUSTOM-AR ---------------------------------------------------
def test_simplecpu_offload_with_expandable_segments_needs_cumem() -> None:
    expandable = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    offload = serve("--kv-transfer-config", kv(OFFLOAD))
    refused = Hit(
        key=key(1),
        message="SimpleCPUOffloadConnector is incompatible with "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True unless enable_cumem_allocator is "
        "also enabled: vLLM refuses to start",
    )
    ctx = context(serve(), offload, offload, env=expandable)
    assert hits(rules.simplecpu_needs_cumem, ctx) == [refused, replace(refused, key=key(2))]
    cumem = serve("--kv-transfer-config", kv(OFFLOAD), "--enable-cumem-allocator")
    assert hits(rules.simplecpu_needs_cumem, context(cumem, env=expandable)) == []
    other = serve("--kv-transfer-config", kv("NixlConnector"))
    assert hits(rules.simplecpu_needs_cumem, context(other, env=expandable)) == []
    assert hits(rules.simplecpu_needs_cumem, context(offload)) == []


def test_cumem_with_tensor_parallel_needs_custom_all_reduce_off() -> None:
    def judge(*flags: str) -> list[Hit]:
        return hits(rules.cumem_needs_no_custom_allreduce, context(serve(*flags)))

    assert judge("--enable-cumem-allocator", TP, "2") == [
        Hit(
            key=key(0),
            message="--enable-cumem-allocator with custom all-reduce (TP 2): CUDA-graph capture "
            "dies with custom_all_reduce.cuh:164 'invalid argument' (the VMM allocator "
            "invalidates its IPC buffers)",
        )
    ]
    assert judge("--enable-cumem-allocator", TP, "1") == []
    assert judge("--enable-cumem-allocator") == []  # TP 1
    assert judge("--enable-cumem-allocator", TP, "2", "--disable-custom-all-reduce") == []
    assert judge(TP, "8") == []


# --- K3-CPU-OFFLOAD-DRAM -----------------------------------------------------------------------
def offload_serve(per_rank: object, *flags: str) -> tuple[str, tuple[str, ...]]:
    config = kv(OFFLOAD, cpu_bytes_to_use_per_rank=per_rank)
    return serve(*flags, "--kv-transfer-config", config)


TP8PP2 = (TP, "8", PP, "2")


def dram(per_rank: str, per_node: int, total: str, node: str, budget: str, most: str) -> str:
    return (
        f"cpu_bytes_to_use_per_rank {per_rank} x {per_node} ranks/node = {total} GB of pinned "
        f"DRAM; the node has {node} GB (budget 80% = {budget} GB)|use at most {most} bytes per rank"
    )


def dram_hits(*commands: tuple[str, tuple[str, ...]], **fields: Any) -> list[str]:
    """Each hit as 'severity: message|fix'."""
    return [
        f"{h.severity}: {h.message}|{h.fix}"
        for h in hits(rules.cpu_offload_dram, context(*commands, **fields))
    ]


def test_offload_bytes_per_rank_fit_the_nodes_dram_budget() -> None:
    # b200-dgxc: 2,998.75 GB a node, budget 80% = 2,399,000,000,000 B, 8 ranks a node.
    assert dram_hits(offload_serve(299_875_000_000, *TP8PP2)) == []
    assert dram_hits(offload_serve(299_875_000_001, *TP8PP2)) == [
        "warning: " + dram("299,875,000,001", 8, "2,399", "2,999", "2,399", "299,875,000,000")
    ]
    assert dram_hits(offload_serve(374_843_750_000, *TP8PP2)) == [  # the whole node
        "warning: " + dram("374,843,750,000", 8, "2,999", "2,999", "2,399", "299,875,000,000")
    ]
    assert dram_hits(offload_serve(374_843_750_001, *TP8PP2)) == [
        "error: " + dram("374,843,750,001", 8, "2,999", "2,999", "2,399", "299,875,000,000")
    ]
    assert dram_hits(offload_serve(3e11, *TP8PP2)) == [  # JSON floats are bytes too
        "warning: " + dram("300,000,000,000", 8, "2,400", "2,999", "2,399", "299,875,000,000")
    ]
    # TP4 fits one node: 4 ranks share its DRAM; TP4 x PP3 spans 2 nodes, 6 ranks a node.
    assert dram_hits(offload_serve(600_000_000_000, TP, "4")) == [
        "warning: " + dram("600,000,000,000", 4, "2,400", "2,999", "2,399", "599,750,000,000")
    ]
    assert dram_hits(offload_serve(400_000_000_000, TP, "4", PP, "3")) == [
        "warning: " + dram("400,000,000,000", 6, "2,400", "2,999", "2,399", "399,833,333,333")
    ]


def test_offload_bytes_that_are_not_a_byte_count_are_named() -> None:
    def invalid(shown: str) -> str:
        return (
            f"None: cpu_bytes_to_use_per_rank {shown} is not a finite byte count|"
            "write the bytes of DRAM each rank may pin, e.g. 299875000000"
        )

    over = offload_serve(10**12, *TP8PP2)
    for value, shown in ((math.nan, "nan"), (math.inf, "inf"), (-1, "-1"), (-0.5, "-0.5"),
                         (2**63, "9223372036854775808"), (10**50, "1" + "0" * 39)):  # fmt: skip
        first, second = dram_hits(offload_serve(value, *TP8PP2), over)
        assert first == invalid(shown)  # the rule's own severity: an error
        assert second.startswith("error: cpu_bytes_to_use_per_rank 1,000,000,000,000 x 8")
    # The largest byte count is judged as one.
    (largest,) = dram_hits(offload_serve(2**63 - 1, *TP8PP2))
    assert largest.startswith("error: cpu_bytes_to_use_per_rank 9,223,372,036,854,775,8")
    assert " x 8 ranks/node = 73,786,976,295 GB of pinned DRAM" in largest
    # Not a number at all (a string, a switch): not this rule's to judge.
    tiny = {"cluster_fields": {"dram_per_node_gb": 1e-9}}  # 1 byte a node, a budget of 0
    assert dram_hits(offload_serve(1), **tiny) == ["warning: " + dram("1", 1, "0", "0", "0", "0")]
    for value in (True, "1", None):  # type: ignore[assignment]
        assert dram_hits(offload_serve(value), **tiny) == []
    assert dram_hits(offload_serve(0), **tiny) == []
    assert dram_hits(serve("--kv-transfer-config", '{"kv_connector_extra_config": null}'),
                     serve(), **tiny) == []  # fmt: skip


def test_each_offloading_command_is_judged_at_its_own_key() -> None:
    ctx = context(
        serve(),
        offload_serve("all of it"),
        offload_serve(-1),
        offload_serve(10**12, *TP8PP2),
    )
    found = hits(rules.cpu_offload_dram, ctx)
    assert [(h.key, h.severity) for h in found] == [(key(2), None), (key(3), ERROR)]


def test_the_offload_budget_is_shown_in_gb_rounded_as_python_rounds() -> None:
    # 1.875 GB a node: a budget of exactly 1.5 GB, shown (half to even) as 2.
    small = {"cluster_fields": {"dram_per_node_gb": 1.875}}
    assert dram_hits(offload_serve(2 * 10**9), **small) == [
        "error: " + dram("2,000,000,000", 1, "2", "2", "2", "1,500,000,000")
    ]


# --- K3-PYTHONHASHSEED -------------------------------------------------------------------------
def test_hashed_kv_blocks_across_ranks_need_a_fixed_hash_seed() -> None:
    connector = ("--kv-transfer-config", kv(OFFLOAD))

    def judge(
        *commands: tuple[str, tuple[str, ...]], env: dict[str, str] | None = None
    ) -> list[Hit]:
        return hits(rules.pythonhashseed, context(*commands, env=env))

    unseeded = Hit(
        key="env.PYTHONHASHSEED",
        message=f"{OFFLOAD} hashes KV block keys on every rank (6 ranks): without a fixed "
        "PYTHONHASHSEED the ranks disagree on block identity",
    )
    ranked = serve(*connector, TP, "2", PP, "3")
    for env in (None, {"PYTHONHASHSEED": "random"}):
        assert judge(serve(*connector), serve(TP, "8"), ranked, ranked, env=env) == [unseeded]
    for seed in ("42", "0"):
        assert judge(ranked, env={"PYTHONHASHSEED": seed}) == []
    assert judge(serve(*connector)) == []  # one rank
    (two,) = judge(serve(*connector, PP, "2"))
    assert "(2 ranks)" in two.message


# --- K3-SRT-FRONTEND ---------------------------------------------------------------------------
def srt_lock(version: str | None = None, **patch_fields: Any) -> Lock:
    """The committed lock with its srt-slurm ``version`` and each patch's fields replaced."""
    lock = committed_lock()
    srt = lock.srt_slurm
    assert srt is not None
    patches = tuple(replace(p, **patch_fields) for p in srt.patches)
    return replace(lock, srt_slurm=replace(srt, version=version or srt.version, patches=patches))


def test_srt_slurm_patches_that_are_not_there_provide_nothing() -> None:
    two_nodes = serve(TP, "8", PP, "2")
    assert hits(rules.srt_frontend, context(two_nodes)) == []  # the committed patch files
    lock = srt_lock(sha256=None)
    path = str(committed_lock().path)
    first, second = committed_lock().srt_slurm.patches  # type: ignore[union-attr]
    assert hits(rules.srt_frontend, context(two_nodes, lock=lock)) == [
        Hit(
            key="srt_slurm.patches[0]",
            file=path,
            message=f"srt-slurm patch PR #278 ({first.file}) would provide frontend.vllm, but it "
            "is unresolved (no sha256): srt-slurm v1.0.36 without it rejects this 2-node profile",
            fix=f"write {first.file} (git format-patch {first.range}) and record it with "
            "`k3env lock --update-hashes`; or pin srt-slurm >=1.0.37",
        ),
        Hit(
            key="srt_slurm.patches[1]",
            file=path,
            message=f"srt-slurm patch {second.title} ({second.file}) would provide "
            "frontend.vllm.multinode, but it is unresolved (no sha256): srt-slurm v1.0.36 "
            "without it rejects this 2-node profile",
            fix=f"write {second.file} (from its PR) and record it with `k3env lock "
            "--update-hashes`; or pin srt-slurm >=1.0.49",
        ),
    ]
    gone = srt_lock(file="patches/srt-slurm/gone.patch")
    messages = [h.message for h in hits(rules.srt_frontend, context(two_nodes, lock=gone))]
    assert len(messages) == 2
    assert all("but it is missing on disk: srt-slurm v1.0.36" in m for m in messages)
    # Each feature is judged on its own: PR #278 is there, the multi-node patch is not.
    srt = committed_lock().srt_slurm
    assert srt is not None
    half = replace(srt, patches=(first, replace(second, sha256=None)))
    half_lock = replace(committed_lock(), srt_slurm=half)
    assert [h.key for h in hits(rules.srt_frontend, context(two_nodes, lock=half_lock))] == [
        "srt_slurm.patches[1]"
    ]
    # One node needs frontend.vllm only: v1.0.37 has it upstream.
    assert hits(rules.srt_frontend, context(serve(), lock=srt_lock("v1.0.37", sha256=None))) == []


def test_srt_slurm_without_the_feature_and_no_patch_rejects_the_recipe() -> None:
    def missing(feature: str, upstream: str, nodes: int) -> Hit:
        return Hit(
            key="srt_slurm.version",
            file=str(committed_lock().path),
            message=f"srt-slurm v1.0.36 has no {feature} (upstream {upstream}), and no pinned "
            f"patch provides it; the profile runs on {nodes} node(s): the recipe is rejected "
            "or runs single-node only",
        )

    lock = srt_lock(provides=())
    assert hits(rules.srt_frontend, context(serve(TP, "16"), lock=lock)) == [
        missing("frontend.vllm", ">=1.0.37", 2),
        missing("frontend.vllm.multinode", ">=1.0.49", 2),
    ]
    assert hits(rules.srt_frontend, context(serve(), lock=lock)) == [
        missing("frontend.vllm", ">=1.0.37", 1)
    ]
    upstream = srt_lock("v1.0.37", provides=())
    assert [h.message for h in hits(rules.srt_frontend, context(serve(TP, "16"), lock=upstream))
            ] == [missing("frontend.vllm.multinode", ">=1.0.49", 2).message.replace(
                "v1.0.36", "v1.0.37")]  # fmt: skip
    assert hits(rules.srt_frontend, context(serve(TP, "16"), lock=srt_lock("v1.0.49"))) == []
    no_srt = replace(committed_lock(), srt_slurm=None)
    assert hits(rules.srt_frontend, context(serve(), lock=no_srt)) == []
    assert hits(rules.srt_frontend, context(FRONTEND, worker(), spec=DYN, lock=lock)) == []


def test_the_profiles_node_count() -> None:
    def nodes(*commands: tuple[str, tuple[str, ...]], **fields: Any) -> int:
        return rules.profile_nodes(context(*commands, **fields))

    assert nodes(FRONTEND) == 1
    assert nodes(serve()) == 1
    assert nodes(serve("--nnodes", "3")) == 3
    assert nodes(serve("--nnodes", "1", TP, "16")) == 1  # as the profile says
    assert nodes(serve(TP, "8", PP, "2")) == 2
    assert nodes(serve(TP, "8", PP, "3")) == 3
    for nnodes in (("--nnodes", "0"), ("--nnodes", "two"), ("--nnodes",)):
        assert nodes(serve(*nnodes, TP, "16")) == 2  # from the ranks
    assert nodes(serve("--nnodes", "2"), serve(TP, "24")) == 3
    assert nodes(serve(TP, "24"), serve("--nnodes", "2")) == 3
    assert nodes(serve(TP, "3"), cluster_fields={"gpus_per_node": 0}) == 3


# --- K3-DROPPED-PATCH --------------------------------------------------------------------------
def test_a_container_patch_pinned_for_the_base_and_not_carried_is_named() -> None:
    assert hits(rules.dropped_patch, context()) == []
    pin = committed_lock().container_patches["mamba-hybrid-index-int64"]
    spec_path = context().spec.path
    dropped = Hit(
        key="patches",
        message="container patch mamba-hybrid-index-int64 is pinned for base vllm-kimi-k3 but "
        f"this image does not carry it: {pin.why}",
        fix=f'add "mamba-hybrid-index-int64" to patches in {spec_path}, or drop the patch from '
        "the lock if the base no longer needs it",
    )
    assert hits(rules.dropped_patch, context(spec_fields={"patches": ()})) == [dropped]
    ctx = context(spec_fields={"patches": ()}, setup_script="setup.sh")
    assert hits(rules.dropped_patch, ctx) == [
        replace(
            dropped,
            severity=WARNING,
            message=dropped.message + " (unless the job's setup_script setup.sh, run at every "
            "job start, applies it: k3env cannot see what it does)",
        )
    ]
    assert hits(rules.dropped_patch, context(spec_fields={"patches": ()}, base_known=False)) == []
    other_base = {"patches": (), "base": "cpu-twin"}
    assert hits(rules.dropped_patch, context(spec_fields=other_base)) == []


# --- K3-TOPOLOGY -------------------------------------------------------------------------------
def test_tp_times_pp_must_fit_the_clusters_gpus() -> None:
    assert hits(rules.topology, context(serve(TP, "8", PP, "2"))) == []  # 16 of 16
    assert hits(rules.topology, context(serve(), serve(TP, "8", PP, "3"))) == [
        Hit(key=key(1), message="TP x PP = 24 ranks, but b200-dgxc has 16 GPUs")
    ]


def test_nnodes_must_be_the_clusters_node_count() -> None:
    def judge(*flags: str, **fields: Any) -> list[str]:
        return [h.message for h in hits(rules.topology, context(serve(*flags), **fields))]

    assert judge(TP, "8", PP, "2", "--nnodes", "2") == []
    for nnodes in ("0", "two"):
        assert judge(TP, "8", "--nnodes", nnodes) == []
    assert judge(TP, "8", "--nnodes", "1") == [
        "--nnodes 1, but the cluster profile has 2 nodes of 8 B200 GPUs"
    ]
    assert judge(TP, "8", PP, "2", "--nnodes", "3") == [
        "--nnodes 3 puts TP x PP = 16 ranks 6 to a node, but a b200-dgxc node has 8 B200 GPUs: "
        "the profile is sized for nodes of 6 GPUs (on b200-dgxc: --nnodes 2, 8 ranks a node)"
    ]
    assert judge(TP, "8", PP, "4", "--nnodes", "4") == [
        "TP x PP = 32 ranks, but b200-dgxc has 16 GPUs",
        "--nnodes 4, but the cluster profile has 2 nodes of 8 B200 GPUs",
    ]
    assert judge(TP, "4", "--nnodes", "1", cluster_fields={"gpus_per_node": 0}) == [
        "TP x PP = 4 ranks, but b200-dgxc has 0 GPUs",
        "--nnodes 1 puts TP x PP = 4 ranks 4 to a node, but a b200-dgxc node has 0 B200 GPUs: "
        "the profile is sized for nodes of 4 GPUs (on b200-dgxc: --nnodes 4, 0 ranks a node)",
    ]


# --- K3-IMAGE-PLATFORM -------------------------------------------------------------------------
def platform_lock(
    platforms: dict[str, str | None], twin_platforms: dict[str, TwinPin] | None = None
) -> Lock:
    lock = committed_lock()
    base = replace(lock.bases["vllm-kimi-k3"], platforms=platforms)
    assert lock.twin is not None
    twin = lock.twin if twin_platforms is None else replace(lock.twin, platforms=twin_platforms)
    return replace(lock, bases={**lock.bases, "vllm-kimi-k3": base}, twin=twin)


AMD, ARM = {"linux/amd64": "sha256:" + "a" * 64}, {"linux/arm64": "sha256:" + "b" * 64}
DOCKER = "docker://docker.io/vllm/vllm-openai:kimi-k3"


def test_the_base_must_pin_the_clusters_platform() -> None:
    path = str(committed_lock().path)
    gb200: dict[str, Any] = {"cluster": "gb200-nvl72"}
    assert hits(rules.image_platform, context(lock=platform_lock({**AMD, **ARM}), **gb200)) == []
    variant = {"linux/arm64/v8": "sha256:" + "b" * 64}
    assert (
        hits(rules.image_platform, context(lock=platform_lock({**AMD, **variant}), **gb200)) == []
    )
    ppc = {"linux/ppc64le": "sha256:" + "c" * 64}
    assert hits(rules.image_platform, context(lock=platform_lock({**ppc, **AMD}), **gb200)) == [
        Hit(
            key="bases.vllm-kimi-k3.platforms",
            file=path,
            message="gb200-nvl72 runs linux/arm64 (aarch64), but base vllm-kimi-k3 pins only "
            "linux/amd64, linux/ppc64le: enroot would import an image its nodes cannot execute "
            "(exec format error at job start)",
            fix='add [bases.vllm-kimi-k3.platforms] "linux/arm64" = the digest of that manifest '
            f"(skopeo inspect --raw {DOCKER})",
        )
    ]
    assert hits(rules.image_platform, context()) == [  # the committed lock: unresolved
        Hit(
            key="bases.vllm-kimi-k3.platforms.linux/amd64",
            file=path,
            severity=WARNING,
            message="base vllm-kimi-k3's linux/amd64 manifest is unresolved: the b200-dgxc "
            "image cannot be built or pulled by digest from this lock yet",
            fix=f"record it: skopeo inspect --raw {DOCKER} (the manifests[] entry whose "
            "platform is linux/amd64)",
        )
    ]
    # A twin base, or one the lock does not pin, has no manifests to judge.
    for base in ("cpu-twin", "elsewhere"):
        assert hits(rules.image_platform, context(spec_fields={"base": base})) == []


def test_the_lock_must_pin_a_twin_for_the_clusters_platform() -> None:
    lock = platform_lock({**AMD, **ARM}, twin_platforms={})
    assert hits(rules.image_platform, context(lock=lock, cluster="gb200-nvl72")) == [
        Hit(
            key="twin.platforms",
            file=str(committed_lock().path),
            severity=WARNING,
            message="the lock pins no CPU twin for linux/arm64: nothing verifies the gb200-nvl72 "
            "image's parsers and registries before the run",
            fix='add [twin.platforms."linux/arm64"] and run `k3env twin --resolve --platform '
            "linux/arm64`",
        )
    ]
    assert hits(rules.image_platform, context(lock=lock)) == []  # amd64: the twin's own
    no_twin = replace(platform_lock({**AMD, **ARM}), twin=None)
    assert hits(rules.image_platform, context(lock=no_twin, cluster="gb200-nvl72")) == []


# --- K3-TP-NVLINK ------------------------------------------------------------------------------
def test_a_tensor_parallel_group_beyond_the_nvlink_domain_warns() -> None:
    assert hits(rules.tp_nvlink, context(serve(TP, "8"), serve())) == []
    assert hits(rules.tp_nvlink, context(serve(), serve(TP, "9"))) == [
        Hit(
            key=key(1),
            message="--tensor-parallel-size 9 spans more than one NVLink domain of b200-dgxc "
            "(8 GPUs): every layer's all-reduce crosses the network",
            fix="keep TP within 8 GPUs and span nodes with --pipeline-parallel-size",
        )
    ]
    assert hits(rules.tp_nvlink, context(serve(TP, "16"), cluster="gb200-nvl72")) == []


# --- K3-ENROOT-DIGEST --------------------------------------------------------------------------
@pytest.mark.parametrize(("version", "refused"), [("3.5.0", True), ("3.99", True),
                                                   ("4.0", False), ("4.1.2", False)])  # fmt: skip
def test_enroot_must_import_by_digest(version: str, refused: bool) -> None:
    runtime = {"enroot": RuntimePin(name="enroot", version=version)}
    found = hits(rules.enroot_digest, context(cluster_fields={"runtime": runtime}))
    assert found == (
        [
            Hit(
                key="runtime.enroot.version",
                message=f"b200-dgxc's enroot {version} rejects an image named by digest "
                "(`docker://REGISTRY#REPO@sha256:...`), the only way k3env names its images",
            )
        ]
        if refused
        else []
    )
    assert hits(rules.enroot_digest, context(cluster_fields={"runtime": {}})) == []


def test_vllms_short_tensor_and_pipeline_parallel_flags_count() -> None:
    """`-tp` / `-pp` are vLLM's own aliases; parse_options reads long flags only, so the rules
    read them from argv (a bug: every rule that counts ranks saw TP 1 x PP 1 for them)."""
    assert [h.message for h in hits(rules.topology, context(serve("-tp", "8", "-pp", "3")))] == [
        "TP x PP = 24 ranks, but b200-dgxc has 16 GPUs"
    ]
    (wide,) = hits(rules.tp_nvlink, context(serve("--enforce-eager", "-tp", "16")))
    assert wide.message.startswith("--tensor-parallel-size 16 spans more than one NVLink domain")
    (cumem,) = hits(rules.cumem_needs_no_custom_allreduce,
                    context(serve("--enable-cumem-allocator", "-tp", "2")))  # fmt: skip
    assert "(TP 2)" in cumem.message
    assert rules.profile_nodes(context(serve("-pp", "2", "-tp", "8"))) == 2
    # The long name outranks the alias, as the smoke plan reads them; an alias with no value
    # after it is none.
    assert rules.profile_nodes(context(serve(TP, "8", "-tp", "16"))) == 1
    assert rules.profile_nodes(context(serve("--enforce-eager", "-tp"))) == 1
    assert rules.profile_nodes(context(serve("-tp", "--enforce-eager", "-pp", "16"))) == 2


def test_kv_transfer_configs_without_a_connector_name_none() -> None:
    for config in ('{"kv_connector": ""}', "{}", "[1]", "not json"):
        ctx = context(serve("--kv-transfer-config", config, TP, "8"))
        assert hits(rules.pythonhashseed, ctx) == []
    assert json.loads(kv(OFFLOAD))["kv_connector"] == OFFLOAD
