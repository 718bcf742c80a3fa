"""The CPU twin: a stand-in for the GPU serving image, built here from real parts, the same
bytes on any clean engine from the same lock.

Debian (debootstrap) + the image's Python + the real PyPI wheels of vLLM, CPU torch and the
rest of the closure ``k3env twin --resolve`` wrote into ``[twin].requirements`` (every wheel
by sha256) and ``[twin].debian`` (every ``.deb`` by sha256). Built once, cached by the content
hash of its inputs, pushed to the local registry so that derived images name it by digest
like any other base. Two stages, each cached on its own, each one layer k3env assembles
itself (sorted entries, every mtime clamped to ``[twin].resolved_before``, a config k3env
writes, dated the same instant), so the image ID is known before the engine loads it:

1. ``k3env/debian-python:<hash>``: ``debootstrap --variant=minbase`` with
   ``SOURCE_DATE_EPOCH`` (and Perl's hash order fixed: debconf writes its databases in it);
   the ``.deb`` files it fetched must be the ones the lock pins, else the build fails naming
   each package that moved; apt's caches, logs and the build host's files are left out.
2. ``REGISTRY/REPOSITORY:<hash>``: the wheels installed ``--no-deps --require-hashes --root``
   into a host directory by a throwaway container of stage 1, every file dated the clamp
   instant, then byte-compiled in sorted order by bare interpreters, one per CPU
   (timestamp ``.pyc`` whose header holds that instant, so they stay valid in the image and
   in an enroot export; cold imports 16-18 s -> 6-8 s). ``image.install`` does it.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from k3env import __version__, jsontext
from k3env.config.pinned_files import verify_pinned_file
from k3env.config.pins import BasePin, Lock, TwinPin
from k3env.config.shapes import DEFAULT_PLATFORM, MACHINES, platform_option
from k3env.engine import registry
from k3env.engine.naming import CLASSIC, ImageNames
from k3env.engine.protocol import BaseImage, Engine
from k3env.engine.registry import manifest_exists, refuse_to_move
from k3env.errors import EngineError, LockError, StateError
from k3env.hashing import canonical_sha256, file_sha256
from k3env.image import records
from k3env.image.bases import ResolvedBase
from k3env.image.blobs import (
    MANIFEST_MEDIA_TYPE,
    Blob,
    Manifest,
    keep_config,
    keep_layer,
    keep_manifest,
    kept_config,
    kept_layer,
    manifest_for_config,
    manifest_of,
)
from k3env.image.identity import identify, know
from k3env.image.install import Native, load_checked
from k3env.image.layer import load_archive, tree_layer
from k3env.image.twindebian import (
    arch_of,
    debootstrap_argv,
    debs_in,
    epoch_of,
    moved,
    python_release,
    read_debian_list,
    run_debootstrap,
    trim_indexes,
    twin_pin,
)
from k3env.image.twinlayer import Inputs, SecondLayer, second_layer
from k3env.image.wheels import platform_tags
from k3env.log import Log
from k3env.runner import run
from k3env.state import State

# 5: stage 2 by image.install, compiled in a process that imports nothing else; 6: its layers'
# registry form stored (gzip level 0), not compressed (level 1): another manifest digest.
TWIN_FORMAT = 6


STAGE1_FORMAT = 3  # 3: the .debs pinned by sha256, a layer k3env writes (no docker import)


STAGE1_REPOSITORY = "k3env/debian-python"


LABEL = "io.k3env.twin.inputs"


PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


# What debootstrap leaves that is about the build, not the image.
_LEFTOVERS = (
    "var/cache/apt/archives",
    "var/lib/apt/lists",
    "var/log/apt",
    "var/log/dpkg.log",
    "var/log/alternatives.log",
    "var/log/bootstrap.log",
    "var/cache/ldconfig/aux-cache",
    "var/cache/debconf/config.dat-old",
    "var/cache/debconf/templates.dat-old",
    "var/lib/dpkg/status-old",
    "var/lib/dpkg/diversions-old",
    "debootstrap",
)


@dataclass(frozen=True, kw_only=True)
class TwinPlan:
    inputs: str
    requirements: Path
    debian: Path | None
    epoch: int  # every mtime in the twin is clamped to this instant
    stage1_ref: str
    reference: str  # REGISTRY/REPOSITORY:TAG
    platform: str = DEFAULT_PLATFORM


def _pinned_file(lock: Lock, twin: TwinPin, key: str) -> Path:
    rel, sha = getattr(twin, key), getattr(twin, f"{key}_sha256")
    again = platform_option(twin.platform)
    return verify_pinned_file(
        lock, rel, sha, key=f"{twin.key}.{key}", label="", what="twin file",
        sha_key=f"{twin.key}.{key}_sha256",
        restore=f"regenerate it with `k3env twin --resolve{again}`, or fix the path",
    )  # fmt: skip


def plan(lock: Lock, platform: str = DEFAULT_PLATFORM) -> TwinPlan:
    twin = twin_pin(lock, platform)
    req = _pinned_file(lock, twin, "requirements")
    debian = _pinned_file(lock, twin, "debian") if twin.debian else None
    epoch = epoch_of(twin)
    # The default platform's hashes predate platforms: they stay what they were.
    on = {} if platform == DEFAULT_PLATFORM else {"platform": platform}
    stage1 = canonical_sha256(
        {
            "format": STAGE1_FORMAT,
            "suite": twin.debian_suite,
            "mirror": twin.debian_mirror,
            "packages": twin.debian_packages,
            "debs": file_sha256(debian) if debian else None,
            "epoch": epoch,
            **on,
        }
    )
    inputs = canonical_sha256(
        {
            "format": TWIN_FORMAT,
            "stage1": stage1,
            "requirements": file_sha256(req),
            "epoch": epoch,
            **on,
        }
    )
    return TwinPlan(
        inputs=inputs,
        requirements=req,
        debian=debian,
        epoch=epoch,
        stage1_ref=f"{STAGE1_REPOSITORY}:{stage1[:20]}",
        reference=f"{twin.registry}/{twin.repository}:{inputs[:20]}",
        platform=platform,
    )


def _date(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- stage 1 ------------------------------------------------------------------------------
def ensure_stage1(
    lock: Lock, p: TwinPlan, engine: Engine, log: Log, state: State | None = None
) -> str:
    """Stage 1's image ID in the engine, built where the engine lacks it (or holds it and
    k3env cannot name it there: a containerd store's image whose manifest is not kept); with
    ``state``, its registry form is kept as it is built (the twin's push sends it)."""
    if state is not None:
        known = know(engine, state, p.stage1_ref)
        if known is not None:
            return known.engine_id
    else:
        image = engine.inspect(p.stage1_ref)
        if image is not None and engine.image_store() == CLASSIC:
            return image.id
    twin = twin_pin(lock, p.platform)
    with tempfile.TemporaryDirectory(prefix="k3env-twin-") as tmp:
        root = Path(tmp) / "rootfs"
        with log.step(
            f"debootstrap {twin.debian_suite} {p.platform} (minbase + "
            f"{', '.join(twin.debian_packages)})"
        ):
            if p.platform == DEFAULT_PLATFORM:
                run_debootstrap(debootstrap_argv(twin, root), log, epoch=p.epoch,
                                what="debootstrap")  # fmt: skip
            else:
                _foreign_debootstrap(twin, root, p, log)
        fetched = debs_in(root / "var/cache/apt/archives")
        if p.debian is not None:
            diff = moved(read_debian_list(p.debian), fetched)
            if diff:
                raise LockError(
                    f"the mirror's {twin.debian_suite} is not the package set the lock pins "
                    f"({len(diff)} moved): " + "; ".join(diff[:12]),
                    where=f"{lock.path}: twin.debian ({twin.debian})",
                    fix="if the new packages are wanted, `k3env twin --resolve` records them "
                    "(a new twin); else build from a mirror that still has the pinned ones",
                )
        # Nothing of the build belongs in the image: apt's caches and logs, the build host's
        # hostname and resolv.conf (debootstrap copies them in).
        run(["rm", "-rf", *(str(root / d) for d in _LEFTOVERS)], log)
        (root / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)
        for name in ("etc/hostname", "etc/resolv.conf"):
            (root / name).unlink(missing_ok=True)
            (root / name).write_text("")
        layer = Path(tmp) / "layer.tar"
        with log.step(f"assemble {p.stage1_ref} (one layer, dated {_date(p.epoch)})"):
            diff_id = tree_layer(root, layer, mtime=p.epoch)
            created = _date(p.epoch)
            config = {
                "architecture": arch_of(p.platform),
                "os": "linux",
                "created": created,
                "config": {"Env": [PATH_ENV], "Cmd": ["bash"]},
                "rootfs": {"type": "layers", "diff_ids": [diff_id]},
                "history": [
                    {
                        "created": created,
                        "created_by": f"k3env twin: debootstrap --variant=minbase "
                        f"--include={','.join(twin.debian_packages)} {twin.debian_suite}",
                        "comment": f"k3env {__version__}",
                    }
                ],
            }
        # The engine is sent the layer's registry form (gzip, stored blocks): the blob the
        # twin's manifest names, in the content store of a containerd engine.
        raw = jsontext.canonical(config)
        blob = _keep(state or State(Path(tmp) / "state"), layer, diff_id, raw, log)
        names, manifest, parts = load_archive(raw, [diff_id], blob, blob.path, [])
        if state is not None and manifest is not None:
            keep_manifest(state, manifest)
        return load_checked(engine, parts, names, p.stage1_ref, log)


def _foreign_debootstrap(twin: TwinPin, root: Path, p: TwinPlan, log: Log) -> None:
    """Another architecture: debootstrap's first stage unpacks, the second runs the target's
    own programs in a chroot, through the kernel's binfmt_misc handler (qemu-user)."""
    machine = MACHINES[p.platform]
    handler = Path(f"/proc/sys/fs/binfmt_misc/qemu-{machine}")
    if not handler.is_file() or "enabled" not in handler.read_text():
        raise EngineError(
            f"this host cannot run {p.platform} programs: no binfmt_misc handler for {machine}",
            where=str(handler),
            fix="apt-get install qemu-user-static binfmt-support (scripts/host-setup.sh does, "
            "and mounts /proc/sys/fs/binfmt_misc)",
        )
    run_debootstrap(debootstrap_argv(twin, root, "--foreign"), log, epoch=p.epoch,
                    what="debootstrap (first stage)")  # fmt: skip
    # The second stage's Perl reads the suite's package index under emulation, several times.
    trim_indexes(root, log)
    run_debootstrap(["chroot", str(root), "/debootstrap/debootstrap", "--second-stage"], log,
                    epoch=p.epoch,
                    what=f"debootstrap --second-stage (under {machine} emulation)")  # fmt: skip


# --- stage 2 ------------------------------------------------------------------------------
def build_twin(
    lock: Lock,
    engine: Engine,
    state: State,
    log: Log,
    platform: str = DEFAULT_PLATFORM,
    *,
    send_blobs: bool = False,
) -> str:
    """The twin's image ID in ``engine``, both stages built where missing; no manifest
    pushed (``send_blobs``: the second layer's blob is sent to the registry while stage 1 is
    built, for the push that follows)."""
    p = plan(lock, platform)
    found = engine.lookup(p.reference)
    if found is not None and found.labels.get(LABEL) == p.inputs and _named(engine, state, p):
        return found.id
    return _stage2(lock, p, engine, state, log, send_blobs=send_blobs)


def _named(engine: Engine, state: State, p: TwinPlan) -> ImageNames | None:
    """The names of the twin the engine holds under ``p.reference`` (``None``: it holds none,
    or one k3env cannot name there: built again)."""
    found = engine.lookup(p.reference)
    if found is None:
        return None
    named = identify(engine.image_store(), state, found.id,
                     repository=p.reference.rsplit(":", 1)[0])  # fmt: skip
    return named[0] if named is not None else None


def _stage2(
    lock: Lock, p: TwinPlan, engine: Engine, state: State, log: Log, *, send_blobs: bool
) -> str:
    with tempfile.TemporaryDirectory(prefix="k3env-twin-") as tmp:
        made = _stage2_layer(lock, p, engine, state, log, Path(tmp), keep=True, send=send_blobs)
        config = jsontext.canonical(_stage2_config(made.stage1, made.diff_id, p))
        # The layer's file goes to the engine as it is (its registry form: stored gzip), named
        # by the manifest a push of the twin sends (``publish_kept``).
        blob = kept_layer(state, made.diff_id, TWIN_LEVEL)
        if blob is None or blob.path != made.path:
            raise StateError("the twin's layer was not kept as it was written",
                             where=str(made.path), fix="run `k3env twin` again")  # fmt: skip
        below = [kept_layer(state, d, TWIN_LEVEL) for d in made.stage1.diff_ids]
        layers = None if any(b is None for b in below) else [b for b in below if b is not None]
        names, manifest, parts = load_archive(
            config, [*made.stage1.diff_ids, made.diff_id], blob, made.path, layers
        )
        keep_config(state, config)
        if manifest is not None:
            keep_manifest(state, manifest)
        return load_checked(engine, parts, names, p.reference, log)


# The twin's layers are kept as gzip members of stored blocks (zlib level 0), not compressed:
# they only ever travel to the registry on the build host, and compressing them was the
# arm64 twin's longest step after debootstrap (its 6.2 GB layer: 95 s at level 1 on one core,
# 7 s stored). The same gzip media type, so every registry and puller takes them as before;
# a blob's digest depends on the level, an image ID does not.
TWIN_LEVEL = 0


def _keep(state: State, layer: Path, diff_id: str, config: bytes, log: Log) -> Blob:
    size = layer.stat().st_size
    with log.step(f"keep the registry form of layer {diff_id[7:19]} ({size / 1e6:.0f} MB)"):
        blob = keep_layer(state, layer, diff_id, level=TWIN_LEVEL)
        keep_config(state, config)
    return blob


def twin_manifest(state: State, config_digest: str) -> Manifest | None:
    """The manifest of a twin image (either stage) k3env wrote: kept as it was loaded, else
    made again from its kept config and layers (an image loaded before manifests were kept);
    ``None`` when one is not kept."""
    kept = manifest_for_config(state, config_digest)
    if kept is not None:
        return kept
    config = kept_config(state, config_digest)
    if config is None:
        return None
    diff_ids = json.loads(config.path.read_bytes())["rootfs"]["diff_ids"]
    layers = [kept_layer(state, d, TWIN_LEVEL) for d in diff_ids]
    if any(b is None for b in layers):
        return None
    manifest = manifest_of(config, [b for b in layers if b is not None])
    keep_manifest(state, manifest)
    return manifest


def publish_kept(reference: str, image_id: str, state: State, log: Log) -> str | None:
    """Push the twin through the registry API from the blobs kept as it was built: the
    manifest digest, or ``None`` when one is not kept (an image built before, or a stage 1
    built without a state), which the engine then pushes."""
    config = kept_config(state, image_id)
    manifest = twin_manifest(state, image_id)
    if config is None or manifest is None:
        return None
    diff_ids = json.loads(config.path.read_bytes())["rootfs"]["diff_ids"]
    layers = [kept_layer(state, d, TWIN_LEVEL) for d in diff_ids]
    blobs = [b for b in layers if b is not None]
    if len(blobs) != len(diff_ids) or [b.digest for b in blobs] != [
        d.digest for d in manifest.layers
    ]:
        return None
    repository, tag = reference.rsplit(":", 1)
    for blob in [*blobs, config]:
        if not registry.blob_exists(repository, blob.digest):
            with log.step(f"send {blob.digest[7:19]} ({blob.size / 1e6:.0f} MB)"):
                registry.put_blob(repository, blob.digest, blob.path)
    return registry.put_manifest(repository, tag, manifest.body, MANIFEST_MEDIA_TYPE)


def stage2_diff_id(
    lock: Lock, engine: Engine, state: State, log: Log, platform: str, *, emulate: bool
) -> str:
    """The diff ID of the twin's second layer for ``platform``, built into a scratch
    directory and nothing loaded; ``emulate``: every step in the platform's own Python (under
    qemu-user for another architecture), else unpacking and byte-compiling natively where
    they can. The two must agree byte for byte (``benchmarks/bench_grace.py --prove-native``)."""
    p = plan(lock, platform)
    with tempfile.TemporaryDirectory(prefix="k3env-twin-") as tmp:
        return _stage2_layer(lock, p, engine, state, log, Path(tmp), keep=False,
                             emulate=emulate).diff_id  # fmt: skip


def _stage1_image(
    lock: Lock, p: TwinPlan, engine: Engine, log: Log, state: State | None = None
) -> BaseImage:
    stage1_id = ensure_stage1(lock, p, engine, log, state)
    known = know(engine, state, stage1_id) if state is not None else None
    stage1 = known.image if known is not None else engine.inspect(stage1_id)
    if stage1 is None:
        raise EngineError("stage 1 vanished", where=p.stage1_ref, fix="run `k3env twin` again")
    return stage1


def _stage2_layer(
    lock: Lock,
    p: TwinPlan,
    engine: Engine,
    state: State,
    log: Log,
    tmp: Path,
    *,
    keep: bool,
    send: bool = False,
    emulate: bool = False,
) -> SecondLayer:
    """Stage 1 (built where missing) and the second layer, its files made beside it."""
    inputs = Inputs(requirements=p.requirements, platform=p.platform, epoch=p.epoch,
                    where=p.reference, keep_level=TWIN_LEVEL if keep else None,
                    send_to=p.reference.rsplit(":", 1)[0] if send else None)  # fmt: skip
    return second_layer(
        engine, state, log, tmp, inputs,
        stage1=lambda: _stage1_image(lock, p, engine, log, state),
        native=lambda: None if emulate else native_helper(lock, p, engine, log, state),
    )  # fmt: skip


def native_helper(
    lock: Lock, p: TwinPlan, engine: Engine, log: Log, state: State | None = None
) -> Native | None:
    """For a twin of another architecture than this host's: the host platform's stage 1,
    when its Debian Python is the same release (unpacking wheels and byte-compiling then
    run at native speed, only the reading of the base under emulation); else ``None``."""
    host = next((name for name, m in MACHINES.items() if m == os.uname().machine), None)
    if host is None or host == p.platform or lock.twin is None:
        return None
    try:
        other = plan(lock, host)
    except LockError:
        return None
    if p.debian is None or other.debian is None:
        return None
    mine = python_release(read_debian_list(p.debian))
    theirs = python_release(read_debian_list(other.debian))
    if not mine or mine != theirs:
        log.info(f"    {host}'s Debian Python is not {p.platform}'s: installing under emulation")
        return None
    return Native(image=ensure_stage1(lock, other, engine, log, state),
                  platform_tags=tuple(platform_tags(p.platform)))  # fmt: skip


def _stage2_config(stage1: BaseImage, diff_id: str, p: TwinPlan) -> dict[str, object]:
    created = _date(p.epoch)
    history = [
        {
            "created": h.created,
            "created_by": h.created_by,
            **({"comment": h.comment} if h.comment else {}),
        }
        for h in stage1.history
    ]
    history.append(
        {
            "created": created,
            "created_by": f"k3env twin: pip install --no-deps --require-hashes "
            f"({p.requirements.name})",
            "comment": f"k3env {__version__}",
        }
    )
    return {
        "architecture": stage1.architecture,
        "os": stage1.os,
        "created": created,
        "config": {"Env": [PATH_ENV], "Cmd": ["python3"], "Labels": {LABEL: p.inputs}},
        "rootfs": {"type": "layers", "diff_ids": [*stage1.diff_ids, diff_id]},
        "history": history,
    }


def ensure_twin(
    lock: Lock, engine: Engine, state: State, log: Log, platform: str = DEFAULT_PLATFORM
) -> tuple[str, str]:
    """The twin's (image reference, registry digest), building and pushing what is missing."""
    p = plan(lock, platform)
    record = records.read(state, records.TwinPush, p.inputs)
    found = engine.lookup(p.reference)
    built = found is not None and found.labels.get(LABEL) == p.inputs
    built = built and _named(engine, state, p) is not None
    if built and record and manifest_exists(p.reference.rsplit(":", 1)[0], record.digest):
        return p.reference, record.digest
    if not built:
        build_twin(lock, engine, state, log, platform, send_blobs=True)
    repository, tag = p.reference.rsplit(":", 1)
    names = _named(engine, state, p)
    if names is None:
        raise EngineError("twin image vanished", where=p.reference, fix="run `k3env twin` again")
    # The registry names an image's config by its digest, whatever the engine calls it.
    if refuse_to_move(repository, tag, names.config) == names.config:  # pushed before: stays
        digest = registry.resolve_digest(repository, tag)
    else:
        with log.step(f"push {p.reference}"):
            digest = (
                publish_kept(p.reference, names.config, state, log)
                or engine.push(repository, tag, log.live).digest
            )
    records.write(state, records.TwinPush(reference=p.reference, digest=digest), p.inputs)
    return p.reference, digest


def twin_base(
    lock: Lock,
    engine: Engine,
    state: State,
    log: Log,
    pin: BasePin,
    platform: str = DEFAULT_PLATFORM,
) -> ResolvedBase:
    reference, digest = ensure_twin(lock, engine, state, log, platform)
    # Its config and manifest as pushed, where this state did not keep them (a clean state):
    # what an image over it is built on is the same bytes whatever the state or engine.
    known = know(engine, state, reference, repository=reference.rsplit(":", 1)[0], digest=digest)
    if known is None:
        raise EngineError("twin image vanished", where=reference, fix="run `k3env twin` again")
    manifest = known.manifest or twin_manifest(state, known.names.config)
    return ResolvedBase(pin=pin, reference=reference, name=reference, digest=digest,
                        image=known.image, manifest=manifest)  # fmt: skip
