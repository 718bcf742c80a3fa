"""Benchmark: `k3env verify` per image against one cold `python -c "import vllm"` in it.

Both over the CPU twin builds of images/, in one run, each a fresh container (`--network
none`, the probe environment). Goal: verify <= 1.3x the bare import. ``--quick`` (CI: a
broken benchmark fails, its figures are no verdict): one image, its imports once, and verify
over this host's state (its recorded verdicts answer), not a fresh one.
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
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from twin_image import arguments  # noqa: E402

from k3env.checks.probe_run import PROBE_ENV  # noqa: E402
from k3env.checks.verify import verify_image  # noqa: E402
from k3env.config.lock import load_lock  # noqa: E402
from k3env.config.pins import Lock  # noqa: E402
from k3env.config.spec import ImageSpec, load_specs  # noqa: E402
from k3env.engine.dockerd import DockerEngine  # noqa: E402
from k3env.image.build import BuildResult, make_builder  # noqa: E402
from k3env.log import Log  # noqa: E402
from k3env.state import State  # noqa: E402

SERVE = "vllm.entrypoints.cli.serve"


def main() -> int:
    quick = "one image; verify over this host's state (its records), not a fresh one"
    args = arguments(__doc__, quick, repeat=1).parse_args()

    engine = DockerEngine()
    state = State()
    lock = load_lock(REPO / "pins/k3.lock.toml")
    specs = load_specs(REPO / "images", lock)
    builder = make_builder(lock, engine, state, Log(quiet=True), True)
    rows = [
        per_image(engine, lock, spec, builder.build(spec), args.repeat, fresh=not args.quick)
        for spec in (specs[:1] if args.quick else specs)
    ]
    summary = whole_command(rows, fresh=not args.quick)
    if args.json:
        print(json.dumps({"images": rows, **summary}, indent=2))
    else:
        print_table(rows, summary, args.repeat)
    return 0


def per_image(
    engine: DockerEngine,
    lock: Lock,
    spec: ImageSpec,
    build: BuildResult,
    repeat: int,
    *,
    fresh: bool = True,
) -> dict[str, Any]:
    """One image: cold imports of vllm and of its serve CLI against verify (medians); verify
    in a fresh state (``fresh``: the probe really runs) or this host's."""
    imports: list[float] = []
    serves: list[float] = []
    verifies: list[float] = []
    failures = 0
    for _ in range(repeat):
        for stmt, times in (("import vllm", imports), (f"import {SERVE}", serves)):
            start = time.perf_counter()
            result = engine.run(build.image_id, ["python3", "-c", stmt], timeout=300, env=PROBE_ENV)
            times.append(time.perf_counter() - start)
            assert result.exit_code == 0, result.stderr[-2000:]
        start = time.perf_counter()
        # A fresh state directory: the probe really runs (no recorded verdicts); --quick:
        # this host's state, its record answers.
        state = State(Path(tempfile.mkdtemp(prefix="k3env-bench-verify-"))) if fresh else State()
        report = verify_image(engine, state, lock, spec, build, twin=True)
        verifies.append(time.perf_counter() - start)
        if fresh:
            shutil.rmtree(state.root, ignore_errors=True)
        failures = len(report.failed)
        timings = report.facts.get("probe_timings", {})
    imp, ver = statistics.median(imports), statistics.median(verifies)
    srv = statistics.median(serves)
    return {
        "image": spec.name,
        "import_vllm_s": round(imp, 2),
        "import_serve_cli_s": round(srv, 2),
        "verify_s": round(ver, 2),
        "ratio": round(ver / imp, 2),
        "ratio_vs_serve_cli": round(ver / srv, 2),
        "checks_failed": failures,
        "probe_timings_s": timings,
    }


def whole_command(rows: list[dict[str, Any]], *, fresh: bool = True) -> dict[str, Any]:
    """The whole command, as a user runs it: every image at once (one container per core),
    then again with nothing changed (answered from the recorded verdicts); in a fresh state
    (``fresh``) or this host's."""
    with tempfile.TemporaryDirectory(prefix="k3env-bench-verify-") as tmp:
        env = {**os.environ, "K3ENV_STATE_DIR": tmp if fresh else str(State().root)}
        cmd = [sys.executable, "-m", "k3env", "verify", "--twin", "-q", "--json"]
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
        all_cold = time.perf_counter() - start
        verified = len(json.loads(proc.stdout)["images"])
        start = time.perf_counter()
        subprocess.run(cmd, cwd=REPO, env=env, capture_output=True)
        all_repeat = time.perf_counter() - start
    slowest_import = max(r["import_serve_cli_s"] for r in rows)
    return {
        "verify_all_images": verified,
        "verify_all_images_s": round(all_cold, 2),
        "verify_all_vs_one_serve_cli_import": round(all_cold / slowest_import, 2),
        "verify_repeat_unchanged_s": round(all_repeat, 2),
    }


def print_table(rows: list[dict[str, Any]], summary: dict[str, Any], repeat: int) -> None:
    print(f"verify per image vs a cold import in the same image (median of {repeat})")
    print(
        f"  {'image':22} {'import vllm':>12} {'import serve CLI':>17} {'verify':>8} "
        f"{'ratio':>6} {'vs CLI':>7}  failed checks"
    )
    for r in rows:
        print(
            f"  {r['image']:22} {r['import_vllm_s']:>11.2f}s {r['import_serve_cli_s']:>16.2f}s "
            f"{r['verify_s']:>7.2f}s {r['ratio']:>6.2f} {r['ratio_vs_serve_cli']:>7.2f}  "
            f"{r['checks_failed']}"
        )
    print(f"  goal: ratio <= 1.3 (serve CLI = `import {SERVE}`, which `vllm serve` itself pays)")
    print(
        f"`k3env verify --twin` of all {summary['verify_all_images']} images: "
        f"{summary['verify_all_images_s']}s "
        f"({summary['verify_all_vs_one_serve_cli_import']}x one serve-CLI import; goal 1.3); "
        f"repeated with nothing changed: {summary['verify_repeat_unchanged_s']}s (goal < 1 s)"
    )


if __name__ == "__main__":
    raise SystemExit(main())
