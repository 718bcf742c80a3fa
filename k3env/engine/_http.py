"""A minimal Docker Engine API client over the daemon's unix socket (stdlib only).

k3env's only transport to dockerd (see ``dockerd`` for why one). Each call is one HTTP/1.0
exchange on a fresh connection: the daemon then answers without chunked encoding and closes,
so a reply, streamed or not, is everything read until EOF. (``http.client`` alone costs ~12 ms
to import, on a path whose whole budget is ~0.15 s.)

Timeouts are the socket's: the longest the daemon may stay silent (connect, each send, each
read), not a budget for the whole exchange. Metadata calls get the client's short default;
the long verbs (load, import, push, pull, wait, export, logs follow) pass their own.
"""

from __future__ import annotations

import contextlib
import enum
import json
import socket
from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from k3env import jsontext

DEFAULT_TIMEOUT = 30.0  # metadata calls: the daemon answers these in milliseconds
# base64 of ``{}``: no credentials. The daemon requires the header on push (it falls back to
# decoding the body otherwise); k3env pushes only to registries that need no login.
NO_AUTH = "e30="
_MAX_HEAD = 1 << 16


class _Default(enum.Enum):
    TIMEOUT = 0


SHORT = _Default.TIMEOUT  # "the client's short default timeout"
Timeout = float | None | _Default
Params = Mapping[str, str | Sequence[str]]


# A request body: bytes, a file, or pieces of either sent one after the other.
Body = bytes | Path | tuple[bytes | Path, ...]


def body_parts(body: Body | None) -> tuple[bytes | Path, ...]:
    return () if body is None else body if isinstance(body, tuple) else (body,)


def body_size(body: Body) -> int:
    return sum(p.stat().st_size if isinstance(p, Path) else len(p) for p in body_parts(body))


class EngineHTTPError(Exception):
    """The daemon answered with an HTTP error (``status`` >= 400), or not with HTTP at all
    (``status`` 0). ``message`` is the daemon's own JSON ``message`` when it sent one."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


def cut(sock: socket.socket) -> None:
    """Shut a connection down from another thread (a deadline's watchdog): the blocked read
    returns at once."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def quote_ref(ref: str) -> str:
    """An image or container reference as a URL path segment (the daemon's routes take
    ``{name:.*}``, so the slashes, colons and ``@`` of a reference stay as they are)."""
    return quote(ref, safe="/:@")


def demux(chunks: Iterable[bytes]) -> Iterator[tuple[int, bytes]]:
    """Split docker's multiplexed log stream into ``(stream, payload)`` frames.

    A container without a TTY has its output framed: 8 bytes [stream (0 stdin, 1 stdout,
    2 stderr), 0, 0, 0, big-endian uint32 size] then ``size`` bytes. Frames may be split
    across the chunks the socket delivers, so a partial frame waits for the next chunk.
    """
    buf = b""
    for chunk in chunks:
        buf += chunk
        while len(buf) >= 8:
            if buf[0] > 2 or buf[1:4] != b"\0\0\0":
                # Not framed (a TTY container): the rest is one raw stdout stream.
                yield 1, buf
                buf = b""
                break
            size = int.from_bytes(buf[4:8], "big")
            if len(buf) < 8 + size:
                break
            yield buf[0], buf[8 : 8 + size]
            buf = buf[8 + size :]
    if buf:
        if buf[0] > 2 or buf[1:4] != b"\0\0\0":
            yield 1, buf
        else:
            raise EngineHTTPError(0, f"log stream ended inside a frame: {buf[:16]!r}")


class EngineHTTP:
    def __init__(self, socket_path: str, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.socket_path = socket_path
        self.timeout = timeout

    # -- one exchange ----------------------------------------------------------------------
    def _open(
        self,
        method: str,
        path: str,
        *,
        params: Params | None,
        body: Body | None,
        content_type: str | None,
        headers: Mapping[str, str] | None,
        timeout: Timeout,
    ) -> tuple[socket.socket, int, bytes, bytes]:
        """Send the request; return the socket, the status, the body bytes read so far and
        the reply's header lines."""
        url = path + (f"?{urlencode(params, doseq=True)}" if params else "")
        head = [f"{method} {url} HTTP/1.0", "Host: docker"]
        if body is not None:
            head.append(f"Content-Length: {body_size(body)}")
        if content_type:
            head.append(f"Content-Type: {content_type}")
        head.extend(f"{k}: {v}" for k, v in (headers or {}).items())
        request = ("\r\n".join(head) + "\r\n\r\n").encode()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout if timeout is SHORT else timeout)
            sock.connect(self.socket_path)
            sock.sendall(request)
            try:
                for part in body_parts(body):
                    if isinstance(part, Path):
                        # The kernel copies the file: gigabytes of layer never enter Python.
                        with part.open("rb") as f:
                            sock.sendfile(f)
                    elif part:
                        sock.sendall(part)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the daemon answered before reading the whole body: its reply says why
            reply = b""
            while b"\r\n\r\n" not in reply:
                chunk = sock.recv(1 << 16)
                if not chunk and not reply:
                    raise EngineHTTPError(0, "the daemon closed the connection without answering")
                if not chunk or len(reply) > _MAX_HEAD:
                    raise EngineHTTPError(0, f"malformed reply from the daemon: {reply[:200]!r}")
                reply += chunk
            header, _, rest = reply.partition(b"\r\n\r\n")
            status_line = header.split(b"\r\n", 1)[0].split()
            if len(status_line) < 2 or not status_line[1].isdigit():
                raise EngineHTTPError(0, f"malformed reply from the daemon: {reply[:200]!r}")
            return sock, int(status_line[1]), rest, header
        except BaseException:
            sock.close()
            raise

    @staticmethod
    def _read_rest(sock: socket.socket, first: bytes) -> bytes:
        chunks = [first]
        while chunk := sock.recv(1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)

    @staticmethod
    def _error(status: int, data: bytes) -> EngineHTTPError:
        try:
            message = json.loads(data).get("message", data.decode(errors="replace"))
        except (ValueError, AttributeError):
            message = data.decode(errors="replace").strip()
        return EngineHTTPError(status, str(message))

    def call(
        self,
        method: str,
        path: str,
        *,
        params: Params | None = None,
        body: Body | None = None,
        json_body: Any = None,
        content_type: str | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: Timeout = SHORT,
        ok_404: bool = False,
    ) -> tuple[int, bytes]:
        """One exchange, the whole reply read; raises ``EngineHTTPError`` for status >= 400
        (but returns a 404 when ``ok_404``: "not there" is an answer for some verbs)."""
        if json_body is not None:
            body, content_type = (
                jsontext.dumps(json_body, sort_keys=False).encode(),
                "application/json",
            )
        sock, status, first, _ = self._open(
            method,
            path,
            params=params,
            body=body,
            content_type=content_type,
            headers=headers,
            timeout=timeout,
        )
        with sock:
            data = self._read_rest(sock, first)
        if status >= 400 and not (ok_404 and status == 404):
            raise self._error(status, data)
        return status, data

    def ping(self) -> dict[str, str]:
        """``GET /_ping``: the daemon's reply headers (lower-case names), e.g. ``api-version``
        (the cheapest question: /version and /info cost the daemon 10-25 ms)."""
        sock, status, first, header = self._open("GET", "/_ping", params=None, body=None,
                                                 content_type=None, headers=None,
                                                 timeout=SHORT)  # fmt: skip
        with sock:
            data = self._read_rest(sock, first)
        if status >= 400:
            raise self._error(status, data)
        lines = header.decode("latin-1").split("\r\n")[1:]
        return {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines)}

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        """``call`` and decode the reply as one JSON document (``None`` for a 404 with
        ``ok_404``)."""
        status, data = self.call(method, path, **kwargs)
        if status == 404:
            return None
        try:
            return json.loads(data)
        except ValueError as e:
            raise EngineHTTPError(0, f"not JSON from {path}: {data[:200]!r}") from e

    def stream(
        self,
        method: str,
        path: str,
        *,
        params: Params | None = None,
        body: Body | None = None,
        content_type: str | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: Timeout = SHORT,
    ) -> Generator[bytes, None, None]:
        """The reply body as it arrives, each read as it comes. The request is sent on the
        first ``next``; closing the iterator closes the connection."""
        sock, first = self._streamed(method, path, params=params, body=body,
                                     content_type=content_type, headers=headers,
                                     timeout=timeout)  # fmt: skip
        with sock:
            if first:
                yield first
            while chunk := sock.recv(1 << 16):
                yield chunk

    def buffers(
        self, path: str, size: int, *, timeout: Timeout
    ) -> Generator[bytearray, None, None]:
        """A GET's reply body in buffers of ``size`` bytes (the first and the last may be
        shorter), each filled by the kernel in place and never reused: a reader may keep
        views of them, and gigabytes pass without a copy in Python."""
        sock, first = self._streamed("GET", path, params=None, body=None, content_type=None,
                                     headers=None, timeout=timeout)  # fmt: skip
        with sock:
            if first:
                yield bytearray(first)
            while True:
                buf = bytearray(size)
                view, filled = memoryview(buf), 0
                while filled < size and (n := sock.recv_into(view[filled:])):
                    filled += n
                if filled:
                    yield buf if filled == size else buf[:filled]
                if filled < size:
                    return

    def _streamed(self, method: str, path: str, **request: Any) -> tuple[socket.socket, bytes]:
        """The request sent (``request``: ``_open``'s keywords); the socket and the body's
        first bytes (an error status raised)."""
        sock, status, first, _ = self._open(method, path, **request)
        if status >= 400:
            with sock:
                raise self._error(status, self._read_rest(sock, first))
        return sock, first

    def json_lines(
        self, method: str, path: str, **kwargs: Any
    ) -> Generator[dict[str, Any], None, None]:
        """A streamed reply of newline-separated JSON messages (pull, push, import, load),
        each yielded as soon as its line is complete."""
        pending = b""
        chunks = self.stream(method, path, **kwargs)
        try:
            for chunk in chunks:
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield _message(line)
            if pending.strip():
                yield _message(pending)
        finally:
            chunks.close()


def _message(line: bytes) -> dict[str, Any]:
    try:
        event = json.loads(line)
    except ValueError as e:
        raise EngineHTTPError(0, f"not a JSON message from the daemon: {line[:200]!r}") from e
    if not isinstance(event, dict):
        raise EngineHTTPError(0, f"not a JSON object from the daemon: {line[:200]!r}")
    return event
