"""What an image says is installed, parsed from its own text (others' bytes: bounded): the
RFC 822 style headers packages carry (a distribution's METADATA, dpkg's status stanzas), and
the Debian packages dpkg's status calls installed. One parser for the SBOM made from an
exported ``.sqsh`` (``handoff.sbom``) and the facts verify reads through the engine
(``checks.verify``), so both list the same packages for the same image.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from k3env.quoting import one_line

DPKG_STATUS = "var/lib/dpkg/status"
STATUS_LIMIT = 64 << 20  # bytes of dpkg's status read (Debian's full archive: ~60k packages)
MAX_PACKAGES = 100_000
FIELD = 200  # characters of a name or version kept (others' text, bounded)
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+~:-]*$")


@dataclass(frozen=True, kw_only=True)
class Deb:
    name: str
    version: str
    arch: str


def field(text: str) -> str:
    """A header's value as kept: one line, ``FIELD`` characters at most."""
    return one_line(text.strip())[:FIELD]


def headers(text: str, names: Sequence[str]) -> dict[str, str]:
    """The first value of each of ``names`` among RFC 822 style headers (until a blank line)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            break
        key, sep, value = line.partition(":")
        if sep and key in names and key not in out:
            out[key] = field(value)
    return out


def debian_installed(text: str) -> list[Deb]:
    """Each package dpkg's status text says is installed, in its order (a name not of
    Debian's shape is left out; ``MAX_PACKAGES`` at most)."""
    out = []
    for block in re.split(r"\n\s*\n", text):
        s = headers(block, ("Package", "Version", "Architecture", "Status"))
        if s.get("Status", "").endswith(" installed") and NAME.match(s.get("Package", "")):
            out.append(Deb(name=s["Package"], version=s.get("Version", ""),
                           arch=s.get("Architecture", "")))  # fmt: skip
        if len(out) >= MAX_PACKAGES:
            break
    return out
