"""The registry client against a local HTTP registry that wants an anonymous bearer token
(as Docker Hub does): a 401 names the realm, the token is fetched, the request is repeated."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from k3env.engine.registry import list_tags, resolve_digest, tagged_config
from k3env.errors import EngineError, LockError

CONFIG = "sha256:" + "cd" * 32
MANIFEST = json.dumps(
    {
        "schemaVersion": 2,
        "config": {"digest": CONFIG},
        "layers": [],
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
    }
).encode()
DIGEST = "sha256:" + hashlib.sha256(MANIFEST).hexdigest()


@pytest.fixture
def registry() -> Iterator[tuple[str, list[str]]]:
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _send(
            self, code: int, body: bytes = b"", headers: dict[str, str] | None = None
        ) -> None:
            self.send_response(code)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_HEAD(self) -> None:
            self.do_GET()

        def do_GET(self) -> None:
            seen.append(f"{self.command} {self.path} {self.headers.get('Authorization')}")
            host = self.headers["Host"]
            if self.path.startswith("/token"):
                return self._send(200, json.dumps({"token": "t0k"}).encode())
            if self.headers.get("Authorization") != "Bearer t0k":
                challenge = f'Bearer realm="http://{host}/token",service="reg",scope="pull"'
                return self._send(401, b"", {"WWW-Authenticate": challenge})
            if self.path == "/v2/team/app/tags/list?n=10000":
                return self._send(200, json.dumps({"tags": ["1", "2"]}).encode())
            if self.path == "/v2/team/app/manifests/1":
                return self._send(200, MANIFEST, {"Docker-Content-Digest": DIGEST})
            return self._send(404)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}/team/app", seen
    finally:
        server.shutdown()
        server.server_close()


def test_a_token_is_fetched_from_the_realm_and_the_request_repeated(
    registry: tuple[str, list[str]],
) -> None:
    repository, seen = registry
    assert resolve_digest(repository, "1") == DIGEST
    # GET, not HEAD: the digest written into a lock is the sha256 of the bytes received.
    assert [s.split()[0] + " " + s.split()[1].split("?")[0] for s in seen] == [
        "GET /v2/team/app/manifests/1",
        "GET /token",
        "GET /v2/team/app/manifests/1",
    ]
    assert seen[-1].endswith("Bearer t0k")
    assert tagged_config(repository, "1") == CONFIG
    assert list_tags(repository) == ["1", "2"]


def test_a_missing_tag_and_a_missing_repository_say_so(
    registry: tuple[str, list[str]],
) -> None:
    repository, _ = registry
    with pytest.raises(LockError, match="tag '9' not found"):
        resolve_digest(repository, "9")
    assert tagged_config(repository, "9") is None
    with pytest.raises(EngineError, match=r"cannot list tags \(HTTP 404\)"):
        list_tags(repository.replace("app", "nope"))


def test_enroots_probe_is_a_head_with_no_accept_and_no_credentials(
    registry: tuple[str, list[str]],
) -> None:
    """enroot 4.1.2 (src/docker.sh `docker::_authenticate`) HEADs the manifest with no
    Accept header and takes a 401 challenge as the way on: k3env asks the same, once."""
    from k3env.engine.registry import enroot_probe

    repository, seen = registry
    assert enroot_probe(repository, DIGEST) == 401  # this registry wants a token: enroot goes on
    (asked,) = seen
    assert asked == f"HEAD /v2/team/app/manifests/{DIGEST} None"
    with pytest.raises(LockError, match="is not a digest"):
        enroot_probe(repository, "latest")
