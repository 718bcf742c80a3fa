"""Where a module lives on the image's own sys.path, found without importing it (or its
parents). The builder runs this file's text as ``python -c TEXT MODULE...`` (it prints
``{module: file}``); the probe's patch check imports it, so the two agree."""

from __future__ import annotations

import json
import os
import sys


def find_module_file(module: str) -> str | None:
    """The file of ``module`` on sys.path, without importing it (or its parents)."""
    parts = module.split(".")
    for d in sys.path:
        if not d or not os.path.isdir(d):
            continue
        stem = os.path.join(d, *parts)
        for cand in (stem + ".py", os.path.join(stem, "__init__.py")):
            if os.path.isfile(cand):
                return os.path.realpath(cand)
    return None


if __name__ == "__main__":
    print(json.dumps({m: find_module_file(m) for m in sys.argv[1:]}))
