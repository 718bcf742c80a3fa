"""The twin's second layer, made beside its first stage.

Building stage 1 (debootstrap; under qemu-user for another architecture, minutes) and making
the second layer's files (the pinned wheels downloaded, unpacked and byte-compiled) need
nothing of each other, so they run at once: stage 1 here, the wheels in a worker thread.
Where a native image holds the base's Python release, the worker goes on to write the layer
and keep its registry form, with the directory modes read from that native image; once stage
1 exists, its own modes are read and compared. Equal, the layer stands (the same bytes as
written from stage 1's modes, by construction); else it is written again from them. Without a
native image, the wheels are installed in stage 1 once it exists, as before. When the twin is
to be pushed, the layer's blob is sent to the registry as soon as it is kept.
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from k3env.engine import registry
from k3env.engine.protocol import BaseImage, Engine
from k3env.files import read_input
from k3env.image.blobs import keep_tree
from k3env.image.install import Native, install_tree, read_base, unpack
from k3env.image.layer import tree_layer, write_tree
from k3env.image.wheels import download_wheels
from k3env.log import Log
from k3env.state import State


@dataclass(frozen=True, kw_only=True)
class SecondLayer:
    diff_id: str
    path: Path
    stage1: BaseImage


@dataclass(frozen=True, kw_only=True)
class Inputs:
    requirements: Path  # the twin's hash-pinned requirements file
    platform: str
    epoch: int  # every mtime is clamped to this instant
    where: str  # the twin's reference, for messages
    keep_level: int | None  # keep the layer's registry form at this zlib level; None: do not
    send_to: str | None = None  # and send it to this registry repository once kept


@dataclass(frozen=True, kw_only=True)
class _Ahead:
    wheelhouse: Path
    native: Native | None
    dirs: dict[str, Any] | None = None  # the modes the layer was written with (native's)
    diff_id: str = ""
    path: Path | None = None


def second_layer(
    engine: Engine,
    state: State,
    log: Log,
    tmp: Path,
    inputs: Inputs,
    *,
    stage1: Callable[[], BaseImage],
    native: Callable[[], Native | None],
) -> SecondLayer:
    """The twin's second layer in ``tmp/layer.tar``, its files made while ``stage1()`` runs."""
    req, out, meta = (tmp / d for d in ("req", "out", "meta"))
    for d in (req, out, meta):
        d.mkdir()
    (req / "requirements.txt").write_bytes(read_input(inputs.requirements))
    layer = tmp / "layer.tar"
    progress = _Progress()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="k3env-twin") as pool:
        ahead = pool.submit(_ahead, engine, state, log, inputs, req / "requirements.txt",
                            out, meta, layer, native, progress)  # fmt: skip
        base = stage1()  # on failure, the pool is waited for and this error stands
        while not progress.installed.wait(0.2):
            if ahead.done():
                ahead.result()  # the worker's error
        dirs = None
        if progress.native is not None:
            # The files are in: stage 1's modes are read while the worker writes the layer.
            with log.step(f"read the directory modes of {inputs.where}'s stage 1"):
                dirs = read_base(engine, base.id, "python3", out=out, meta=meta, replace=(),
                                 log=log, where=inputs.where)["dirs"]  # fmt: skip
        early = ahead.result()
    if early.native is None:
        with log.step(f"install the pinned wheels for {inputs.where} (minutes; progress below)"):
            # Stage 1 has no pip of its own: it runs from its pinned wheel. Timestamp .pyc,
            # their headers the clamp instant (cold imports 16-18 s -> 6-8 s).
            info = install_tree(
                engine, base.id, "python3", requirements=req / "requirements.txt",
                wheelhouse=early.wheelhouse, out=out, meta=meta, epoch=inputs.epoch,
                pyc="TIMESTAMP", pip_from_wheel=True, replace=(), log=log, where=inputs.where,
            )  # fmt: skip
        diff_id, path = _write(out, layer, info["dirs"], inputs, state, log)
        return SecondLayer(diff_id=diff_id, path=path, stage1=base)
    if dirs == early.dirs and early.path is not None:
        log.detail("the same as the native image's: the layer written beside stage 1 stands")
        return SecondLayer(diff_id=early.diff_id, path=early.path, stage1=base)
    log.detail("they differ from the native image's: the layer is written again from them")
    diff_id, path = _write(out, layer, dirs or {}, inputs, state, log)
    return SecondLayer(diff_id=diff_id, path=path, stage1=base)


@dataclass(kw_only=True)
class _Progress:
    """What the worker has done so far: the files are in (``installed``), and by which image."""

    installed: threading.Event = field(default_factory=threading.Event)
    native: Native | None = None


def _ahead(
    engine: Engine,
    state: State,
    log: Log,
    inputs: Inputs,
    requirements: Path,
    out: Path,
    meta: Path,
    layer: Path,
    native: Callable[[], Native | None],
    progress: _Progress,
) -> _Ahead:
    """The worker's part: the wheelhouse; with a native image, the files, the layer written
    with that image's directory modes, and its registry form."""
    wheelhouse = download_wheels(inputs.requirements, state, log, inputs.platform)
    helper = native()
    if helper is None:
        progress.installed.set()
        return _Ahead(wheelhouse=wheelhouse, native=None)
    where = inputs.where
    with log.step(f"install the pinned wheels for {where} natively (beside stage 1)"):
        unpack(engine, helper, "python3", requirements=requirements, wheelhouse=wheelhouse,
               out=out, meta=meta, epoch=inputs.epoch, pyc="TIMESTAMP", pip_from_wheel=True,
               log=log, where=where)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="k3env-dirs-") as scratch:
        dirs = read_base(engine, helper.image, "python3", out=out, meta=Path(scratch), replace=(),
                         log=log, where=where)["dirs"]  # fmt: skip
    progress.native = helper
    progress.installed.set()
    diff_id, path = _write(out, layer, dirs, inputs, state, log)
    return _Ahead(wheelhouse=wheelhouse, native=helper, dirs=dirs, diff_id=diff_id, path=path)


def _write(
    out: Path, layer: Path, dirs: dict[str, Any], inputs: Inputs, state: State, log: Log
) -> tuple[str, Path]:
    """The layer of ``out`` with ``dirs``' modes: its diff ID and file, a tar at ``layer``, or
    with ``keep_level`` its registry form written straight into the state (and sent)."""
    if inputs.keep_level is None:
        with log.step(f"write the layer of {inputs.where}"):
            return tree_layer(out, layer, mtime=inputs.epoch, owners=False, dirs=dirs), layer
    level = inputs.keep_level
    with log.step(f"write the layer of {inputs.where} as its registry form (gzip level {level})"):
        diff_id, blob = keep_tree(state, level, lambda sink: write_tree(
            out, sink, mtime=inputs.epoch, owners=False, dirs=dirs))  # fmt: skip
    if inputs.send_to and not registry.blob_exists(inputs.send_to, blob.digest):
        # Sent now, beside stage 1: the twin's push then finds it there.
        with log.step(f"send {blob.digest[7:19]} ({blob.size / 1e6:.0f} MB)"):
            registry.put_blob(inputs.send_to, blob.digest, blob.path)
    return diff_id, blob.path
