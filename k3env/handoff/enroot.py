"""The enroot image: export to squashfs, and check any squashfs against the lock.

Slurm jobs run images through pyxis/enroot. ``export`` writes the enroot image itself (a
squashfs with /etc/environment, /etc/rc, /etc/fstab), streamed from the engine into
mksquashfs, deterministic byte for byte; ``check`` re-reads any squashfs, e.g. one
``enroot import`` made on the cluster, against the lock."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from k3env.config.lock import Lock, verify_patch_file
from k3env.config.patchfile import load_patch_file
from k3env.config.spec import ImageSpec
from k3env.engine.protocol import BaseImage, Engine
from k3env.errors import CheckFailed, EngineError
from k3env.handoff.push import Pushed, last_push
from k3env.hashing import file_sha256
from k3env.image.build import PROVENANCE_PATH, BuildResult
from k3env.image.layer import epoch_of
from k3env.image.patches import ALREADY_PRESENT, APPLIED, missing_edits
from k3env.image.tarstream import entries, filter_tar
from k3env.log import Log
from k3env.runner import output_or_none, require_tool, run, run_streaming
from k3env.state import State

# enroot's defaults (ENROOT_SQUASH_OPTIONS), plus what makes the bytes reproducible.
SQUASH_OPTIONS = ("-comp", "lzo", "-noD")
ENROOT_FILES = ("etc/environment", "etc/rc", "etc/rc.local", "etc/fstab")


# --- enroot image files (pure) ------------------------------------------------------------------
def enroot_files(image: BaseImage, provenance_uri: str) -> list[tuple[str, bytes, int]]:
    """/etc/environment, /etc/rc, /etc/rc.local, /etc/fstab for ``image``, in enroot's format."""
    config = image.config
    env = "".join(f"{e}\n" for e in config.get("Env") or [])
    volumes = sorted((config.get("Volumes") or {}).keys())
    fstab = "".join(
        f"${{ENROOT_ROOTFS}}{v} {v} none x-create=dir,bind,rw,nosuid,nodev\n" for v in volumes
    )
    entrypoint = [shlex.quote(a) for a in config.get("Entrypoint") or []]
    cmd = [shlex.quote(a) for a in config.get("Cmd") or []]
    if not entrypoint and not cmd:
        cmd = ["/bin/sh"]
    workdir = config.get("WorkingDir") or "/"
    labels = "".join(f"# {k} {v}\n" for k, v in sorted((config.get("Labels") or {}).items()))
    rc = (
        f"# enroot-provenance: {provenance_uri}\n"
        f"# k3env-image-id: {image.id}\n"
        f"{labels}\n"
        f'mkdir -p "{workdir}" 2> /dev/null\n'
        f'cd "{workdir}" && unset OLDPWD || exit 1\n'
        "\n"
        "if [ -s /etc/rc.local ]; then\n"
        "    . /etc/rc.local\n"
        "fi\n"
        "\n"
        "if [ $# -gt 0 ]; then\n"
        f'    exec {" ".join(entrypoint)} "$@"\n'
        "else\n"
        f"    exec {' '.join([*entrypoint, *cmd])}\n"
        "fi\n"
    )
    rc_local = (
        "# This file is sourced by /etc/rc when the container starts.\n"
        "# It can be used to manipulate the entrypoint or the command of the container.\n"
    )
    return [
        ("etc/environment", env.encode(), 0o644),
        ("etc/fstab", fstab.encode(), 0o644),
        ("etc/rc", rc.encode(), 0o755),
        ("etc/rc.local", rc_local.encode(), 0o644),
    ]


def _drop(name: str) -> bool:
    return name in ENROOT_FILES or name == ".dockerenv" or name.startswith("dev/")


@dataclass(frozen=True, kw_only=True)
class Exported:
    image: str
    image_id: str
    path: str
    sha256: str
    size: int
    provenance: str
    mksquashfs: str
    options: tuple[str, ...]

    def as_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def squashfs_version(log: Log) -> str:
    out = run([require_tool("mksquashfs", "squashfs-tools"), "-version"], log, capture=True)
    return out.splitlines()[0].strip() if out else "unknown"


def export_image(
    engine: Engine, state: State, build: BuildResult, out_dir: Path, log: Log
) -> Exported:
    """Write ``out_dir/<repo>+<tag>.sqsh``; a partial file never appears under that name."""
    mksquashfs = require_tool("mksquashfs", "squashfs-tools")
    image = engine.inspect(build.image_id)
    if image is None:
        raise EngineError("image not found", where=build.image_id, fix="build it first")
    pushed = last_push(state, build.image_id)
    provenance = pushed.enroot_uri if pushed else f"dockerd://{build.reference}"
    when = str(epoch_of(image.created))
    options = (*SQUASH_OPTIONS, "-all-root", "-all-time", when, "-mkfs-time", when)
    out_dir.mkdir(parents=True, exist_ok=True)
    final = out_dir / (build.reference.replace("/", "+").replace(":", "+") + ".sqsh")
    tmp = final.with_name(f".{final.name}.{os.getpid()}.partial")
    append = entries(enroot_files(image, provenance), int(when))
    try:
        run_streaming(
            [mksquashfs, "-", str(tmp), "-tar", "-noappend", "-no-progress", "-quiet", *options],
            filter_tar(engine.export(build.image_id), _drop, append),
            log,
            what=f"mksquashfs ({final})",
        )
        os.replace(tmp, final)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    exported = Exported(
        image=build.image,
        image_id=build.image_id,
        path=str(final),
        sha256=file_sha256(final),
        size=final.stat().st_size,
        provenance=provenance,
        mksquashfs=squashfs_version(log),
        options=options,
    )
    state.write_record(exported.as_json(), "exports", build.image_id)
    return exported


def cluster_commands(spec: ImageSpec, pushed: Pushed | None, exported: Exported | None) -> str:
    """What to run on the cluster, and the srtslurm.yaml mapping, for one image."""
    lines = [f"# {spec.name}"]
    sqsh = Path(exported.path).name if exported else f"{spec.name}.sqsh"
    if pushed:
        lines.append(f"ENROOT_ALLOW_HTTP=y enroot import -o {sqsh} '{pushed.enroot_uri}'")
        lines.append(f"k3env export --check {sqsh}   # on a host with this repo and lock")
        lines.append("# srtslurm.yaml")
        lines.append("containers:")
        lines.append(f'  "{pushed.by_digest}": /path/to/{sqsh}')
    if exported:
        lines.append(f"# or copy the exported image: sha256 {exported.sha256}  {sqsh}")
    return "\n".join(lines)


# --- check a squashfs against the lock ----------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class CheckItem:
    what: str
    ok: bool
    detail: str


def _cat(sqsh: Path, path: str, log: Log) -> bytes | None:
    unsquashfs = require_tool("unsquashfs", "squashfs-tools")
    return output_or_none([unsquashfs, "-cat", str(sqsh), path], log)


def check_squashfs(
    sqsh: Path, lock: Lock, specs: Mapping[str, ImageSpec], log: Log
) -> list[CheckItem]:
    from k3env.image.envpolicy import merged_env

    items: list[CheckItem] = []
    raw = _cat(sqsh, PROVENANCE_PATH, log)
    if raw is None:
        return [CheckItem(what="provenance", ok=False, detail=f"{PROVENANCE_PATH} is missing")]
    prov = json.loads(raw)
    spec = specs.get(prov.get("image", ""))
    if spec is None:
        return [CheckItem(what="image", ok=False, detail=f"no spec named {prov.get('image')!r}")]
    items.append(
        CheckItem(
            what="provenance.lock",
            ok=prov["lock"]["sha256"] == lock.sha256,
            detail=f"image built from lock {prov['lock']['sha256'][:16]}, this lock is "
            f"{lock.sha256[:16]}",
        )
    )
    items.append(
        CheckItem(
            what="provenance.spec",
            ok=prov["spec"]["sha256"] == spec.sha256,
            detail=f"image built from {prov['spec']['path']} {prov['spec']['sha256'][:16]}, "
            f"the spec is now {spec.sha256[:16]}",
        )
    )
    rc = _cat(sqsh, "etc/rc", log) or b""
    items.append(
        CheckItem(
            what="etc/rc",
            ok=rc.startswith(b"# enroot-provenance: "),
            detail=rc.decode(errors="replace").splitlines()[0] if rc else "missing",
        )
    )
    env_lines = set((_cat(sqsh, "etc/environment", log) or b"").decode().splitlines())
    base = lock.bases[prov["base"]["pin"]]
    for name, value in sorted(merged_env(lock, spec, base).items()):
        items.append(
            CheckItem(
                what=f"env {name}",
                ok=f"{name}={value}" in env_lines,
                detail=f"/etc/environment {'has' if f'{name}={value}' in env_lines else 'lacks'} "
                f"{name}={value}",
            )
        )
    for p in prov.get("patches", []):
        if p["status"] not in (APPLIED, ALREADY_PRESENT):
            items.append(CheckItem(what=f"patch {p['name']}", ok=True, detail=p["status"]))
            continue
        pin = lock.container_patches[p["name"]]
        patch = load_patch_file(pin, verify_patch_file(lock, pin))
        text = (_cat(sqsh, p["target"].lstrip("/"), log) or b"").decode(errors="replace")
        missing = missing_edits(patch, text)
        items.append(
            CheckItem(
                what=f"patch {p['name']}",
                ok=not missing,
                detail=f"{p['target']}: "
                + ("; ".join(missing) if missing else f"{len(patch.edits)} edit(s) present"),
            )
        )
    return items


def require_ok(sqsh: Path, items: list[CheckItem]) -> None:
    bad = [i for i in items if not i.ok]
    if bad:
        raise CheckFailed(
            f"{len(bad)} check(s) failed: " + "; ".join(f"{i.what}: {i.detail}" for i in bad),
            where=str(sqsh),
            fix="re-export from the image built from this lock (k3env export), or import it again",
        )
