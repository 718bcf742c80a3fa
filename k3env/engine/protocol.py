"""The engine boundary: only the verbs k3env uses. ``dockerd.DockerEngine`` implements it.

A test fake satisfies this Protocol without inheritance; the same paths also run against a
real dockerd in the tests marked ``engine``.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True, kw_only=True)
class HistoryEntry:
    created: str
    created_by: str
    comment: str = ""
    empty_layer: bool = False


@dataclass(frozen=True, kw_only=True)
class BaseImage:
    """What the builder needs to know of a base image (read from the engine)."""

    id: str  # sha256:... the engine's ID: the config digest, or the manifest's (engine.naming)
    created: str  # RFC 3339
    architecture: str
    os: str
    variant: str | None
    config: Mapping[str, Any]  # the image's container config (Env, Cmd, Entrypoint, Labels, ...)
    diff_ids: tuple[str, ...]
    history: tuple[HistoryEntry, ...] = field(default=())


@dataclass(frozen=True, kw_only=True)
class ImageFile:
    path: str
    content: bytes
    mode: int
    uid: int
    gid: int


@dataclass(frozen=True, kw_only=True)
class Tagged:
    """An image the engine has under some reference: its ID and labels."""

    id: str
    labels: Mapping[str, str]


@dataclass(frozen=True, kw_only=True)
class RunResult:
    exit_code: int
    stdout: str
    stderr: str


@dataclass(frozen=True, kw_only=True)
class PushResult:
    digest: str
    layers: Mapping[str, str]  # short layer id -> last status ("Pushed", "Layer already exists")

    @property
    def sent(self) -> list[str]:
        return [layer for layer, status in self.layers.items() if status == "Pushed"]


Progress = Callable[[str], None]


class Engine(Protocol):
    def describe(self) -> str:
        """Engine name, version and storage driver, for reports."""

    def image_store(self) -> str:
        """``naming.CLASSIC`` or ``naming.CONTAINERD``: which digest the engine calls an image
        by (``naming.engine_id``)."""

    def inspect(self, ref: str) -> BaseImage | None:
        """The image's config, or ``None`` when the engine does not have it."""

    def lookup(self, ref: str) -> Tagged | None:
        """The image's ID and labels (one cheap call), or ``None`` when the engine lacks it."""

    def pull(self, reference: str, progress: Progress) -> None:
        """Pull ``repository@digest``."""

    def read_files(self, image: str, paths: Sequence[str]) -> dict[str, ImageFile | None]:
        """Files from the image's filesystem, without starting a container."""

    def run(
        self,
        image: str,
        argv: Sequence[str],
        *,
        timeout: float,
        env: Mapping[str, str] | None = None,
        mounts: Mapping[str, str] | None = None,
        writable: Mapping[str, str] | None = None,
        user: str | None = None,
        progress: Progress | None = None,
        shm_bytes: int | None = None,
    ) -> RunResult:
        """Run ``argv`` (entrypoint replaced) with no network; the container is always removed.
        ``mounts`` are read-only host directories, ``writable`` read-write ones; ``user`` is
        ``UID:GID`` to run as (the image's user otherwise); ``progress`` gets each output line
        as it comes (the run's own timeout then bounds only the wait after it); ``shm_bytes``
        sizes the container's /dev/shm (the engine's default otherwise: 64 MiB on dockerd)."""

    def load(self, archive: bytes | Path | tuple[bytes | Path, ...]) -> str:
        """``docker load`` an archive (its bytes, its file, or pieces of either in order);
        returns the loaded image's ID as this engine names it (``naming.engine_id``)."""

    def tag(self, image_id: str, repository: str, tag: str) -> None: ...

    def remove(self, ref: str) -> None:
        """Remove an image (or just this tag of it); a missing image is not an error."""

    def import_rootfs(self, tarball: Path, repository: str, tag: str) -> str:
        """``docker import`` a root filesystem tarball; returns the image ID."""

    def push(self, repository: str, tag: str, progress: Progress) -> PushResult:
        """Push ``repository:tag``: the registry's manifest digest and each layer's fate."""

    def export(self, image: str) -> Generator[bytes | bytearray, None, None]:
        """The image's root filesystem as a tar stream (``docker create`` + ``export``).

        The container is removed when the stream is exhausted or closed."""
