"""The CPU twin: a stand-in for the GPU serving image, built here from real parts.

Debian (debootstrap) + the image's Python + the real PyPI wheels of vLLM, Dynamo and CPU
torch, every wheel pinned by sha256 in ``[twin].requirements``. Built once, cached by the
content hash of its inputs, pushed to the local registry so that derived images name it by
digest like any other base. Two stages, each cached on its own:

1. ``k3env/debian-python:<hash>``: ``debootstrap --variant=minbase`` + ``docker import``;
2. ``REGISTRY/REPOSITORY:<hash>``: the wheels installed ``--no-deps --require-hashes`` from a
   host wheelhouse mounted read-only, byte-compiled (cold imports 16-18 s -> 6-8 s).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from k3env.config.lock import BasePin, Lock, TwinPin
from k3env.engine.protocol import Engine
from k3env.engine.registry import manifest_exists, refuse_to_move
from k3env.errors import EngineError, LockError
from k3env.hashing import canonical_sha256, file_sha256
from k3env.image.bases import ResolvedBase
from k3env.image.wheels import download_wheels
from k3env.log import Log
from k3env.runner import require_tool, run
from k3env.state import State

TWIN_FORMAT = 3  # 3: no VOLUMEs from build mounts, no build-host files from debootstrap
STAGE1_FORMAT = 2  # 2: the build host's hostname, resolv.conf and apt/dpkg logs removed
STAGE1_REPOSITORY = "k3env/debian-python"
LABEL = "io.k3env.twin.inputs"


@dataclass(frozen=True, kw_only=True)
class TwinPlan:
    inputs: str
    requirements: Path
    stage1_ref: str
    reference: str  # REGISTRY/REPOSITORY:TAG


def plan(lock: Lock) -> TwinPlan:
    twin = _pin(lock)
    req = lock.resolve_path(twin.requirements)
    try:
        actual = file_sha256(req) if req.is_file() else None
    except OSError:
        actual = None
    if actual is None:
        raise LockError(
            f"twin requirements {twin.requirements[:80]} is missing or unreadable",
            where=f"{lock.path}: twin.requirements",
            fix="restore the file, or fix the path",
        )
    if twin.requirements_sha256 is not None and actual != twin.requirements_sha256:
        raise LockError(
            f"{twin.requirements} has sha256 {actual}, the lock pins {twin.requirements_sha256}",
            where=f"{lock.path}: twin.requirements_sha256",
            fix="if deliberate, run `k3env lock --update-hashes`; else restore the file",
        )
    stage1 = canonical_sha256(
        {
            "format": STAGE1_FORMAT,
            "suite": twin.debian_suite,
            "mirror": twin.debian_mirror,
            "packages": twin.debian_packages,
        }
    )
    inputs = canonical_sha256({"format": TWIN_FORMAT, "stage1": stage1, "requirements": actual})
    return TwinPlan(
        inputs=inputs,
        requirements=req,
        stage1_ref=f"{STAGE1_REPOSITORY}:{stage1[:20]}",
        reference=f"{twin.registry}/{twin.repository}:{inputs[:20]}",
    )


def _pin(lock: Lock) -> TwinPin:
    if lock.twin is None:
        raise LockError("the lock has no [twin]", where=str(lock.path), fix="add [twin]")
    return lock.twin


def ensure_stage1(lock: Lock, p: TwinPlan, engine: Engine, log: Log) -> str:
    image = engine.inspect(p.stage1_ref)
    if image is not None:
        return image.id
    twin = _pin(lock)
    debootstrap = require_tool("debootstrap", "debootstrap")
    with tempfile.TemporaryDirectory(prefix="k3env-twin-") as tmp:
        root = Path(tmp) / "rootfs"
        tarball = Path(tmp) / "rootfs.tar"
        with log.step(
            f"debootstrap {twin.debian_suite} (minbase + {', '.join(twin.debian_packages)})"
        ):
            run(
                [
                    debootstrap,
                    "--variant=minbase",
                    f"--include={','.join(twin.debian_packages)}",
                    twin.debian_suite,
                    str(root),
                    twin.debian_mirror,
                ],
                log,
                capture=True,
                what="debootstrap",
            )
            # Nothing of the build host belongs in the image: debootstrap copies its hostname
            # and resolv.conf in, and leaves apt's cache and the install logs.
            run(
                [
                    "rm",
                    "-rf",
                    str(root / "var/cache/apt/archives"),
                    str(root / "var/lib/apt/lists"),
                    str(root / "var/log/apt"),
                    str(root / "var/log/dpkg.log"),
                    str(root / "var/log/alternatives.log"),
                    str(root / "var/cache/ldconfig/aux-cache"),
                ],
                log,
            )
            for name in ("etc/hostname", "etc/resolv.conf"):
                (root / name).unlink(missing_ok=True)
                (root / name).write_text("")
            run(["tar", "--numeric-owner", "-C", str(root), "-cf", str(tarball), "."], log)
        with log.step(f"import {p.stage1_ref}"):
            return engine.import_rootfs(tarball, *p.stage1_ref.split(":"))


_INSTALL = """set -eu
pip_whl=$(ls /k3env/wheels/pip-*.whl | head -n1)
echo "installing $(grep -c -- '--hash' /k3env/req/requirements.txt) pinned wheels"
python3 "$pip_whl/pip" install --no-index --no-deps --require-hashes --no-compile \
  --break-system-packages --disable-pip-version-check --root-user-action=ignore \
  --find-links /k3env/wheels -r /k3env/req/requirements.txt
echo "byte-compiling site-packages"
purelib=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
python3 -m compileall -q -j 2 "$purelib" >/dev/null || true
rm -rf /root/.cache
"""


def ensure_twin(lock: Lock, engine: Engine, state: State, log: Log) -> tuple[str, str]:
    """The twin's (image reference, registry digest), building and pushing what is missing."""
    p = plan(lock)
    record = state.read_record("twin", p.inputs)
    found = engine.lookup(p.reference)
    built = found is not None and found.labels.get(LABEL) == p.inputs
    if (
        built
        and record
        and record.get("digest")
        and manifest_exists(p.reference.rsplit(":", 1)[0], str(record["digest"]))
    ):
        return p.reference, str(record["digest"])
    if not built:
        stage1 = ensure_stage1(lock, p, engine, log)
        wheelhouse = download_wheels(p.requirements, state, log)
        with log.step(f"install the pinned wheels into {p.reference} (minutes; progress below)"):
            repository, tag = p.reference.rsplit(":", 1)
            engine.run_and_commit(
                stage1,
                ["sh", "-c", _INSTALL],
                repository=repository,
                tag=tag,
                mounts={str(wheelhouse): "/k3env/wheels", str(_req_dir(p, state)): "/k3env/req"},
                changes=[
                    f"LABEL {LABEL}={p.inputs}",
                    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    'CMD ["python3"]',
                ],
                progress=log.detail,
            )
    repository, tag = p.reference.rsplit(":", 1)
    image = engine.lookup(p.reference)
    if image is not None:
        refuse_to_move(repository, tag, image.id)
    with log.step(f"push {p.reference}"):
        digest = engine.push(repository, tag, log.detail).digest
    state.write_record({"reference": p.reference, "digest": digest}, "twin", p.inputs)
    return p.reference, digest


def _req_dir(p: TwinPlan, state: State) -> Path:
    """A directory holding only the requirements file, as requirements.txt, to mount."""
    d = state.path("twin-req", p.inputs[:20])
    d.mkdir(parents=True, exist_ok=True)
    (d / "requirements.txt").write_bytes(p.requirements.read_bytes())
    return d


def twin_base(lock: Lock, engine: Engine, state: State, log: Log, pin: BasePin) -> ResolvedBase:
    reference, digest = ensure_twin(lock, engine, state, log)
    image = engine.inspect(reference)
    if image is None:
        raise EngineError("twin image vanished", where=reference, fix="run `k3env twin` again")
    return ResolvedBase(pin=pin, reference=reference, name=reference, digest=digest, image=image)
