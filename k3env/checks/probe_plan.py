"""What the probe is asked inside an image: the plan built from the spec's serve profiles,
the lock's patches and versions, and the baked env (pure: data in, data out).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from k3env.checks.verdicts import COMPONENTS, expected_versions, twin_of
from k3env.config.pins import BasePin, Lock
from k3env.config.spec import ImageSpec
from k3env.image.build import BuildResult
from k3env.image.envpolicy import merged_env
from k3env.image.patches import SKIPPED

# Where to look for the reader of an env var, by its family prefix: a hint for the search in
# the image, never a pass by itself (a misspelt PYTORCH_ name is read by nothing). ":python"
# is the interpreter, ":ld.so" the dynamic loader. The serving stack is always searched too.
ENV_FAMILIES: dict[str, tuple[str, ...]] = {
    "VLLM_": ("vllm",),
    "DYN_": ("ai-dynamo", "ai-dynamo-runtime"),
    "AIPERF_": ("aiperf",),
    "NCCL_": ("torch", "nvidia-nccl-cu12", "nvidia-nccl-cu13"),
    "PYTORCH_": ("torch",),
    "TORCH_": ("torch",),
    "CUDA_": ("torch", "nvidia-cuda-runtime-cu12"),
    "CUBLAS_": ("torch", "nvidia-cublas-cu12"),
    "CUDNN_": ("torch", "nvidia-cudnn-cu12"),
    "NVIDIA_": ("torch",),
    "OMP_": ("torch",),
    "MKL_": ("torch",),
    "GLOO_": ("torch",),
    "HF_": ("huggingface-hub", "transformers"),
    "TRANSFORMERS_": ("transformers",),
    "TOKENIZERS_": ("tokenizers",),
    "UCX_": ("ai-dynamo-runtime", "nixl"),
    "NVSHMEM_": ("nvidia-nvshmem-cu12",),
    "TRITON_": ("triton",),
    "PYTHON": (":python",),
    "LD_": (":ld.so",),
}


ENV_DEFAULT_SOURCES = ("vllm", "ai-dynamo", "ai-dynamo-runtime")


# The modules each role's process imports first: the probe imports them as the process would.
ENTRYPOINTS = {
    "vllm-serve": ("vllm.entrypoints.cli.serve",),
    "dynamo-worker": ("dynamo.vllm.main",),
    "dynamo-frontend": ("dynamo.frontend.main",),
}


# Tokenizer model_types probed in the Dynamo frontend for preflight's facts.
TOKENIZER_CANDIDATES = ("kimi", "kimi_k2", "kimi_k25", "kimi_k3", "deepseek_v3")


def plan_for(
    lock: Lock, spec: ImageSpec, build: BuildResult, base_pin: BasePin, twin: bool
) -> dict[str, Any]:
    statuses = {p.name: p for p in build.patches}
    patches: list[dict[str, Any]] = []
    for name in spec.patches:
        pin = lock.container_patches[name]
        result = statuses.get(name)
        if result is not None and result.status == SKIPPED:
            patches.append({"name": name, "skip": result.detail})
            continue
        patches.append({"name": name, "module": pin.module, "path": pin.path})
    env = merged_env(lock, spec, base_pin)
    return {
        "image": spec.name,
        # Modules the CPU twin leaves out on purpose: an import that needs only those to
        # complete is not held against the twin (the output says so).
        "absent_by_design": list(t.omit) if (t := twin_of(lock, twin, build.platform)) else [],
        # The twin's CPU stand-ins (torch): an env var only they and absent GPU libraries
        # could read is not checked here, never failed for what the twin lacks.
        "stand_ins": list(t.stand_ins) if t else [],
        "profiles": [
            {
                "name": p.name,
                "tokenizer_model_type": p.tokenizer_model_type,
                "tool_call_parser": p.tool_call_parser,
                "reasoning_parser": p.reasoning_parser,
                "commands": [{"role": c.role, "argv": list(c.argv)} for c in p.commands],
            }
            for p in spec.profiles.values()
        ],
        "imports": sorted(
            {m for p in spec.profiles.values() for c in p.commands for m in ENTRYPOINTS[c.role]}
        ),
        "patches": patches,
        "env": {name: spec.env_readers.get(name) for name in env},
        "env_families": {k: list(v) for k, v in ENV_FAMILIES.items()},
        "env_default_sources": list(ENV_DEFAULT_SOURCES),
        "versions": expected_versions(lock, spec, twin, build.platform),
        "components": COMPONENTS,
        "tokenizer_candidates": list(TOKENIZER_CANDIDATES)
        if any(c.role == "dynamo-frontend" for p in spec.profiles.values() for c in p.commands)
        else [],
    }


def planned_checks(plan: Mapping[str, Any]) -> list[tuple[str, str | None, str]]:
    """(check, profile, subject) of each verdict the probe owes for ``plan``: each component's
    version, each entrypoint's import, each command line, each profile's parser names and the
    model_type its Dynamo frontend loads, each baked env var. (The parser names on command
    lines are found in the image; patches and requirements are judged on the host.)"""
    out: list[tuple[str, str | None, str]] = [("versions", None, c) for c in plan["versions"]]
    out += [("imports", None, m) for m in plan["imports"]]
    for p in plan["profiles"]:
        roles = [c["role"] for c in p["commands"]]
        out += [("args", p["name"], f"commands[{i}] {role}") for i, role in enumerate(roles)]
        out += [("parsers", p["name"], f"{kind} {p[kind]}")
                for kind in ("tool_call_parser", "reasoning_parser") if p[kind]]  # fmt: skip
        if "dynamo-frontend" in roles and p["tokenizer_model_type"]:
            out.append(("tokenizer", p["name"], f"model_type {p['tokenizer_model_type']}"))
    return out + [("env", None, name) for name in plan["env"]]
