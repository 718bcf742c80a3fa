"""``python DIR PLAN.json``: the probe started from its directory (no package context)."""

from __future__ import annotations

import importlib
import os
import sys

if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    # sys.path[0] is this directory: its parent holds the package, as the probe's one script
    # directory was before (the image's own paths follow, unchanged).
    sys.path[0] = os.path.dirname(here)
    importlib.import_module(os.path.basename(here) + ".main").main()
