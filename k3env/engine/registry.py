"""The registry's HTTP API (stdlib ``http.client``), the one registry client: a tag's
manifest digest, whether a manifest is still there, tags, blobs and manifests to publish.

What a registry answers is untrusted data:
- every request has a wall-clock deadline (a watchdog cuts the connection) on top of the
  socket's idle timeout, so a registry that sends a byte at a time cannot hold k3env; a
  streamed blob must keep a floor rate instead;
- bodies are bounded (a manifest 4 MiB, a tag list 16 MiB, a token 64 KiB);
- a token realm and every redirect must be http(s) under the registry scheme rule below
  (never ``file:`` or ``ftp:``, never https -> http), and a bearer token is only sent back to
  the host it was fetched for;
- a ``Docker-Content-Digest`` is checked against the sha256 of the manifest bytes received,
  and the digest k3env records is the one it computed;
- whatever is fetched by digest (a manifest, a blob) is hashed as it arrives and compared with
  that digest before anything uses it: a registry (or a proxy, a cache) that answers a digest
  with other bytes is an error naming the digest, and a blob's file is removed;
- JSON is read through ``jsontext`` (a size and a nesting cap, no NaN or infinity) and
  written through it (strict);
- JSON of the wrong shape, tags outside the OCI tag grammar, and any transport error
  (``OSError``, ``http.client`` protocol errors) are an ``EngineError`` naming the registry.

Registries that want a token (Docker Hub) say so in ``WWW-Authenticate``; an anonymous token
is fetched from the realm it names. Loopback registries are spoken to over http, every other
over https.

Why k3env's own client and not ``skopeo`` for these verbs: what they need is four requests
(HEAD/GET a manifest, list tags, the token dance), and the answers are checked here either
way; skopeo (Debian's 1.9) adds a process start of ~40 ms per call and still leaves the
digest and tag checks to the caller. Credentials are read where docker and skopeo keep them
(``credentials``), sent only to the registry's own host (and its token realm on the same
site), only over https (or loopback http), and never printed.
"""

from __future__ import annotations

import http.client
import re
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

from k3env import jsontext
from k3env.engine import credentials
from k3env.engine._http import cut
from k3env.errors import CheckFailed, EngineError, LockError
from k3env.hashing import sha256_digest, sha256_stream
from k3env.quoting import one_line

INDEX_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)
MANIFEST_TYPES = (
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
ACCEPT = ", ".join((*INDEX_TYPES, *MANIFEST_TYPES))
MAX_MANIFEST = 4 << 20
MAX_TAGS = 16 << 20
MAX_TOKEN = 1 << 16
MAX_REPLY = 1 << 20  # what a registry says back to an upload, a mount, a manifest PUT
DEADLINE = 60.0  # seconds for one request (and its token and redirects), whole
FLOOR_RATE = 64 << 10  # bytes per second a streamed blob must keep after its first DEADLINE
MAX_REDIRECTS = 5
# The OCI distribution spec's tag grammar.
TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def split_repository(repository: str) -> tuple[str, str]:
    """``docker.io/vllm/vllm-openai`` -> (``registry-1.docker.io``, ``vllm/vllm-openai``)."""
    first, _, rest = repository.partition("/")
    if not rest or ("." not in first and ":" not in first and first != "localhost"):
        return "registry-1.docker.io", repository if rest else f"library/{repository}"
    if first == "docker.io":
        return "registry-1.docker.io", rest
    return first, rest


def _loopback(host: str) -> bool:
    name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    return name in ("localhost", "127.0.0.1") or name.startswith("127.")


def _scheme(host: str) -> str:
    return "http" if _loopback(host) else "https"


def _allowed(url: str, where: str, *, plain: bool = False) -> urllib.parse.SplitResult:
    """``url`` split, if k3env may follow it: http(s) only, https for all but loopback
    hosts, no credentials or fragment in it. Else an EngineError naming ``where``."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
    except ValueError as e:
        _refuse(f"the registry sent a URL that does not parse: {url[:200]!r} ({e})", where)
    if parts.scheme not in ("http", "https") or not host:
        _refuse(f"the registry sent a {parts.scheme or 'relative'}: URL {url[:200]!r}", where)
    if parts.scheme == "http" and not plain and not _loopback(parts.netloc):
        _refuse(f"the registry sent a plain-http URL {url[:200]!r} (https only)", where)
    if parts.username or parts.password or parts.fragment:
        _refuse(f"the registry sent a URL with credentials or a fragment: {url[:200]!r}", where)
    return parts


def _refuse(message: str, where: str) -> NoReturn:
    raise EngineError(message, where=where, fix="k3env follows only http(s) URLs of the "
                      "registry's own scheme; check the registry (or its proxy)")  # fmt: skip


class _Reply:
    """One answer: status, headers (lower-case names), body (empty when streamed to a file,
    then ``streamed`` is the sha256 digest of what was written)."""

    def __init__(
        self, status: int, headers: http.client.HTTPMessage, body: bytes, streamed: str = ""
    ) -> None:
        self.status, self.headers, self.body, self.streamed = status, headers, body, streamed

    def header(self, name: str) -> str:
        return str(self.headers.get(name) or "")


def _exchange(
    url: str,
    method: str,
    headers: dict[str, str],
    *,
    limit: int,
    into: Path | None = None,
    body: bytes | Path | None = None,
    progress: Callable[[int], None] | None = None,
    deadline: float,
    plain: bool = False,
) -> _Reply:
    """One HTTP request, no redirects followed: bounded by ``deadline`` (monotonic) for the
    headers and a small body; a streamed body (``into``) must keep FLOOR_RATE after that."""
    parts = _allowed(url, url, plain=plain)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.netloc, timeout=30, blocksize=1 << 20)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    watch = _Watchdog(conn, deadline)
    try:
        _send_request(conn, method, path, headers, body, progress)
        response = conn.getresponse()
        if into is not None and response.status == 200:
            streamed = _stream(response, into, watch)
            return _Reply(response.status, response.headers, b"", streamed)
        data = response.read(limit + 1) if method != "HEAD" else b""
        if len(data) > limit:
            raise EngineError(f"the answer is over {limit} bytes", where=url,
                              fix="check the registry or mirror")  # fmt: skip
        _whole(response, len(data), method)
        return _Reply(response.status, response.headers, data)
    except (OSError, http.client.HTTPException, ValueError) as e:
        why = "no answer within the deadline" if watch.fired else f"{type(e).__name__}: {e}"
        raise EngineError(f"cannot reach the registry: {why}", where=url,
                          fix="check the network / registry") from e  # fmt: skip
    finally:
        watch.stop()
        conn.close()


def _send_request(
    conn: http.client.HTTPConnection,
    method: str,
    path: str,
    headers: dict[str, str],
    body: bytes | Path | None,
    progress: Callable[[int], None] | None,
) -> None:
    if not isinstance(body, Path):
        if body is not None or method in ("POST", "PUT"):
            headers = {**headers, "Content-Length": str(len(body or b""))}
        conn.request(method, path, body=body, headers=headers)
        return
    conn.putrequest(method, path, skip_accept_encoding=True)
    for k, v in {**headers, "Content-Length": str(body.stat().st_size)}.items():
        conn.putheader(k, v)
    conn.endheaders()
    sent = 0
    with body.open("rb") as f:
        while block := f.read(1 << 22):
            conn.send(block)
            sent += len(block)
            if progress:
                progress(sent)


def _stream(response: http.client.HTTPResponse, into: Path, watch: _Watchdog) -> str:
    """The body into the file ``into``, hashed as it is written: its sha256 digest."""
    got = 0

    def blocks() -> Iterator[bytes]:
        nonlocal got
        with into.open("wb") as f:
            while block := response.read1(1 << 20):
                f.write(block)
                got += len(block)
                watch.received(len(block))
                yield block

    digest = "sha256:" + sha256_stream(blocks()).hex()
    _whole(response, got, "GET")
    return digest


def _whole(response: http.client.HTTPResponse, got: int, method: str) -> None:
    """A body shorter than its Content-Length (the connection closed early) is an error:
    ``http.client`` hands back what arrived."""
    length = str(response.headers.get("Content-Length") or "").strip()
    if method == "HEAD" or response.status in (204, 304) or not length.isdigit():
        return
    if got < int(length):
        raise http.client.IncompleteRead(b"", int(length) - got)


class _Watchdog:
    """Cuts the connection at the deadline; while a body streams, the deadline moves on with
    each FLOOR_RATE worth of bytes received."""

    def __init__(self, conn: http.client.HTTPConnection, deadline: float) -> None:
        self.conn, self.deadline, self.fired = conn, deadline, False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._done.wait(max(0.0, min(1.0, self.deadline - time.monotonic()))):
            if time.monotonic() >= self.deadline:
                self.fired = True
                if self.conn.sock is not None:
                    cut(self.conn.sock)
                return

    def received(self, n: int) -> None:
        self.deadline = max(self.deadline, time.monotonic()) + n / FLOOR_RATE

    def stop(self) -> None:
        self._done.set()


def _request(
    url: str,
    method: str = "GET",
    *,
    headers: dict[str, str] | None = None,
    limit: int | None = None,
    into: Path | None = None,
    seconds: float | None = None,
) -> _Reply:
    """A registry GET or HEAD: redirects followed (at most MAX_REDIRECTS, each one checked;
    credentials are not carried to another host), and once more with credentials when the
    registry asks (401: a bearer token from its realm, or Basic). All within ``seconds``."""
    deadline = time.monotonic() + (DEADLINE if seconds is None else seconds)
    limit = MAX_MANIFEST if limit is None else limit
    headers = dict(headers or {})
    auth: str | None = None
    asked = False
    origin = urllib.parse.urlsplit(url).netloc
    for _ in range(MAX_REDIRECTS + 2):
        here = urllib.parse.urlsplit(url).netloc
        sent = {**headers, "Authorization": auth} if auth and here == origin else headers
        reply = _exchange(url, method, sent, limit=limit, into=into, deadline=deadline)
        if reply.status in (301, 302, 303, 307, 308) and reply.header("Location"):
            url = urllib.parse.urljoin(url, reply.header("Location"))
            _allowed(url, f"a redirect from {origin}")
            continue
        if reply.status == 401 and not asked and here == origin:
            asked = True
            auth = _authorization(reply.header("WWW-Authenticate"), origin, deadline)
            if auth:
                continue
        return reply
    raise EngineError(f"the registry redirected more than {MAX_REDIRECTS} times", where=url,
                      fix="check the registry (or its proxy)")  # fmt: skip


def _authorization(challenge: str, registry: str, deadline: float) -> str | None:
    """The Authorization header a 401's challenge asks for: a bearer token from its realm
    (with the registry's credential, if k3env finds one and the realm is on the registry's
    own site), or Basic with that credential; None when there is nothing to answer with."""
    credential = credentials.lookup(registry)
    scheme = challenge.split(" ", 1)[0].lower()
    if scheme == "basic":
        return credential.basic() if credential is not None else None
    if scheme != "bearer":
        return None
    token = _token(challenge, registry, deadline, credential)
    return f"Bearer {token}" if token else None


def _token(
    challenge: str, registry: str, deadline: float, credential: credentials.Credential | None
) -> str | None:
    """A bearer token from the realm a 401 names (http(s) only, checked); the registry's
    credential goes with it only to a realm on the registry's own site."""
    params = dict(re.findall(r'(\w+)="([^"]*)"', challenge[:4096]))
    realm = params.pop("realm", None)
    if realm is None:
        return None
    parts = _allowed(realm, f"the token realm {registry} named")
    query = "&".join(q for q in (parts.query, urllib.parse.urlencode(params)) if q)
    url = urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, query, ""))
    send = {}
    if credential is not None and credentials.same_site(parts.netloc, registry):
        send["Authorization"] = credential.basic()
    reply = _exchange(url, "GET", send, limit=MAX_TOKEN, deadline=deadline)
    if reply.status != 200:
        if credential is not None and send:
            raise EngineError(
                f"the registry's token service refused the credential from {credential.source} "
                f"(HTTP {reply.status})",
                where=registry, fix="log in again (docker login / skopeo login)",
            )  # fmt: skip
        return None
    body = _json(reply.body, dict, url)
    token = body.get("token") or body.get("access_token")
    if not isinstance(token, str) or not re.fullmatch(r"[\x21-\x7e]{1,8192}", token):
        return None  # a token that cannot go into a header as it is
    return token


def _json(data: bytes, shape: type, where: str) -> Any:
    """``data`` parsed, if it is strict JSON of ``shape`` (dict or list) within the size and
    nesting caps; else an EngineError naming ``where``."""
    fix = "check the registry (or a proxy in front of it)"
    try:
        value = jsontext.loads(data, where=where, limit=MAX_TAGS, expect=object,
                               error=EngineError, fix=fix)  # fmt: skip
    except EngineError as e:  # not JSON, a NaN, too deep: said as the registry's
        raise EngineError(f"the registry sent JSON that does not parse ({e.message})"[:300],
                          where=where, fix=fix) from e  # fmt: skip
    if not isinstance(value, shape):
        raise EngineError(f"the registry sent a JSON {type(value).__name__}, not a "
                          f"{shape.__name__}", where=where, fix=fix)  # fmt: skip
    return value


def field(doc: dict[str, Any], key: str, kind: type, where: str, default: Any = ...) -> Any:
    """``doc[key]`` of ``kind`` (``default`` when absent), or an EngineError naming ``where``."""
    return jsontext.field(doc, key, kind, where=where, default=default, error=EngineError)


def check_digest(digest: str, where: str) -> None:
    """A digest k3env puts into a URL or asks a registry for: ``sha256:<64 hex>`` only (a
    digest read from a manifest could be ``../..``: a path on the registry)."""
    if not DIGEST.fullmatch(digest):
        raise EngineError(f"not a sha256 digest: {one_line(digest)[:80]!r}", where=where,
                          fix="check the manifest that named it")  # fmt: skip


def _same_bytes(digest: str, got: str, what: str, where: str) -> None:
    """What was fetched by ``digest`` hashes to ``got``: the same, or an EngineError."""
    if got != digest:
        raise EngineError(
            f"the registry answered {what} {digest} with bytes that hash to {got}: not what "
            "was asked for, and not used",
            where=where,
            fix="do not trust this registry's answer (or the proxy or cache in front of it); "
            "fetch it from the image's own registry",
        )


def _shaped_manifest(body: bytes, content_type: str, url: str) -> None:
    """A 200 whose body is not an image manifest or index of a media type asked for (an empty
    body, a body cut short, an error page) is an error, never a digest: its sha256 would be
    written into a lock as the image."""
    value = _json(body, dict, url)
    media = value.get("mediaType") or content_type.split(";", 1)[0].strip()
    shaped = value.get("schemaVersion") == 2 and (
        (media in INDEX_TYPES and isinstance(value.get("manifests"), list))
        or (media in MANIFEST_TYPES and isinstance(value.get("config"), dict)
            and isinstance(value.get("layers"), list))
    )  # fmt: skip
    if not shaped:
        raise EngineError(
            f"the registry's answer ({len(body)} bytes, media type {str(media)[:80]!r}) is not "
            "an image manifest or index of a type asked for",
            where=url,
            fix="check the registry (or a proxy in front of it): nothing was recorded",
        )


def _manifest(
    repository: str, reference: str, method: str, *, shaped: bool = True
) -> tuple[str, bytes]:
    """A manifest by tag or digest: its digest and (for GET) its body. For GET the digest is
    the sha256 of the bytes received (by digest: that digest; the registry's
    ``Docker-Content-Digest`` must agree), and the body strict JSON of a manifest's or an
    index's shape unless ``shaped`` is False (the caller reads it); a HEAD's header is taken
    only in the digest grammar."""
    if not (TAG.fullmatch(reference) or DIGEST.fullmatch(reference)):
        # Checked before any request: a "tag" like ../../../v2/_catalog is a path on the
        # registry, never sent.
        raise LockError(
            f"{one_line(reference)[:140]!r} is neither a tag (the OCI grammar: letters, digits, "
            "_ . -, at most 128, not starting with . or -) nor a sha256 digest",
            where=f"{repository}:{one_line(reference)[:140]}",
            fix="name the tag as the registry lists it (skopeo list-tags docker://REPOSITORY)",
        )
    host, repo = split_repository(repository)
    url = f"{_scheme(host)}://{host}/v2/{repo}/manifests/{reference}"
    reply = _request(url, method, headers={"Accept": ACCEPT})
    if reply.status in (401, 404):
        raise LockError(
            f"tag {reference!r} not found in {repository} (HTTP {reply.status})",
            where=f"{repository}:{reference}",
            fix="check the tag (skopeo list-tags docker://REPOSITORY)",
        )
    if reply.status != 200:
        raise EngineError(f"registry error {reply.status}", where=url, fix="try again")
    said = reply.header("Docker-Content-Digest")
    if method == "GET":
        digest = sha256_digest(reply.body)
        if DIGEST.fullmatch(reference):  # fetched by digest: the bytes must be those
            _same_bytes(reference, digest, "manifest", url)
        if said and said != digest:
            raise EngineError(
                f"the registry says manifest {reference} is {said[:80]}, but its bytes hash "
                f"to {digest}", where=url, fix="do not trust this registry's answer",
            )  # fmt: skip
        if shaped:
            _shaped_manifest(reply.body, reply.header("Content-Type"), url)
        return digest, reply.body
    if not DIGEST.fullmatch(said):
        raise EngineError(f"the registry sent no valid Docker-Content-Digest ({said[:80]!r})",
                          where=url, fix="check the registry")  # fmt: skip
    if reference.startswith("sha256:") and said != reference:
        raise EngineError(f"the registry answered {reference} with {said}", where=url,
                          fix="do not trust this registry's answer")  # fmt: skip
    return said, b""


def resolve_digest(repository: str, tag: str) -> str:
    """The manifest digest a registry serves for ``repository:tag`` now: the sha256 of the
    manifest bytes it sends (its ``Docker-Content-Digest`` must agree), never the header
    alone, since this digest is written into the lock."""
    return _manifest(repository, tag, "GET")[0]


def tagged_config(repository: str, tag: str) -> str | None:
    """The config digest (the image ID) that ``repository:tag`` names in its registry now,
    or ``None`` when the tag does not exist there. Lets a push refuse to move a tag."""
    try:
        _digest, body = _manifest(repository, tag, "GET")
    except LockError:
        return None  # 404: no such tag
    where = f"{repository}:{tag}"
    config = field(_json(body, dict, where), "config", dict, where, default={})
    digest = field(config, "digest", str, where, default=None)
    return digest if isinstance(digest, str) and DIGEST.fullmatch(digest) else None


def enroot_probe(repository: str, digest: str) -> int:
    """The status enroot's permission probe gets for ``repository@digest``: enroot (4.1.2
    src/docker.sh ``docker::_authenticate``) sends a HEAD of the manifest with no Accept
    header and takes 200 or a 401 challenge; anything else ends its import there."""
    if not DIGEST.fullmatch(digest):
        raise LockError(f"{one_line(digest)[:80]!r} is not a digest", where=repository,
                        fix="probe a manifest digest")  # fmt: skip
    host, repo = split_repository(repository)
    url = f"{_scheme(host)}://{host}/v2/{repo}/manifests/{digest}"
    reply = _exchange(url, "HEAD", {}, limit=MAX_MANIFEST, into=None, deadline=_deadline())
    return reply.status


def manifest_exists(repository: str, digest: str) -> bool:
    """Whether the registry still serves ``repository@digest`` (a registry can be wiped)."""
    try:
        return _manifest(repository, digest, "HEAD")[0] == digest
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
    """The tags a registry has for ``repository`` (``GET /v2/<repo>/tags/list``), only those
    in the OCI tag grammar (a name with whitespace or a newline is no version to offer)."""
    host, repo = split_repository(repository)
    url = f"{_scheme(host)}://{host}/v2/{repo}/tags/list?n=10000"
    reply = _request(url, limit=MAX_TAGS)
    if reply.status != 200:
        raise EngineError(
            f"cannot list tags (HTTP {reply.status})", where=url, fix="check the repository"
        )
    tags = _json(reply.body, dict, url).get("tags") or []
    if not isinstance(tags, list):
        raise EngineError("the registry's tags are not a list", where=url,
                          fix="check the registry")  # fmt: skip
    return [t for t in tags if isinstance(t, str) and TAG.fullmatch(t)]


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
    """One publishing request: (status, headers, body). A file body is streamed in 4 MiB
    blocks (``progress`` gets the bytes sent so far), its deadline grown by its size at
    FLOOR_RATE. A registry that asks for credentials (401) is answered once, as ``_request``
    does, with the credential k3env finds for it (else the 401 stands)."""
    size = body.stat().st_size if isinstance(body, Path) else 0
    deadline = time.monotonic() + _deadline() + size / FLOOR_RATE
    headers = dict(headers or {})
    reply = _exchange(url, method, headers, limit=MAX_REPLY, body=body, progress=progress,
                      deadline=deadline)  # fmt: skip
    if reply.status == 401:
        origin = urllib.parse.urlsplit(url).netloc
        auth = _authorization(reply.header("WWW-Authenticate"), origin, deadline)
        if auth:
            reply = _exchange(url, method, {**headers, "Authorization": auth}, limit=MAX_REPLY,
                              body=body, progress=progress, deadline=deadline)  # fmt: skip
    return reply.status, reply.headers, reply.body


def _deadline() -> float:
    return DEADLINE


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
    check_digest(digest, repository)
    base, repo = _base_url(repository)
    status, _h, _b = _send("HEAD", f"{base}/v2/{repo}/blobs/{digest}")
    return status == 200


def _location(url: str, headers: Any) -> str | None:
    """The upload URL a registry gave, resolved against ``url`` and checked."""
    location = headers.get("Location")
    if not location:
        return None
    target = urllib.parse.urljoin(url, str(location))
    _allowed(target, f"the upload location {url} gave")
    return target


def mount_blob(repository: str, digest: str, source: str) -> bool:
    """Ask the registry to link ``digest`` from ``source`` (a repository on the same host)
    into ``repository`` without sending it; whether it did."""
    check_digest(digest, repository)
    base, repo = _base_url(repository)
    _src_host, src_repo = split_repository(source)
    query = urllib.parse.urlencode({"mount": digest, "from": src_repo})
    url = f"{base}/v2/{repo}/blobs/uploads/?{query}"
    status, headers, data = _send("POST", url)
    if status == 201:
        return True
    if status == 202:  # the registry opened an upload instead: close it, send the bytes
        location = _location(url, headers)
        if location:
            _send("DELETE", location)
        return False
    raise _refused(status, data, f"a mount of {digest[:19]}", url)


def put_blob(
    repository: str, digest: str, source: Path, progress: Callable[[int], None] | None = None
) -> None:
    """Upload ``source`` as ``digest`` (one monolithic PUT); the registry checks the digest."""
    check_digest(digest, repository)
    base, repo = _base_url(repository)
    url = f"{base}/v2/{repo}/blobs/uploads/"
    status, headers, data = _send("POST", url)
    target = _location(url, headers)
    if status != 202 or not target:
        raise _refused(status, data, "an upload", url)
    target += ("&" if "?" in target else "?") + urllib.parse.urlencode({"digest": digest})
    status, _headers, data = _send(
        "PUT", target, headers={"Content-Type": "application/octet-stream"}, body=source,
        progress=progress,
    )  # fmt: skip
    if status != 201:
        raise _refused(status, data, f"blob {digest[:19]}", url)


def read_blob(repository: str, digest: str, into: Path) -> None:
    """A blob of ``repository`` into the file ``into`` (streamed, at FLOOR_RATE or better;
    an anonymous token when the registry asks for one), hashed as it arrives: bytes that are
    not ``digest`` are an EngineError, and ``into`` is removed."""
    check_digest(digest, repository)
    base, repo = _base_url(repository)
    url = f"{base}/v2/{repo}/blobs/{digest}"
    try:
        reply = _request(url, into=into)
        if reply.status != 200:
            raise EngineError(
                f"cannot read blob {digest[:19]} of {repository} (HTTP {reply.status})",
                where=url, fix="check that the image is still in its registry",
            )  # fmt: skip
        _same_bytes(digest, reply.streamed, "blob", url)
    except BaseException:
        into.unlink(missing_ok=True)  # nothing half-read or of other bytes is left to use
        raise


def copy_blob(source: str, repository: str, digest: str, into: Path) -> None:
    """A blob of another registry, through ``into`` (a file), into ``repository``."""
    read_blob(source, digest, into)
    put_blob(repository, digest, into)


def get_manifest(repository: str, reference: str) -> tuple[str, str, bytes]:
    """(digest, media type, body) of a manifest or index, by tag or digest."""
    digest, body = _manifest(repository, reference, "GET")
    where = f"{repository}@{reference}"
    media_type = field(_json(body, dict, where), "mediaType", str, where, default="")
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
            f"the registry stored manifest {reference} as {digest[:80]}, not {expected}",
            where=url, fix="the registry rewrote the manifest: use another registry",
        )  # fmt: skip
    return expected


def referrers(repository: str, digest: str) -> bytes | None:
    """The OCI referrers index of manifest ``digest`` (distribution spec 1.1), or None when
    the registry has no referrers API (then clients read the ``sha256-<hex>`` tag)."""
    if not DIGEST.fullmatch(digest):
        raise EngineError(f"not a sha256 digest: {one_line(digest)[:80]!r}", where=repository,
                          fix="name the manifest by its digest")  # fmt: skip
    base, repo = _base_url(repository)
    url = f"{base}/v2/{repo}/referrers/{digest}"
    reply = _request(url, headers={"Accept": INDEX_TYPES[0]})
    if reply.status == 200 and reply.header("Content-Type").startswith(INDEX_TYPES[0]):
        _json(reply.body, dict, url)
        return reply.body
    if reply.status in (200, 404, 405):  # 200 of another type: a catch-all, not the API
        return None
    raise EngineError(f"registry error {reply.status} asking for referrers", where=url,
                      fix="check the registry")  # fmt: skip


def tagged_index(repository: str, tag: str) -> bytes | None:
    """The bytes a tag names (meant to be an OCI index), or None when there is no such tag.
    Not parsed here: the caller reads them entry by entry (a referrers fallback index is a
    list others append to, and one malformed entry is dropped, not the whole list)."""
    try:
        return _manifest(repository, tag, "GET", shaped=False)[1]
    except LockError:  # 404
        return None


def download(url: str, *, limit: int, timeout: float = 60) -> bytes:
    """One file over HTTP(S) from a mirror (a Debian pool file), at most ``limit`` bytes: a
    longer answer is refused, never truncated into something that might hash right. Plain
    http is taken here (Debian's mirrors speak it): the caller checks the bytes' sha256."""
    deadline = time.monotonic() + timeout + limit / FLOOR_RATE
    for _ in range(MAX_REDIRECTS + 1):
        reply = _exchange(url, "GET", {}, limit=limit, deadline=deadline, plain=True)
        if reply.status in (301, 302, 303, 307, 308) and reply.header("Location"):
            url = urllib.parse.urljoin(url, reply.header("Location"))
            continue
        if reply.status != 200:
            raise EngineError(f"cannot fetch {url}: HTTP {reply.status}", where=url,
                              fix="check the mirror")  # fmt: skip
        return reply.body
    raise EngineError(f"{url} redirected more than {MAX_REDIRECTS} times", where=url,
                      fix="check the mirror")  # fmt: skip
