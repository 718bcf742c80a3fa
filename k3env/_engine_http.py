"""A minimal Docker Engine API client over the daemon's unix socket (stdlib only).

Why next to the docker SDK: importing the SDK (requests, urllib3, ...) costs ~120 ms, more
than a whole legacy ``docker build`` of an env edit. The verbs on the rebuild path (inspect,
history, load, tag) go through here; everything else goes through the SDK, imported only when
needed. Used only when DOCKER_HOST is a unix socket (the default).
"""

from __future__ import annotations

import http.client
import json
import socket
from typing import Any
from urllib.parse import quote, urlencode


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


class EngineHTTPError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


class EngineHTTP:
    def __init__(self, socket_path: str, timeout: float = 600) -> None:
        self.socket_path = socket_path
        self.timeout = timeout

    def _request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        body: bytes | None = None,
        content_type: str | None = None,
    ) -> tuple[int, bytes]:
        url = path + (f"?{urlencode(params)}" if params else "")
        headers = {"Connection": "close"}
        if content_type:
            headers["Content-Type"] = content_type
        # One connection per request: a unix-socket connect costs microseconds, and nothing
        # is left open for the caller to close.
        conn = _UnixConnection(self.socket_path, self.timeout)
        try:
            conn.request(method, url, body=body, headers=headers)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def _check(self, status: int, data: bytes) -> bytes:
        if status >= 400:
            try:
                message = json.loads(data).get("message", data.decode(errors="replace"))
            except ValueError:
                message = data.decode(errors="replace")
            raise EngineHTTPError(status, str(message))
        return data

    def ping(self) -> None:
        self._check(*self._request("GET", "/_ping"))

    def inspect_image(self, ref: str) -> dict[str, Any] | None:
        status, data = self._request("GET", f"/images/{quote(ref, safe='/:@')}/json")
        if status == 404:
            return None
        result: dict[str, Any] = json.loads(self._check(status, data))
        return result

    def history(self, ref: str) -> list[dict[str, Any]]:
        status, data = self._request("GET", f"/images/{quote(ref, safe='/:@')}/history")
        rows: list[dict[str, Any]] = json.loads(self._check(status, data))
        return rows

    def load(self, archive: bytes) -> list[dict[str, Any]]:
        status, data = self._request(
            "POST", "/images/load", body=archive, content_type="application/x-tar"
        )
        self._check(status, data)
        return [json.loads(line) for line in data.splitlines() if line.strip()]

    def tag(self, image: str, repository: str, tag: str) -> None:
        params = {"repo": repository, "tag": tag}
        self._check(
            *self._request("POST", f"/images/{quote(image, safe='/:@')}/tag", params=params)
        )
