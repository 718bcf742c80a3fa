"""The registry's HTTP API (stdlib), the one registry client: a tag's manifest digest, and
whether a manifest is still there.

``HEAD /v2/<repo>/manifests/<tag>`` answers with ``Docker-Content-Digest``. Registries that
want a token (Docker Hub) say so in ``WWW-Authenticate``; an anonymous token is fetched from
the realm it names. Loopback registries are spoken to over http, every other over https.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from k3env.errors import CheckFailed, EngineError, LockError

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


def _fetch(url: str, *, method: str = "GET", headers: dict[str, str]) -> tuple[Any, bytes]:
    """One registry request: (response headers, body; empty for HEAD). When the registry asks
    for a token (401 + ``WWW-Authenticate``), once more with an anonymous one. ``HTTPError``
    and ``OSError`` are the caller's to name."""
    headers = dict(headers)
    while True:
        request = urllib.request.Request(url, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
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


def refuse_to_move(repository: str, tag: str, image_id: str) -> None:
    """Fail when the registry's ``repository:tag`` already names another image: a tag is the
    content hash of an image's inputs, so another image under it means the bytes moved (a
    build that is not reproducible), and moving it would change what others pull."""
    try:
        current = tagged_config(repository, tag)
    except EngineError:
        return  # the registry is unreachable: the push itself will say so
    if current is not None and current != image_id:
        raise CheckFailed(
            f"{repository}:{tag} already names image {current[:19]}, not {image_id[:19]}: "
            "the same inputs built different bytes here",
            where=f"{repository}:{tag}",
            fix="do not overwrite it: find what differs (`docker image inspect` both, compare "
            "layers); pull the registry's image by digest to build on the same bytes",
        )


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
