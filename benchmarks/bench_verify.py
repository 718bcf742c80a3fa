"""Benchmark: `k3env verify` per image against one cold `python -c "import vllm"` in it.

Both over the CPU twin builds of images/, in one run, each a fresh container (`--network
none`, the probe environment). Goal: verify <= 1.3x the bare import.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from k3env.cli import make_builder  # noqa: E402
from k3env.docker_engine import DockerEngine  # noqa: E402
from k3env.lock import load_lock  # noqa: E402
from k3env.log import Log  # noqa: E402
from k3env.spec import load_specs  # noqa: E402
from k3env.state import State  # noqa: E402
from k3env.verify import PROBE_ENV, verify_image  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    engine = DockerEngine()
    state = State()
    lock = load_lock(REPO / "pins/k3.lock.toml")
    specs = load_specs(REPO / "images", lock)
    builder = make_builder(lock, engine, state, Log(quiet=True), True)
    rows = []
    for spec in specs:
        build = builder.build(spec)
        imports, verifies, failures = [], [], 0
        for _ in range(args.repeat):
            start = time.perf_counter()
            result = engine.run(
                build.image_id, ["python3", "-c", "import vllm"], timeout=300, env=PROBE_ENV
            )
            imports.append(time.perf_counter() - start)
            assert result.exit_code == 0, result.stderr[-2000:]
            start = time.perf_counter()
            report = verify_image(engine, state, lock, spec, build, twin=True)
            verifies.append(time.perf_counter() - start)
            failures = len(report.failed)
            timings = report.facts.get("probe_timings", {})
        imp, ver = statistics.median(imports), statistics.median(verifies)
        rows.append(
            {
                "image": spec.name,
                "import_vllm_s": round(imp, 2),
                "verify_s": round(ver, 2),
                "ratio": round(ver / imp, 2),
                "checks_failed": failures,
                "probe_timings_s": timings,
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(f"verify per image vs cold `python -c 'import vllm'` (median of {args.repeat})")
        print(f"  {'image':22} {'import vllm':>12} {'verify':>8} {'ratio':>6}  failed checks")
        for r in rows:
            print(
                f"  {r['image']:22} {r['import_vllm_s']:>11.2f}s {r['verify_s']:>7.2f}s "
                f"{r['ratio']:>6.2f}  {r['checks_failed']}"
            )
        print("  goal: ratio <= 1.3")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
