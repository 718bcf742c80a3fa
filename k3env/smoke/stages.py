"""The GPU engine's stages, and the failures the Kimi-K3 bring-up met in them, as facts.

Each fact is a pattern on one log line, the stage it was met in, what it means and what fixed
it, with where it came from: the bring-up's commit messages
(shared/context/kimi-k3-b200-agentic-bringup.txt; the PR numbers are that record's), and where
the pinned releases' own text has the message, its file (and line) there. Each pattern is tested
against that text (tests/engine/test_stage_facts_engine.py: compiled strings read from the
pinned wheels, and torch's errors raised by the twin's own torch). A log
line no fact knows is tied to the stage the log had reached (``MARKERS``: the lines vLLM
prints as it passes each stage) when it fails.

Add a fact when a cluster run meets a new failure: its exact line, its stage, its source.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

# The stages in the order an engine passes them.
INIT = "init"
KV_CACHE = "KV-cache init"
GRAPHS = "CUDA graph capture"
FIRST_DECODE = "first decode"
SERVING = "serving"
STAGES = (INIT, KV_CACHE, GRAPHS, FIRST_DECODE, SERVING)


@dataclass(frozen=True, kw_only=True)
class Fact:
    name: str
    stage: str
    pattern: re.Pattern[str]
    meaning: str
    fix: str
    source: str
    # What the matched line must also say (its figures), beyond the pattern.
    holds: Callable[[re.Match[str]], bool] = lambda m: True


def _fact(
    name: str,
    stage: str,
    pattern: str,
    meaning: str,
    fix: str,
    source: str,
    holds: Callable[[re.Match[str]], bool] | None = None,
) -> Fact:
    return Fact(
        name=name,
        stage=stage,
        pattern=re.compile(pattern),
        meaning=meaning,
        fix=fix,
        source=source,
        **({"holds": holds} if holds else {}),
    )


def _fragmented(m: re.Match[str]) -> bool:
    """More sat reserved but unallocated than the allocation asked for."""
    return float(m.group("reserved")) >= float(m.group("want"))


# Most specific first: the first fact whose pattern a line matches is the verdict.
FACTS: tuple[Fact, ...] = (
    # Variant E/F (#2370, #2372): "KV connector SimpleCPUOffloadConnector is incompatible with
    # PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True unless enable_cumem_allocator is also
    # enabled" -- vLLM's config validation at startup.
    _fact(
        "simplecpu-offload-expandable-segments",
        INIT,
        r"SimpleCPUOffloadConnector is incompatible with PYTORCH_CUDA_ALLOC_CONF="
        r"expandable_segments",
        "vLLM refuses SimpleCPUOffloadConnector with expandable_segments unless the cumem "
        "allocator is on (torch's VMM allocator can remap KV addresses under pinned connector "
        "memory)",
        "add --enable-cumem-allocator (and then --disable-custom-all-reduce), or drop "
        "expandable_segments",
        "bring-up #2372, the commit enabling the cumem allocator; the Kimi-K3 image's vLLM "
        "(not in vLLM 0.31.0's text, so not checked against a pinned release here)",
    ),
    # #2359 / variant F: "VLLM_PREFIX_CACHE_RETENTION_INTERVAL (32768) must be non-negative and
    # a multiple of scheduler_block_size (3145728)" -- engine init hard-fails.
    # vLLM 0.31.0 says it of the flag that replaced the env var (vllm/v1/core/
    # kv_cache_coordinator.py:60): "prefix_cache_retention_interval (N) must be ...".
    _fact(
        "retention-interval-not-block-multiple",
        INIT,
        r"(?:VLLM_PREFIX_CACHE_RETENTION_INTERVAL|prefix_cache_retention_interval) \(\d+\) "
        r"must be non-negative and a multiple of scheduler_block_size \(\d+\)",
        "the prefix-cache retention interval is not a multiple of the model's scheduler block "
        "(Kimi-K3's KDA hybrid: 3,145,728 tokens)",
        "set VLLM_PREFIX_CACHE_RETENTION_INTERVAL to 0 or a multiple of the block size",
        "bring-up #2359, the commit dropping the interval; #2372 sets it to 0; vLLM 0.31.0 "
        "vllm/v1/core/kv_cache_coordinator.py:60 (the flag's name)",
    ),
    # Variant E (#2370): with enable_cross_layers_blocks true, "shape '[64980, 64, 576]' is
    # invalid for input of size 199618560" at KV-cache initialization (12x = the MLA layers
    # per PP stage: the cross-layer fold mishandles the hybrid geometry).
    _fact(
        "cross-layer-block-shape",
        KV_CACHE,
        r"shape '\[[\d, ]+\]' is invalid for input of size \d+",
        "the KV-cache tensor's shape does not fit its storage: the cross-layer block fold of "
        "the KV connector mishandles a hybrid model's layers",
        'set "enable_cross_layers_blocks": false in --kv-transfer-config',
        "bring-up #2370, the commit turning cross-layer blocks off; torch 2.13.0 "
        'libtorch_cpu.so (ATen/InferSize.h: "shape \'" ... "\' is invalid for input of size ")',
    ),
    # Variant F (#2372), ninth attempt: died in CUDA-graph capture with
    # "custom_all_reduce.cuh:164 'invalid argument'" (its IPC buffers, invalidated by the
    # VMM-backed CuMemAllocator).
    _fact(
        "custom-all-reduce-graph-capture",
        GRAPHS,
        r"custom_all_reduce\.cuh:\d+ 'invalid argument'",
        "vLLM's custom all-reduce registers IPC buffers that the cumem allocator invalidates; "
        "it dies when CUDA graphs are captured",
        "add --disable-custom-all-reduce with --enable-cumem-allocator (TP all-reduce falls "
        "back to NCCL)",
        "bring-up #2372, the commit pairing the cumem allocator with custom all-reduce off; "
        "vLLM 0.31.0 _C_stable_libtorch.abi3.so (\"Failed: Cuda error %s:%d '%s'\\n\" of "
        "/workspace/csrc/custom_all_reduce.cuh)",
    ),
    # Sixth attempt (variants A and C): the first decode step crashes in the KDA hybrid-state
    # postprocess (mamba_hybrid.py postprocess_state): "IndexError: index_fill_(): Expected
    # dtype int64 for index".
    _fact(
        "mamba-hybrid-int32-index",
        FIRST_DECODE,
        r"index_fill_\(\): Expected dtype int64 for index",
        "the hybrid-state postprocess passes the int32 idx_mapping to index_fill_, which needs "
        "int64: the first decode step crashes",
        "bake the container patch mamba-hybrid-index-int64 (.long() on the index)",
        "bring-up sixth sweep attempt, the mamba_hybrid.py container patch; torch 2.13.0 "
        "libtorch_cpu.so (raised as IndexError by the twin's torch)",
    ),
    # Inherited from the dynamo-frontend variants (#2355/#2358), seen again in #2370: at
    # utilization 0.90 "the first long-context MLA prefill OOM'd on a 2.92 GiB transient while
    # 3.39 GiB sat reserved-but-unallocated" (torch's OOM message says both figures).
    _fact(
        "prefill-oom-fragmentation",
        SERVING,
        r"CUDA out of memory\. Tried to allocate (?P<want>[\d.]+) GiB.*?(?P<reserved>[\d.]+) "
        r"GiB is reserved by PyTorch but unallocated",
        "a prefill's transient allocation failed while more than it sat reserved but "
        "unallocated: fragmentation of the caching allocator",
        "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (with SimpleCPUOffloadConnector "
        "that needs --enable-cumem-allocator)",
        "bring-up #2355/#2358, the expandable_segments commit; #2370's 2.36 / 2.63 GiB; "
        "torch 2.13.0 libc10_cuda.so (the caching allocator's OOM message)",
        _fragmented,
    ),
    # Variant D (#2359) and the dynamo-frontend variants: "the flashinfer trtllm MXFP4 MoE
    # kernel allocates a ~1.6 GiB runtime workspace outside vLLM's memory pool on the first
    # forward; at 0.95 a 178 GiB B200 has only ~1.35 GiB free". Any other CUDA OOM on the
    # first forward is the same kind: memory outside the pool.
    _fact(
        "out-of-pool-oom",
        FIRST_DECODE,
        r"CUDA out of memory\. Tried to allocate [\d.]+ [GM]iB",
        "an allocation outside vLLM's memory pool did not fit in what --gpu-memory-utilization "
        "left free (the bring-up's: flashinfer's MXFP4 MoE workspace, ~1.6 GiB, at 0.95)",
        "lower --gpu-memory-utilization (the bring-up went to 0.90)",
        "bring-up #2359, the commit lowering gpu-memory-utilization to 0.90; torch 2.13.0 "
        "libc10_cuda.so (the caching allocator's OOM message)",
    ),
)

# The line vLLM prints as it enters (or finishes) a stage: the last one a log reached says
# where an error no fact knows was met. (vLLM's own log texts.)
MARKERS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(p), stage)
    for p, stage in (
        (r"Loading weights took|Model loading took|Starting to load model", INIT),
        (r"Available KV cache memory|GPU KV cache size|KV cache", KV_CACHE),
        (r"Capturing CUDA graphs|CUDA graph", GRAPHS),
        (
            r"Graph capturing finished|Starting vLLM API server|Application startup complete",
            FIRST_DECODE,
        ),
        (r"\[smoke\] chat: ok|POST /v1/chat/completions HTTP/1\.1\" 200", SERVING),
    )
)
# A line that says something failed (for a log that no fact explains).
ERROR = re.compile(
    # `error: ` is argparse's (a flag the engine refuses: "vllm serve: error: argument ...").
    r"(Error|Exception|CUDA error|Traceback|FAILED|Failed|RuntimeError|out of memory|\berror: )"
)


def match(line: str) -> Fact | None:
    """The first fact whose pattern ``line`` matches."""
    for fact in FACTS:
        m = fact.pattern.search(line)
        if m and fact.holds(m):
            return fact
    return None


def reached(lines: list[str]) -> str:
    """The stage a log had reached: the last marker's (``init`` before any)."""
    stage = INIT
    for line in lines:
        for pattern, at in MARKERS:
            if pattern.search(line) and STAGES.index(at) > STAGES.index(stage):
                stage = at
    return stage
