"""srt-slurm 2.x's own schema gate and role/engine/services expansion on recipe files.

Runs with the interpreter of the environment k3env installed srtctl into (carried at run
time, never copied into srt-slurm): each file through ``srtctl.core.config``'s
``resolve_config_with_defaults`` (``require_current_schema``, then ``expand_roles`` and
``expand_services``) with no cluster config. Prints one JSON line: file -> None (it passes) or
srt-slurm's own message; or ``error`` when that function cannot be had.
"""

from __future__ import annotations

import importlib
import json
import sys


def main(paths: list[str]) -> int:
    try:
        # srt-slurm's environment, not k3env's: its PyYAML, its srtctl
        yaml = importlib.import_module("yaml")
        resolve_config_with_defaults = importlib.import_module(
            "srtctl.core.config"
        ).resolve_config_with_defaults
    except Exception as e:  # the reason is the verdict
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}))
        return 0
    results: dict[str, str | None] = {}
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                resolve_config_with_defaults(yaml.safe_load(f), None)
            results[path] = None
        except Exception as e:  # srt-slurm's own message is the finding
            results[path] = f"{type(e).__name__}: {e}"
    print(json.dumps({"results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
