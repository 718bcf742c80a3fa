"""Benchmark: the SBOM rebuild of `k3env export --check` (``handoff.sbom.sbom``, what
``attest.check`` calls) on an image whose dpkg status lists N Debian packages.

The image is made here: a k3env provenance file, dpkg's status of N installed packages (the
fields a real one carries, a two-line description each), per package its ``info/*.list``,
``info/*.md5sums`` and ``/usr/share/doc/*/copyright`` (the listing grows with the packages,
as a real image's does), and 50 Python distributions. Timed cold: a new ``Squashfs`` (its
listing read again by unsquashfs), then the SBOM made. Goal: 20,000 packages in under 5 s,
linear in N (seconds per 1,000 packages flat as N grows); exit 1 when 20,000 take 5 s or more.
``--quick`` (CI: a broken benchmark fails, its figures are no verdict): N = 20,000 only.
"""

from __future__ import annotations

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

from k3env.handoff.sbom import sbom  # noqa: E402
from k3env.handoff.squashfs import Squashfs  # noqa: E402
from k3env.log import Log  # noqa: E402

GOAL_N, GOAL_S = 20_000, 5.0
SITE = "usr/lib/python3/dist-packages"
DISTS = 50


def _stanza(i: int) -> str:
    return (
        f"Package: lib{i}-pkg\nStatus: install ok installed\nPriority: optional\n"
        f"Section: libs\nInstalled-Size: {100 + i % 900}\n"
        "Maintainer: Debian Maintainers <debian@example.org>\nArchitecture: amd64\n"
        f"Multi-Arch: same\nSource: src{i // 3}\nVersion: 1:{i % 7}.{i}-{i % 3}+b1\n"
        f"Depends: libc6 (>= 2.36), lib{(i + 1) % 1000}-pkg\n"
        f"Description: synthetic package {i}\n the second line of its description\n"
    )


def make_image(n: int, root: Path, out: Path) -> Path:
    """A squashfs of a k3env image whose dpkg status lists ``n`` installed packages."""
    prov = {
        "k3env_build_format": 1, "image": "bench", "inputs": "ab" * 32,
        "lock": {"path": "pins/k3.lock.toml", "sha256": "0" * 64},
        "spec": {"path": "images/bench.toml", "sha256": "1" * 64},
        "base": {"pin": "cpu-twin", "name": "twin", "digest": "sha256:" + "2" * 64},
        "pins": {"base.cpu-twin": "reg/twin:1@sha256:" + "2" * 64, "patch.x": "3" * 64,
                 "dynamo": "ai-dynamo@" + "4" * 40, "aiperf": "0.13.0"},
        "patches": [],
        "components": {"wheels": [{"name": f"dist{i}", "version": "1.0", "sha256": "5" * 64}
                                  for i in range(0, DISTS, 5)]},
        "config": {}, "files": {},
    }  # fmt: skip
    (root / "etc/k3env").mkdir(parents=True)
    (root / "etc/k3env/provenance.json").write_text(json.dumps(prov, indent=2))
    info = root / "var/lib/dpkg/info"
    info.mkdir(parents=True)
    doc = root / "usr/share/doc"
    doc.mkdir(parents=True)
    stanzas = []
    for i in range(n):
        stanzas.append(_stanza(i))
        (info / f"lib{i}-pkg:amd64.list").write_text(f"/usr/share/doc/lib{i}-pkg\n")
        (info / f"lib{i}-pkg:amd64.md5sums").write_text(f"{i:032x}  usr/share/doc/lib{i}-pkg\n")
        (doc / f"lib{i}-pkg").mkdir()
        (doc / f"lib{i}-pkg/copyright").write_text("synthetic\n")
    (root / "var/lib/dpkg/status").write_text("\n".join(stanzas))
    for i in range(DISTS):
        dist = root / SITE / f"dist{i}-1.0.dist-info"
        dist.mkdir(parents=True)
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: dist{i}\nVersion: 1.0\n")
        (dist / "RECORD").write_text("")
    subprocess.run(["mksquashfs", str(root), str(out), "-noappend", "-quiet", "-no-progress"],
                   check=True)  # fmt: skip
    return out


def rebuild(sqsh: Path, work: Path) -> tuple[float, int]:
    """Seconds of a cold SBOM rebuild, and the Debian packages it lists."""
    start = time.perf_counter()
    document = sbom(Squashfs(sqsh, Log(quiet=True), work))
    seconds = time.perf_counter() - start
    debs = sum(c.get("purl", "").startswith("pkg:deb/") for c in json.loads(document)["components"])
    return seconds, debs


def run(n: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="k3env-bench-sbom-") as tmp:
        t = Path(tmp)
        made = time.perf_counter()
        sqsh = make_image(n, t / "root", t / "image.sqsh")
        made = time.perf_counter() - made
        (t / "work").mkdir()
        seconds, debs = rebuild(sqsh, t / "work")
    assert debs == n, f"the SBOM lists {debs} Debian packages of {n}"
    return {
        "packages": n,
        "sbom_rebuild_s": round(seconds, 2),
        "s_per_1000": round(seconds / n * 1000, 3),
        "image_made_s": round(made, 1),
    }


def main() -> int:
    parser = arguments(__doc__, f"{GOAL_N:,} packages only")
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")],
                        help="package counts to time (default 1000,4000,20000)")  # fmt: skip
    args = parser.parse_args()
    sizes = args.sizes or ([GOAL_N] if args.quick else [1_000, 4_000, GOAL_N])
    results = [run(n) for n in sizes]
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for r in results:
            print(f"export --check SBOM rebuild, {r['packages']:,} Debian packages: "
                  f"{r['sbom_rebuild_s']} s ({r['s_per_1000']} s per 1,000)")  # fmt: skip
    slow = [r for r in results if r["packages"] == GOAL_N and r["sbom_rebuild_s"] >= GOAL_S]
    if slow:
        print(f"FAILED: {GOAL_N:,} packages took {slow[0]['sbom_rebuild_s']} s, goal < {GOAL_S} s",
              file=sys.stderr)  # fmt: skip
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
