"""What preflight knows of upstream: model, hardware and version numbers, each with its source.

The tables the rules in ``rules`` read (and ``srt.recipe`` the models). Each entry says
where it came from (the bring-up, an upstream PR or release); facts learned by ``k3env verify``
about the image override them. Add a number here when a new model, GPU or release is measured.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Models, keyed by tokenizer model_type.
MODELS: Mapping[str, Mapping[str, Any]] = {
    "kimi_k3": {
        # "must be non-negative and a multiple of scheduler_block_size (3145728)" (#2359)
        "scheduler_block_size": 3_145_728,
        # KDA linear attention + gated MLA layers (24 MLA layers; 12 per PP2 stage).
        "hybrid": True,
        "mla": True,
        # MXFP4 MoE weights: flashinfer's trtllm MoE kernel on Blackwell.
        "moe_quant": "mxfp4",
    },
}
# Workspaces allocated outside vLLM's memory pool on the first forward, per (GPU, MoE quant).
OUT_OF_POOL_WORKSPACE_GIB: Mapping[tuple[str, str], tuple[float, str]] = {
    ("B200", "mxfp4"): (1.6, "flashinfer trtllm MXFP4 MoE runtime workspace"),
}
# Dynamo Rust frontend: tiktoken model_types it loads, by Dynamo version. kimi_k3 came with
# ba83080 ("feat: Added support for Kimi-K3", tag v1.4.0-kimi-k3-dev.1); 1.2.1 listed
# "kimi, kimi_k2, kimi_k25, deepseek_v3" in its error.
DYNAMO_TIKTOKEN: Mapping[str, str] = {
    "kimi": ">=1.2.1",
    "kimi_k2": ">=1.2.1",
    "kimi_k25": ">=1.2.1",
    "deepseek_v3": ">=1.2.1",
    "kimi_k3": ">=1.4.0.dev1",
}
DYNAMO_TIKTOKEN_KNOWN_UNTIL = "1.2.1"  # at or below this, the list above is complete
# srt-slurm features by upstream version (PR #278 -> v1.0.37, PR #296 -> v1.0.49).
SRT_FEATURES: Mapping[str, str] = {
    "frontend.vllm": ">=1.0.37",
    "frontend.vllm.multinode": ">=1.0.49",
}
VLLM_DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
OFFLOAD_DRAM_BUDGET_PERCENT = 80  # the framework's CPU-offload budget per node
# vLLM frontend-only flags: `python -m dynamo.vllm` rejects them (bring-up commit 2).
FRONTEND_ONLY_FLAGS = ("--tool-call-parser", "--enable-auto-tool-choice")

# --- srt-slurm (the pinned v1.0.36 + PR #278), read from its source -----------------------------
# The keys and types of a recipe and of srtslurm.yaml are recorded from srt-slurm's own
# loader (`k3env srt schema`, schemas/srt-slurm.schema.json; config.srtschema checks them).
# What srt-slurm fills in for a recipe key left out (src/srtctl/core/schema.py: FrontendConfig,
# SrtConfig.backend, DynamoConfig; src/srtctl/backends/vllm.py: VLLMProtocol.connector).
SRT_DEFAULTS: Mapping[str, Any] = {
    "frontend.type": "dynamo",
    "frontend.enable_multiple_frontends": True,
    "backend.type": "sglang",
    # Turned into --kv-transfer-config on a Dynamo worker (build_worker_command); `vllm serve`
    # (frontend.type: vllm) pops it.
    "backend.connector": "nixl",
    # Installed at every job start unless `install: false`.
    "dynamo.install": True,
    "dynamo.version": "0.8.0",
    # The Dynamo worker's `--request-plane` (schema.py DynamoConfig.request_plane).
    "dynamo.request_plane": "tcp",
    # false: the worker gets `--device-ids` (vllm.py VLLMProtocol, build_worker_command).
    "backend.set_cuda_visible_devices": False,
    # One process per GPU of a `data-parallel-size` worker (else per_node: one per node).
    "backend.dp_launch_mode": "per_gpu",
}
# src/srtctl/ports.py VLLM_DATA_PARALLEL_RPC_PORT: a DP leader's first `--data-parallel-rpc-port`.
SRT_DP_RPC_PORT = 8400
SRT_KV_EVENTS_PORT = 5200  # ports.py KV_EVENTS_PORT_BASE: the first worker's kv-events endpoint
# backends/vllm.py `_CONNECTOR_MAP`: the connector shorthands and the JSON they become.
SRT_CONNECTORS: Mapping[str, Mapping[str, str]] = {
    "nixl": {"kv_connector": "NixlConnector", "kv_role": "kv_both"},
    "lmcache": {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"},
    "kvbm": {"kv_connector": "DynamoConnector",
             "kv_connector_module_path": "kvbm.vllm_integration.connector", "kv_role": "kv_both"},
}  # fmt: skip
# Dynamo commits a recipe's `dynamo.hash` builds, as the version the rules compare.
DYNAMO_COMMITS: Mapping[str, str] = {
    # "feat: Added support for Kimi-K3", tag v1.4.0-kimi-k3-dev.1 (the bring-up's day-zero pin)
    "ba83080ecd31c1ce918559e576d3c5bc9e092ff1": "1.4.0.dev1",
}

# --- srt-slurm 2.x (schema 2), read from its source ---------------------------------------------
# Its load gate's refusals of a schema-1 recipe, verbatim (src/srtctl/core/config.py
# `require_current_schema` at 020fbc6, after PR #456: `MIGRATE_HINT` joined in); `{value!r}` is
# the recipe's `schema:`. tests/test_srt_schema2.py runs the real gate and checks these words.
SRT2_GATE_NO_SCHEMA = (
    "recipe has no `schema:` key, which marks the pre-2.0 layout; schema 1 recipes no longer "
    "load. Declare `schema: 2` or run `srtctl migrate -f <recipe> --in-place` to rewrite it "
    "(docs/legacy-v1.md maps every key)"
)
SRT2_GATE_UNSUPPORTED = (
    "schema {value!r} is not supported; this srtctl loads schema 2 only. For an older recipe, "
    "run `srtctl migrate -f <recipe> --in-place` to rewrite it (docs/legacy-v1.md maps every key)"
)
# ... and of a schema-1 key left under `schema: 2` (`legacy_keys_present`: these keys, each
# named as `SECTION.KEY`, in this order); `{keys}` joins them with ", ".
SRT2_GATE_LEGACY = (
    "recipe uses the pre-2.0 (v1) layout: {keys}. These keys no longer load; run `srtctl "
    "migrate -f <recipe> --in-place` to rewrite it (docs/legacy-v1.md maps every key)"
)
SRT2_LEGACY_KEYS: tuple[str, ...] = (
    "backend", "infra",
    *(f"resources.{key}" for role in ("prefill", "decode", "agg")
      for key in (f"{role}_nodes", f"{role}_workers", f"gpus_per_{role}", f"{role}_critical")),
    "frontend.orchestrator_placement", "frontend.dedicated_node",
    "benchmark.client_placement", "benchmark.client_dedicated_node",
    "dynamo.version", "dynamo.hash", "dynamo.wheel", "dynamo.cargo_patches",
)  # fmt: skip
# The first srt-slurm release whose recipes are schema 2 (the 2.x rewrite, PR #407).
SRT_SCHEMA2_FROM = "2.0.0.dev0"
