"""Pinned wheels into a new layer: the one way k3env turns ``pip install`` into image bytes.

A throwaway container of the base runs its own Python with the script below: pip installs
the hash-pinned wheels ``--no-deps --no-index --require-hashes --ignore-installed --root``
into a host directory; every file is dated the layer's instant; sources are byte-compiled
one at a time in sorted order (hash-checked or timestamp ``.pyc``, ``PYTHONHASHSEED=0``); the
base's releases of the same distributions are listed (to be whited out, as pip's uninstall
would remove them), with the modes of the base's directories the layer touches. The host
then writes the tree as one layer (``layer.tree_layer``) and loads it, checking the ID.
Used by the CPU twin's second stage and by the pinned components layer.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from k3env.engine.protocol import Engine
from k3env.errors import EngineError
from k3env.log import Log

OUT = "/k3env/out"
META = "/k3env/meta"

# Runs in the base: stdlib only. argv[1]: JSON {epoch, pyc, pip, replace, stages, platforms}.
# Stage "install" unpacks and byte-compiles into OUT; stage "dirs" reads the base (what it
# holds of the replaced distributions, its directories' modes) and writes META/meta.json.
# Both run in the base, except for a base of another architecture whose Python is the same
# release as a native image's: there "install" runs natively (pip told the base's platform
# tags; unpacking and .pyc bytes do not depend on the CPU) and only "dirs" under emulation.
_SCRIPT = r"""
import glob, importlib.metadata as md, json, os, py_compile, re, subprocess, sys

OUT, META = "/k3env/out", "/k3env/meta"
cfg = json.loads(sys.argv[1])
epoch = cfg["epoch"]
req = "/k3env/req/requirements.txt"

def canon(name):
    return re.sub(r"[-_.]+", "-", name).lower()

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

if "install" in cfg["stages"]:
    print(f"installing {sum('--hash' in l for l in open(req))} pinned wheels", flush=True)
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
        pip + ["install", "--no-deps", "--no-index", "--require-hashes", "--ignore-installed",
               "--no-compile", "--no-warn-script-location", "--disable-pip-version-check",
               *tags, "--root", OUT, "--find-links", "/k3env/wheels", "-r", req],
        env=env,
    )
    if code:
        sys.exit(code)
    # Every file dated the layer's instant before compiling: timestamp .pyc headers hold it, so
    # they stay valid in the image (whose mtimes are that instant) and in an export.
    sources = []
    for root, dirs, files in os.walk(OUT):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            os.utime(path, (epoch, epoch), follow_symlinks=False)
            if name.endswith(".py") and not os.path.islink(path):
                sources.append(path)
    print(f"byte-compiling {len(sources)} modules ({cfg['pyc'].lower()} .pyc)", flush=True)
    # In a process of its own that imports nothing else: marshal's output depends on what the
    # compiling interpreter holds, and so the .pyc bytes on what this script imported.
    with open("/tmp/k3env-sources", "w") as f:
        f.write("\0".join(sorted(sources)))
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
    code = subprocess.call([sys.executable, "-c", COMPILE, cfg["pyc"], "/tmp/k3env-sources", OUT])
    if code:
        sys.exit(code)
    for root, _, files in os.walk(OUT):
        for name in files:
            if name.endswith(".pyc"):
                os.utime(os.path.join(root, name), (epoch, epoch))

if "dirs" not in cfg["stages"]:
    sys.exit(0)
# What the base already holds of these distributions: replaced, as pip would uninstall it.
replaced = {}
for dist in md.distributions():
    name = canon(dist.metadata["Name"] or "")
    if name in cfg["replace"]:
        files = [os.path.normpath(str(dist.locate_file(f))) for f in (dist.files or [])]
        replaced.setdefault(name, []).append({"version": dist.version, "files": files})
# The base's own directories keep their modes and owners in the layer: those pip wrote
# into, and the parents of what it replaces.
wanted = {"/" + os.path.relpath(root, OUT) for root, _, _ in os.walk(OUT) if root != OUT}
for installs in replaced.values():
    for install in installs:
        for path in install["files"]:
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
"""


def install_tree(
    engine: Engine,
    image: str,
    python: str,
    *,
    requirements: Path,
    wheelhouse: Path,
    out: Path,
    meta: Path,
    epoch: int,
    pyc: str,
    pip_from_wheel: bool,
    replace: Sequence[str],
    log: Log,
    where: str,
    native: Native | None = None,
) -> dict[str, Any]:
    """Run the install in a throwaway container of ``image`` into ``out``; returns what the
    script found (``replaced``: name -> [{version, files}], ``dirs``: path -> [mode, uid,
    gid]). ``pyc``: ``CHECKED_HASH`` or ``TIMESTAMP``. With ``native``, the unpacking and
    byte-compiling run in its image (the same Python release on the engine's own CPU, pip
    told ``image``'s platform tags), and only the reading of ``image`` runs in ``image``."""
    assert requirements.name == "requirements.txt"  # mounted as /k3env/req
    config = {"epoch": epoch, "pyc": pyc, "pip": "wheel" if pip_from_wheel else "module",
              "replace": list(replace), "stages": ["install", "dirs"], "platforms": []}  # fmt: skip
    mounts = {str(wheelhouse): "/k3env/wheels", str(requirements.parent): "/k3env/req"}
    if native is not None:
        _in(engine, native.image, python, {**config, "stages": ["install"],
            "platforms": list(native.platform_tags)}, mounts, {str(out): OUT, str(meta): META},
            log, where)  # fmt: skip
        _in(engine, image, python, {**config, "stages": ["dirs"]},
            {**mounts, str(out): OUT}, {str(meta): META}, log, where)  # fmt: skip
    else:
        _in(engine, image, python, config, mounts, {str(out): OUT, str(meta): META}, log, where)
    info: dict[str, Any] = json.loads((meta / "meta.json").read_text())
    return info


@dataclass(frozen=True, kw_only=True)
class Native:
    """An image of the engine's own architecture that holds the same Python release as the
    base being installed into, and the base's platform tags for pip."""

    image: str
    platform_tags: tuple[str, ...]


def _in(
    engine: Engine,
    image: str,
    python: str,
    config: Mapping[str, Any],
    mounts: Mapping[str, str],
    writable: Mapping[str, str],
    log: Log,
    where: str,
) -> None:
    result = engine.run(
        image,
        [python, "-c", _SCRIPT, json.dumps(config)],
        timeout=3600,
        env={"PYTHONHASHSEED": "0", "SOURCE_DATE_EPOCH": str(config["epoch"])},
        mounts=dict(mounts),
        writable=dict(writable),
        user=f"{os.getuid()}:{os.getgid()}",
        progress=log.detail,
    )
    if result.exit_code != 0:
        raise EngineError(
            f"installing the pinned wheels failed (exit {result.exit_code}): "
            f"{(result.stdout + result.stderr).strip()[-3000:]}",
            where=where,
            fix="the base needs pip (or pip pinned among the wheels) and wheels that fit its "
            "Python; read the output above",
        )


def add_whiteouts(out: Path, replaced: Mapping[str, Sequence[Mapping[str, Any]]]) -> None:
    """A whiteout in ``out`` for each file of a replaced release that the new one does not
    hold (a replaced ``.dist-info`` directory goes whole), as pip's uninstall would remove."""
    present = {"/" + p.relative_to(out).as_posix() for p in out.rglob("*")}
    gone: set[str] = set()
    for installs in replaced.values():
        for install in installs:
            for removed in install["files"]:
                parent = os.path.dirname(str(removed))
                if parent.endswith(".dist-info") and parent not in present:
                    gone.add(parent)
                elif str(removed) not in present:
                    gone.add(str(removed))
    for whited in sorted(gone):
        if any(whited.startswith(g + "/") for g in gone):
            continue
        folder = out / os.path.dirname(whited).lstrip("/")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f".wh.{os.path.basename(whited)}").write_bytes(b"")


def load_checked(
    engine: Engine, archive: bytes | Path, image_id: str, reference: str, log: Log
) -> str:
    """Load an archive whose config k3env wrote; tag it only if the engine stored exactly
    that config (its ID is the config's sha256), else remove what it stored and fail."""
    size = len(archive) if isinstance(archive, bytes) else archive.stat().st_size
    with log.step(f"load {reference} ({size / 1e6:.1f} MB)"):
        loaded = engine.load(archive)
    if loaded != image_id:
        engine.remove(loaded)
        raise EngineError(
            f"the engine stored {loaded}, expected {image_id}",
            where=reference,
            fix="the engine rewrote the config (a containerd image store?); report it",
        )
    engine.tag(image_id, *reference.rsplit(":", 1))
    return image_id
