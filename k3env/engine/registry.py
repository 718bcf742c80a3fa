"""The registry's HTTP API (stdlib), the one registry client: a tag's manifest digest, and
whether a manifest is still there.

``HEAD /v2/<repo>/manifests/<tag>`` answers with ``Docker-Content-Digest``. Registries that
want a token (Docker Hub) say so in ``WWW-Authenticate``; an anonymous token is fetched from
the realm it names. Loopback registries are spoken to over http, every other over https.
"""

from __future__ import annotations

import http.client
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from k3env.errors import CheckFailed, EngineError, LockError
from k3env.hashing import sha256_digest

ACCEPT = ", ".join(
    (
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    )
)


def split_repository(repository: str) -> tuple[str, str]:
    """``docker.io/vllm/vllm-openai`` -> (``registry-1.docker.io``, ``vllm/vllm-openai``)."""
    first, _, rest = repository.partition("/")
    if not rest or ("." not in first and ":" not in first and first != "localhost"):
        return "registry-1.docker.io", repository if rest else f"library/{repository}"
    if first == "docker.io":
        return "registry-1.docker.io", rest
    return first, rest


def _scheme(host: str) -> str:
    name = host.split(":")[0]
    return "http" if name in ("localhost", "127.0.0.1") or name.startswith("127.") else "https"


def _token(challenge: str) -> str | None:
    params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
    realm = params.pop("realm", None)
    if not challenge.lower().startswith("bearer") or realm is None:
        return None
    with urllib.request.urlopen(f"{realm}?{urllib.parse.urlencode(params)}", timeout=30) as r:
        body = json.loads(r.read())
    token = body.get("token") or body.get("access_token")
    return str(token) if token else None


def _head_manifest(repository: str, reference: str) -> str:
    """``HEAD`` a manifest by tag or digest; its ``Docker-Content-Digest``."""
    return _manifest(repository, reference, "HEAD")[0]


def _fetch(
    url: str,
    *,
    method: str = "GET",
    headers: dict[str, str],
    into: Path | None = None,
    timeout: float = 30,
) -> tuple[Any, bytes]:
    """One registry request: (response headers, body; empty for HEAD, and when the body is
    streamed into the file ``into``). When the registry asks for a token (401 +
    ``WWW-Authenticate``), once more with an anonymous one. ``HTTPError`` and ``OSError``
    are the caller's to name."""
    headers = dict(headers)
    while True:
        request = urllib.request.Request(url, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                if into is not None:
                    with into.open("wb") as f:
                        while block := response.read(1 << 22):
                            f.write(block)
                    return response.headers, b""
                return response.headers, response.read() if method == "GET" else b""
        except urllib.error.HTTPError as e:
            if e.code == 401 and "Authorization" not in headers:
                token = _token(e.headers.get("WWW-Authenticate", ""))
                if token:
                    headers["Authorization"] = f"Bearer {token}"
                    continue
            raise


def _manifest(repository: str, reference: str, method: str) -> tuple[str, bytes]:
    """A manifest by tag or digest: its ``Docker-Content-Digest`` and (for GET) its body."""
    host, repo = split_repository(repository)
    url = f"{_scheme(host)}://{host}/v2/{repo}/manifests/{reference}"
    try:
        headers, body = _fetch(url, method=method, headers={"Accept": ACCEPT})
    except urllib.error.HTTPError as e:
        if e.code in (401, 404):
            raise LockError(
                f"tag {reference!r} not found in {repository} (HTTP {e.code})",
                where=f"{repository}:{reference}",
                fix="check the tag (skopeo list-tags docker://REPOSITORY)",
            ) from e
        raise EngineError(f"registry error {e.code}", where=url, fix="try again") from e
    except OSError as e:
        raise EngineError(
            f"cannot reach the registry: {e}", where=url, fix="check the network / registry"
        ) from e
    digest = headers.get("Docker-Content-Digest")
    if not digest:
        raise EngineError("the registry sent no Docker-Content-Digest", where=url, fix="use skopeo")
    return str(digest), body


def resolve_digest(repository: str, tag: str) -> str:
    """The manifest digest a registry serves for ``repository:tag`` now."""
    return _head_manifest(repository, tag)


def tagged_config(repository: str, tag: str) -> str | None:
    """The config digest (the image ID) that ``repository:tag`` names in its registry now,
    or ``None`` when the tag does not exist there. Lets a push refuse to move a tag."""
    try:
        _digest, body = _manifest(repository, tag, "GET")
    except LockError:
        return None  # 404: no such tag
    try:
        config = json.loads(body).get("config", {}).get("digest")
    except (ValueError, AttributeError):
        config = None
    return str(config) if config else None


def manifest_exists(repository: str, digest: str) -> bool:
    """Whether the registry still serves ``repository@digest`` (a registry can be wiped)."""
    try:
        return _head_manifest(repository, digest) == digest
    except (EngineError, LockError):
        return False


def refuse_to_move(repository: str, tag: str, image_id: str) -> str | None:
    """Fail when the registry's ``repository:tag`` already names another image: a tag is the
    content hash of an image's inputs, so another image under it means the bytes moved (a
    build that is not reproducible), and moving it would change what others pull. Returns
    the image the tag names now (``image_id``, or ``None``: no such tag, or no answer)."""
    try:
        current = tagged_config(repository, tag)
    except EngineError:
        return None  # the registry is unreachable: the push itself will say so
    if current is not None and current != image_id:
        raise CheckFailed(
            f"{repository}:{tag} already names image {current[:19]}, not {image_id[:19]}: "
            "the same inputs built different bytes here",
            where=f"{repository}:{tag}",
            fix="do not overwrite it: find what differs (`docker image inspect` both, compare "
            "layers); pull the registry's image by digest to build on the same bytes",
        )
    return current


def list_tags(repository: str) -> list[str]:
    """The tags a registry has for ``repository`` (``GET /v2/<repo>/tags/list``)."""
    host, repo = split_repository(repository)
    url = f"{_scheme(host)}://{host}/v2/{repo}/tags/list?n=10000"
    try:
        _headers, body = _fetch(url, headers={})
        return [str(t) for t in json.loads(body).get("tags") or []]
    except urllib.error.HTTPError as e:
        raise EngineError(
            f"cannot list tags (HTTP {e.code})", where=url, fix="check the repository"
        ) from e
    except (OSError, ValueError) as e:
        raise EngineError(
            f"cannot list tags: {e}", where=url, fix="check the network / registry"
        ) from e


# --- publishing: blobs, manifests and indexes through the registry API --------------------
def _base_url(repository: str) -> tuple[str, str]:
    host, repo = split_repository(repository)
    return f"{_scheme(host)}://{host}", repo


def _send(
    method: str,
    url: str,
    *,
    headers: dict[str, str] | None = None,
    body: bytes | Path | None = None,
    progress: Callable[[int], None] | None = None,
) -> tuple[int, Any, bytes]:
    """One request over ``http.client``: (status, headers, body). A file body is streamed in
    1 MiB blocks (``progress`` gets the bytes sent so far). No token dance: publishing goes to
    registries that take anonymous pushes (a loopback registry, a site mirror)."""
    parts = urllib.parse.urlsplit(url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.netloc, timeout=120, blocksize=1 << 20)
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    headers = dict(headers or {})
    try:
        if isinstance(body, Path):
            size = body.stat().st_size
            headers["Content-Length"] = str(size)
            conn.putrequest(method, path, skip_accept_encoding=True)
            for k, v in headers.items():
                conn.putheader(k, v)
            conn.endheaders()
            sent = 0
            with body.open("rb") as f:
                while block := f.read(1 << 22):
                    conn.send(block)
                    sent += len(block)
                    if progress:
                        progress(sent)
        else:
            if body is not None or method in ("POST", "PUT"):
                headers["Content-Length"] = str(len(body or b""))
            conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        data = response.read()
        return response.status, response.headers, data
    except OSError as e:
        raise EngineError(
            f"cannot reach the registry: {e}", where=url, fix="check the network / registry"
        ) from e
    finally:
        conn.close()


def _refused(status: int, data: bytes, what: str, url: str) -> EngineError:
    detail = data.decode("utf-8", "replace").strip()[:400]
    if status in (401, 403):
        return EngineError(
            f"the registry refused {what} (HTTP {status}): it wants credentials",
            where=url,
            fix="publish to a registry that takes k3env's anonymous pushes (a site mirror), "
            "or push through the engine: `k3env push --via-engine` (docker login first)",
        )
    return EngineError(f"the registry refused {what} (HTTP {status}): {detail}", where=url,
                       fix="check the registry's log")  # fmt: skip


def blob_exists(repository: str, digest: str) -> bool:
    base, repo = _base_url(repository)
    status, _h, _b = _send("HEAD", f"{base}/v2/{repo}/blobs/{digest}")
    return status == 200


def mount_blob(repository: str, digest: str, source: str) -> bool:
    """Ask the registry to link ``digest`` from ``source`` (a repository on the same host)
    into ``repository`` without sending it; whether it did."""
    base, repo = _base_url(repository)
    _src_host, src_repo = split_repository(source)
    query = urllib.parse.urlencode({"mount": digest, "from": src_repo})
    url = f"{base}/v2/{repo}/blobs/uploads/?{query}"
    status, headers, data = _send("POST", url)
    if status == 201:
        return True
    if status == 202:  # the registry opened an upload instead: close it, send the bytes
        location = headers.get("Location")
        if location:
            _send("DELETE", urllib.parse.urljoin(url, location))
        return False
    raise _refused(status, data, f"a mount of {digest[:19]}", url)


def put_blob(
    repository: str, digest: str, source: Path, progress: Callable[[int], None] | None = None
) -> None:
    """Upload ``source`` as ``digest`` (one monolithic PUT); the registry checks the digest."""
    base, repo = _base_url(repository)
    url = f"{base}/v2/{repo}/blobs/uploads/"
    status, headers, data = _send("POST", url)
    location = headers.get("Location")
    if status != 202 or not location:
        raise _refused(status, data, "an upload", url)
    target = urllib.parse.urljoin(url, location)
    target += ("&" if "?" in target else "?") + urllib.parse.urlencode({"digest": digest})
    status, _headers, data = _send(
        "PUT", target, headers={"Content-Type": "application/octet-stream"}, body=source,
        progress=progress,
    )  # fmt: skip
    if status != 201:
        raise _refused(status, data, f"blob {digest[:19]}", url)


def read_blob(repository: str, digest: str, into: Path) -> None:
    """A blob of ``repository`` into the file ``into`` (streamed; an anonymous token when
    the registry asks for one)."""
    base, repo = _base_url(repository)
    url = f"{base}/v2/{repo}/blobs/{digest}"
    try:
        _fetch(url, headers={}, into=into, timeout=120)
    except urllib.error.HTTPError as e:
        raise EngineError(
            f"cannot read blob {digest[:19]} of {repository} (HTTP {e.code})",
            where=url, fix="check that the image is still in its registry",
        ) from e  # fmt: skip
    except OSError as e:
        raise EngineError(
            f"cannot read blob {digest[:19]} of {repository}: {e}",
            where=url, fix="check the network / registry",
        ) from e  # fmt: skip


def copy_blob(source: str, repository: str, digest: str, into: Path) -> None:
    """A blob of another registry, through ``into`` (a file), into ``repository``."""
    read_blob(source, digest, into)
    put_blob(repository, digest, into)


def get_manifest(repository: str, reference: str) -> tuple[str, str, bytes]:
    """(digest, media type, body) of a manifest or index, by tag or digest."""
    digest, body = _manifest(repository, reference, "GET")
    try:
        media_type = str(json.loads(body).get("mediaType") or "")
    except (ValueError, AttributeError) as e:
        raise EngineError(
            "the registry sent a manifest that is not JSON", where=f"{repository}@{reference}",
            fix="check the registry",
        ) from e  # fmt: skip
    return digest, media_type, body


def put_manifest(repository: str, reference: str, body: bytes, media_type: str) -> str:
    """Store a manifest or index under ``reference`` (a tag or its digest); its digest, which
    must be the sha256 of ``body``."""
    base, repo = _base_url(repository)
    url = f"{base}/v2/{repo}/manifests/{reference}"
    status, headers, data = _send("PUT", url, headers={"Content-Type": media_type}, body=body)
    if status != 201:
        raise _refused(status, data, f"manifest {reference}", url)
    digest = str(headers.get("Docker-Content-Digest") or "")
    expected = sha256_digest(body)
    if digest and digest != expected:
        raise EngineError(
            f"the registry stored manifest {reference} as {digest}, not {expected}",
            where=url, fix="the registry rewrote the manifest: use another registry",
        )  # fmt: skip
    return expected


def download(url: str, *, limit: int, timeout: float = 60) -> bytes:
    """One file over HTTP(S) from a mirror (a Debian pool file), at most ``limit`` bytes: a
    longer answer is refused, never truncated into something that might hash right."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            data: bytes = response.read(limit + 1)
    except OSError as e:
        raise EngineError(f"cannot fetch {url}: {e}", where=url, fix="check the mirror") from e
    if len(data) > limit:
        raise EngineError(
            f"{url} is over {limit} bytes", where=url, fix="check that the pin names the file"
        )
    return data
