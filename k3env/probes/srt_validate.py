"""Validate srt-slurm recipes with srt-slurm's own config loading.

Runs with the interpreter of the environment k3env installed srtctl into (carried at run
time, never copied into srt-slurm). Prints one JSON line: every error as file, key path and
srt-slurm's message. marshmallow's ValidationError carries ``messages``, a dict nested like
the recipe (``{"benchmark": {"aiperf_server_metrics": ["Unknown field."]}}``).
"""

from __future__ import annotations

import json
import sys
import traceback


def flatten(messages, prefix=""):
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


def load_config_function():
    from srtctl.core import config

    return config.load_config


def main():
    errors = []
    try:
        load_config = load_config_function()
    except Exception:
        print(json.dumps([{"file": "", "key": "", "message": traceback.format_exc(limit=-3)}]))
        return
    for path in sys.argv[1:]:
        try:
            load_config(path)
        except Exception as e:
            # load_config wraps marshmallow's ValidationError ("Invalid config in PATH: ...");
            # the structured messages are on the wrapped exception.
            messages = None
            cause = e
            while cause is not None and not messages:
                messages = getattr(cause, "messages", None)
                cause = cause.__cause__ or cause.__context__
            if messages:
                errors += [{"file": path, "key": k, "message": m} for k, m in flatten(messages)]
            else:
                errors.append({"file": path, "key": "", "message": f"{type(e).__name__}: {e}"})
    print(json.dumps(errors))


if __name__ == "__main__":
    main()
