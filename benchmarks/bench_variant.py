"""Benchmark: adding a vLLM variant to the matrix (``[variants."vllm-0.29.0".vllm]``).

One run prints, for the lock's vLLM 0.29.0 line over the CPU twin:
  * resolve: ``k3env twin --resolve --variant vllm-0.29.0`` (uv against the twin's file;
    needs the package index, and the CPU torch where ``PIP_FIND_LINKS`` says);
  * layer, cold: its one layer over the twin with an empty k3env state and an empty pip cache
    (the 315 MB wheel downloaded, installed by the twin's pip, byte-compiled, loaded);
  * layer, warm: the layer image removed, the wheelhouse kept (install, compile, load);
  * layer, hit: the engine holds the layer under its content tag;
  * the layer's size (its uncompressed tar, as the engine counts it) and its files;
  * the column's cell: ``k3env matrix --variant vllm-0.29.0 kimi-k3-direct-f`` with the
    variant's derived image and the verify records removed (layer held: the derived image,
    one probe run).
``--quick`` (CI: a broken benchmark fails, its figures are no verdict): each step once on what
this host already holds: the resolve runs, the layer and the cell are not removed to be built
again, and the matrix runs over this host's state (its recorded cells answer). Each figure is
the median of ``--repeat`` runs.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from twin_image import arguments, k3env, rmi  # noqa: E402

from k3env.config.lock import load_lock  # noqa: E402
from k3env.engine.dockerd import DockerEngine  # noqa: E402
from k3env.image.build import make_builder  # noqa: E402
from k3env.image.components import LABEL  # noqa: E402
from k3env.image.twin import twin_base  # noqa: E402
from k3env.log import Log  # noqa: E402
from k3env.state import State  # noqa: E402

VARIANT = "vllm-0.29.0"
IMAGE = "kimi-k3-direct-f"


def rmi_layer(base: Any) -> None:
    """The layer image and every image built over it (the spec's, the aiperf layer's), the
    deepest first: a cold build loads every byte again (an image still held by a child
    would only be re-tagged)."""
    top = base.image.diff_ids[-1]
    held = []
    for repository in (f"k3env/{IMAGE}", "k3env/components"):
        ids = subprocess.run(["docker", "images", "-q", "--no-trunc", repository],
                             capture_output=True, text=True).stdout.split()  # fmt: skip
        for image in set(ids):
            proc = subprocess.run(["docker", "image", "inspect", "-f",
                                   "{{json .RootFS.Layers}}", image],
                                  capture_output=True, text=True)  # fmt: skip
            layers = json.loads(proc.stdout or "[]")
            if top in layers:
                held.append((len(layers), image))
    for _, image in sorted(held, reverse=True):
        rmi(image)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main() -> int:
    quick = "each step once on what this host holds: nothing removed, its records"
    args = arguments(__doc__, quick, repeat=1).parse_args()
    repeat = 1 if args.quick else args.repeat

    workdir = Path(tempfile.mkdtemp(prefix="k3env-bench-variant-"))
    for d in ("pins", "images", "patches"):
        shutil.copytree(REPO / d, workdir / d)
    for spec in (workdir / "images").glob("*.toml"):
        if spec.stem != IMAGE:
            spec.unlink()
    # --quick: this host's own state (its wheelhouse, verify records); nothing is removed.
    state_dir = State().root if args.quick else workdir / "state"
    env = {**os.environ, "K3ENV_STATE_DIR": str(state_dir)}
    # The twin's CPU torch is not on the index: where this host's pip finds it.
    opt = "/opt/wheels" if Path("/opt/wheels").is_dir() else ""
    links = [a for d in (os.environ.get("PIP_FIND_LINKS") or opt).split()
             for a in ("--find-links", d)]  # fmt: skip
    try:
        resolve = [timed(lambda: k3env(["twin", "--resolve", "--variant", VARIANT, *links],
                                       workdir, env))[0] for _ in range(repeat)]  # fmt: skip
        summary = _layer(workdir, state_dir, repeat, cold_runs=0 if args.quick else repeat,
                         remove=not args.quick)  # fmt: skip
        column, status = _cell(workdir, env, state_dir, repeat, remove=not args.quick)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    summary = {"variant": VARIANT, "resolve_seconds": _median(resolve), **summary,
               "cell_seconds": _median(column), "cell_status": status,
               "repeat": repeat}  # fmt: skip
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        how = "--quick: cache hits, no figure" if args.quick else f"median of {repeat}"
        print(f"variant {VARIANT} ({how})")
        print(f"  resolve against the twin: {summary['resolve_seconds']:.2f} s")
        cold = summary["layer_cold_seconds"]
        print(f"  layer cold (empty state and pip cache): "
              f"{'not run (--quick)' if cold is None else f'{cold:.2f} s'}; "
              f"warm {summary['layer_warm_seconds']:.2f} s; "
              f"hit {summary['layer_hit_seconds']:.3f} s")  # fmt: skip
        print(f"  layer: {summary['layer_mb']} MB, {summary['layer_files']} files")
        print(f"  {IMAGE} cell (build + verify): {summary['cell_seconds']:.2f} s, {status}")
    return 0


def _median(xs: list[float]) -> float:
    return round(statistics.median(xs), 2)


def _layer(
    workdir: Path, state_dir: Path, repeat: int, *, cold_runs: int, remove: bool
) -> dict[str, Any]:
    """The variant's layer over the twin: ``cold_runs`` cold (a fresh state and a fresh pip
    cache), warm (the wheelhouse kept; with ``remove``, the layer removed first), a hit; its
    size and files."""
    engine = DockerEngine()
    lock = load_lock(workdir / "pins/k3.lock.toml")
    vlock = lock.with_variant(lock.variants[VARIANT])

    def layer(state_dir: Path) -> Any:
        builder = make_builder(vlock, engine, State(state_dir), Log(quiet=True), twin=True)
        return builder.resolve_base(vlock.bases["cpu-twin"])

    cold, warm = [], []
    base: Any = layer(state_dir)  # its reference; the wheelhouse warm runs keep
    for _ in range(cold_runs):
        with tempfile.TemporaryDirectory(prefix="k3env-bench-cold-") as tmp:
            rmi_layer(base)
            os.environ["PIP_CACHE_DIR"] = str(Path(tmp) / "pip-cache")
            seconds, base = timed(lambda: layer(Path(tmp) / "state"))
            os.environ.pop("PIP_CACHE_DIR", None)
            cold.append(seconds)
    for _ in range(repeat):
        if remove:
            rmi_layer(base)
        seconds, base = timed(lambda: layer(state_dir))
        warm.append(seconds)
    hit, _ = timed(lambda: layer(state_dir))
    twin = twin_base(lock, engine, State(state_dir), Log(quiet=True),
                     lock.bases["cpu-twin"])  # fmt: skip
    return {
        "layer_cold_seconds": _median(cold) if cold else None,
        "layer_warm_seconds": _median(warm),
        "layer_hit_seconds": round(hit, 3),
        "layer_mb": round((_size(base.reference) - _size(twin.reference)) / 2**20, 1),
        "layer_files": int((base.image.config.get("Labels") or {}).get(f"{LABEL}.files", "0")),
    }


def _cell(
    workdir: Path, env: dict[str, str], state_dir: Path, repeat: int, *, remove: bool
) -> tuple[list[float], str]:
    """The column's cell as a user runs it, its derived image and verify records removed
    (with ``remove``; else as this host holds them)."""
    argv = ["matrix", "--variant", VARIANT, IMAGE]
    cell = next(c for c in k3env(argv, workdir, env)["cells"] if c["variant"] == VARIANT)
    column = []
    for _ in range(repeat):
        if remove:
            rmi(cell["image_id"])
            shutil.rmtree(state_dir / "verify", ignore_errors=True)
        seconds, again = timed(lambda: k3env(argv, workdir, env))
        column.append(seconds)
        cell = next(c for c in again["cells"] if c["variant"] == VARIANT)
    return column, str(cell["status"])


def _size(reference: str) -> int:
    """The image's size in bytes, as the engine counts it (its layers, uncompressed)."""
    out = subprocess.run(["docker", "image", "inspect", "-f", "{{.Size}}", reference],
                         check=True, capture_output=True, text=True).stdout  # fmt: skip
    return int(out.strip())


if __name__ == "__main__":
    raise SystemExit(main())
