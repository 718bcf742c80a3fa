"""k3env's own Docker API client against a fake daemon on a unix socket (no engine needed).

The fake answers canned replies per route, records every request, and can accept a
connection and never answer: the short metadata timeout must turn that into an EngineError.
"""

from __future__ import annotations

import contextlib
import json
import socketserver
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from k3env.engine._http import NO_AUTH, EngineHTTP, EngineHTTPError, demux
from k3env.engine.dockerd import DockerEngine
from k3env.errors import EngineError

HANG = (0, b"")  # accept, read the request, never answer


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes


Route = Callable[[Request], tuple[int, bytes]]


@dataclass
class FakeDaemon:
    url: str
    requests: list[Request] = field(default_factory=list)
    route: Route = lambda r: (404, b'{"message": "no route"}')


def frame(stream: int, data: bytes) -> bytes:
    return bytes([stream, 0, 0, 0]) + len(data).to_bytes(4, "big") + data


def _serve(path: Path, daemon: FakeDaemon, release: threading.Event) -> socketserver.BaseServer:
    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = self.request.recv(1 << 16)
                if not chunk:
                    return
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            first, *lines = head.decode().split("\r\n")
            method, target, _version = first.split(" ")
            headers = dict(line.split(": ", 1) for line in lines)
            while len(body) < int(headers.get("Content-Length", 0)):
                body += self.request.recv(1 << 16)
            url = urlsplit(target)
            request = Request(method, url.path, parse_qs(url.query), headers, body)
            daemon.requests.append(request)
            status, payload = daemon.route(request)
            if status == 0:
                release.wait(10)
                return
            reply = f"HTTP/1.0 {status} X\r\nContent-Type: application/json\r\n\r\n"
            with contextlib.suppress(OSError):  # the client gave up first
                self.request.sendall(reply.encode() + payload)

    class Server(socketserver.ThreadingUnixStreamServer):
        daemon_threads = True

    return Server(str(path), Handler)


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeDaemon]:
    sock = tmp_path / "d.sock"
    daemon = FakeDaemon(url=f"unix://{sock}")
    release = threading.Event()
    server = _serve(sock, daemon, release)
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    yield daemon
    release.set()
    server.shutdown()
    server.server_close()
    thread.join(5)


def routes(table: dict[str, tuple[int, bytes]]) -> Route:
    """Replies by ``METHOD /path`` (``/_ping`` always answers)."""

    def route(r: Request) -> tuple[int, bytes]:
        key = f"{r.method} {r.path}"
        if key == "GET /_ping" and key not in table:
            return 200, b"OK"
        return table.get(key, (404, b'{"message": "no route for ' + key.encode() + b'"}'))

    return route


def test_demux_splits_frames_across_chunk_boundaries() -> None:
    stream = frame(1, b"out 1\n") + frame(2, b"err\n") + frame(1, b"") + frame(1, b"out 2\n")
    one_byte_chunks = [stream[i : i + 1] for i in range(len(stream))]
    assert list(demux(one_byte_chunks)) == [
        (1, b"out 1\n"),
        (2, b"err\n"),
        (1, b""),
        (1, b"out 2\n"),
    ]
    assert list(demux([stream[:11], stream[11:]])) == list(demux([stream]))
    with pytest.raises(EngineHTTPError, match="inside a frame"):
        list(demux([stream[:-2]]))


def test_run_demultiplexes_stdout_and_stderr(fake: FakeDaemon) -> None:
    def route(r: Request) -> tuple[int, bytes]:
        if r.path == "/containers/c1/logs":
            if r.query == {"stdout": ["1"]}:
                return 200, frame(1, b"hello ") + frame(1, b"world\n")
            if r.query == {"stderr": ["1"]}:
                return 200, frame(2, b"warning\n")
        return routes(
            {
                "POST /containers/create": (201, b'{"Id": "c1", "Warnings": []}'),
                "POST /containers/c1/start": (204, b""),
                "POST /containers/c1/wait": (200, b'{"StatusCode": 3, "Error": null}'),
                "DELETE /containers/c1": (204, b""),
            }
        )(r)

    fake.route = route
    result = DockerEngine(fake.url).run(
        "img", ["sh", "-c", "x"], timeout=5, env={"A": "1"}, mounts={"/src": "/dst"}
    )
    assert (result.exit_code, result.stdout, result.stderr) == (3, "hello world\n", "warning\n")
    create = next(r for r in fake.requests if r.path == "/containers/create")
    config = json.loads(create.body)
    assert config["Entrypoint"] == ["sh"] and config["Cmd"] == ["-c", "x"]
    assert config["Env"] == ["A=1"] and config["NetworkDisabled"] is True
    assert config["HostConfig"] == {"NetworkMode": "none", "Binds": ["/src:/dst:ro"]}
    # The container is removed, with force, after the logs were read.
    assert [r.path for r in fake.requests][-1] == "/containers/c1"
    assert fake.requests[-1].method == "DELETE" and fake.requests[-1].query["force"] == ["1"]


def test_missing_image_is_none_and_missing_removal_is_fine(fake: FakeDaemon) -> None:
    missing = (404, b'{"message": "No such image: nope:1"}')
    fake.route = routes({"GET /images/nope:1/json": missing, "DELETE /images/nope:1": missing})
    engine = DockerEngine(fake.url)
    assert engine.inspect("nope:1") is None
    assert engine.lookup("nope:1") is None
    engine.remove("nope:1")


def test_daemon_error_message_is_surfaced(fake: FakeDaemon) -> None:
    fake.route = routes({"GET /images/bad/json": (500, b'{"message": "disk on fire"}')})
    with pytest.raises(EngineHTTPError) as raw:
        EngineHTTP(fake.url.removeprefix("unix://")).json("GET", "/images/bad/json")
    assert (raw.value.status, raw.value.message) == (500, "disk on fire")
    with pytest.raises(EngineError) as reported:
        DockerEngine(fake.url).inspect("bad")
    assert reported.value.message == "inspect failed: disk on fire (HTTP 500)"
    assert reported.value.where == "bad"


@pytest.mark.parametrize("route", ["GET /info", "GET /_ping"], ids=["at-a-request", "at-connect"])
def test_a_silent_daemon_is_an_engine_error_within_the_short_timeout(
    fake: FakeDaemon, route: str
) -> None:
    fake.route = routes({route: HANG})
    connected = None if route == "GET /_ping" else DockerEngine(fake.url, timeout=0.3)
    start = time.monotonic()
    with pytest.raises(EngineError, match="did not answer in time"):
        (connected or DockerEngine(fake.url, timeout=0.3)).describe()
    assert time.monotonic() - start < 3


def test_push_sends_auth_and_reads_the_digest_from_the_stream(fake: FakeDaemon) -> None:
    events = [
        {"status": "The push refers to repository [reg/x]"},
        {"status": "Preparing", "id": "aaa", "progressDetail": {}},
        {"status": "Pushing", "id": "aaa", "progressDetail": {"current": 1, "total": 2}},
        {"status": "Pushed", "id": "aaa", "progressDetail": {}},
        {"status": "Layer already exists", "id": "bbb", "progressDetail": {}},
        {"status": "1: digest: sha256:abc size: 1"},
        {"progressDetail": {}, "aux": {"Tag": "1", "Digest": "sha256:abc", "Size": 1}},
    ]
    # Progress messages arrive as the daemon writes them: "\r\n"-terminated JSON lines.
    body = b"".join(json.dumps(e).encode() + b"\r\n" for e in events)
    fake.route = routes({"POST /images/reg:5000/x/push": (200, body)})
    result = DockerEngine(fake.url).push("reg:5000/x", "1", lambda _: None)
    assert result.digest == "sha256:abc"
    assert result.layers == {"aaa": "Pushed", "bbb": "Layer already exists"}
    push = fake.requests[-1]
    assert push.headers["X-Registry-Auth"] == NO_AUTH and push.query == {"tag": ["1"]}


def test_a_push_with_no_aux_event_reads_the_digest_from_its_status_line(fake: FakeDaemon) -> None:
    """Docker 28's containerd image store ends a push with the status line alone (as it
    answered here, 28.5.2: no aux event); another tag's line is not this push's digest."""
    pushed = "sha256:ae325cdf668397d022a179600223138b5b2e9d29d49b2a0ee86d91cf5dcd87e2"
    events = [
        {"status": "The push refers to repository [127.0.0.1:5000/k3env-test/x]"},
        {"status": "Mounted from k3env-test/base", "progressDetail": {}, "id": "834065cef34b"},
        {"status": "t10: digest: sha256:" + "0" * 64 + " size: 736"},
        {"status": f"t1: digest: {pushed} size: 736"},
    ]
    route = "POST /images/127.0.0.1:5000/k3env-test/x/push"
    fake.route = routes({route: (200, b"".join(json.dumps(e).encode() + b"\r\n" for e in events))})
    result = DockerEngine(fake.url).push("127.0.0.1:5000/k3env-test/x", "t1", lambda _: None)
    assert result.digest == pushed
    fake.route = routes({route: (200, b"".join(json.dumps(e).encode() + b"\r\n"
                                                for e in events[:3]))})  # fmt: skip
    with pytest.raises(EngineError, match="the registry returned no digest"):
        DockerEngine(fake.url).push("127.0.0.1:5000/k3env-test/x", "t1", lambda _: None)


def test_error_in_a_pull_stream_is_an_engine_error(fake: FakeDaemon) -> None:
    body = b'{"status": "Pulling"}\r\n{"error": "manifest unknown"}\r\n'
    fake.route = routes({"POST /images/create": (200, body)})
    with pytest.raises(EngineError, match="pull failed: manifest unknown"):
        DockerEngine(fake.url).pull("reg:5000/x@sha256:abc", lambda _: None)
    assert fake.requests[-1].query == {"fromImage": ["reg:5000/x"], "tag": ["sha256:abc"]}


def test_import_streams_the_tarball_as_the_body(fake: FakeDaemon, tmp_path: Path) -> None:
    tarball = tmp_path / "rootfs.tar"
    tarball.write_bytes(bytes(range(256)) * 4096)  # 1 MiB: more than one socket buffer
    fake.route = routes(
        {
            "POST /images/create": (200, b'{"status": "sha256:img"}\r\n'),
            "GET /images/k3/x:1/json": (200, b'{"Id": "sha256:img"}'),
        }
    )
    assert DockerEngine(fake.url).import_rootfs(tarball, "k3/x", "1") == "sha256:img"
    sent = next(r for r in fake.requests if r.path == "/images/create")
    assert sent.headers["Content-Length"] == str(tarball.stat().st_size)
    assert sent.body == tarball.read_bytes()
    assert sent.query == {"fromSrc": ["-"], "repo": ["k3/x"], "tag": ["1"]}


def test_remote_docker_host_is_refused_with_a_fix() -> None:
    for url in ("tcp://10.0.0.1:2375", "ssh://user@host"):
        with pytest.raises(EngineError) as e:
            DockerEngine(url)
        assert e.value.where == "DOCKER_HOST"
        assert e.value.fix is not None and "ssh -nNT -L" in e.value.fix


def test_missing_socket_is_an_engine_error(tmp_path: Path) -> None:
    with pytest.raises(EngineError, match="cannot reach the Docker engine"):
        DockerEngine(f"unix://{tmp_path}/absent.sock")


def test_run_past_its_timeout_is_killed(fake: FakeDaemon) -> None:
    fake.route = routes(
        {
            "POST /containers/create": (201, b'{"Id": "c1"}'),
            "POST /containers/c1/start": (204, b""),
            "POST /containers/c1/wait": HANG,
            "POST /containers/c1/kill": (204, b""),
            "GET /containers/c1/logs": (200, frame(1, b"started\n")),
            "DELETE /containers/c1": (204, b""),
        }
    )
    result = DockerEngine(fake.url).run("img", ["sleep", "30"], timeout=0.3)
    assert result.exit_code == -9 and result.stderr.endswith("[k3env] killed after 0 s")
    assert [f"{r.method} {r.path}" for r in fake.requests][-5:] == [
        "POST /containers/c1/wait",
        "POST /containers/c1/kill",
        "GET /containers/c1/logs",
        "GET /containers/c1/logs",
        "DELETE /containers/c1",
    ]


def test_push_retries_then_names_the_registry(
    fake: FakeDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:

    monkeypatch.setattr("k3env.engine.dockerd.time.sleep", lambda _: None)
    fake.route = routes({"POST /images/reg:5000/x/push": (500, b'{"message": "registry down"}')})
    lines: list[str] = []
    with pytest.raises(EngineError) as e:
        DockerEngine(fake.url).push("reg:5000/x", "1", lines.append)
    assert e.value.message == "docker push (3 attempts) failed: registry down (HTTP 500)"
    assert e.value.fix is not None and "registry" in e.value.fix
    assert sum(r.path.endswith("/push") for r in fake.requests) == 3
    assert len(lines) == 2


def test_a_sized_stream_gives_whole_buffers_of_their_own(fake: FakeDaemon) -> None:
    payload = bytes(range(256)) * 5000  # 1.28 MB: several socket reads per buffer
    fake.route = routes({"GET /blob": (200, payload)})
    http = EngineHTTP(fake.url.removeprefix("unix://"))
    pieces = list(http.buffers("/blob", 1 << 18, timeout=5))
    assert b"".join(pieces) == payload
    # The header's read may carry the body's first bytes; after it, full buffers, a short last.
    sized = pieces[1:] if len(pieces[0]) != 1 << 18 else pieces
    assert all(len(p) == 1 << 18 for p in sized[:-1]) and 0 < len(sized[-1]) <= 1 << 18
    assert len({id(p) for p in pieces}) == len(pieces)  # none reused: views of them stay true
    assert list(http.stream("GET", "/blob")) and b"".join(http.stream("GET", "/blob")) == payload
