"""A squashfs others made (an ``enroot import`` on the cluster, a ``k3env export``), read
without a mount: ``unsquashfs``'s long listing says what each entry is, only regular files are
extracted (a link, device or FIFO is never created on this host) into a private directory, and
each is read through ``k3env.untrusted`` (regular files only, size limits, streamed hashing).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from k3env import untrusted
from k3env.errors import ConfigError, UntrustedFileError
from k3env.log import Log
from k3env.runner import attempt, output_or_none, require_tool, run


class Squashfs:
    """Read access to a squashfs image through unsquashfs (no mount): only its regular files,
    extracted into ``work`` (a private directory) and read through ``k3env.untrusted``."""

    def __init__(self, path: Path, log: Log, work: Path) -> None:
        self.path = path
        self.log = log
        self.work = work
        self._entries: dict[str, Entry] | None = None
        # False: a name in the listing was not read exactly (it holds a newline, or a link's
        # " -> "), so no directory is extracted whole (its odd entries could not be named).
        self.exact = True
        self._extracted = 0
        self.unsquashfs = require_tool("unsquashfs", "squashfs-tools")
        if path.is_dir():
            raise ConfigError(
                "is a directory, not a squashfs image", where=str(path), fix="pass a .sqsh file"
            )
        if not path.is_file():
            raise ConfigError("file not found", where=str(path), fix="check the path")
        code, out = attempt([self.unsquashfs, "-s", str(path)], log)
        if code != 0:
            size = path.stat().st_size
            raise ConfigError(
                f"not a squashfs image ({size} bytes; unsquashfs: "
                f"{out.strip().splitlines()[-1] if out.strip() else 'no output'})",
                where=str(path),
                fix="pass the .sqsh that `enroot import` or `k3env export` wrote",
            )

    def entries(self) -> dict[str, Entry]:
        """Every file, link, device and empty directory in the image by path (relative, no
        leading ``/``), with its type and size, from unsquashfs's long listing."""
        if self._entries is None:
            # -lln, not -llc: -llc names each entry's owner, a getpwuid() and getgrgid() per
            # entry (glibc opens /etc/passwd and /etc/group each time, or asks the cluster's
            # directory): 1.4 s of a 60,000-entry listing, 0.2 s with numeric owners. -lln
            # lists every directory too: those holding an entry are dropped below, so what
            # is kept is what -llc lists (files, links, devices, empty directories).
            out = output_or_none(
                [self.unsquashfs, "-lln", "-UTC", "-d", "", str(self.path)], self.log
            )
            if out is None:
                raise ConfigError(
                    "unsquashfs cannot list the image", where=str(self.path), fix="re-import it"
                )
            self._entries = {}
            lines = out.split(b"\n")
            if lines and _ROOT.match(os.fsdecode(lines[0])):  # the image's root, listed first
                lines = lines[1:]
            for line in lines:
                if not (m := _LISTED.match(os.fsdecode(line))):
                    self.exact = self.exact and not line  # a name holding a newline
                    continue
                path, target = m["path"], None
                if m["type"] == "l":  # a name holding " -> " is split at its first
                    self.exact = self.exact and path.count(" -> ") == 1
                    path, _, target = path.partition(" -> ")
                self._entries[path] = Entry(
                    mode=_MODES[m["type"]],
                    size=int(m["size"]) if m["size"].isdigit() else 0,
                    target=target,
                    when=m["when"],
                )
            held = {p.rpartition("/")[0] for p in self._entries}
            for path in [p for p, e in self._entries.items() if stat.S_ISDIR(e.mode)]:
                if path in held:
                    del self._entries[path]
        return self._entries

    def listing(self) -> list[str]:
        """Every path in the image (relative, no leading ``/``)."""
        return list(self.entries())

    def refusal(self, path: str) -> UntrustedFileError | None:
        """Why ``path`` is not read (it is not a regular file in the image), or None."""
        entry = self.entries().get(path.lstrip("/"))
        if entry is None or stat.S_ISREG(entry.mode):
            return None
        return untrusted.not_regular("/" + path.lstrip("/"), entry.mode, entry.target)

    def fresh(self) -> Path:
        """A new empty directory under ``work`` to extract into."""
        self._extracted += 1
        dest = self.work / f"x{self._extracted}"
        dest.mkdir()
        return dest

    def extract(self, dest: Path, paths: Iterable[str]) -> None:
        """Extract the regular files among ``paths`` under ``dest``: links, devices and FIFOs
        are never created (exact names: unsquashfs reads an extract list as globs, so ``[`` in
        a vLLM config file name is escaped). unsquashfs matches each directory's entries
        against the list's names in that directory, one by one: a directory of many wanted
        files is listed whole instead (its non-regular entries excluded by name), so the
        work stays linear in files."""
        entries = self.entries()
        regular = sorted({p for p in paths if (e := entries.get(p)) and stat.S_ISREG(e.mode)})
        if not regular:
            return
        extract, exclude = _extract_lists(entries, regular) if self.exact else (regular, [])
        listed = dest.with_name(dest.name + ".list")
        listed.write_bytes(b"".join(os.fsencode(_glob_escape(p)) + b"\n" for p in extract))
        argv = [
            self.unsquashfs,
            "-q",
            "-n",
            "-f",
            "-no-xattrs",
            "-d",
            str(dest),
            "-ef",
            str(listed),
        ]
        if exclude:
            excluded = dest.with_name(dest.name + ".exclude")
            excluded.write_bytes(b"".join(os.fsencode(_glob_escape(p)) + b"\n" for p in exclude))
            argv += ["-excf", str(excluded)]
        run([*argv, str(self.path)], self.log, capture=True, what="unsquashfs")

    def _alone(self, path: str) -> tuple[Path, str] | None:
        """``path`` extracted alone into a fresh directory: (that directory, the relative
        path), or None when the image has nothing there; a link, device or FIFO there is
        refused (UntrustedFileError)."""
        rel = path.lstrip("/")
        if refused := self.refusal(rel):
            raise refused
        if rel not in self.entries():
            return None
        dest = self.fresh()
        self.extract(dest, [rel])
        return dest, rel

    def read(self, path: str, *, limit: int = untrusted.TEXT_LIMIT) -> bytes | None:
        """The bytes of the regular file ``path``, None when the image has none there; a
        link, device or FIFO there, or a file over ``limit``, is refused (UntrustedFileError)."""
        if (found := self._alone(path)) is None:
            return None
        return untrusted.read_bytes(*found, limit=limit, shown_as="/")

    def sha256(self, path: str) -> str | None:
        """The hex sha256 of the regular file ``path`` (streamed), None when missing."""
        if (found := self._alone(path)) is None:
            return None
        got = untrusted.file_sha256(*found, shown_as="/")
        return None if got is None else got[0].hex()


@dataclass(frozen=True, kw_only=True)
class Entry:
    mode: int  # the file type bits (stat.S_IFREG, S_IFLNK, ...)
    size: int  # bytes (0 for a device)
    target: str | None  # a symlink's target as listed
    when: str = ""  # its mtime as listed (UTC, to the minute: ``2026-12-01 00:00``)


# unsquashfs -lln: `-rw-r--r-- 0/0   3 2024-01-01 00:00 /path` (a device: `1,  5` for the
# size; a link: `/path -> target`). A name with a newline breaks its line: not matched.
_LISTED = re.compile(
    r"^(?P<type>[-dlcbps])\S{9} +\S+ +(?P<size>\d+|\d+, *\d+) +(?P<when>\S+ +\S+) /(?P<path>.+)$"
)
_ROOT = re.compile(r"^d\S{9} +\S+ +\d+ +\S+ +\S+ $")  # the root directory: no path
_MODES = {
    "-": stat.S_IFREG,
    "d": stat.S_IFDIR,
    "l": stat.S_IFLNK,
    "c": stat.S_IFCHR,
    "b": stat.S_IFBLK,
    "p": stat.S_IFIFO,
    "s": stat.S_IFSOCK,
}


WHOLE_DIR = 256  # wanted files in one directory from which it is extracted whole


def _extract_lists(entries: Mapping[str, Entry], regular: list[str]) -> tuple[list[str], list[str]]:
    """What to name to unsquashfs for ``regular`` (sorted): the files, but a directory holding
    ``WHOLE_DIR`` or more of them named whole (its subtree comes along); and every entry that
    is not a regular file or directory under such a directory, to exclude. A directory whose
    subtree holds a directory of ``WHOLE_DIR`` or more such entries is never named whole:
    the exclude list would be as slow as the files."""
    wanted: dict[str, int] = {}
    for p in regular:
        parent = p.rpartition("/")[0]
        wanted[parent] = wanted.get(parent, 0) + 1
    odd: dict[str, list[str]] = {}  # directory -> its entries to exclude
    for path, e in entries.items():
        if not (stat.S_ISREG(e.mode) or stat.S_ISDIR(e.mode)):
            odd.setdefault(path.rpartition("/")[0], []).append(path)
    crowded = {d for d, names in odd.items() if len(names) >= WHOLE_DIR}

    def ancestors(path: str) -> Iterator[str]:
        while path:
            path = path.rpartition("/")[0]
            yield path

    blocked = {a for d in crowded for a in (d, *ancestors(d))}
    whole = {d for d, n in wanted.items() if n >= WHOLE_DIR and d and d not in blocked}
    if not whole:
        return regular, []

    def inside(path: str) -> bool:
        return any(a in whole for a in ancestors(path))

    extract = sorted(
        {*whole, *(p for p in regular if not inside(p))} - {d for d in whole if inside(d)}
    )
    exclude = sorted(p for names in odd.values() for p in names if inside(p))
    return extract, exclude


def _glob_escape(path: str) -> str:
    return re.sub(r"([][*?\\])", r"\\\1", path)


def installed_records(listing: list[str]) -> list[str]:
    """The RECORD of every installed distribution in the image's listing."""
    # Installed distributions live in a site directory on sys.path; a dist-info vendored
    # inside a package (setuptools/_vendor/wheel-*.dist-info) lists files never installed.
    return [
        p for p in listing if re.search(r"(^|/)(site|dist)-packages/[^/]+\.dist-info/RECORD$", p)
    ]
