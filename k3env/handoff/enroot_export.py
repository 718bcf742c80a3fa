"""Export an image to an enroot image (``.sqsh``): its root filesystem into ``mksquashfs``.

The image's root filesystem is streamed from the engine into ``mksquashfs -tar`` with the
image's own file mtimes (so Python's timestamp-based ``.pyc`` stay valid), root 0755, and the
files enroot writes from the image config (/etc/environment, /etc/rc, /etc/rc.local,
/etc/fstab) in enroot's own format (rendered by ``enroot``), so an export and an ``enroot
import`` of the same image run the same. Bytes depend only on the image.
"""

from __future__ import annotations

import contextlib
import os
from datetime import UTC, datetime
from pathlib import Path

from k3env.engine.protocol import Engine
from k3env.errors import EngineError
from k3env.handoff.enroot import ENROOT_FILES, enroot_files
from k3env.hashing import file_sha256
from k3env.image import records
from k3env.image.build import BuildResult
from k3env.image.layer import epoch_of
from k3env.image.records import Exported
from k3env.image.tarstream import entries, filter_tar
from k3env.log import Log
from k3env.runner import require_tool, run, run_streaming
from k3env.state import State

# Bump when what an export writes changes (the filter, enroot's files): a file written before
# is then no longer taken as this image's export.
EXPORT_FORMAT = 1
# enroot's defaults (ENROOT_SQUASH_OPTIONS).
SQUASH_OPTIONS = ("-comp", "lzo", "-noD")
# What `docker create` + `export` add to an image's files (the container's init layer), with
# the container's creation time as mtime: given the image's creation time instead, so the
# export's bytes depend on the image only.
INIT_LAYER = frozenset(
    ("", "etc", "etc/hosts", "etc/hostname", "etc/resolv.conf", "etc/mtab", "proc", "sys", "dev")
)


def _drop(name: str) -> bool:
    return name in ENROOT_FILES or name == ".dockerenv" or name.startswith("dev/")


def squashfs_version(log: Log) -> str:
    out = run([require_tool("mksquashfs", "squashfs-tools"), "-version"], log, capture=True)
    return out.splitlines()[0].strip() if out else "unknown"


def export_image(
    engine: Engine, state: State, build: BuildResult, out_dir: Path, log: Log
) -> Exported:
    """Write ``out_dir/<repo>+<tag>.sqsh``; a partial file never appears under that name. A
    file already there whose sha256 is this image's recorded export (same mksquashfs, options
    and format) is that export: it is not written again."""
    mksquashfs = require_tool("mksquashfs", "squashfs-tools")
    image = engine.inspect(build.engine_id)
    if image is None:
        raise EngineError("image not found", where=build.image_id, fix="build it first")
    when = epoch_of(image.created)
    # The image's own mtimes stay (Python's .pyc check them); owners root as enroot makes
    # them; the root directory 0755 as enroot's `mkdir rootfs`.
    options = (*SQUASH_OPTIONS, "-all-root", "-root-mode", "755", "-mkfs-time", str(when))
    final = out_dir / (build.reference.replace("/", "+").replace(":", "+") + ".sqsh")
    version = squashfs_version(log)
    held = _already_exported(state, build, final, options, version, log)
    if held is not None:
        return held
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.{os.getpid()}.partial")
    append = entries(enroot_files(image.config), when)
    # mksquashfs -tar stamps the root directory with the current time whatever -root-time
    # says (squashfs-tools 4.5.1); a stopped clock keeps the bytes a function of the image.
    # (`faketime -f TIME` stops the clock; `faketime TIME` starts it there and lets it run.)
    clock = [
        require_tool("faketime", "faketime"),
        "-f",
        datetime.fromtimestamp(when, UTC).strftime("%Y-%m-%d %H:%M:%S"),
    ]
    try:
        run_streaming(
            [
                *clock,
                mksquashfs,
                "-",
                str(tmp),
                "-tar",
                "-noappend",
                "-no-progress",
                "-quiet",
                *options,
            ],
            filter_tar(
                engine.export(build.engine_id), _drop, append, mtimes={n: when for n in INIT_LAYER}
            ),
            log,
            what=f"mksquashfs ({final})",
            env={"TZ": "UTC"},
            sealed=True,
        )
        os.replace(tmp, final)
    except ValueError as e:  # the engine's tar stream ended early
        raise EngineError(
            f"the export stream broke off: {e}", where=build.image_id, fix="export again"
        ) from e
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    exported = _exported(build, final, file_sha256(final), version, options)
    records.write(state, exported, build.image_id)
    return exported


def _exported(
    build: BuildResult, final: Path, sha256: str, version: str, options: tuple[str, ...]
) -> Exported:
    return Exported(
        image=build.image,
        image_id=build.image_id,
        path=str(final),
        sha256=sha256,
        size=final.stat().st_size,
        mksquashfs=version,
        options=options,
        platform=build.platform,
        format=EXPORT_FORMAT,
    )


def _already_exported(
    state: State,
    build: BuildResult,
    final: Path,
    options: tuple[str, ...],
    version: str,
    log: Log,
) -> Exported | None:
    """The export at ``final`` when its bytes are the ones recorded for this image by the same
    mksquashfs, options and format (the bytes depend on the image only); else None."""
    record = records.read(state, Exported, build.image_id)
    if record is None or not final.is_file():
        return None
    same = (
        record.format == EXPORT_FORMAT
        and record.mksquashfs == version
        and record.options == options
        and record.size == final.stat().st_size
    )
    if not same:
        return None
    with log.step(f"check {final} against this image's recorded export"):
        digest = file_sha256(final)
    if digest != record.sha256:
        return None
    log.info(f"    {build.image}: already exported ({final}, sha256 {digest[:16]})")
    return _exported(build, final, digest, version, options)
