"""Check any squashfs, an ``enroot import`` made on the cluster or a ``k3env export``, against
what the image itself carries, then against the lock and spec in this checkout.

Against the image: its provenance file (in k3env's layer, its sha256 in the config's labels),
every file of k3env's layer, every installed Python distribution's files against its own
``RECORD``, each /etc/environment line and the /etc/rc script enroot derives from the config
(rendered by ``enroot``). Against this checkout: the lock and spec the image was built from,
its env, and each container patch it applied still present. The squashfs is read through
``unsquashfs`` (no mount): its long listing says what each entry is, only regular files are
extracted (a link, device or FIFO is never created on this host), and each is read through
``k3env.untrusted`` (regular files only, size limits, streamed hashing). An entry that is not
a regular file where the check reads one is a failure naming it and what it is.
"""

from __future__ import annotations

import csv
import io
import os
import re
import stat
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from k3env import jsontext, untrusted
from k3env.config.patchfile import load_patch_file
from k3env.config.pinned_files import verify_patch_file
from k3env.config.pins import Lock
from k3env.config.spec import ImageSpec
from k3env.errors import CheckFailed, ConfigError, UntrustedFileError
from k3env.handoff.enroot import enroot_files
from k3env.hashing import digest_hex, record_b64, sha256_digest
from k3env.image.build import PROVENANCE_LABEL, PROVENANCE_PATH, RUNTIME_KEYS
from k3env.image.envpolicy import merged_env
from k3env.image.patches import ALREADY_PRESENT, APPLIED, missing_edits
from k3env.log import Log
from k3env.quoting import one_line
from k3env.runner import attempt, output_or_none, require_tool, run
from k3env.verdict import FAILED, NOT_CHECKED, PASSED, Gate, ok


# --- check a squashfs ---------------------------------------------------------------------------
def _item(*, what: str, ok: bool, detail: str) -> Gate:
    """One check of the squashfs, as a gate: passed with its evidence, or failed."""
    return Gate(name=what, status=PASSED if ok else FAILED, detail=detail)


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


PROVENANCE_LIMIT = 16 << 20  # k3env writes KiB (its layer's files by sha256, the wheels)
PROVENANCE_DEPTH = 16  # k3env's nests 4 deep (components.wheels[].name)
PROVENANCE_FIX = "re-export or re-import the image from the registry digest"


@dataclass(frozen=True, kw_only=True)
class Pinned:
    """A file the image was built from, by path and sha256 (its lock, its spec)."""

    path: str | None
    sha256: str | None


@dataclass(frozen=True, kw_only=True)
class BaseImage:
    pin: str | None
    name: str | None
    digest: str | None


@dataclass(frozen=True, kw_only=True)
class Wheel:
    """A pinned wheel baked into the image's components layer."""

    name: str
    version: str
    sha256: str


@dataclass(frozen=True, kw_only=True)
class AppliedPatch:
    name: str
    status: str
    target: str | None
    sha256: str | None


@dataclass(frozen=True, kw_only=True)
class Provenance:
    """An image's provenance file, read within its budgets and every field's type checked
    (``read_provenance``): what the SBOM, the in-toto statement and the image checks use.
    ``doc`` is the whole document, its shape checked, for the checks that compare its config
    and files with the image's."""

    raw: bytes
    sha256: str  # hex, of ``raw``
    image: str | None
    inputs: str | None
    lock: Pinned | None
    spec: Pinned | None
    base: BaseImage | None
    pins: tuple[tuple[str, str], ...]  # pin -> identity, sorted by pin
    wheels: tuple[Wheel, ...]
    patches: tuple[AppliedPatch, ...]
    doc: Mapping[str, Any]


def provenance_of(doc: Mapping[str, Any], raw: bytes = b"") -> Provenance:
    """``doc`` as typed fields, each field's type checked first (``_misshapen``); one of
    another type than k3env writes is a ConfigError naming it, never a traceback later."""
    if wrong := _misshapen(doc, config=False):
        raise ConfigError(f"{PROVENANCE_PATH} is not valid provenance ({wrong})",
                          fix=PROVENANCE_FIX)  # fmt: skip

    def pinned(value: Any) -> Pinned | None:
        return None if value is None else Pinned(path=value.get("path"), sha256=value.get("sha256"))

    base = doc.get("base")
    components = doc.get("components") or {}
    return Provenance(
        raw=raw,
        sha256=digest_hex(sha256_digest(raw)),
        image=doc.get("image"),
        inputs=doc.get("inputs"),
        lock=pinned(doc.get("lock")),
        spec=pinned(doc.get("spec")),
        base=None if base is None else BaseImage(pin=base.get("pin"), name=base.get("name"),
                                                 digest=base.get("digest")),
        pins=tuple(sorted((doc.get("pins") or {}).items())),
        wheels=tuple(Wheel(name=w["name"], version=w["version"], sha256=w["sha256"])
                     for w in components.get("wheels") or []),
        patches=tuple(AppliedPatch(name=p["name"], status=p["status"], target=p.get("target"),
                                   sha256=p.get("sha256")) for p in doc.get("patches") or []),
        doc=doc,
    )  # fmt: skip


def read_provenance(fs: Squashfs) -> Provenance:
    """The image's provenance file, typed (``Provenance``); a file over its budgets or not of
    the shape k3env writes is a ConfigError naming the field."""
    doc, raw = _provenance(fs)
    return provenance_of(doc, raw)


def _provenance(fs: Squashfs) -> tuple[dict[str, Any], bytes]:
    """The image's provenance document (read within its budgets, its shape checked) and its
    bytes."""
    try:
        raw = fs.read(PROVENANCE_PATH, limit=PROVENANCE_LIMIT)
    except UntrustedFileError as e:
        raise UntrustedFileError(e.message, where=str(fs.path), fix=e.fix) from e
    if raw is None:
        raise ConfigError(
            f"{PROVENANCE_PATH} is not in the image: it was not built by k3env (or its layer "
            "was removed)",
            where=str(fs.path),
            fix="check an image that `k3env build` made (import it by the digest k3env push "
            "printed)",
        )
    doc: dict[str, Any] = {}
    try:
        doc = jsontext.loads(raw, where=PROVENANCE_PATH, limit=PROVENANCE_LIMIT,
                             max_depth=PROVENANCE_DEPTH, error=ConfigError)  # fmt: skip
        wrong = _misshapen(doc)
    except ConfigError as e:
        wrong = e.message
    if wrong:
        raise ConfigError(
            f"{PROVENANCE_PATH} is not valid provenance ({wrong}): the image was altered, or "
            "built by an older k3env",
            where=str(fs.path),
            fix=PROVENANCE_FIX,
        )
    return doc, raw


def _is_strs(value: Any, container: type) -> bool:
    if container is list:
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    )


def _fields(value: Any, **kinds: Any) -> bool:
    """Whether ``value`` is an object whose keys ``kinds`` names are of those types (a key
    missing counts as None)."""
    return isinstance(value, dict) and all(isinstance(value.get(k), t) for k, t in kinds.items())


def _misshapen(doc: Mapping[str, Any], *, config: bool = True) -> str | None:
    """The first field of a provenance document whose type is not the one k3env writes (the
    file is the image's, so untrusted: a check must say so, not fail on it), else None.
    ``config``: its config too (what the image checks compare), else the typed fields."""
    fields: list[tuple[str, Any, bool]] = []
    if config:
        if not isinstance(doc.get("config"), dict):
            return (f"its config is {_shown(doc.get('config'))}: not a k3env provenance "
                    "document of this format")  # fmt: skip
        fields += _config_fields(doc["config"])
    opt = str | None
    components = doc.get("components")
    fields += [
        ("files", doc.get("files"), doc.get("files") is None or _is_strs(doc.get("files"), dict)),
        ("image", doc.get("image"), isinstance(doc.get("image"), opt)),
        ("inputs", doc.get("inputs"), isinstance(doc.get("inputs"), opt)),
        ("patches", doc.get("patches"), isinstance(doc.get("patches"), list | None) and all(
            _fields(p, name=str, status=str, target=opt, sha256=opt)
            for p in doc.get("patches") or [])),
        ("pins", doc.get("pins"), doc.get("pins") is None or _is_strs(doc.get("pins"), dict)),
        ("components", components, components is None or _fields(components, wheels=list | None)),
    ]  # fmt: skip
    if isinstance(components, dict):
        wheels = components.get("wheels") or []
        fields.append(("components.wheels", wheels, all(
            _fields(w, name=str, version=str, sha256=str) for w in wheels)))  # fmt: skip
    for key, inner in (("lock", ("path", "sha256")), ("spec", ("path", "sha256")),
                       ("base", ("pin", "name", "digest"))):  # fmt: skip
        value = doc.get(key)
        fits = value is None or _fields(value, **dict.fromkeys(inner, opt))
        fields.append((key, value, fits))
    for name, value, fits in fields:
        if not fits:
            return f"its {name} is {_shown(value)}, not as k3env writes it"
    return None


def _config_fields(config: Mapping[str, Any]) -> list[tuple[str, Any, bool]]:
    def strs(key: str, container: type) -> tuple[str, Any, bool]:
        value = config.get(key)
        return f"config.{key}", value, value is None or _is_strs(value, container)

    return [
        strs("Env", list), strs("Labels", dict), strs("Entrypoint", list), strs("Cmd", list),
        ("config.WorkingDir", config.get("WorkingDir"),
         isinstance(config.get("WorkingDir"), str | None)),
        ("config.Volumes", config.get("Volumes"), isinstance(config.get("Volumes"), dict | None)),
    ]  # fmt: skip


def _shown(value: Any) -> str:
    """``value`` named for a message: its JSON type and its first characters."""
    if value is None:
        return "null"
    kind = {dict: "object", list: "array", str: "string", bool: "boolean",
            int: "number", float: "number"}.get(type(value), type(value).__name__)  # fmt: skip
    return f"a JSON {kind} {one_line(jsontext.dumps(value, default=str)[:60])}"


def _lines_diff(what: str, expected: list[str], actual: list[str]) -> list[Gate]:
    if expected == actual:
        return [_item(what=what, ok=True, detail=f"{len(actual)} line(s) as the config says")]
    items = []
    exp_keys = {line.split("=", 1)[0]: line for line in expected}
    act_keys = {line.split("=", 1)[0]: line for line in actual}
    for key, line in act_keys.items():
        if key not in exp_keys:
            items.append(_item(what=what, ok=False, detail=f"extra line {line!r}"))
        elif exp_keys[key] != line:
            items.append(
                _item(
                    what=what,
                    ok=False,
                    detail=f"changed: {line!r} (image config: {exp_keys[key]!r})",
                )
            )
    for key, line in exp_keys.items():
        if key not in act_keys:
            items.append(_item(what=what, ok=False, detail=f"missing line {line!r}"))
    if not items:
        items.append(_item(what=what, ok=False, detail="lines reordered or repeated"))
    return items


def _short(match: re.Match[bytes] | None) -> str:
    return match.group(1).decode()[:16] if match else "absent"


# enroot >= 4.2 (NVIDIA/enroot main since 8ea147d; doc/image-format.md) writes the URI it
# imported from as /etc/rc's first line, "# enroot-provenance: <uri>", before the labels, and
# a blank line after them even when there are none. A comment: it runs nothing, and says where
# the file came from, not what the image is.
_ENROOT_PROVENANCE = re.compile(r"# enroot-provenance: ([^\n]{0,4096})\n")


def _rc_items(expected: str, actual: bytes | None) -> list[Gate]:
    if actual is None:
        return [_item(what="etc/rc", ok=False, detail="missing")]
    text = actual.decode(errors="replace")
    if text == expected:
        return [_item(what="etc/rc", ok=True, detail="labels and command as the config says")]
    if (m := _ENROOT_PROVENANCE.match(text)) and text[m.end() :] in (expected, "\n" + expected):
        uri = one_line(m.group(1))[:200]
        return [_item(what="etc/rc", ok=True, detail="labels and command as the config says, "
                      f"after the line enroot >= 4.2 adds: enroot-provenance {uri}")]  # fmt: skip
    exp, act = expected.splitlines(), text.splitlines()
    items = [
        _item(what="etc/rc", ok=False, detail=f"unexpected line {line!r}")
        for line in act
        if line not in exp
    ]
    items += [
        _item(what="etc/rc", ok=False, detail=f"missing line {line!r}")
        for line in exp
        if line not in act
    ]
    return items or [_item(what="etc/rc", ok=False, detail="lines reordered")]


def _read(fs: Squashfs, path: str) -> tuple[bytes | None, str | None]:
    """(the bytes of ``path`` or None when missing, why it was refused or None)."""
    try:
        return fs.read(path), None
    except UntrustedFileError as e:
        return None, e.message


def _record_items(fs: Squashfs, listing: list[str], patched: set[str], log: Log) -> list[Gate]:
    """Every installed distribution's files against the sha256 in its own RECORD; files
    k3env's layer replaced (patched) are checked against the provenance instead."""
    records = _installed_records(listing)
    if not records:
        return [_item(what="python", ok=True, detail="no installed distributions")]
    refused = {r: e for r in records if (e := fs.refusal(r))}
    dest = fs.fresh()
    fs.extract(dest, [r for r in records if r not in refused])
    wanted, unread = _recorded_files(dest, [r for r in records if r not in refused], patched)
    unread.update((r.rsplit("/", 2)[1].removesuffix(".dist-info"), e.message)
                  for r, e in refused.items())  # fmt: skip
    with log.step(f"read {len(wanted)} file(s) of {len(records)} distribution(s)"):
        fs.extract(dest, sorted({w.path for w in wanted}))
    bad = _record_differences(fs, dest, wanted)
    for dist, why in sorted(unread):
        bad.setdefault(dist, []).insert(0, why)
    return _record_verdict(bad, len(wanted), len(records))


def _installed_records(listing: list[str]) -> list[str]:
    """The RECORD of every installed distribution in the image's listing."""
    # Installed distributions live in a site directory on sys.path; a dist-info vendored
    # inside a package (setuptools/_vendor/wheel-*.dist-info) lists files never installed.
    return [
        p for p in listing if re.search(r"(^|/)(site|dist)-packages/[^/]+\.dist-info/RECORD$", p)
    ]


@dataclass(frozen=True, kw_only=True)
class Recorded:
    dist: str
    path: str  # relative to the image's root
    sha256: str  # as RECORD writes it (urlsafe base64, no padding)
    size: int | None  # as RECORD gives it


def _recorded_files(
    dest: Path, records: list[str], patched: set[str]
) -> tuple[list[Recorded], set[tuple[str, str]]]:
    """Each file the extracted RECORDs under ``dest`` list with a sha256, but those k3env's
    layer replaced; and (distribution, why) for each RECORD that could not be read."""
    wanted: list[Recorded] = []
    unread: set[tuple[str, str]] = set()
    for record in records:
        site = record.rsplit("/", 2)[0]
        dist = record.rsplit("/", 2)[1].removesuffix(".dist-info")
        try:
            text = untrusted.read_text(dest, record, shown_as="/")
        except UntrustedFileError as e:
            unread.add((dist, e.message))
            continue
        for row in csv.reader(io.StringIO(text or "")):
            if len(row) >= 2 and row[1].startswith("sha256="):
                rel = os.path.normpath(os.path.join(site, row[0]))
                if rel not in patched:
                    size = row[2] if len(row) > 2 else ""
                    wanted.append(
                        Recorded(
                            dist=dist,
                            path=rel,
                            sha256=row[1].removeprefix("sha256=").rstrip("="),
                            size=int(size) if size.isdigit() and len(size) < 20 else None,
                        )
                    )
    return wanted, unread


def _record_differences(fs: Squashfs, dest: Path, wanted: list[Recorded]) -> dict[str, list[str]]:
    """Per distribution, each of its extracted files missing, not a regular file, or unlike
    its RECORD (its size first: a file of another size is not read)."""
    entries = fs.entries()
    problems: list[str | None] = []  # per wanted file, what its listing already shows
    for w in wanted:
        entry = entries.get(w.path)
        if entry is None:
            problems.append(f"/{one_line(w.path)} is missing")
        elif refused := fs.refusal(w.path):
            problems.append(refused.message)
        elif w.size is not None and entry.size != w.size:
            problems.append(
                f"/{one_line(w.path)} differs from its RECORD: {entry.size} bytes, RECORD {w.size}"
            )
        else:
            problems.append(None)
    to_hash = sorted({w.path for w, p in zip(wanted, problems, strict=True) if p is None})
    hashed = dict(untrusted.files_sha256(dest, to_hash, shown_as="/"))
    bad: dict[str, list[str]] = {}
    for w, problem in zip(wanted, problems, strict=True):
        if problem is None:
            got = hashed[w.path]
            if isinstance(got, UntrustedFileError):
                problem = got.message
            elif got is None:
                problem = f"/{one_line(w.path)} is missing"
            elif record_b64(got[0]) != w.sha256:
                problem = f"/{one_line(w.path)} differs from its RECORD sha256"
        if problem:
            bad.setdefault(w.dist, []).append(problem)
    return bad


def _record_verdict(bad: Mapping[str, list[str]], files: int, records: int) -> list[Gate]:
    items = [
        _item(
            what=f"python {dist}",
            ok=False,
            detail="; ".join(problems[:5])
            + (f"; and {len(problems) - 5} more" if len(problems) > 5 else ""),
        )
        for dist, problems in sorted(bad.items())
    ]
    if not bad:
        items.append(
            _item(
                what="python",
                ok=True,
                detail=f"{files} file(s) of {records} distribution(s) match their RECORD",
            )
        )
    return items


def check_squashfs(sqsh: Path, lock: Lock, specs: Mapping[str, ImageSpec], log: Log) -> list[Gate]:
    """Every difference between ``sqsh`` and what its image and this lock say it holds:
    first against the image (its provenance, /etc/rc, /etc/environment, k3env's files, every
    RECORD), then against this checkout (lock, spec, env, patches)."""
    with tempfile.TemporaryDirectory(prefix="k3env-check-") as work:
        return check_image(Squashfs(sqsh, log, Path(work)), lock, specs, log)


def check_image(fs: Squashfs, lock: Lock, specs: Mapping[str, ImageSpec], log: Log) -> list[Gate]:
    """``check_squashfs`` of an image already open (its listing read once, shared)."""
    prov, raw = _provenance(fs)
    config = prov["config"]
    # The provenance file against its hash in the image's labels (/etc/rc carries them).
    digest = digest_hex(sha256_digest(raw))
    try:
        expected_rc = _expected_rc(config, digest)
    except ConfigError as e:
        return [_item(what="config", ok=False, detail=e.message)]
    rc, rc_refused = _read(fs, "etc/rc")
    items = [_provenance_item(rc, digest)]
    items += (
        [_item(what="etc/rc", ok=False, detail=rc_refused)]
        if rc_refused
        else _rc_items(expected_rc, rc)
    )
    env, env_refused = _read(fs, "etc/environment")
    env_actual = (env or b"").decode(errors="replace").splitlines()
    items += (
        [_item(what="etc/environment", ok=False, detail=env_refused)]
        if env_refused
        else _lines_diff("etc/environment", list(config.get("Env") or []), env_actual)
    )
    items += _file_items(fs, prov.get("files") or {})
    patched = {p.lstrip("/") for p in prov.get("files") or {}}
    items += _record_items(fs, fs.listing(), patched, log)
    return items + _checkout_items(fs, prov, lock, specs, set(env_actual))


def _expected_rc(config: Mapping[str, Any], digest: str) -> str:
    """The /etc/rc enroot writes for the image's config, the provenance label its ``digest``
    (raises ConfigError for a config enroot would split into injected lines)."""
    labels = dict(config.get("Labels") or {})
    labels[PROVENANCE_LABEL] = digest
    runtime = {k: config.get(k) for k in RUNTIME_KEYS}
    runtime["Labels"] = dict(sorted(labels.items()))
    expected = {p: data for p, data, _ in enroot_files(runtime)}
    return expected["etc/rc"].decode()


def _provenance_item(rc: bytes | None, digest: str) -> Gate:
    carried = re.search(
        rb"^# " + re.escape(PROVENANCE_LABEL.encode()) + rb" ([0-9a-f]{64})$", rc or b"", re.M
    )
    ok = carried is not None and carried.group(1).decode() == digest
    return _item(
        what="provenance",
        ok=ok,
        detail=f"{PROVENANCE_PATH} has the sha256 the image's config names"
        if ok
        else f"{PROVENANCE_PATH} sha256 {digest[:16]} differs from the image "
        f"config's {PROVENANCE_LABEL} ({_short(carried)})",
    )


def _file_items(fs: Squashfs, files: Mapping[str, str]) -> list[Gate]:
    """Every file of k3env's layer, by sha256."""
    items = []
    for path, sha in sorted(files.items()):
        try:
            got = fs.sha256(path)
        except UntrustedFileError as e:
            items.append(_item(what=f"file {path}", ok=False, detail=e.message))
            continue
        items.append(
            _item(
                what=f"file {path}",
                ok=got == sha,
                detail="sha256 as built"
                if got == sha
                else ("missing" if got is None else f"sha256 {got[:16]}, built {sha[:16]}"),
            )
        )
    return items


def _checkout_items(
    fs: Squashfs,
    prov: Mapping[str, Any],
    lock: Lock,
    specs: Mapping[str, ImageSpec],
    env_lines: set[str],
) -> list[Gate]:
    """The image against this checkout: the lock and spec it was built from, its env, and
    each patch it applied still present."""
    spec = specs.get(str(prov.get("image", "")))
    lock_sha = str((prov.get("lock") or {}).get("sha256"))
    items = [
        _item(
            what="provenance.lock",
            ok=lock_sha == lock.sha256,
            detail=f"image built from lock {lock_sha[:16]}, this lock is {lock.sha256[:16]}",
        )
    ]
    if spec is None:
        return [*items, _item(what="provenance.spec", ok=False,
                                  detail=f"no spec named {prov.get('image')!r} here")]  # fmt: skip
    spec_sha = str((prov.get("spec") or {}).get("sha256"))
    items.append(
        _item(
            what="provenance.spec",
            ok=spec_sha == spec.sha256,
            detail=f"image built from spec {spec_sha[:16]}, {spec.path} is {spec.sha256[:16]}",
        )
    )
    base_pin = lock.bases.get(str((prov.get("base") or {}).get("pin", "")))
    if base_pin is None:
        items.append(Gate(name="env", status=NOT_CHECKED, detail=(
            f"the image's base pin {one_line(str((prov.get('base') or {}).get('pin')))[:100]!r} "
            "is not in this lock: the env it bakes is not known here")))  # fmt: skip
    else:
        for name, value in sorted(merged_env(lock, spec, base_pin).items()):
            ok = f"{name}={value}" in env_lines
            items.append(
                _item(
                    what=f"env {name}",
                    ok=ok,
                    detail=f"/etc/environment {'has' if ok else 'lacks'} {name}={value}",
                )
            )
    return items + [_patch_item(fs, p, lock) for p in prov.get("patches", [])]


def _patch_item(fs: Squashfs, p: Mapping[str, Any], lock: Lock) -> Gate:
    if p.get("status") not in (APPLIED, ALREADY_PRESENT):  # the build did not apply it
        status = one_line(str(p.get("status")))[:200]
        return Gate(name=f"patch {p.get('name')}", status=NOT_CHECKED,
                    detail=f"not applied by the build ({status})")  # fmt: skip
    pin = lock.container_patches.get(str(p.get("name")))
    if pin is None:
        return _item(what=f"patch {p.get('name')}", ok=False, detail="not in this lock")
    patch = load_patch_file(pin, verify_patch_file(lock, pin))
    data, refused = _read(fs, str(p["target"]))
    if refused:
        return _item(what=f"patch {p['name']}", ok=False, detail=refused)
    text = (data or b"").decode(errors="replace")
    missing = missing_edits(patch, text)
    return _item(
        what=f"patch {p['name']}",
        ok=not missing,
        detail=f"{p['target']}: "
        + ("; ".join(missing) if missing else f"{len(patch.edits)} edit(s) present"),
    )


def require_ok(sqsh: Path, items: list[Gate]) -> None:
    if not ok(items):
        bad = [i for i in items if i.bad] or list(items)
        raise CheckFailed(
            f"{len(bad)} check(s) failed: " + "; ".join(f"{i.name}: {i.detail}" for i in bad),
            where=str(sqsh),
            fix="re-import the image by the digest k3env push printed (or re-export it); a "
            "difference you did not make is tampering",
        )
