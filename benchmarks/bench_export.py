"""Benchmark: `k3env export` against `docker export | tar -x` + `mksquashfs` of the same image,
and a cold `import vllm` inside the exported image against the same import in the image.

Same image (the twin build of the final variant F), same squash options; k3env streams the
export into mksquashfs (`-tar`) and never unpacks to disk. Goal: at most 1.0x. Also checks
that two exports give identical bytes. The import runs in a read-only container of the
export's rootfs (as `enroot start` runs it: a stale `.pyc` cannot be rewritten there), timed
inside Python so container start-up is not counted. Goal: at most 1.05x the source image.
``--quick`` (CI: a broken benchmark fails, its figures are no verdict): one k3env export of the
Dynamo image into ``out/sqsh``, where `nox -s enroot` writes it (after CI's enroot step the
file there is this image's recorded export: its sha256 is checked, nothing written again).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from twin_image import arguments, twin_build  # noqa: E402

from k3env.handoff.enroot_export import SQUASH_OPTIONS, export_image  # noqa: E402
from k3env.hashing import file_sha256  # noqa: E402
from k3env.image.layer import epoch_of  # noqa: E402
from k3env.log import Log  # noqa: E402

IMPORT = "import time; t = time.perf_counter(); import vllm; print(time.perf_counter() - t)"


def _import_seconds(image: str, repeat: int = 3) -> float:
    """Median cold `import vllm` (a fresh container and Python each time, read-only root),
    after one discarded run so both images are timed with the files in the page cache."""
    times = []
    for _ in range(repeat + 1):
        out = subprocess.run(
            ["docker", "run", "--rm", "--read-only", "--tmpfs", "/tmp", "--network", "none",
             "-e", "VLLM_TARGET_DEVICE=cpu", "-e", "CUDA_VISIBLE_DEVICES=",
             "--entrypoint", "python3", image, "-c", IMPORT],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        times.append(float(out.strip().splitlines()[-1]))
    times = times[1:]
    return sorted(times)[len(times) // 2]


def _compare(build: Any, first: Any, root: Path, options: list[str], repeat: int) -> dict[str, Any]:
    """The usual way beside k3env's, and the cold import in both images."""
    # The usual way: docker export | tar -x, then mksquashfs of the directory.
    start = time.perf_counter()
    cid = subprocess.run(
        ["docker", "create", build.image_id, "k3env"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    rootfs = root / "rootfs"
    rootfs.mkdir()
    try:
        subprocess.run(
            f"docker export {cid} | tar -C {rootfs} -px --exclude='dev/*' --exclude=.dockerenv",
            shell=True,
            check=True,
        )
    finally:
        subprocess.run(["docker", "rm", "-f", cid], capture_output=True, check=False)
    subprocess.run(
        ["mksquashfs", str(rootfs), str(root / "plain.sqsh"), "-noappend", "-no-progress",
         "-quiet", *options],
        check=True,
    )  # fmt: skip
    plain_s = time.perf_counter() - start
    shutil.rmtree(rootfs)
    # Cold import in the exported image vs the image itself (read-only root, no network).
    unpacked = root / "unpacked"
    subprocess.run(["unsquashfs", "-q", "-n", "-d", str(unpacked), first.path], check=True)
    subprocess.run(
        f"tar -C {unpacked} -c . | docker import - k3env-bench/exported:x",
        shell=True, check=True, capture_output=True,
    )  # fmt: skip
    shutil.rmtree(unpacked)
    try:
        source_import = _import_seconds(build.image_id, repeat)
        export_import = _import_seconds("k3env-bench/exported:x", repeat)
    finally:
        subprocess.run(["docker", "rmi", "-f", "k3env-bench/exported:x"], capture_output=True)
    return {
        "docker_export_tar_mksquashfs_s": round(plain_s, 2),
        "import_vllm_source_s": round(source_import, 2),
        "import_vllm_exported_s": round(export_import, 2),
        "import_ratio": round(export_import / source_import, 3),
        "plain_sha256": file_sha256(root / "plain.sqsh"),
    }


def main() -> int:
    ap = arguments(__doc__, "one k3env export into out/sqsh: not two compared, no docker export "
                 "or import")  # fmt: skip
    ap.add_argument("--image", help="the image spec (default: kimi-k3-direct-f; "
                    "kimi-k3-dynamo with --quick)")  # fmt: skip
    args = ap.parse_args()
    args.image = args.image or ("kimi-k3-dynamo" if args.quick else "kimi-k3-direct-f")

    engine, state, build = twin_build(args.image)
    image = engine.inspect(build.image_id)
    assert image is not None
    when = str(epoch_of(image.created))
    options = [*SQUASH_OPTIONS, "-all-root", "-root-mode", "755", "-mkfs-time", when]

    with tempfile.TemporaryDirectory(prefix="k3env-bench-export-", dir="/var/tmp") as tmp:
        root = Path(tmp)
        start = time.perf_counter()
        out = REPO / "out/sqsh" if args.quick else root / "k3env-1"
        first = export_image(engine, state, build, out, Log(quiet=True))
        k3env_s = time.perf_counter() - start
        second = None if args.quick else export_image(engine, state, build, root / "k3env-2",
                                                      Log(quiet=True))  # fmt: skip

        # --quick: the k3env export only (the comparisons are minutes of docker export,
        # mksquashfs and imports of a 6 GB image; they are for people and closing notes).
        compared = {} if args.quick else _compare(build, first, root, options, 3)
        result = {
            "image": args.image,
            "size_gb": round(first.size / 1e9, 2),
            "k3env_export_s": round(k3env_s, 2),
            "identical_bytes": None if second is None else first.sha256 == second.sha256,
            "sha256": first.sha256,
            "mksquashfs": first.mksquashfs,
            **compared,
            "options": list(first.options),
        }
        if compared:
            result["ratio"] = round(k3env_s / compared["docker_export_tar_mksquashfs_s"], 3)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"export of {args.image} ({result['size_gb']} GB squashfs, {first.mksquashfs})")
        print(f"  k3env export (streamed)            {result['k3env_export_s']:>7.2f}s")
        if not compared:
            print(f"  (--quick: no comparison) sha256 {first.sha256[:16]}")
            return 0
        plain = result["docker_export_tar_mksquashfs_s"]
        print(f"  docker export | tar -x; mksquashfs {plain:>7.2f}s")
        print(f"  ratio {result['ratio']:.3f} (goal <= 1.0); two exports identical: "
              f"{result['identical_bytes']} ({first.sha256[:16]})")  # fmt: skip
        print(f"  cold `import vllm`: image {result['import_vllm_source_s']:.2f}s, exported "
              f"{result['import_vllm_exported_s']:.2f}s, ratio {result['import_ratio']:.3f} "
              "(goal <= 1.05)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
