"""Benchmark: the RECORD check of `k3env export --check` (every installed file against the
sha256 its distribution's RECORD gives) against what a person would run by hand on the same
squashfs: `unsquashfs -d DIR` of the whole image, then `sha256sum` of every file.

The image is one distribution of N files (half in one flat directory, as a large vendored
package or a hostile image lays them out; half 100 to a directory) and its RECORD. Goal:
200,000 entries in under 30 s, and linear in N (the ratio to the anchor holds as N grows).
``--quick`` (CI: a broken benchmark fails, its figures are no verdict): N = 20,000.
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from twin_image import arguments  # noqa: E402

from k3env.handoff.squashfs import Squashfs  # noqa: E402
from k3env.handoff.squashfs_check import _record_items  # noqa: E402
from k3env.log import Log  # noqa: E402

SITE = "usr/lib/python3/dist-packages"


def make_image(n: int, root: Path, out: Path) -> Path:
    """A squashfs of one distribution of ``n`` files and its RECORD."""
    site = root / SITE
    (site / "big-1.0.dist-info").mkdir(parents=True)
    rows = []
    for i in range(n):
        rel = f"big/flat/f{i}.py" if i % 2 else f"big/m{i // 200}/f{i}.py"
        data = f"x = {i}\n".encode()
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        rows.append(f"{rel},sha256={digest},{len(data)}\n")
    (site / "big-1.0.dist-info/RECORD").write_text("".join(rows) + "big-1.0.dist-info/RECORD,,\n")
    subprocess.run(["mksquashfs", str(root), str(out), "-noappend", "-quiet", "-no-progress"],
                   check=True)  # fmt: skip
    return out


def k3env_check(sqsh: Path, work: Path) -> tuple[float, str]:
    start = time.perf_counter()
    log = Log(quiet=True)
    fs = Squashfs(sqsh, log, work)
    items = _record_items(fs, fs.listing(), set(), log)
    seconds = time.perf_counter() - start
    assert [i.status for i in items] == ["passed"], [i.detail for i in items]
    return seconds, items[0].detail


def by_hand(sqsh: Path, work: Path) -> float:
    start = time.perf_counter()
    subprocess.run(["unsquashfs", "-q", "-n", "-d", str(work / "all"), str(sqsh)], check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    subprocess.run(f"cd {work / 'all'} && find . -type f -print0 | xargs -0 sha256sum >/dev/null",
                   shell=True, check=True)  # fmt: skip
    return time.perf_counter() - start


def run(n: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="k3env-bench-check-") as tmp:
        t = Path(tmp)
        made = time.perf_counter()
        sqsh = make_image(n, t / "root", t / "image.sqsh")
        made = time.perf_counter() - made
        (t / "w1").mkdir()
        (t / "w2").mkdir()
        anchor = by_hand(sqsh, t / "w2")
        ours, detail = k3env_check(sqsh, t / "w1")
    return {
        "entries": n,
        "k3env_s": round(ours, 2),
        "unsquashfs_sha256sum_s": round(anchor, 2),
        "ratio": round(ours / anchor, 2),
        "detail": detail,
        "image_made_s": round(made, 1),
    }


def main() -> int:
    args = arguments(__doc__, "20,000 entries only").parse_args()
    sizes = (20_000,) if args.quick else (50_000, 200_000)
    results = [run(n) for n in sizes]
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for r in results:
            print(
                f"export --check RECORD of {r['entries']:,} entries: k3env {r['k3env_s']} s, "
                f"unsquashfs + sha256sum {r['unsquashfs_sha256sum_s']} s ({r['ratio']}x)"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
