"""The builder's wheel build from a pinned source commit, run in a container of the base
(standard library only): ``python -c TEXT PROJECT...`` with this file's text
(``k3env.image.sources`` runs it). Each project under /k3env/src is built with the base's own
pip, offline and without build isolation, into /k3env/out."""

from __future__ import annotations

import os
import subprocess
import sys


def main() -> None:
    env = dict(os.environ, PIP_NO_CACHE_DIR="1", HOME="/tmp", PIP_BREAK_SYSTEM_PACKAGES="1")
    for project in sys.argv[1:]:
        print(f"building {project}", flush=True)
        code = subprocess.call(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
             "--no-index", "--disable-pip-version-check", "--wheel-dir", "/k3env/out",
             os.path.join("/k3env/src", project)],
            env=env,
        )  # fmt: skip
        if code:
            sys.exit(code)


if __name__ == "__main__":
    main()
