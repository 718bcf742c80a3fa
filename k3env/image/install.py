"""Pinned wheels into a new layer: the one way k3env turns ``pip install`` into image bytes.

A throwaway container of the base runs its own Python with
``k3env/probes/probe/install.py``: pip installs the hash-pinned wheels ``--no-deps
--no-index --require-hashes --ignore-installed --root`` into a host directory; every file is
dated the layer's instant; sources are byte-compiled in sorted order, slices of the list in
fresh interpreters at once, one per CPU (hash-checked or timestamp ``.pyc``,
``PYTHONHASHSEED=0``); the base's releases of the same distributions are listed (to be
whited out, as pip's uninstall would remove them), with the modes of the base's directories
the layer touches. The host then writes the tree as one
layer (``layer.tree_layer``) and loads it, checking the ID.
Used by the CPU twin's second stage and by the pinned components layer.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from k3env import jsontext
from k3env.engine.naming import CLASSIC, ImageNames, engine_id
from k3env.engine.protocol import Engine
from k3env.errors import EngineError
from k3env.log import Log

OUT = "/k3env/out"
META = "/k3env/meta"

# The script that runs in the base (stdlib only): a module of the probe package, run as
# ``python -c TEXT CONFIG`` (see its docstring for the stages and where each runs).
_SCRIPT = (resources.files("k3env.probes.probe") / "install.py").read_text()


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
    config = _config(epoch, pyc, pip_from_wheel, replace)
    mounts = _mounts(requirements, wheelhouse)
    if native is not None:
        unpack(engine, native, python, requirements=requirements, wheelhouse=wheelhouse,
               out=out, meta=meta, epoch=epoch, pyc=pyc, pip_from_wheel=pip_from_wheel,
               log=log, where=where)  # fmt: skip
        return read_base(engine, image, python, out=out, meta=meta, replace=replace, log=log,
                         where=where)  # fmt: skip
    _in(engine, image, python, config, mounts, {str(out): OUT, str(meta): META}, log, where)
    return _meta(meta)


def unpack(
    engine: Engine,
    native: Native,
    python: str,
    *,
    requirements: Path,
    wheelhouse: Path,
    out: Path,
    meta: Path,
    epoch: int,
    pyc: str,
    pip_from_wheel: bool,
    log: Log,
    where: str,
) -> None:
    """The install's first half alone, in ``native``'s image: the wheels unpacked into
    ``out`` for the base's platform tags and byte-compiled, nothing of the base read."""
    config = {**_config(epoch, pyc, pip_from_wheel, ()), "stages": ["install"],
              "platforms": list(native.platform_tags)}  # fmt: skip
    _in(engine, native.image, python, config, _mounts(requirements, wheelhouse),
        {str(out): OUT, str(meta): META}, log, where)  # fmt: skip


def read_base(
    engine: Engine,
    image: str,
    python: str,
    *,
    out: Path,
    meta: Path,
    replace: Sequence[str],
    log: Log,
    where: str,
) -> dict[str, Any]:
    """The install's second half alone: what ``image`` holds of ``replace`` and the modes of
    its directories that ``out`` touches (``out`` mounted read-only)."""
    config = {**_config(0, "TIMESTAMP", False, replace), "stages": ["dirs"]}
    _in(engine, image, python, config, {str(out): OUT}, {str(meta): META}, log, where)
    return _meta(meta)


def _config(epoch: int, pyc: str, pip_from_wheel: bool, replace: Sequence[str]) -> dict[str, Any]:
    return {"epoch": epoch, "pyc": pyc, "pip": "wheel" if pip_from_wheel else "module",
            "replace": list(replace), "stages": ["install", "dirs"], "platforms": []}  # fmt: skip


def _mounts(requirements: Path, wheelhouse: Path) -> dict[str, str]:
    assert requirements.name == "requirements.txt"  # mounted as /k3env/req
    return {str(wheelhouse): "/k3env/wheels", str(requirements.parent): "/k3env/req"}


def _meta(meta: Path) -> dict[str, Any]:
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
        [python, "-c", _SCRIPT, jsontext.dumps(config, sort_keys=False)],
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
    engine: Engine,
    archive: bytes | Path | tuple[bytes | Path, ...],
    names: ImageNames,
    reference: str,
    log: Log,
) -> str:
    """Load an archive k3env wrote (``layer.load_archive``) and tag it, only if the engine
    stored exactly that image: its ID is what ``naming.engine_id`` says this engine's store
    calls ``names`` (the config digest, or the manifest's); else remove what it stored and
    fail. Returns the engine's ID."""
    store = engine.image_store()
    expected = engine_id(store, names)
    parts = archive if isinstance(archive, tuple) else (archive,)
    size = sum(p.stat().st_size if isinstance(p, Path) else len(p) for p in parts)
    with log.step(f"load {reference} ({size / 1e6:.1f} MB)"):
        loaded = engine.load(archive)
    if loaded != expected:
        engine.remove(loaded)
        what = "config" if store == CLASSIC else "manifest"
        raise EngineError(
            f"the engine stored {loaded}, expected {expected} (the {what} digest k3env wrote; "
            f"the engine's image store: {store})",
            where=reference,
            fix=f"the engine rewrote the image's {what}: report it, with `docker version`",
        )
    engine.tag(loaded, *reference.rsplit(":", 1))
    return loaded
