"""Validate srt-slurm recipes with srt-slurm's own config loading.

Runs with the interpreter of the environment k3env installed srtctl into (carried at run
time, never copied into srt-slurm). Prints one JSON line: every error as file, key path and
srt-slurm's message. marshmallow's ValidationError carries ``messages``, a dict nested like
the recipe (``{"benchmark": {"aiperf_server_metrics": ["Unknown field."]}}``).
"""

from __future__ import annotations

import importlib
import json
import sys
import traceback
from collections.abc import Callable, Iterator
from typing import Any


def flatten(messages: Any, prefix: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(messages, dict):
        for key, value in messages.items():
            yield from flatten(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(messages, (list, tuple)) and all(isinstance(m, str) for m in messages):
        for m in messages:
            yield prefix, m
    elif isinstance(messages, (list, tuple)):
        for i, m in enumerate(messages):
            yield from flatten(m, f"{prefix}[{i}]")
    else:
        yield prefix, str(messages)


def load_config_function() -> Callable[[str], Any]:
    load: Callable[[str], Any] = importlib.import_module("srtctl.core.config").load_config
    return load


def field(config: Any, *keys: str) -> Any:
    """``config.a.b`` (srt-slurm's dataclasses) or ``config["a"]["b"]`` (a mapping)."""
    for key in keys:
        if config is None:
            return None
        config = config.get(key) if isinstance(config, dict) else getattr(config, key, None)
    return config


# What srt-slurm looks up only when the job runs (its dry-run does not): the frontend and the
# benchmark runner, by the recipe's type, through srt-slurm's own registries.
JOB_TIME = (
    ("frontend.type", "srtctl.frontends.base", "get_frontend", "dynamo"),
    ("benchmark.type", "srtctl.benchmarks.base", "get_runner", None),
)


NOT_CHECKED: list[str] = []


def job_time_errors(path: str, config: Any) -> list[dict[str, str]]:
    errors = []
    for key, module, function, default in JOB_TIME:
        value = field(config, *key.split(".")) or default
        if value is None or value == "manual":  # srt-slurm handles "manual" inline
            continue
        try:
            lookup = getattr(importlib.import_module(module), function)
        except (ImportError, AttributeError):
            note = f"{key}: this srt-slurm has no {module}.{function} to ask"
            if note not in NOT_CHECKED:
                NOT_CHECKED.append(note)
            continue
        try:
            lookup(value)
        except Exception as e:
            errors.append({"file": path, "key": key, "message": str(e), "stage": "job"})
    return errors


def main() -> None:
    errors: list[dict[str, str]] = []
    try:
        load_config = load_config_function()
    except Exception:
        failure = {"file": "", "key": "", "message": traceback.format_exc(limit=-3),
                   "stage": "load"}  # fmt: skip
        print(json.dumps({"errors": [failure], "not_checked": []}))
        return
    for path in sys.argv[1:]:
        try:
            config = load_config(path)
            errors += job_time_errors(path, config)
        except Exception as e:
            # load_config wraps marshmallow's ValidationError ("Invalid config in PATH: ...");
            # the structured messages are on the wrapped exception.
            messages = None
            cause: BaseException | None = e
            while cause is not None and not messages:
                messages = getattr(cause, "messages", None)
                cause = cause.__cause__ or cause.__context__
            if messages:
                errors += [
                    {"file": path, "key": k, "message": m, "stage": "load"}
                    for k, m in flatten(messages)
                ]
            else:
                message = str(e).removeprefix(f"Invalid config in {path}: ")
                errors.append({"file": path, "key": "", "message": message, "stage": "load"})
    print(json.dumps({"errors": errors, "not_checked": NOT_CHECKED}))


if __name__ == "__main__":
    main()
