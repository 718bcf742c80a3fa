"""The Docker engine: the only module that imports the docker SDK.

The rebuild path (inspect, history, load, tag) talks to the daemon's unix socket through
``_engine_http`` (stdlib); every other verb goes through the docker SDK, imported on first use.
With DOCKER_HOST naming a non-unix endpoint (tcp://, ssh://) everything goes through the SDK.
"""

from __future__ import annotations

import io
import os
import posixpath
import tarfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from k3env.engine._http import EngineHTTP, EngineHTTPError
from k3env.engine.protocol import (
    BaseImage,
    HistoryEntry,
    ImageFile,
    LayerPaths,
    Progress,
    PushResult,
    RunResult,
    Tagged,
)
from k3env.errors import EngineError

_FIX_DAEMON = (
    "start the engine (`dockerd &` as root, or `systemctl start docker`) and check DOCKER_HOST"
)


def _connection_error() -> Any:
    import requests.exceptions  # what the SDK raises on a read timeout or a dropped socket

    return requests.exceptions.ConnectionError


def _sdk() -> Any:
    import docker  # the SDK costs ~120 ms to import: only when a verb needs it
    import docker.errors

    return docker


class DockerEngine:
    def __init__(self, base_url: str | None = None, *, use_sdk_only: bool = False) -> None:
        self.base_url = base_url or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        self._client: Any = None
        self.http: EngineHTTP | None = None
        if self.base_url.startswith("unix://") and not use_sdk_only:
            self.http = EngineHTTP(self.base_url.removeprefix("unix://"))
            try:
                self.http.ping()
            except (OSError, EngineHTTPError) as e:
                raise EngineError(
                    f"cannot reach the Docker engine: {e}", where=self.base_url, fix=_FIX_DAEMON
                ) from e
        else:
            self.client.ping()

    @property
    def client(self) -> Any:
        if self._client is None:
            docker = _sdk()
            try:
                # version="auto" negotiates the API version with one /version call.
                self._client = docker.DockerClient(
                    base_url=self.base_url, timeout=600, version="auto"
                )
            except self.errors.DockerException as e:
                raise EngineError(
                    f"cannot reach the Docker engine: {e}", where=self.base_url, fix=_FIX_DAEMON
                ) from e
        return self._client

    @property
    def api(self) -> Any:
        return self.client.api

    @property
    def errors(self) -> Any:
        return _sdk().errors

    # -- reading ---------------------------------------------------------------------------
    def describe(self) -> str:
        info = self.client.info()
        return f"dockerd {info.get('ServerVersion')} ({info.get('Driver')})"

    def _attrs(self, ref: str) -> dict[str, Any] | None:
        if self.http is not None:
            try:
                return self.http.inspect_image(ref)
            except (OSError, EngineHTTPError) as e:
                raise EngineError(f"inspect failed: {e}", where=ref, fix=_FIX_DAEMON) from e
        errors = self.errors
        try:
            attrs: dict[str, Any] = self.api.inspect_image(ref)
            return attrs
        except errors.ImageNotFound:
            return None
        except errors.APIError as e:
            if e.status_code == 404:
                return None
            raise EngineError(f"inspect failed: {e}", where=ref, fix=_FIX_DAEMON) from e

    def inspect(self, ref: str) -> BaseImage | None:
        attrs = self._attrs(ref)
        if attrs is None:
            return None
        diff_ids = tuple(attrs.get("RootFS", {}).get("Layers") or ())
        return BaseImage(
            id=attrs["Id"],
            created=attrs["Created"],
            architecture=attrs.get("Architecture") or "amd64",
            os=attrs.get("Os") or "linux",
            variant=attrs.get("Variant") or None,
            config=attrs.get("Config") or {},
            diff_ids=diff_ids,
            history=self._history(ref, len(diff_ids)),
        )

    def _history(self, ref: str, n_layers: int) -> tuple[HistoryEntry, ...]:
        # The engine's history API drops `empty_layer`; a size of 0 stands in for it. When
        # that does not add up to the layer count, the base history is left out rather than
        # written wrong (it is informational: the image ID only needs it to be stable).
        raw = self.http.history(ref) if self.http is not None else self.api.history(ref)
        rows = list(reversed(raw))
        entries = tuple(
            HistoryEntry(
                created=datetime.fromtimestamp(int(r.get("Created") or 0), UTC).strftime(
                    "%Y-%m-%dT%H:%M:%SZ"
                ),
                created_by=r.get("CreatedBy") or "",
                comment=r.get("Comment") or "",
                empty_layer=int(r.get("Size") or 0) == 0,
            )
            for r in rows
        )
        if sum(not e.empty_layer for e in entries) != n_layers:
            return ()
        return entries

    def lookup(self, ref: str) -> Tagged | None:
        attrs = self._attrs(ref)
        if attrs is None:
            return None
        return Tagged(id=attrs["Id"], labels=dict((attrs.get("Config") or {}).get("Labels") or {}))

    def layer_paths(self, ref: str) -> LayerPaths:
        attrs = self._attrs(ref)
        if attrs is None:
            raise EngineError("image not found", where=ref, fix="build it first")
        driver = attrs.get("GraphDriver", {})
        data = driver.get("Data") or {}
        lower = [d for d in (data.get("LowerDir") or "").split(":") if d]
        upper = [data["UpperDir"]] if data.get("UpperDir") else []
        return LayerPaths(driver=driver.get("Name", "?"), dirs=(*reversed(lower), *upper))

    def read_files(self, image: str, paths: Sequence[str]) -> dict[str, ImageFile | None]:
        out: dict[str, ImageFile | None] = {}
        container = self._create(image, ["k3env-read-only"])
        try:
            for path in paths:
                out[path] = self._read_one(container, path)
        finally:
            container.remove(force=True)
        return out

    def _create(self, image: str, argv: Sequence[str], **kwargs: Any) -> Any:
        try:
            return self.client.containers.create(
                image, command=list(argv[1:]), entrypoint=[argv[0]], **kwargs
            )
        except self.errors.ImageNotFound as e:
            raise EngineError("image not found", where=image, fix="build or pull it first") from e
        except self.errors.APIError as e:
            raise EngineError(
                f"cannot create a container: {e}", where=image, fix=_FIX_DAEMON
            ) from e

    def _read_one(self, container: Any, path: str, hops: int = 0) -> ImageFile | None:
        try:
            chunks, _stat = container.get_archive(path)
        except self.errors.NotFound:
            return None
        with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
            member = tar.next()
            if member is None:
                return None
            if member.issym() and hops < 8:
                target = posixpath.normpath(
                    posixpath.join(posixpath.dirname(path), member.linkname)
                )
                return self._read_one(container, target, hops + 1)
            if not member.isfile():
                return None
            f = tar.extractfile(member)
            content = f.read() if f else b""
            return ImageFile(
                path=path, content=content, mode=member.mode, uid=member.uid, gid=member.gid
            )

    # -- running ---------------------------------------------------------------------------
    def run(
        self,
        image: str,
        argv: Sequence[str],
        *,
        timeout: float,
        env: Mapping[str, str] | None = None,
        mounts: Mapping[str, str] | None = None,
    ) -> RunResult:
        volumes = {src: {"bind": dst, "mode": "ro"} for src, dst in (mounts or {}).items()}
        container = self._create(
            image, argv, network_mode="none", environment=dict(env or {}), volumes=volumes
        )
        try:
            container.start()
            try:
                status = container.wait(timeout=timeout)
                code = int(status.get("StatusCode", -1))
            except _connection_error():
                container.kill()
                code = -9
            stdout = container.logs(stdout=True, stderr=False).decode(errors="replace")
            stderr = container.logs(stdout=False, stderr=True).decode(errors="replace")
            if code == -9:
                stderr += f"\n[k3env] killed after {timeout:.0f} s"
            return RunResult(exit_code=code, stdout=stdout, stderr=stderr)
        finally:
            container.remove(force=True)

    def run_and_commit(
        self,
        image: str,
        argv: Sequence[str],
        *,
        repository: str,
        tag: str,
        mounts: Mapping[str, str],
        changes: Iterable[str],
        progress: Progress,
    ) -> str:
        # argv runs as the image's command, not as a replaced entrypoint: a commit keeps the
        # container's entrypoint, and "ENTRYPOINT []" does not reset it (moby merges changes
        # over the container config). So the image must not have an entrypoint of its own.
        attrs = self._attrs(image) or {}
        if (attrs.get("Config") or {}).get("Entrypoint"):
            raise EngineError(
                "run_and_commit needs an image without an entrypoint",
                where=image,
                fix="report this as a k3env bug",
            )
        volumes = {src: {"bind": dst, "mode": "ro"} for src, dst in mounts.items()}
        try:
            container = self.client.containers.create(image, command=list(argv), volumes=volumes)
        except self.errors.APIError as e:
            raise EngineError(
                f"cannot create a container: {e}", where=image, fix=_FIX_DAEMON
            ) from e
        try:
            container.start()
            for line in container.logs(stream=True, follow=True):
                progress(line.decode(errors="replace").rstrip())
            code = int(container.wait().get("StatusCode", -1))
            if code != 0:
                raise EngineError(
                    f"`{' '.join(argv)}` exited {code}",
                    where=image,
                    fix="read the output above; fix the input it names and run again",
                )
            result = self.api.commit(
                container.id, repository=repository, tag=tag, changes=list(changes)
            )
            return str(result["Id"])
        finally:
            container.remove(force=True)

    # -- writing ---------------------------------------------------------------------------
    def pull(self, reference: str, progress: Progress) -> None:
        repository, _, digest = reference.partition("@")
        try:
            for event in self.api.pull(repository, tag=digest, stream=True, decode=True):
                if "error" in event:
                    raise EngineError(
                        f"pull failed: {event['error']}",
                        where=reference,
                        fix="check that the registry is reachable and the digest exists",
                    )
                if event.get("status") and not event.get("progressDetail"):
                    progress(f"{event.get('id', '')} {event['status']}".strip())
        except self.errors.APIError as e:
            raise EngineError(f"pull failed: {e}", where=reference, fix=_FIX_DAEMON) from e

    def load(self, archive: bytes) -> str:
        loaded = []
        errors = (OSError, EngineHTTPError) if self.http is not None else (self.errors.APIError,)
        try:
            events = (
                self.http.load(archive) if self.http is not None else self.api.load_image(archive)
            )
            for event in events:
                if "error" in event:
                    raise EngineError(
                        f"docker load failed: {event['error']}",
                        where="docker load",
                        fix="check that the base image is in this engine (k3env pulls it)",
                    )
                stream = event.get("stream", "")
                if stream.startswith("Loaded image ID: "):
                    loaded.append(stream.split(": ", 1)[1].strip())
        except errors as e:
            raise EngineError(
                f"docker load failed: {e}",
                where="docker load",
                fix="check that the base image is in this engine (k3env pulls it by digest)",
            ) from e
        if len(loaded) != 1:
            raise EngineError(
                f"docker load gave {len(loaded)} images, expected 1", where="docker load", fix=""
            )
        return str(loaded[0])

    def tag(self, image_id: str, repository: str, tag: str) -> None:
        if self.http is not None:
            try:
                self.http.tag(image_id, repository, tag)
                return
            except (OSError, EngineHTTPError) as e:
                raise EngineError(
                    f"tag failed: {e}", where=f"{repository}:{tag}", fix=_FIX_DAEMON
                ) from e
        if not self.api.tag(image_id, repository, tag, force=True):
            raise EngineError("tag failed", where=f"{repository}:{tag}", fix=_FIX_DAEMON)

    def remove(self, ref: str) -> None:
        try:
            self.api.remove_image(ref, force=False, noprune=False)
        except self.errors.ImageNotFound:
            pass
        except self.errors.APIError as e:
            if e.status_code != 404:
                raise EngineError(f"cannot remove image: {e}", where=ref, fix=_FIX_DAEMON) from e

    def import_rootfs(self, tarball: Path, repository: str, tag: str) -> str:
        try:
            self.api.import_image_from_file(str(tarball), repository=repository, tag=tag)
        except self.errors.APIError as e:
            raise EngineError(
                f"docker import failed: {e}", where=str(tarball), fix=_FIX_DAEMON
            ) from e
        attrs = self._attrs(f"{repository}:{tag}")
        if attrs is None:
            raise EngineError("imported image not found", where=f"{repository}:{tag}", fix="")
        return str(attrs["Id"])

    def push(self, repository: str, tag: str, progress: Progress) -> PushResult:
        digest = None
        layers: dict[str, str] = {}
        last = 0.0
        for attempt in range(3):
            try:
                for event in self.api.push(repository, tag=tag, stream=True, decode=True):
                    if "error" in event:
                        raise EngineError(
                            f"push failed: {event['error']}",
                            where=f"{repository}:{tag}",
                            fix="check that the registry is up (curl http://REGISTRY/v2/)",
                        )
                    aux = event.get("aux") or {}
                    if aux.get("Digest"):
                        digest = aux["Digest"]
                    status = event.get("status") or ""
                    if event.get("id") and not event.get("progressDetail"):
                        layers[event["id"]] = status
                    if time.monotonic() - last > 2 and status:
                        last = time.monotonic()
                        progress(f"{event.get('id', '')} {status}".strip())
                break
            except (self.errors.APIError, _connection_error()) as e:
                if attempt == 2:
                    raise EngineError(
                        f"push failed after 3 attempts: {e}",
                        where=f"{repository}:{tag}",
                        fix="check that the registry is up (curl http://REGISTRY/v2/)",
                    ) from e
                progress(f"push failed ({e}); retrying")
                time.sleep(2**attempt)
        if digest is None:
            raise EngineError(
                "the registry returned no digest", where=f"{repository}:{tag}", fix="push again"
            )
        return PushResult(digest=str(digest), layers=layers)

    def export(self, image: str) -> Iterator[bytes]:
        container = self._create(image, ["k3env-export"])
        try:
            yield from container.export(chunk_size=1 << 20)
        finally:
            container.remove(force=True)
