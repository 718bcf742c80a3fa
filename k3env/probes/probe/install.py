"""The builder's install, run in a throwaway container of the base (standard library only):
``python -c TEXT CONFIG`` with this file's text (``k3env.image.install`` runs it).

CONFIG is JSON ``{epoch, pyc, pip, replace, stages, platforms}``. Stage ``install`` unpacks the
hash-pinned wheels into OUT and byte-compiles them; stage ``dirs`` reads the base (what it
holds of the replaced distributions, its directories' modes) and writes META/meta.json. Both
run in the base, except for a base of another architecture whose Python is the same release as
a native image's: there ``install`` runs natively (pip told the base's platform tags; unpacking
and ``.pyc`` bytes do not depend on the CPU) and only ``dirs`` under emulation.
"""

from __future__ import annotations

import glob
import importlib.metadata as md
import json
import os
import re
import subprocess
import sys
from typing import Any

OUT, META = "/k3env/out", "/k3env/meta"
REQUIREMENTS = "/k3env/req/requirements.txt"

# pip refuses --platform without --target (its other checks stand): the wheels go into the
# base's own layout under --root, as the base's pip would put them.
FOREIGN = (
    "import sys\n"
    "sys.path.insert(0, sys.argv.pop(1))\n"
    "from pip._internal.cli import cmdoptions\n"
    "check = cmdoptions.check_dist_restriction\n"
    "cmdoptions.check_dist_restriction = lambda options, check_target=False: check(options)\n"
    "from pip._internal.cli.main import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)
# In a process of its own that imports nothing else: marshal's output depends on what the
# compiling interpreter holds, and so the .pyc bytes on what the script that starts it imported.
COMPILE = (
    "import os, py_compile, sys\n"
    "mode = getattr(py_compile.PycInvalidationMode, sys.argv[1])\n"
    "paths = [p for p in open(sys.argv[2]).read().split('\\0') if p]\n"
    "for n, path in enumerate(paths):\n"
    "    try:\n"
    "        py_compile.compile(path, dfile='/' + os.path.relpath(path, sys.argv[3]),\n"
    "                           doraise=True, invalidation_mode=mode)\n"
    "    except py_compile.PyCompileError:\n"
    "        pass  # as compileall: a file Python cannot compile stays source only\n"
    "    if n % 5000 == 4999:\n"
    "        print(f'  {n + 1} of {len(paths)}', flush=True)\n"
)


def canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def install(cfg: dict[str, Any]) -> None:
    """pip installs the pinned wheels into OUT; every file dated the layer's instant."""
    with open(REQUIREMENTS) as f:
        count = sum("--hash" in line for line in f)
    print(f"installing {count} pinned wheels", flush=True)
    # A base without pip of its own runs pip from its wheel (the twin's first stage).
    wheel = sorted(glob.glob("/k3env/wheels/pip-*.whl"))[-1] if cfg["pip"] == "wheel" else ""
    if cfg["platforms"]:
        pip = [sys.executable, "-c", FOREIGN, wheel]
    elif wheel:
        pip = [sys.executable, wheel + "/pip"]
    else:
        pip = [sys.executable, "-m", "pip"]
    tags = [a for t in cfg["platforms"] for a in ("--platform", t)]
    env = dict(os.environ, PIP_BREAK_SYSTEM_PACKAGES="1", PIP_NO_CACHE_DIR="1", HOME="/tmp")
    code = subprocess.call(
        [*pip, "install", "--no-deps", "--no-index", "--require-hashes", "--ignore-installed",
         "--no-compile", "--no-warn-script-location", "--disable-pip-version-check",
         *tags, "--root", OUT, "--find-links", "/k3env/wheels", "-r", REQUIREMENTS],
        env=env,
    )  # fmt: skip
    if code:
        sys.exit(code)
    byte_compile(cfg["epoch"], cfg["pyc"])


def byte_compile(epoch: int, pyc: str) -> None:
    """Every file dated ``epoch`` before compiling: timestamp .pyc headers hold it, so they stay
    valid in the image (whose mtimes are that instant) and in an export."""
    sources = []
    for root, dirs, files in os.walk(OUT):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            os.utime(path, (epoch, epoch), follow_symlinks=False)
            if name.endswith(".py") and not os.path.islink(path):
                sources.append(path)
    sources.sort()
    # One fresh interpreter per slice of the sorted list, the slices at once: a module's
    # .pyc bytes depend on its source and the CPython release, not on what the same process
    # compiled before it, so any number of slices gives the same files (the twin's layer
    # has the same diff ID either way); one per CPU, at least 2,000 modules each.
    jobs = max(1, min(os.cpu_count() or 1, 8, len(sources) // 2000))
    print(f"byte-compiling {len(sources)} modules ({pyc.lower()} .pyc, {jobs} at once)",
          flush=True)  # fmt: skip
    step = -(-len(sources) // jobs) if sources else 1
    procs = []
    for n, start in enumerate(range(0, len(sources), step)):
        listing = f"/tmp/k3env-sources-{n}"
        with open(listing, "w") as f:
            f.write("\0".join(sources[start : start + step]))
        procs.append(subprocess.Popen([sys.executable, "-c", COMPILE, pyc, listing, OUT]))
    codes = [p.wait() for p in procs]
    if any(codes):
        sys.exit(next(c for c in codes if c))
    for root, _, files in os.walk(OUT):
        for name in files:
            if name.endswith(".pyc"):
                os.utime(os.path.join(root, name), (epoch, epoch))


def read_base(replace: list[str]) -> None:
    """What the base already holds of these distributions (replaced, as pip would uninstall
    it), and the modes and owners of the base's own directories the layer touches: those pip
    wrote into, and the parents of what it replaces. Into META/meta.json."""
    replaced: dict[str, list[dict[str, Any]]] = {}
    for dist in md.distributions():
        name = canon(dist.metadata["Name"] or "")
        if name in replace:
            files = [os.path.normpath(str(dist.locate_file(f))) for f in (dist.files or [])]
            replaced.setdefault(name, []).append({"version": dist.version, "files": files})
    wanted = {"/" + os.path.relpath(root, OUT) for root, _, _ in os.walk(OUT) if root != OUT}
    for installs in replaced.values():
        for one in installs:
            for path in one["files"]:
                parent = os.path.dirname(path)
                while parent not in ("/", ""):
                    wanted.add(parent)
                    parent = os.path.dirname(parent)
    dirs = {}
    for real in wanted:
        if os.path.isdir(real) and not os.path.islink(real):
            st = os.stat(real)
            dirs[real] = [st.st_mode & 0o7777, st.st_uid, st.st_gid]
    with open(os.path.join(META, "meta.json"), "w") as f:
        json.dump({"replaced": replaced, "dirs": dirs}, f)


def main() -> None:
    cfg = json.loads(sys.argv[1])
    if "install" in cfg["stages"]:
        install(cfg)
    if "dirs" in cfg["stages"]:
        read_base(cfg["replace"])


if __name__ == "__main__":
    main()
