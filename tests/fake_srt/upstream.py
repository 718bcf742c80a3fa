"""A small stand-in for the NVIDIA/srt-slurm repository, built as a real git repository.

No GitHub here: the tests need an "upstream" with tags, a ``srtctl`` entry point and a
marshmallow-style schema that rejects unknown fields at every level, plus PR patches made
with ``git format-patch``. Its shapes follow srt-slurm (``src/srtctl/core/config.py``'s
``load_config`` wraps a ValidationError whose ``messages`` nest like the recipe).
"""

from __future__ import annotations

import subprocess
import textwrap
from dataclasses import dataclass
from pathlib import Path

ENV = {
    "GIT_AUTHOR_NAME": "upstream",
    "GIT_AUTHOR_EMAIL": "upstream@example.invalid",
    "GIT_COMMITTER_NAME": "upstream",
    "GIT_COMMITTER_EMAIL": "upstream@example.invalid",
    "GIT_AUTHOR_DATE": "2026-07-22T00:00:00Z",
    "GIT_COMMITTER_DATE": "2026-07-22T00:00:00Z",
    "PATH": "/usr/bin:/bin:/usr/local/bin",
    "HOME": "/tmp",
}

PYPROJECT = """\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "srtctl"
version = "1.0.36"
dependencies = ["pyyaml"]

[project.scripts]
srtctl = "srtctl.cli.submit:main"

[tool.setuptools.packages.find]
where = ["src"]
"""

SCHEMA = '''\
"""Recipe schema: every level rejects unknown fields (like marshmallow's RAISE).

The key set is srt-slurm's at v1.0.36/v1.0.37 (src/srtctl/core/schema.py and the backend
schemas), written from its field names, not from what any recipe writer emits.
"""


class ValidationError(Exception):
    def __init__(self, messages):
        super().__init__(messages)
        self.messages = messages if isinstance(messages, (dict, list)) else [messages]


FREE = None  # a free-form mapping: any keys
ANY = "any"
STR, INT, BOOL, FLOAT, LIST = "str", "int", "bool", "float", "list"
STAGES = {"prefill": FREE, "decode": FREE, "aggregated": FREE}
ENVS = {"prefill_environment": FREE, "decode_environment": FREE, "aggregated_environment": FREE}
MOONCAKE = {"container": STR, "env": FREE, "master_extra_args": LIST, "store_config": FREE}
BACKENDS = {
    "sglang": {"type": STR, "gpu_type": STR, **ENVS, "sglang_config": STAGES,
               "kv_events_config": ANY, "mooncake_kv_store": MOONCAKE},
    "vllm": {"type": STR, **ENVS, "vllm_config": STAGES, "set_cuda_visible_devices": BOOL,
             "connector": STR, "mooncake_kv_store": MOONCAKE, "kv_events_config": ANY,
             "allow_prefill_decode_colocation": BOOL,
             "allow_prefill_decode_colocation_across_nodes": BOOL, "dp_launch_mode": STR},
    "trtllm": {"type": STR, **ENVS, "trtllm_config": STAGES, "publish_events_and_metrics": BOOL},
}
SCHEMA = {
    "name": STR,
    "model": {"path": STR, "container": STR, "precision": STR, "stage_dir": STR},
    "resources": {"gpu_type": STR, "gpus_per_node": INT, "prefill_nodes": INT,
                  "decode_nodes": INT, "prefill_workers": INT, "decode_workers": INT,
                  "agg_nodes": INT, "agg_workers": INT, "spread_workers": BOOL,
                  "het_jobs": BOOL, "gpus_per_prefill": INT, "gpus_per_decode": INT,
                  "gpus_per_agg": INT},
    "slurm": {"account": STR, "partition": STR, "time_limit": STR},
    "backend": "backend",
    "frontend": {"type": STR, "enable_multiple_frontends": BOOL,
                 "num_additional_frontends": INT, "nginx_container": STR,
                 "nginx_raise_ulimit": BOOL, "nginx_session_affinity": BOOL,
                 "nginx_session_affinity_header": STR, "args": FREE, "env": FREE,
                 "ctx_router": FREE, "gen_router": FREE, "server_config_extra": FREE,
                 "orchestrator_placement": STR},
    "dynamo": {"install": BOOL, "version": STR, "hash": STR, "top_of_tree": BOOL,
               "wheel": STR, "request_plane": STR, "event_plane": STR,
               "cargo_patches": LIST},
    "benchmark": {"type": STR, "isl": INT, "osl": INT, "concurrencies": ANY,
                  "req_rate": ANY, "client_placement": STR, "sweep": FREE,
                  "num_examples": INT, "max_tokens": INT, "repeat": INT, "num_threads": INT,
                  "max_context_length": INT, "categories": LIST, "num_shots": INT,
                  "temperature": FLOAT, "top_p": FLOAT, "top_k": INT, "num_requests": INT,
                  "concurrency": INT, "prefix_ratios": ANY, "mooncake_workload": STR,
                  "ttft_threshold_ms": INT, "itl_threshold_ms": INT,
                  "random_range_ratio": FLOAT, "num_prompts_mult": INT,
                  "num_warmup_mult": INT, "dataset_name": STR, "dataset_path": STR,
                  "trace_file": STR, "custom_tokenizer": STR, "use_chat_template": BOOL,
                  "reuse_http_connections": BOOL, "command": STR, "container_image": STR,
                  "env": FREE, "aiperf_package": STR, "aiperf_args": FREE,
                  "export_node_metrics": BOOL, "slow_down_sleep_time": FLOAT,
                  "slow_down_wait_time": FLOAT},
    "profiling": {"type": STR, "extra_nsys_args": LIST, "prefill": FREE, "decode": FREE,
                  "aggregated": FREE, "delay_secs": INT, "duration_secs": INT,
                  "benchmark_duration_secs": INT},
    "output": {"log_dir": STR},
    "health_check": {"max_attempts": INT, "interval_seconds": INT},
    "infra": {"etcd_nats_dedicated_node": BOOL, "nats_max_payload_mb": INT},
    "observability": {"enable_otel": BOOL, "otel_endpoint": STR},
    "telemetry": FREE,
    "environment": FREE,
    "container_mounts": FREE,
    "extra_mount": LIST,
    "srun_options": FREE,
    "sbatch_directives": FREE,
    "enable_config_dump": BOOL,
    "setup_script": STR,
    "identity": FREE,
    "reporting": FREE,
}
REQUIRED = {"name": (), "model": ("path", "container", "precision"), "resources": ("gpu_type",)}
KINDS = {STR: (str, "Not a valid string."), INT: (int, "Not a valid integer."),
         BOOL: (bool, "Not a valid boolean."), FLOAT: ((int, float), "Not a valid number."),
         LIST: (list, "Not a valid list.")}


def check(data, schema):
    errors = {}
    for key, value in data.items():
        if key not in schema:
            errors[key] = ["Unknown field."]
            continue
        kind = schema[key]
        if kind is FREE or kind == ANY:
            continue
        if kind == "backend":
            btype = value.get("type", "sglang") if isinstance(value, dict) else None
            if btype not in BACKENDS:
                errors[key] = [f"Unknown backend type: {btype!r}. Supported types: "
                               "sglang, trtllm, vllm, mocker"]
                continue
            kind = BACKENDS[btype]
        if isinstance(kind, dict):
            if not isinstance(value, dict):
                errors[key] = ["Not a valid mapping type."]
                continue
            nested = check(value, kind)
            if nested:
                errors[key] = nested
        elif not isinstance(value, KINDS[kind][0]) or (kind == INT and isinstance(value, bool)):
            errors[key] = [KINDS[kind][1]]
    return errors


def missing(data):
    errors = {}
    for key, fields in REQUIRED.items():
        if key not in data:
            errors[key] = ["Missing data for required field."]
        elif isinstance(data[key], dict):
            absent = {f: ["Missing data for required field."] for f in fields if f not in data[key]}
            if absent:
                errors[key] = absent
    return errors


def validate(data):
    errors = {**missing(data), **check(data, SCHEMA)}
    if errors:
        raise ValidationError(errors)
    dynamo = data.get("dynamo") or {}
    sources = [k for k in ("hash", "top_of_tree", "wheel") if dynamo.get(k)]
    if len(sources) > 1:
        raise ValueError("Cannot specify both Dynamo install sources: " + ", ".join(sources))
    post_validate(data)


def post_validate(data):
    pass
'''

FRONTENDS = """\
FRONTENDS = ("dynamo", "sglang", "trtllm_serve")


def get_frontend(frontend_type):
    if frontend_type not in FRONTENDS:
        raise ValueError(
            f"Unknown frontend type: {frontend_type!r}. Supported: " + ", ".join(FRONTENDS)
        )
    return frontend_type
"""

BENCHMARKS = """\
RUNNERS = ("custom", "gpqa", "gsm8k", "lm-eval", "longbenchv2", "mmlu", "mooncake-router",
           "router", "sa-bench", "sglang-bench", "trace-replay")


def get_runner(benchmark_type):
    if benchmark_type not in RUNNERS:
        available = ", ".join(sorted(RUNNERS))
        raise ValueError(f"Unknown benchmark type: {benchmark_type}. Available: {available}")
    return benchmark_type
"""

CONFIG = '''\
"""Load a recipe: YAML -> validated config (raises ValueError from ValidationError)."""

import yaml

from .schema import validate


def load_config(path):
    with open(path) as f:
        data = yaml.safe_load(f)
    if not isinstance(data, dict):
        raise TypeError(f"{path}: top level must be a mapping")
    try:
        validate(data)
    except Exception as e:
        raise ValueError(f"Invalid config in {path}: {e}") from e
    return data
'''

SUBMIT = '''\
"""srtctl: `dry-run -f RECIPE` loads the recipe and renders its sbatch script, no Slurm."""

import argparse
import sys

from srtctl.core.config import load_config

TEMPLATE = """#!/bin/bash
#SBATCH --job-name={name}
#SBATCH --nodes={nodes}
#SBATCH --output={log_dir}/slurm.out
srun --container-image={container} ...
"""


# The render fails on an unknown placeholder in output.log_dir: the stand-in's own render-time
# failure (srt-slurm's real dry-run renders a jinja template). What k3env relies on is
# srtctl's contract on any failure: an `Error: ...` line on stdout and exit 1.
def render(config):
    resources = config.get("resources") or {}
    nodes = resources.get("agg_nodes") or 1
    log_dir = (config.get("output") or {}).get("log_dir", "./outputs/{job_id}/logs")
    try:
        log_dir = log_dir.format(job_id="dry-run")
    except (KeyError, IndexError) as e:
        raise ValueError(f"output.log_dir: unknown placeholder {e} in {log_dir!r}") from e
    return TEMPLATE.format(name=config["name"], nodes=nodes, log_dir=log_dir,
                           container=config["model"]["container"])


def main():
    parser = argparse.ArgumentParser(prog="srtctl")
    sub = parser.add_subparsers(dest="command", required=True)
    dry = sub.add_parser("dry-run", help="Validate without submitting")
    dry.add_argument("-f", "--file", dest="config", required=True)
    args = parser.parse_args()
    try:
        config = load_config(args.config)
        print(render(config))
    except Exception as e:
        print(f"Error: {e}")
        return 1
    print("DRY-RUN")
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''


@dataclass(frozen=True)
class Upstream:
    path: Path
    v1036: str  # tag v1.0.36
    pr278: str  # merged commit of "support direct aggregate serving" (tag v1.0.37)
    multinode: str  # the multi-node patch commit on top of PR #278
    patches: Path  # directory with the format-patch files


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, env=ENV, check=True, capture_output=True, text=True
    ).stdout.strip()


def commit(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def build(root: Path) -> Upstream:
    repo = root / "srt-slurm"
    src = repo / "src/srtctl"
    v1036 = _v1036(repo, src)
    _pr278(src)
    pr278 = commit(repo, "support direct aggregate serving (#278)")
    git(repo, "tag", "v1.0.37")
    _pr296(src)
    multinode = commit(repo, "direct vllm frontend: vLLM-native multi-node serve")
    _mocker(src)
    commit(repo, "frontend: mocker type")
    git(repo, "tag", "v1.0.38")
    patches = root / "patches"
    patches.mkdir()
    (patches / "pr278.patch").write_text(
        git(repo, "format-patch", "--stdout", f"{v1036}..{pr278}") + "\n"
    )
    (patches / "multinode.patch").write_text(
        git(repo, "format-patch", "--stdout", f"{pr278}..{multinode}") + "\n"
    )
    return Upstream(path=repo, v1036=v1036, pr278=pr278, multinode=multinode, patches=patches)


def _v1036(repo: Path, src: Path) -> str:
    """The repository at tag v1.0.36: its package, schema, config loader, CLI and lookups."""
    for sub in ("core", "cli", "frontends", "benchmarks"):
        (src / sub).mkdir(parents=True)
        (src / sub / "__init__.py").write_text("")
    git(repo, "init", "-q", "-b", "main")
    (repo / "pyproject.toml").write_text(PYPROJECT)
    (src / "__init__.py").write_text("")
    (src / "core/schema.py").write_text(SCHEMA)
    (src / "core/config.py").write_text(CONFIG)
    (src / "cli/submit.py").write_text(SUBMIT)
    (src / "frontends/base.py").write_text(FRONTENDS)
    (src / "benchmarks/base.py").write_text(BENCHMARKS)
    v1036 = commit(repo, "srt-slurm v1.0.36")
    git(repo, "tag", "v1.0.36")
    return v1036


def _pr278(src: Path) -> None:
    """PR #278: the vllm frontend, and its load-time checks (srt-slurm's messages, in order)."""
    frontends = src / "frontends/base.py"
    frontends.write_text(
        frontends.read_text().replace(
            'FRONTENDS = ("dynamo", "sglang", "trtllm_serve")',
            'FRONTENDS = ("dynamo", "sglang", "trtllm_serve", "vllm")',
        )
    )
    schema = src / "core/schema.py"
    schema.write_text(
        schema.read_text().replace(
            "def post_validate(data):\n    pass\n",
            textwrap.dedent(
                """\
                def post_validate(data):
                    frontend = data.get("frontend") or {}
                    if frontend.get("type") != "vllm":
                        return
                    backend = (data.get("backend") or {}).get("type", "sglang")
                    resources = data.get("resources") or {}
                    if backend != "vllm":
                        raise ValidationError(
                            f"frontend.type: vllm requires backend.type: vllm; got {backend!r}"
                        )
                    if frontend.get("enable_multiple_frontends", True):
                        raise ValidationError(
                            "frontend.type: vllm binds vllm serve directly; set "
                            "frontend.enable_multiple_frontends: false"
                        )
                    if resources.get("prefill_nodes") or resources.get("decode_nodes"):
                        raise ValidationError(
                            "frontend.type: vllm supports aggregate jobs only, not "
                            "disaggregated layouts"
                        )
                    if (resources.get("agg_workers") or 0) < 1:
                        raise ValidationError("frontend.type: vllm requires resources.agg_workers >= 1")
                    if (resources.get("agg_nodes") or 1) != 1:
                        raise ValidationError(
                            "frontend.type: vllm currently supports single-node aggregate jobs only"
                        )
                """
            ),
        )
    )


def _pr296(src: Path) -> None:
    """PR #296: multi-node aggregate jobs with the direct vllm frontend."""
    schema = src / "core/schema.py"
    text = schema.read_text()
    schema.write_text(
        text.replace(
            """    if (resources.get("agg_workers") or 0) < 1:
        raise ValidationError("frontend.type: vllm requires resources.agg_workers >= 1")
    if (resources.get("agg_nodes") or 1) != 1:
        raise ValidationError(
            "frontend.type: vllm currently supports single-node aggregate jobs only"
        )
""",
            """    workers = resources.get("agg_workers") or 0
    if workers != 1:
        raise ValidationError(
            f"frontend.type: vllm supports exactly one aggregate worker, got {workers}."
        )
""",
        )
    )


def _mocker(src: Path) -> None:
    """A later release that touched the same lines again: PR #278 no longer reverses cleanly,
    yet it is upstream (its commit is an ancestor of the tag)."""
    frontends = src / "frontends/base.py"
    schema = src / "core/schema.py"
    frontends.write_text(
        frontends.read_text().replace(
            '"trtllm_serve", "vllm")', '"trtllm_serve", "vllm", "mocker")'
        )
    )
    schema.write_text(
        schema.read_text().replace(
            "frontend.type: vllm binds vllm serve directly; set ",
            "frontend.type: vllm binds vllm serve to the public port; set ",
        )
    )
