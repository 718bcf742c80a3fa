"""Registry credentials, read where docker and skopeo keep them, for the registry they belong
to only.

Looked up in the order podman and skopeo use: ``$REGISTRY_AUTH_FILE``,
``$XDG_RUNTIME_DIR/containers/auth.json``, ``~/.config/containers/auth.json``, then docker's
``$DOCKER_CONFIG/config.json`` (``~/.docker/config.json``). In each file a ``credHelpers``
entry for the host wins (``docker-credential-NAME get``, the host on stdin), then an
``auths`` entry (``auth``: base64 of ``user:password``; or ``identitytoken``), then the
file's ``credsStore`` helper. Docker Hub is keyed as docker does (``https://index.docker.io/v1/``).

Every file is untrusted data: read as a regular file of bounded size, its JSON shape checked;
a malformed entry is skipped, never a traceback. A ``Credential`` never prints its secret.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from publicsuffixlist import PublicSuffixList

from k3env.errors import ConfigError
from k3env.files import read_input
from k3env.runner import ask

MAX_FILE = 1 << 20
HELPER_TIMEOUT = 20.0
DOCKER_HUB = ("registry-1.docker.io", "index.docker.io", "docker.io")
HUB_KEY = "https://index.docker.io/v1/"


@dataclass(frozen=True)
class Credential:
    """A user name and its secret (a password or an identity token) for ``host``."""

    host: str
    username: str
    secret: str = field(repr=False)
    source: str = ""  # where it was found: a file, or a helper (said in errors, never the secret)

    def basic(self) -> str:
        raw = f"{self.username}:{self.secret}".encode()
        return "Basic " + base64.b64encode(raw).decode()


def auth_files() -> list[Path]:
    """Where credentials are kept, in the order they are asked."""
    out = []
    if os.environ.get("REGISTRY_AUTH_FILE"):
        out.append(Path(os.environ["REGISTRY_AUTH_FILE"]))
    if os.environ.get("XDG_RUNTIME_DIR"):
        out.append(Path(os.environ["XDG_RUNTIME_DIR"]) / "containers/auth.json")
    home = Path(os.environ.get("HOME") or Path.home())
    out.append(home / ".config/containers/auth.json")
    docker = (
        Path(os.environ["DOCKER_CONFIG"]) if os.environ.get("DOCKER_CONFIG") else home / ".docker"
    )
    out.append(docker / "config.json")
    return out


def _keys(host: str) -> list[str]:
    """The keys an auth file may hold ``host`` under."""
    if host in DOCKER_HUB:
        return [HUB_KEY, "docker.io", "index.docker.io", "registry-1.docker.io"]
    return [host, f"https://{host}", f"http://{host}", f"https://{host}/v1/", f"https://{host}/v2/"]


def _config(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(read_input(path, limit=MAX_FILE))
    except (ConfigError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def _from_helper(name: object, host: str, source: str) -> Credential | None:
    if not isinstance(name, str) or not name.replace("-", "").replace("_", "").isalnum():
        return None  # a helper name is a program name's tail, never a path
    server = HUB_KEY if host in DOCKER_HUB else host
    out = ask([f"docker-credential-{name}", "get"], server.encode(), timeout=HELPER_TIMEOUT,
              limit=MAX_FILE)  # fmt: skip
    if out is None:
        return None
    try:
        answer = json.loads(out)
    except (ValueError, RecursionError):
        return None
    if not isinstance(answer, dict):
        return None
    user, secret = answer.get("Username"), answer.get("Secret")
    if not isinstance(user, str) or not isinstance(secret, str) or not secret:
        return None
    return Credential(host, user, secret, f"docker-credential-{name}")


def _from_auths(entry: object, host: str, source: str) -> Credential | None:
    if not isinstance(entry, dict):
        return None
    token = entry.get("identitytoken")
    if isinstance(token, str) and token:
        return Credential(host, "<token>", token, source)
    auth = entry.get("auth")
    if not isinstance(auth, str) or not auth:
        return None
    try:
        user, sep, secret = base64.b64decode(auth, validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    return Credential(host, user, secret, source) if sep and user and secret else None


def _candidates(path: Path, data: dict[str, Any], host: str) -> Iterator[Credential | None]:
    helpers, auths = data.get("credHelpers"), data.get("auths")
    for key in _keys(host):
        if isinstance(helpers, dict) and key in helpers:
            yield _from_helper(helpers[key], host, str(path))
    for key in _keys(host):
        if isinstance(auths, dict) and key in auths:
            yield _from_auths(auths[key], host, str(path))
    if data.get("credsStore"):
        yield _from_helper(data["credsStore"], host, str(path))


def lookup(host: str) -> Credential | None:
    """The credential for registry ``host``, or None (anonymous)."""
    for path in auth_files():
        data = _config(path)
        if data is None:
            continue
        for found in _candidates(path, data, host):
            if found is not None:
                return found
    return None


def _split(host: str) -> tuple[str, str]:
    """(name, port) of ``host`` (``[v6]:port`` and a bare IPv6 address kept whole)."""
    host = host.lower()
    if host.startswith("["):
        name, _, rest = host.partition("]")
        return name + "]", rest.removeprefix(":")
    if host.count(":") == 1:
        name, port = host.split(":")
        return name, port
    return host, ""


def same_site(a: str, b: str) -> bool:
    """Whether hosts ``a`` and ``b`` belong to one registry: equal, or DNS names on the same
    port under one registrable domain (the Public Suffix List's: Docker Hub's
    registry-1.docker.io and its token realm auth.docker.io share docker.io; evil.co.uk and
    reg.example.co.uk share only the public suffix co.uk, so they are two sites). Addresses
    are one site only with themselves."""
    (na, pa), (nb, pb) = _split(a), _split(b)
    if (na, pa) == (nb, pb):
        return True
    if pa != pb or any(n.replace(".", "").isdigit() or ":" in n or "[" in n for n in (na, nb)):
        return False
    ra, rb = _registrable(na), _registrable(nb)
    return ra is not None and ra == rb


def _registrable(name: str) -> str | None:
    """The registrable domain of ``name`` (one label under its public suffix), or None for a
    public suffix itself or a single label."""
    global _PSL
    if _PSL is None:
        _PSL = PublicSuffixList()
    found = _PSL.privatesuffix(name.rstrip("."))
    return found if isinstance(found, str) else None


_PSL: PublicSuffixList | None = None
