"""The files the lock pins by sha256 (patches, requirements, .deb lists): hash and check them.

The I/O beside ``pins``: ``lock --check`` compares every pinned file with its hash
(``check_files``); the builder, verify and the handoff check one before using it
(``verify_pinned_file``, ``verify_patch_file``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from k3env.config.pins import ContainerPatchPin, Lock
from k3env.errors import LockError
from k3env.files import file_kind
from k3env.hashing import file_sha256


@dataclass(frozen=True, kw_only=True)
class FileCheck:
    key: str
    file: str
    expected: str | None
    actual: str | None  # None: the file is missing

    @property
    def ok(self) -> bool:
        return self.expected is not None and self.expected == self.actual


def pinned_files(lock: Lock) -> list[tuple[str, str, str | None]]:
    """``(key, file, sha256)`` for every file the lock pins by hash."""
    out: list[tuple[str, str, str | None]] = []
    for cp in lock.container_patches.values():
        out.append((f"container_patches.{cp.name}.sha256", cp.file, cp.sha256))
    if lock.srt_slurm:
        for p in lock.srt_slurm.patches:
            out.append((f"srt_slurm.patches[{p.index}].sha256", p.file, p.sha256))
        if lock.srt_slurm.requirements:
            out.append(("srt_slurm.requirements_sha256", lock.srt_slurm.requirements,
                        lock.srt_slurm.requirements_sha256))  # fmt: skip
        if lock.srt_slurm.schema:
            out.append(("srt_slurm.schema_sha256", lock.srt_slurm.schema,
                        lock.srt_slurm.schema_sha256))  # fmt: skip
    if lock.twin:
        for twin in (lock.twin, *lock.twin.platforms.values()):
            out.append(
                (f"{twin.key}.requirements_sha256", twin.requirements, twin.requirements_sha256)
            )
            if twin.debian:
                out.append((f"{twin.key}.debian_sha256", twin.debian, twin.debian_sha256))
    for variant in lock.variants.values():
        for c in variant.components.values():
            if c.closure is not None:
                out.append((closure_key(variant.name, c.name), c.closure, c.closure_sha256))
    return out


def closure_key(variant: str, component: str) -> str:
    """The lock key of a variant's closure hash (the variant's name may hold dots)."""
    return f'variants."{variant}".{component}.closure_sha256'


def _sha256_or_none(path: Path, key: str, lock: Lock) -> str | None:
    """The file's sha256; None when it is not there; a LockError naming the key when the
    path itself cannot be used (too long, a directory, a FIFO or a device, no permission)."""
    if kind := file_kind(path):
        raise LockError(
            f"the pinned file {path.name[:80]} is {kind}, not a regular file",
            where=f"{lock.path}: {key}",
            fix="restore the file the lock pins, or fix the file path in the lock",
        )
    try:
        return file_sha256(path) if path.is_file() else None
    except OSError as e:
        raise LockError(
            f"cannot read the pinned file {path.name[:80]}: {e.strerror}",
            where=f"{lock.path}: {key}",
            fix="fix the file path in the lock",
        ) from e


def check_files(lock: Lock) -> list[FileCheck]:
    results = []
    for key, rel, expected in pinned_files(lock):
        actual = _sha256_or_none(lock.resolve_path(rel, key=key), key, lock)
        results.append(FileCheck(key=key, file=rel, expected=expected, actual=actual))
    return results


def verify_pinned_file(
    lock: Lock,
    rel: str,
    sha256: str | None,
    *,
    key: str,
    label: str,
    what: str = "patch file",
    sha_key: str | None = None,
    restore: str = "restore the file, or fix `file` in the lock",
) -> Path:
    """``rel``'s path, after checking the file exists and has the sha256 the lock pins
    (``None``: unresolved, so only that it exists)."""
    path = lock.resolve_path(rel, key=key)
    where = f"{lock.path}: {key}"
    actual = _sha256_or_none(path, key, lock)
    if actual is None:
        raise LockError(f"{what} {rel}{label} is missing", where=where, fix=restore)
    if sha256 is not None and actual != sha256:
        raise LockError(
            f"{what} {rel}{label} has sha256 {actual}, the lock pins {sha256}",
            where=f"{lock.path}: {sha_key}" if sha_key else f"{where}.sha256",
            fix="if deliberate, run `k3env lock --update-hashes`; else restore the file",
        )
    return path


def verify_patch_file(lock: Lock, pin: ContainerPatchPin) -> Path:
    """The container patch file's path, after checking its sha256 against the lock."""
    return verify_pinned_file(
        lock, pin.file, pin.sha256, key=f"container_patches.{pin.name}", label=""
    )
