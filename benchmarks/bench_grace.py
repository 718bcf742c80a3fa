"""The Grace (linux/arm64) path, as CI runs it once per change: build the images over the
arm64 twin (the twin itself built first where this host lacks it: cold), build them again
(warm: every stage a cache hit), verify both platforms from inside their images (arm64 under
qemu-user emulation), and publish each spec's two images as one OCI index.

Prints the seconds of each step and whether the twin was cold. Fails (exit 1) when a step
fails to run, when an image's verdicts differ between the platforms (the offline default's
are the same on both: a difference is a platform-specific incompatibility or a broken
emulation path, both worth a red CI), or when a published index lacks a platform. Verdicts
that fail on both platforms alike are findings about the offline default, not about this
path (`k3env verify` exits 4 for them), and are listed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from k3env.config.lock import load_lock  # noqa: E402
from k3env.image import records  # noqa: E402
from k3env.image.twin import plan  # noqa: E402
from k3env.state import State  # noqa: E402

ARM, AMD = "linux/arm64", "linux/amd64"
BOTH = f"{AMD},{ARM}"


def k3env(*argv: str, ok: tuple[int, ...] = (0,)) -> tuple[float, dict[str, Any]]:
    """Seconds and --json output of one k3env command (its progress goes to stderr)."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "k3env", *argv, "--json"], cwd=REPO,
                          stdout=subprocess.PIPE, text=True)  # fmt: skip
    seconds = time.perf_counter() - start
    if proc.returncode not in ok:
        raise SystemExit(f"k3env {' '.join(argv)}: exit {proc.returncode}")
    return seconds, json.loads(proc.stdout)


def verdicts(report: dict[str, Any]) -> dict[str, Any]:
    failed = sorted(
        f"{r['check']} {r.get('profile') or '-'} {r['subject']}"
        for r in report["results"]
        if r["status"] == "fail"
    )
    return {"matrix": report["matrix"], "failed": failed}


def prove_native(as_json: bool) -> int:
    """The arm64 twin's second layer twice, into scratch directories: unpacked and
    byte-compiled natively (what `k3env twin` does), then with every step in the arm64
    Python under qemu-user; the same diff ID or exit 1."""
    from k3env.engine.dockerd import DockerEngine
    from k3env.image.twin import stage2_diff_id
    from k3env.log import Log

    lock, engine, state, log = load_lock(REPO / "pins/k3.lock.toml"), DockerEngine(), State(), Log()
    seconds, ids = {}, {}
    for how, emulate in (("native", False), ("emulated", True)):
        start = time.perf_counter()
        ids[how] = stage2_diff_id(lock, engine, state, log, ARM, emulate=emulate)
        seconds[how] = round(time.perf_counter() - start, 1)
    result = {"benchmark": "grace-native", "diff_ids": ids, "seconds": seconds,
              "same_bytes": ids["native"] == ids["emulated"]}  # fmt: skip
    print(json.dumps(result, indent=2) if as_json else
          f"arm64 twin layer: native {seconds['native']} s, emulated {seconds['emulated']} s, "
          f"{'the same bytes' if result['same_bytes'] else 'DIFFERENT BYTES'}: {ids}")  # fmt: skip
    return 0 if result["same_bytes"] else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--prove-native",
        action="store_true",
        help="also build the arm64 twin's second layer with every step under emulation (about "
        "10 minutes) and require the same bytes as the native unpack and byte-compile",
    )
    args = ap.parse_args()
    if args.prove_native:
        return prove_native(args.json)

    lock = load_lock(REPO / "pins/k3.lock.toml")
    twin = plan(lock, ARM)
    held = subprocess.run(["docker", "image", "inspect", twin.reference], capture_output=True)
    twin_cold = held.returncode != 0 or records.read(State(), records.TwinPush, twin.inputs) is None
    cold_s, built = k3env("build", "--twin", "--platform", ARM)
    warm_s, again = k3env("build", "--twin", "--platform", ARM)
    same = [b["image_id"] for b in built["images"]] == [b["image_id"] for b in again["images"]]
    verify_s, verified = k3env("verify", "--twin", "--platform", BOTH, ok=(0, 4))
    by = {(r["image"], r["platform"]): verdicts(r) for r in verified["images"]}
    images = sorted({image for image, _ in by})
    differ = {i: {p: by.get((i, p)) for p in (AMD, ARM)} for i in images
              if by.get((i, AMD)) != by.get((i, ARM))}  # fmt: skip
    push_s, pushed = k3env("push", "--twin", "--platform", BOTH)
    indexes = {str(p["index"]): str(p["by_digest"]).split("@")[0] for p in pushed["images"]}
    listed = {}
    for index, repository in indexes.items():
        raw = subprocess.run(
            ["skopeo", "inspect", "--tls-verify=false", "--raw", f"docker://{repository}@{index}"],
            check=True, capture_output=True, text=True,
        ).stdout  # fmt: skip
        listed[f"{repository}@{index}"] = sorted(
            f"{m['platform']['os']}/{m['platform']['architecture']}"
            for m in json.loads(raw)["manifests"]
        )
    result: dict[str, Any] = {
        "benchmark": "grace",
        "twin_cold": twin_cold,
        "build_arm64_s": round(cold_s, 1),
        "rebuild_arm64_s": round(warm_s, 1),
        "rebuild_same_ids": same,
        "verify_both_s": round(verify_s, 1),
        "verify_failures_on_both": sorted(
            {f"{i}: {f}" for (i, p), v in by.items() for f in v["failed"] if i not in differ}
        ),
        "verdicts_differ": differ,
        "publish_index_s": round(push_s, 1),
        "indexes": listed,
    }
    ok = (
        same
        and not differ
        and len(by) == 2 * len(images)
        and all(v == [AMD, ARM] for v in listed.values())
    )
    result["ok"] = ok
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"grace: build arm64 {result['build_arm64_s']} s (twin "
            f"{'cold' if twin_cold else 'warm'}), rebuild {result['rebuild_arm64_s']} s "
            f"(same IDs: {same}), verify both {result['verify_both_s']} s, publish "
            f"{len(listed)} index(es) {result['publish_index_s']} s"
        )
        for line in result["verify_failures_on_both"]:
            print(f"  fails on both platforms: {line}")
        for image, rows in differ.items():
            print(f"  VERDICTS DIFFER for {image}: {json.dumps(rows)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
