"""The shapes a value must have before it may reach a file in an image, a command line or a
tag: image references (the OCI distribution grammar), git sources, tag names, and strings
free of control characters. Checked at load time, so bad input stops with exit 2 naming the
file and key, long before a shell, git or dockerd sees it.
"""

from __future__ import annotations

import re

from k3env.errors import ConfigError

# github.com/distribution/reference grammar (reference.go): lowercase path components
# separated by "/", an optional registry host[:port] in front; tags up to 128 characters.
_ALNUM = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|[-]+)"
_COMPONENT = rf"{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?"
REPOSITORY_RE = re.compile(rf"^(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*$")
TAG_MAX = 128  # the distribution spec's tag grammar: [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}
TAG_RE = re.compile(r"^[\w][\w.-]{0,127}$")
# An OCI platform as the index names it: os/architecture[/variant].
PLATFORM_RE = re.compile(r"^linux/(amd64|arm64)(/v8)?$")
PLATFORM_FIX = 'write "linux/amd64" or "linux/arm64"'
DEFAULT_PLATFORM = "linux/amd64"


def platform_option(platform: str) -> str:
    """`` --platform P`` for a printed command line; nothing for the default platform."""
    return "" if platform == DEFAULT_PLATFORM else f" --platform {platform}"


def platform_name(os_name: str, architecture: str, variant: str | None = None) -> str:
    """``os/architecture[/variant]``, as an index names a platform and ``--platform`` takes."""
    return "/".join(p for p in (os_name, architecture, variant) if p)


# A platform's CPU architecture as `uname -m` says it, and as wheel tags name it.
MACHINES = {"linux/amd64": "x86_64", "linux/arm64": "aarch64"}
# A git tag as srt-slurm releases them (v1.0.36); a lock may declare its own pattern.
DEFAULT_RELEASE_TAG_RE = re.compile(r"^v[0-9]+(\.[0-9]+)*$")
# What a git ref name may hold and still be one safe argv word (git check-ref-format, minus
# the characters no release tag uses).
REF_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/+-]*$")
# git sources: a URL with a scheme git speaks, scp-like user@host:path, or a local path.
_GIT_URL_RE = re.compile(r"^(?:https?|ssh|git|file)://[^\s]+$")
_GIT_SCP_RE = re.compile(r"^[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:[^\s]+$")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
_CONTROL_BUT_LAYOUT_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")

REPOSITORY_FIX = (
    "use an image repository as the OCI reference grammar has it: lowercase letters, digits "
    "and . _ - separators, path components joined by /, an optional registry host[:port]/ "
    "in front (e.g. 127.0.0.1:5000/k3env/kimi-k3)"
)
TAG_FIX = "use letters, digits, '_', '.', '-' (at most 128, not starting with '.' or '-')"
GIT_FIX = (
    "use a git URL (https://, ssh://, git://, file://, or user@host:path) or a local path "
    "that does not start with '-'"
)


def control_character(value: str, *, multiline: bool = False) -> str | None:
    """The first control character in ``value`` (as ``\\xNN``), or None. ``multiline``
    allows newlines and tabs (text such as a patch anchor, never a line of a file k3env
    writes into an image)."""
    m = (_CONTROL_BUT_LAYOUT_RE if multiline else _CONTROL_RE).search(value)
    return f"\\x{ord(m.group(0)):02x}" if m else None


def is_normal_absolute_path(path: str) -> bool:
    """An absolute path below ``/`` with no empty, ``.`` or ``..`` part: it names one place
    and cannot climb out of the directory it is applied under (a patch target, a layer
    entry). One leading ``/`` only: POSIX keeps ``//`` through normpath."""
    return (
        path.startswith("/")
        and path != "/"
        and not any(part in ("", ".", "..") for part in path[1:].split("/"))
    )


def is_normal_relative_path(path: str) -> bool:
    """A path relative to the directory it is applied under (the repository root, a mirror)
    that stays inside it: not absolute, no empty, ``.`` or ``..`` part. The one check every
    path a file names goes through (a pinned file, a generated file, a mirror path)."""
    return (
        bool(path)
        and not path.startswith("/")
        and not any(part in ("", ".", "..") for part in path.split("/"))
    )


RELATIVE_PATH_FIX = (
    "write a path relative to the repository root, without '..', '.', '//' or a leading '/'"
)


def require_git_source(value: str, where: str) -> str:
    """``value`` if it is a git source (see ``is_git_source``), else a ConfigError."""
    if not is_git_source(value):
        raise ConfigError(f"{value!r} is not a git source", where=where, fix=GIT_FIX)
    return value


def is_git_source(value: str) -> bool:
    """A git URL or a local path that git cannot read as an option."""
    if not value or value.startswith("-") or control_character(value):
        return False
    if "://" in value:
        return bool(_GIT_URL_RE.match(value))
    if _GIT_SCP_RE.match(value):
        return True
    return not any(c.isspace() for c in value) and "::" not in value  # a path (no transport)
