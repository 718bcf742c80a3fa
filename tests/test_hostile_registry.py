"""A registry that misbehaves, on 127.0.0.1: every answer k3env reads from it is data with a
shape, a size and a deadline. Each case is one way a registry (or a proxy in front of it) can
answer; k3env's answer is an ``EngineError`` naming the registry (exit 3), never a host file
read, a token sent elsewhere, a hang or a traceback."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from k3env import jsontext
from k3env.cli import main
from k3env.engine import registry
from k3env.engine.credentials import same_site
from k3env.engine.registry import get_manifest, list_tags, read_blob, resolve_digest
from k3env.errors import EngineError, LockError
from k3env.handoff import publish, referrers
from k3env.log import Log
from k3env.runner import ask

from .conftest import replace_in

Answer = Callable[[str, dict[str, str], socket.socket, str], None]


class Hostile:
    """A raw TCP server: ``answer(path, headers, conn, host)`` writes whatever bytes it likes."""

    def __init__(self) -> None:
        self.answer: Answer = lambda path, headers, conn, host: None
        self.seen: list[tuple[str, dict[str, str]]] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.host = f"127.0.0.1:{self.port}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            head_bytes, body = data.split(b"\r\n\r\n", 1)
            head = head_bytes.decode("latin-1").split("\r\n")
            method, path = head[0].split()[:2]
            headers = dict(line.split(": ", 1) for line in head[1:] if ": " in line)
            if self._record(conn, method, path, headers, body):
                with contextlib.suppress(OSError):
                    self.answer(path, headers, conn, self.host)

    def _record(
        self, conn: socket.socket, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> bool:
        self.seen.append((path, headers))
        return True


@pytest.fixture
def hostile() -> Iterator[Hostile]:
    server = Hostile()
    try:
        yield server
    finally:
        server.sock.close()


def reply(conn: socket.socket, status: str, body: bytes = b"", **headers: str) -> None:
    lines = [f"HTTP/1.1 {status}", f"Content-Length: {len(body)}", "Connection: close"]
    lines += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
    conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)


def manifest_json(**extra: object) -> bytes:
    media = "application/vnd.oci.image.manifest.v1+json"
    return json.dumps({"schemaVersion": 2, "mediaType": media, "config": {}, "layers": [],
                       **extra}).encode()  # fmt: skip


def sha(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


def test_a_file_realm_is_refused_and_the_host_file_never_read(
    hostile: Hostile, tmp_path: Path
) -> None:
    secret = tmp_path / "token.json"
    secret.write_text(json.dumps({"token": "HOST-SECRET"}))

    def answer(path: str, headers: dict[str, str], conn: socket.socket, host: str) -> None:
        realm = f"file://{secret}#"
        reply(conn, "401 Unauthorized", WWW_Authenticate=f'Bearer realm="{realm}",scope="x"')

    hostile.answer = answer
    with pytest.raises(EngineError, match="the registry sent a file: URL") as e:
        resolve_digest(f"{hostile.host}/team/app", "1")
    assert "the token realm" in str(e.value.where)
    assert all("HOST-SECRET" not in str(h) for _, h in hostile.seen)
    assert len(hostile.seen) == 1  # nothing sent back


def replies(status: str, **headers: str) -> Answer:
    """An answer with no body; ``{host}`` in a header value is the server's own address."""
    return lambda path, _, conn, host: reply(
        conn, status, b"", **{k: v.format(host=host) for k, v in headers.items()}
    )


@pytest.mark.parametrize(
    ("answer", "said", "where"),
    [
        *(pytest.param(replies("401 Unauthorized", WWW_Authenticate=f'Bearer realm="{realm}"'),
                       "the registry sent a", "the token realm", id=f"realm-{what}")
          for what, realm in [("ftp", "ftp://127.0.0.1/token"),
                              ("http-elsewhere", "http://registry.example.com/token"),
                              ("with-userinfo", "https://u:p@example.com/t")]),
        pytest.param(replies("302 Found", Location="file:///etc/passwd"), "file: URL",
                     "a redirect from", id="redirect-to-a-file"),
        pytest.param(replies("302 Found", Location="http://{host}/again"),
                     "redirected more than 5 times", "", id="redirect-loop-ends"),
    ],
)  # fmt: skip
def test_a_realm_off_the_scheme_rules_or_a_bad_redirect_is_refused(
    hostile: Hostile, answer: Answer, said: str, where: str
) -> None:
    hostile.answer = answer
    with pytest.raises(EngineError, match=said) as e:
        resolve_digest(f"{hostile.host}/team/app", "1")
    assert where in str(e.value.where)


def test_a_token_is_never_carried_to_another_host(hostile: Hostile) -> None:
    body = manifest_json()

    def answer(path: str, headers: dict[str, str], conn: socket.socket, host: str) -> None:
        if path.startswith("/token"):
            return reply(conn, "200 OK", json.dumps({"token": "t0k"}).encode())
        if headers.get("Host", "").startswith("localhost"):  # the other host
            return reply(conn, "200 OK", body, Docker_Content_Digest=sha(body))
        if headers.get("Authorization") != "Bearer t0k":
            realm = f"http://{host}/token"
            return reply(conn, "401 Unauthorized", WWW_Authenticate=f'Bearer realm="{realm}"')
        reply(conn, "307 Temporary Redirect", Location=f"http://localhost:{hostile.port}/elsewhere")

    hostile.answer = answer
    assert resolve_digest(f"{hostile.host}/team/app", "1") == sha(body)
    elsewhere = [h for p, h in hostile.seen if p == "/elsewhere"]
    assert elsewhere and "Authorization" not in elsewhere[0]


def test_a_registry_that_sends_a_byte_at_a_time_meets_the_deadline(
    hostile: Hostile, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(registry, "DEADLINE", 1.5)

    def answer(path: str, headers: dict[str, str], conn: socket.socket, host: str) -> None:
        for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 1000:
            conn.sendall(bytes([byte]))
            time.sleep(0.2)  # well inside the socket's idle timeout: it never fires

    hostile.answer = answer
    start = time.monotonic()
    with pytest.raises(EngineError, match="no answer within the deadline"):
        resolve_digest(f"{hostile.host}/team/app", "1")
    assert time.monotonic() - start < 5


UNREACHABLE = "cannot reach the registry"
NO_MANIFEST = r"not an image manifest|does not parse|cannot reach"


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        (b"garbage\r\n\r\n", UNREACHABLE),  # a status line that is not HTTP
        (b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(200)) + b"\r\n",
         UNREACHABLE),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n{}", UNREACHABLE),  # short, closed
        (b"", UNREACHABLE),  # the connection closed before any answer
        # A 200 that is not a manifest: each of these put the sha256 of (almost) no bytes into
        # the lock, exit 0.
        (b"HTTP/1.1 200 OK\r\n\r\n", NO_MANIFEST),  # headers, then closed: no body at all
        (b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + manifest_json()[:30], NO_MANIFEST),
        (b"HTTP/1.0 200 OK\r\n\r\n", NO_MANIFEST),  # an empty HTTP/1.0 answer
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}", NO_MANIFEST),  # JSON, not a manifest
        (b"HTTP/1.1 200 OK\r\nContent-Length: 15\r\n\r\n<html>503</html>"[:-1], NO_MANIFEST),
    ],
    ids=["status-line", "too-many-headers", "short-body", "no-answer", "200-eof-after-headers",
         "200-cut-without-length", "200-empty-http10", "200-empty-object", "200-html"],
)  # fmt: skip
def test_protocol_garbage_is_an_engine_error_never_a_traceback_or_a_digest(
    hostile: Hostile, raw: bytes, said: str
) -> None:
    hostile.answer = lambda path, headers, conn, host: conn.sendall(raw)
    with pytest.raises(EngineError, match=said):
        resolve_digest(f"{hostile.host}/team/app", "1")


def test_a_digest_header_that_is_not_the_bytes_is_refused(hostile: Hostile) -> None:
    body = manifest_json()
    hostile.answer = lambda path, headers, conn, host: reply(
        conn, "200 OK", body, Docker_Content_Digest="sha256:" + "0" * 64
    )
    with pytest.raises(EngineError, match="but its bytes hash to " + sha(body)):
        resolve_digest(f"{hostile.host}/team/app", "1")


def test_a_manifest_over_the_limit_is_refused(
    hostile: Hostile, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(registry, "MAX_MANIFEST", 1000)
    body = manifest_json(pad="x" * 5000)
    hostile.answer = lambda path, headers, conn, host: reply(conn, "200 OK", body)
    with pytest.raises(EngineError, match="the answer is over 1000 bytes"):
        get_manifest(f"{hostile.host}/team/app", "1")


@pytest.mark.parametrize(
    "body",
    [b'{"tags": "1.0"}', b'["1.0"]', b"[" * 100_000 + b"]" * 100_000, b'{"tags": {"a": 1}}'],
    ids=["string", "list", "deep", "object"],
)
def test_tags_of_the_wrong_shape_are_an_engine_error(hostile: Hostile, body: bytes) -> None:
    hostile.answer = lambda path, headers, conn, host: reply(conn, "200 OK", body)
    with pytest.raises(EngineError, match="the registry"):
        list_tags(f"{hostile.host}/team/app")


def test_tags_outside_the_grammar_are_never_offered(hostile: Hostile) -> None:
    tags = ["1.2.3", "1.2.4\n", "1.2.5 ", "-x", "a" * 129, 7, "v2.0_rc-1", "1.2.6\nsetup: x"]
    body = json.dumps({"tags": tags}).encode()
    hostile.answer = lambda path, headers, conn, host: reply(conn, "200 OK", body)
    assert list_tags(f"{hostile.host}/team/app") == ["1.2.3", "v2.0_rc-1"]


def test_a_blob_that_trickles_is_cut_at_the_floor_rate(
    hostile: Hostile, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(registry, "DEADLINE", 1.0)

    def answer(path: str, headers: dict[str, str], conn: socket.socket, host: str) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000000\r\n\r\n")
        for _ in range(100):
            conn.sendall(b"x")
            time.sleep(0.2)

    hostile.answer = answer
    start = time.monotonic()
    with pytest.raises(EngineError, match="no answer within the deadline"):
        read_blob(f"{hostile.host}/team/app", "sha256:" + "1" * 64, tmp_path / "blob")
    assert time.monotonic() - start < 5


# --- credentials: found where docker and skopeo keep them, sent only where they belong ---------
SECRET = "s3cr3t-pw"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty home: no auth file but those a test writes."""
    for name in ("REGISTRY_AUTH_FILE", "XDG_RUNTIME_DIR", "DOCKER_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def docker_login(home: Path, host: str, user: str = "alice", secret: str = SECRET) -> str:
    (home / ".docker").mkdir(exist_ok=True)
    auth = base64.b64encode(f"{user}:{secret}".encode()).decode()
    (home / ".docker/config.json").write_text(json.dumps({"auths": {host: {"auth": auth}}}))
    return "Basic " + auth


def basic_registry(body: bytes, expected: str) -> Answer:
    def answer(path: str, headers: dict[str, str], conn: socket.socket, host: str) -> None:
        if headers.get("Authorization") != expected:
            return reply(conn, "401 Unauthorized", WWW_Authenticate='Basic realm="reg"')
        reply(conn, "200 OK", body, Docker_Content_Digest=sha(body))

    return answer


def test_docker_config_credentials_answer_a_basic_challenge(hostile: Hostile, home: Path) -> None:
    body = manifest_json()
    hostile.answer = basic_registry(body, docker_login(home, hostile.host))
    assert resolve_digest(f"{hostile.host}/team/app", "1") == sha(body)
    assert [h.get("Authorization", "")[:6] for _, h in hostile.seen] == ["", "Basic "]


def test_without_credentials_a_basic_registry_stays_refused(hostile: Hostile, home: Path) -> None:
    hostile.answer = basic_registry(manifest_json(), "Basic nothing")
    with pytest.raises(LockError, match="HTTP 401"):
        resolve_digest(f"{hostile.host}/team/app", "1")


def test_a_containers_auth_file_comes_before_docker_config(hostile: Hostile, home: Path) -> None:
    docker_login(home, hostile.host, user="stale", secret="old")
    auth = base64.b64encode(f"bob:{SECRET}".encode()).decode()
    (home / ".config/containers").mkdir(parents=True)
    (home / ".config/containers/auth.json").write_text(
        json.dumps({"auths": {hostile.host: {"auth": auth}}})
    )
    body = manifest_json()
    hostile.answer = basic_registry(body, "Basic " + auth)
    assert resolve_digest(f"{hostile.host}/team/app", "1") == sha(body)


def test_a_credential_helper_is_asked_for_its_host(
    hostile: Hostile, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = home / "bin"
    bin_dir.mkdir()
    helper = bin_dir / "docker-credential-k3test"
    helper.write_text(
        "#!/bin/sh\nread host\n"
        f'printf \'{{"ServerURL": "%s", "Username": "carol", "Secret": "{SECRET}"}}\' "$host"\n'
    )
    helper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    (home / ".docker").mkdir()
    (home / ".docker/config.json").write_text(json.dumps({"credHelpers": {hostile.host: "k3test"}}))
    body = manifest_json()
    expected = "Basic " + base64.b64encode(f"carol:{SECRET}".encode()).decode()
    hostile.answer = basic_registry(body, expected)
    assert resolve_digest(f"{hostile.host}/team/app", "1") == sha(body)


@pytest.mark.parametrize("content", ["fifo", "not json {", '["a list"]', '{"auths": {"H": 7}}'])
def test_an_auth_file_of_the_wrong_shape_is_skipped_not_a_traceback(
    hostile: Hostile, home: Path, content: str
) -> None:
    (home / ".docker").mkdir()
    config = home / ".docker/config.json"
    if content == "fifo":
        os.mkfifo(config)
    else:
        config.write_text(content.replace("H", hostile.host))
    hostile.answer = basic_registry(manifest_json(), "Basic nothing")
    with pytest.raises(LockError, match="HTTP 401"):  # anonymous, as with no file at all
        resolve_digest(f"{hostile.host}/team/app", "1")


def test_a_credential_never_goes_to_a_realm_on_another_site(hostile: Hostile, home: Path) -> None:
    docker_login(home, hostile.host)
    other = f"localhost:{hostile.port}"  # another host name: another site
    body = manifest_json()

    def answer(path: str, headers: dict[str, str], conn: socket.socket, host: str) -> None:
        if path.startswith("/token"):
            return reply(conn, "200 OK", json.dumps({"token": "anon"}).encode())
        if headers.get("Authorization") != "Bearer anon":
            realm = f"http://{other}/token"
            return reply(conn, "401 Unauthorized", WWW_Authenticate=f'Bearer realm="{realm}"')
        reply(conn, "200 OK", body, Docker_Content_Digest=sha(body))

    hostile.answer = answer
    assert resolve_digest(f"{hostile.host}/team/app", "1") == sha(body)
    token_requests = [h for p, h in hostile.seen if p.startswith("/token")]
    assert token_requests and "Authorization" not in token_requests[0]
    assert all(SECRET not in str(h) for _, h in hostile.seen)


def test_a_refused_credential_is_named_by_its_source_never_shown(
    hostile: Hostile, home: Path
) -> None:
    docker_login(home, hostile.host)

    def answer(path: str, headers: dict[str, str], conn: socket.socket, host: str) -> None:
        if path.startswith("/token"):
            return reply(conn, "403 Forbidden")
        realm = f"http://{host}/token"
        reply(conn, "401 Unauthorized", WWW_Authenticate=f'Bearer realm="{realm}"')

    hostile.answer = answer
    with pytest.raises(EngineError, match=r"refused the credential from .*config\.json") as e:
        resolve_digest(f"{hostile.host}/team/app", "1")
    assert SECRET not in str(e.value) and base64.b64encode(SECRET.encode()).decode() not in str(
        e.value
    )
    assert "Basic" in next(h for p, h in hostile.seen if p.startswith("/token"))["Authorization"]


def test_a_credential_is_not_carried_across_a_redirect(hostile: Hostile, home: Path) -> None:
    expected = docker_login(home, hostile.host)
    body = manifest_json()

    def answer(path: str, headers: dict[str, str], conn: socket.socket, host: str) -> None:
        if path == "/elsewhere":
            return reply(conn, "200 OK", body, Docker_Content_Digest=sha(body))
        if headers.get("Authorization") != expected:
            return reply(conn, "401 Unauthorized", WWW_Authenticate='Basic realm="reg"')
        reply(conn, "302 Found", Location=f"http://localhost:{hostile.port}/elsewhere")

    hostile.answer = answer
    assert resolve_digest(f"{hostile.host}/team/app", "1") == sha(body)
    assert "Authorization" not in next(h for p, h in hostile.seen if p == "/elsewhere")


def test_bump_writes_nothing_when_the_registry_answers_no_manifest(
    hostile: Hostile, repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lock = Path("pins/k3.lock.toml")
    replace_in(lock, 'repository = "docker.io/vllm/vllm-openai"',
               f'repository = "{hostile.host}/vllm/vllm-openai"')  # fmt: skip
    before = lock.read_bytes()
    hostile.answer = lambda path, headers, conn, host: conn.sendall(b"HTTP/1.1 200 OK\r\n\r\n")
    assert main(["bump", "bases.vllm-kimi-k3", "kimi-k3", "--edit-only", "-q"]) == 3
    assert lock.read_bytes() == before
    capsys.readouterr()
    tags = json.dumps({"name": "vllm/vllm-openai", "tags": ["kimi-k3"]}).encode()
    hostile.answer = lambda path, headers, conn, host: (
        reply(conn, "200 OK", tags) if "/tags/list" in path
        else conn.sendall(b"HTTP/1.1 200 OK\r\n\r\n")
    )  # fmt: skip
    assert main(["outdated", "--no-twin", "--json", "-q"]) == 0
    pins = {p["pin"]: p for p in json.loads(capsys.readouterr().out)["pins"]}
    base = pins["bases.vllm-kimi-k3"]
    assert base["moved"] is None and not base["outdated"]  # never "the tag moved"
    assert "does not parse" in base["error"]  # an empty body: said, never hashed


@pytest.mark.parametrize("tag", ["../../../v2/_catalog", "a/b", ".hidden", "-x", "t" * 129, "x?y"])
def test_a_tag_outside_the_grammar_is_refused_before_any_request(
    hostile: Hostile, tag: str
) -> None:
    with pytest.raises(LockError, match="is neither a tag"):
        resolve_digest(f"{hostile.host}/team/app", tag)
    assert hostile.seen == []  # nothing was sent


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("registry-1.docker.io", "auth.docker.io", True),  # Docker Hub and its token realm
        ("evil.co.uk", "reg.example.co.uk", False),  # only the public suffix co.uk in common
        ("reg.example.co.uk", "auth.example.co.uk", True),
        ("a.github.io", "b.github.io", False),  # github.io is a public suffix: two tenants
        ("reg.example.com:5000", "auth.example.com:5001", False),  # another port
        ("reg.example.com:5000", "auth.example.com:5000", True),
        ("127.0.0.1:5000", "127.0.0.1:5001", False),
        ("127.0.0.1:5000", "127.0.0.1:5000", True),
        ("co.uk", "x.co.uk", False),
    ],
)
def test_one_site_is_one_registrable_domain_and_port(a: str, b: str, same: bool) -> None:
    assert same_site(a, b) is same
    assert same_site(b, a) is same


def test_a_credential_helper_that_hangs_is_cut_with_everything_it_started(
    tmp_path: Path,
) -> None:
    """The helper and the child it left holding the pipe: both gone at the deadline, and the
    read does not wait for the child."""
    pidfile = tmp_path / "child.pid"
    helper = tmp_path / "docker-credential-hang"
    helper.write_text(f"#!/bin/sh\nsleep 300 &\necho $! > {pidfile}\nsleep 300\n")
    helper.chmod(0o755)
    start = time.monotonic()
    assert ask([str(helper), "get"], b"reg.example.com", timeout=1, limit=1 << 16) is None
    assert time.monotonic() - start < 5
    child = int(pidfile.read_text())
    for _ in range(50):  # the kernel reaps it a moment later
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        with open(f"/proc/{child}/stat") as f:
            if f.read().split(") ", 1)[1].startswith("Z"):
                break  # a zombie: killed, waiting for its (reparented) parent
        time.sleep(0.1)
    else:
        pytest.fail(f"the helper's child {child} still runs")


# --- what is fetched by digest is those bytes, or nothing --------------------------------------
OTHER = "sha256:" + "1" * 64  # a digest the bytes served below never hash to


@pytest.mark.parametrize("header", ["none", "the-bytes", "the-reference"])
def test_a_manifest_fetched_by_digest_whose_bytes_are_other_is_refused(
    hostile: Hostile, header: str
) -> None:
    """A registry, a proxy or a pull-through cache that answers a digest with another manifest:
    with no Docker-Content-Digest, with one computed from the bytes it sends (consistent, but
    not what was asked for), or with the digest asked for (a lie the bytes give away). Refused
    naming the digest, through ``get_manifest`` and through publish's read of a base."""
    body = manifest_json(config={"digest": "sha256:" + "2" * 64})
    said = {"none": {}, "the-bytes": {"Docker_Content_Digest": sha(body)},
            "the-reference": {"Docker_Content_Digest": OTHER}}[header]  # fmt: skip
    hostile.answer = lambda path, headers, conn, host: reply(conn, "200 OK", body, **said)
    repository = f"{hostile.host}/team/app"
    with pytest.raises(EngineError, match=f"manifest {OTHER} with bytes that hash to {sha(body)}"):
        get_manifest(repository, OTHER)
    with pytest.raises(EngineError, match=f"manifest {OTHER} with bytes that hash to"):
        publish._base_manifest(f"{repository}:1@{OTHER}", OTHER, "linux/amd64")
    if header != "the-reference":  # by tag: no digest to compare with, the bytes are the tag's
        assert get_manifest(repository, "1")[0] == sha(body)


def test_a_blob_whose_bytes_are_other_is_refused_removed_and_never_sent_on(
    hostile: Hostile, tmp_path: Path
) -> None:
    """``read_blob`` hashes as it streams; ``copy_blob`` never uploads what did not match."""
    hostile.answer = lambda path, headers, conn, host: reply(conn, "200 OK", b"other bytes")
    into = tmp_path / "blob"
    with pytest.raises(
        EngineError, match=f"blob {OTHER} with bytes that hash to {sha(b'other bytes')}"
    ):
        read_blob(f"{hostile.host}/team/app", OTHER, into)
    assert not into.exists()
    with pytest.raises(EngineError, match=f"blob {OTHER}"):
        registry.copy_blob(f"{hostile.host}/team/app", f"{hostile.host}/team/copy", OTHER, into)
    assert not into.exists()
    assert [path for path, _ in hostile.seen] == [f"/v2/team/app/blobs/{OTHER}"] * 2  # no upload
    # The right bytes are kept.
    hostile.answer = lambda path, headers, conn, host: reply(conn, "200 OK", b"right")
    read_blob(f"{hostile.host}/team/app", sha(b"right"), into)
    assert into.read_bytes() == b"right"


@pytest.mark.parametrize("digest", ["../../../v2/_catalog", "sha256:" + "A" * 64, "md5:00", ""])
def test_a_blob_digest_outside_the_grammar_is_refused_before_any_request(
    hostile: Hostile, tmp_path: Path, digest: str
) -> None:
    for call in (
        lambda: read_blob(f"{hostile.host}/team/app", digest, tmp_path / "blob"),
        lambda: registry.blob_exists(f"{hostile.host}/team/app", digest),
        lambda: registry.mount_blob(f"{hostile.host}/team/app", digest, "team/other"),
    ):
        with pytest.raises(EngineError, match="not a sha256 digest"):
            call()
    assert hostile.seen == []


class Recording(Hostile):
    """A Hostile that reads each request's body (by Content-Length) into ``bodies``."""

    def __init__(self) -> None:
        super().__init__()
        self.bodies: dict[str, bytes] = {}

    def _record(
        self, conn: socket.socket, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> bool:
        while len(body) < int(headers.get("Content-Length", "0")):
            chunk = conn.recv(65536)
            if not chunk:
                return False
            body += chunk
        self.seen.append((f"{method} {path}", headers))
        self.bodies[f"{method} {path}"] = body
        return True


def test_a_fallback_index_with_nan_and_junk_is_published_again_without_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The sha256-<hex> tag holds others' entries: a size NaN, Infinity, 1e999, -1, 1.5 or
    "9", a digest that is a path, no mediaType, a string, a number, a duplicate. Each is
    dropped with a note naming it; the well-formed ones and ours are published, as strict
    JSON, and nothing else."""
    manifest = "application/vnd.oci.image.manifest.v1+json"

    def entry(n: str, **over: object) -> dict[str, object]:
        return {"mediaType": manifest, "digest": "sha256:" + n * 64, "size": 7, **over}

    good = [entry("a", artifactType="application/spdx+json"),
            entry("e", annotations={"org.example": "kept"})]  # fmt: skip
    junk = [entry("b", size=-1), entry("b", size=1.5), entry("b", size="9"),
            entry("b", size=True), entry("b", digest="../../x"), {"digest": "sha256:" + "b" * 64},
            entry("b", mediaType="not a type"), "junk", 42, entry("a")]  # fmt: skip
    text = json.dumps({"schemaVersion": 2, "mediaType": referrers.OCI_INDEX,
                       "manifests": [good[0], *junk, good[1]]})  # fmt: skip
    nan = ', '.join(f'{{"mediaType": "{manifest}", "digest": "sha256:{"c" * 64}", "size": {n}}}'
                    for n in ("NaN", "Infinity", "1e999"))  # fmt: skip
    held = (text[:-2] + ", " + nan + ', {"mediaType": "' + manifest + '", "digest": "sha256:'
            + "d" * 64 + '", "size": 1, "annotations": {"x": NaN}}]}').encode()  # fmt: skip
    subject = "sha256:" + "f" * 64
    tag = "sha256-" + "f" * 64
    server = Recording()
    try:

        def answer(path: str, headers: dict[str, str], conn: socket.socket, host: str) -> None:
            if server.seen[-1][0] == f"GET /v2/team/app/manifests/{tag}":
                return reply(conn, "200 OK", held, Content_Type=referrers.OCI_INDEX)
            put = server.bodies[server.seen[-1][0]]
            reply(conn, "201 Created", Docker_Content_Digest=sha(put))

        server.answer = answer
        ours = {"mediaType": manifest, "digest": "sha256:" + "9" * 64, "size": 5,
                "artifactType": "application/vnd.cyclonedx+json"}  # fmt: skip
        capsys.readouterr()
        referrers._fallback(f"{server.host}/team/app", subject, [ours], Log())
        sent = server.bodies[f"PUT /v2/team/app/manifests/{tag}"]
        index = jsontext.loads(sent, where="the index sent")  # strict: no NaN anywhere
        assert index["manifests"] == [*good, ours]
        assert [p for p, _ in server.seen] == [f"GET /v2/team/app/manifests/{tag}",
                                               f"PUT /v2/team/app/manifests/{tag}"]  # fmt: skip
        notes = [line for line in capsys.readouterr().err.splitlines() if "dropped" in line]
        assert len(notes) == len(junk) + 4, notes
        for why in ("size is NaN, not a finite number", "size is Infinity", "size is 1e999",
                    "a NaN or an infinity in it", "size -1 is out of range",
                    "size is not an integer", "digest is not a digest", "no mediaType",
                    "mediaType is not a media type", "not an object",
                    "a second entry for the same digest"):  # fmt: skip
            assert any(why in n for n in notes), (why, notes)
    finally:
        server.sock.close()


@pytest.mark.parametrize(
    "held",
    [b"not json", b"[" * 10_000 + b"]" * 10_000, b'{"mediaType": "application/vnd.oci.image.'
     b'manifest.v1+json", "config": {}, "layers": []}', b'{"manifests": {}}'],
    ids=["not-json", "deep", "a-manifest", "manifests-not-a-list"],
)  # fmt: skip
def test_a_fallback_tag_that_is_no_index_is_left_alone(hostile: Hostile, held: bytes) -> None:
    """Not ours to replace: an error naming the tag, no PUT."""
    hostile.answer = lambda path, headers, conn, host: reply(conn, "200 OK", held)
    with pytest.raises(EngineError, match=r"not JSON|nests|not an OCI index") as e:
        referrers._fallback(f"{hostile.host}/team/app", "sha256:" + "f" * 64, [], Log(quiet=True))
    assert e.value.where == f"{hostile.host}/team/app:sha256-{'f' * 64}"
    assert len(hostile.seen) == 1
