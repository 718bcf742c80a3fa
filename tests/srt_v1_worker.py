"""Run srt-slurm's own ``VLLMProtocol.build_worker_command`` (a source tree given on the command
line: the pinned tag with the lock's patches applied) for the cases on stdin, and print each
leader worker's argv as JSON. Run in its own process by tests/test_recipe_worker_argv.py, so
srt-slurm's ``srtctl`` never meets another srtctl (srt-slurm 2.x's) in a test's modules.

Stubbed, because nothing here reaches them: marshmallow and marshmallow_dataclass (the schema
layer; ``build_worker_command`` reads none of it, and they are not installed here), the
package ``__init__`` files (they import the whole CLI) and ``srtctl.core.slurm`` (its
``get_hostname_ip`` asks the cluster's DNS: a node's name stands for its IP).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import json
import sys
import types
from pathlib import Path
from typing import Any


def _stub(name: str, **attrs: Any) -> None:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    sys.modules[name] = module


def _load(src: Path) -> tuple[Any, Any]:
    _stub("marshmallow", Schema=type("Schema", (), {}),
          ValidationError=type("ValidationError", (Exception,), {}))  # fmt: skip
    _stub("marshmallow_dataclass", dataclass=dataclasses.dataclass)
    for package in ("srtctl", "srtctl.core", "srtctl.backends"):
        _stub(package, __path__=[str(src.joinpath(*package.split(".")))])
    _stub("srtctl.core.slurm", get_hostname_ip=lambda node, interface=None: node)
    return importlib.import_module("srtctl.backends.vllm"), importlib.import_module(
        "srtctl.core.topology"
    )


def request_plane_default(src: Path) -> Any:
    """``DynamoConfig.request_plane``'s default, as srt-slurm's schema.py writes it (the
    schema layer is marshmallow's: read, not run)."""
    tree = ast.parse((src / "srtctl/core/schema.py").read_text())
    (config,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DynamoConfig"]
    for node in config.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "request_plane":
            return ast.literal_eval(node.value) if node.value else None
    raise LookupError("DynamoConfig has no request_plane")


def leader_argv(vllm: Any, case: dict[str, Any]) -> list[str]:
    """The first worker of ``case["mode"]``: its leader's command, as ``start_worker`` asks
    ``build_worker_command`` for it (``dump_config_path = log_dir / f"{node}_config.json"``)."""
    given = dict(case["backend"])
    config = vllm.VLLMServerConfig(**given.pop("vllm_config", {}))
    fields = {f.name for f in dataclasses.fields(vllm.VLLMProtocol)}
    backend = vllm.VLLMProtocol(
        vllm_config=config, **{k: v for k, v in given.items() if k in fields}
    )
    counts = case["workers"]  # mode -> [workers, gpus per worker]
    mode = case["mode"]
    endpoints = backend.allocate_endpoints(
        num_prefill=counts.get("prefill", [0, 0])[0],
        num_decode=counts.get("decode", [0, 0])[0],
        num_agg=counts.get("agg", [0, 0])[0],
        gpus_per_prefill=counts.get("prefill", [0, 0])[1],
        gpus_per_decode=counts.get("decode", [0, 0])[1],
        gpus_per_agg=counts.get("agg", [0, 0])[1],
        gpus_per_node=case["gpus_per_node"],
        available_nodes=[f"node-{i}" for i in range(32)],
    )
    processes = backend.endpoints_to_processes(endpoints, frontend_type=case["frontend"])
    mine = [p for p in processes if p.endpoint_mode == mode and p.endpoint_index == 0]
    runtime = types.SimpleNamespace(
        model_path=Path(case["model"]), is_hf_model=False, request_plane=case["request_plane"],
        frontend_port=8000, network_interface=None, log_dir=Path(case["log_dir"]),
    )  # fmt: skip
    return list(
        backend.build_worker_command(
            process=mine[0],
            endpoint_processes=mine,
            runtime=runtime,
            frontend_type=case["frontend"],
            dump_config_path=runtime.log_dir / f"{mine[0].node}_config.json",
        )
    )


def main() -> None:
    src = Path(sys.argv[1])
    vllm, _ = _load(src)
    cases = json.load(sys.stdin)
    for case in cases:
        case["request_plane"] = case["request_plane"] or request_plane_default(src)
    print(json.dumps([leader_argv(vllm, case) for case in cases]))


if __name__ == "__main__":
    main()
