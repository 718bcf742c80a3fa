"""Benchmark: the baked components layer and a twin variant, over the CPU twin.

One run prints:
  * baked-layer build: the lock's pinned components (ai-dynamo + ai-dynamo-runtime 1.6.1,
    aiperf 0.13.0) installed by the twin's own pip into one deterministic layer and loaded
    (wheels already in the wheelhouse; the layer image removed before each run);
  * twin-variant build + verify: `k3env matrix --variant dynamo-1.4.2 kimi-k3-dynamo` as a
    user runs it, with the variant's components layer, its image and every verify record
    removed first (the pinned cell is answered from its records, so the figure is the
    variant's own cost: components layer, derived image, one probe run).
Each figure is the median of --repeat runs. ``--quick`` (CI: a broken benchmark fails, its
figures are no verdict): the same steps once, on what this host already holds: no layer or
image removed to be built again, the matrix run over this host's state (its recorded cells
answer), so the figures are those of cache hits.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from twin_image import arguments, k3env, rmi  # noqa: E402

from k3env.config.lock import load_lock  # noqa: E402
from k3env.engine.dockerd import DockerEngine  # noqa: E402
from k3env.image.components import REPOSITORY, bake, components_key  # noqa: E402
from k3env.image.twin import twin_base  # noqa: E402
from k3env.log import Log  # noqa: E402
from k3env.state import State  # noqa: E402

VARIANT = "dynamo-1.4.2"
IMAGE = "kimi-k3-dynamo"


def main() -> int:
    quick = "each step once on what this host holds: nothing removed, its state's records"
    args = arguments(__doc__, quick, repeat=1).parse_args()
    repeat = 1 if args.quick else args.repeat

    engine = DockerEngine()
    lock = load_lock(REPO / "pins/k3.lock.toml")
    state_dir = Path(tempfile.mkdtemp(prefix="k3env-bench-components-"))
    # --quick: this host's own state (its wheelhouse and verify records); nothing is removed.
    state = State() if args.quick else State(state_dir)
    log = Log(quiet=True)
    try:
        base = twin_base(lock, engine, state, log, lock.bases["cpu-twin"])
        pins = [lock.components["dynamo"], lock.components["aiperf"]]
        reference = f"{REPOSITORY}:{components_key(base, pins)[:20]}"
        bake(engine, state, log, base, pins)  # warm the wheelhouse
        layer, ids = [], set()
        for _ in range(repeat):
            if not args.quick:
                rmi(reference)
            start = time.perf_counter()
            _, baked = bake(engine, state, log, base, pins)
            layer.append(time.perf_counter() - start)
            ids.add(baked.image_id)

        env = {**os.environ, "K3ENV_STATE_DIR": str(state.root)}
        workdir = Path(tempfile.mkdtemp(prefix="k3env-bench-matrix-"))
        for d in ("pins", "images", "patches"):
            shutil.copytree(REPO / d, workdir / d)
        argv = ["matrix", "--variant", VARIANT, IMAGE]
        first = k3env(argv, workdir, env)  # the pinned cell's records, the variant's wheels
        cell = next(c for c in first["cells"] if c["variant"] == VARIANT)
        vlock = lock.with_variant(lock.variants[VARIANT])
        vpins = [vlock.components["dynamo"], vlock.components["aiperf"]]
        variant_layer = f"{REPOSITORY}:{components_key(base, vpins)[:20]}"
        variant = []
        for _ in range(repeat):
            if not args.quick:
                rmi(cell["image_id"], variant_layer)
                shutil.rmtree(state_dir / "verify", ignore_errors=True)
            start = time.perf_counter()
            again = k3env(argv, workdir, env)
            variant.append(time.perf_counter() - start)
            cell = next(c for c in again["cells"] if c["variant"] == VARIANT)
        shutil.rmtree(workdir, ignore_errors=True)
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)

    summary = {
        "baked_layer_seconds": round(statistics.median(layer), 2),
        "baked_layer_image_ids": sorted(ids),
        "twin_variant_seconds": round(statistics.median(variant), 2),
        "repeat": repeat,
        "quick": args.quick,
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        how = "--quick: cache hits, no figure" if args.quick else f"median of {repeat}"
        print(f"components ({how})")
        print(f"  baked layer (dynamo 1.6.1 + aiperf 0.13.0) build: "
              f"{summary['baked_layer_seconds']:.2f} s, image IDs {len(ids)} distinct")  # fmt: skip
        print(f"  twin variant {VARIANT} build + verify of {IMAGE}: "
              f"{summary['twin_variant_seconds']:.2f} s")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
