"""The enroot image: export to squashfs, and check any squashfs against the lock.

Slurm jobs run images through pyxis/enroot. ``export`` writes the enroot image itself: the
image's root filesystem streamed from the engine into ``mksquashfs -tar`` with the image's own
file mtimes (so Python's timestamp-based ``.pyc`` stay valid), root 0755, and the files enroot
writes from the image config (/etc/environment, /etc/rc, /etc/rc.local, /etc/fstab) in
enroot's own format, so an export and an ``enroot import`` of the same image run the same.
Bytes depend only on the image.

``check`` re-reads any squashfs, an ``enroot import`` made on the cluster or a ``k3env
export``, against what the image itself carries: its provenance file (in k3env's layer, its
sha256 in the config's labels), every file of k3env's layer, every installed Python
distribution's files against its own ``RECORD``, each /etc/environment line and the /etc/rc
script enroot derives from the config; then against the lock and spec in this checkout.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from k3env.config.lock import Lock, verify_patch_file
from k3env.config.patchfile import load_patch_file
from k3env.config.shapes import DEFAULT_PLATFORM, MACHINES, control_character
from k3env.config.spec import ImageSpec
from k3env.engine.protocol import Engine
from k3env.errors import CheckFailed, ConfigError, EngineError
from k3env.handoff.push import Pushed
from k3env.hashing import digest_hex, file_sha256, record_hash, sha256_digest
from k3env.image.build import PROVENANCE_LABEL, PROVENANCE_PATH, RUNTIME_KEYS, BuildResult
from k3env.image.envpolicy import merged_env
from k3env.image.layer import epoch_of
from k3env.image.patches import ALREADY_PRESENT, APPLIED, missing_edits
from k3env.image.tarstream import entries, filter_tar
from k3env.log import Log
from k3env.runner import attempt, output_or_none, require_tool, run, run_streaming
from k3env.state import State

# enroot's defaults (ENROOT_SQUASH_OPTIONS).
SQUASH_OPTIONS = ("-comp", "lzo", "-noD")
ENROOT_FILES = ("etc/environment", "etc/rc", "etc/rc.local", "etc/fstab")
# What `docker create` + `export` add to an image's files (the container's init layer), with
# the container's creation time as mtime: given the image's creation time instead, so the
# export's bytes depend on the image only.
INIT_LAYER = frozenset(
    ("", "etc", "etc/hosts", "etc/hostname", "etc/resolv.conf", "etc/mtab", "proc", "sys", "dev")
)
RC_LOCAL = (
    "# This file is sourced by /etc/rc when the container starts.\n"
    "# It can be used to manipulate the entrypoint or the command of the container.\n"
)


# --- enroot image files (pure) ------------------------------------------------------------------
def _bash_quote(word: str) -> str:
    """A word as bash's ``${word@Q}`` writes it (enroot quotes the entrypoint and cmd so)."""
    return "'" + word.replace("'", "'\\''") + "'"


def _one_line(what: str, value: str) -> str:
    """``value``, refused when a control character would split it into more lines of a file
    that enroot reads line by line (/etc/environment) or runs (/etc/rc)."""
    if bad := control_character(value):
        raise ConfigError(
            f"{what} holds the control character {bad}: enroot would split it into separate "
            "lines of /etc/environment or /etc/rc (an injected line runs at `enroot start`)",
            where=what,
            fix="remove the control character from the image config (env, label or command)",
        )
    return value


def enroot_files(config: Mapping[str, Any]) -> list[tuple[str, bytes, int]]:
    """/etc/environment, /etc/fstab, /etc/rc, /etc/rc.local for an image config, in the form
    ``enroot import`` writes them (enroot 4.x ``docker::configure``)."""
    env = "".join(f"{_one_line('env', e)}\n" for e in config.get("Env") or [])
    volumes = sorted((config.get("Volumes") or {}).keys())
    fstab = "".join(
        f"${{ENROOT_ROOTFS}}{_one_line('volume', v)} {v} none x-create=dir,bind,rw,nosuid,nodev\n"
        for v in volumes
    )
    return [
        ("etc/environment", env.encode(), 0o644),
        ("etc/fstab", fstab.encode(), 0o644),
        ("etc/rc", render_rc(config).encode(), 0o644),
        ("etc/rc.local", RC_LOCAL.encode(), 0o644),
    ]


def render_rc(config: Mapping[str, Any]) -> str:
    """enroot's /etc/rc: the labels as comments (config order: sorted), a blank line, then the
    script that enters the working directory, sources /etc/rc.local and execs the command."""
    labels = config.get("Labels") or {}
    head = "".join(
        f"# {_one_line('label', k)} {_one_line(f'label {k}', v)}\n" for k, v in labels.items()
    )
    entrypoint = [_bash_quote(_one_line("entrypoint", a)) for a in config.get("Entrypoint") or []]
    cmd = [_bash_quote(_one_line("cmd", a)) for a in config.get("Cmd") or []]
    if not entrypoint and not cmd:
        cmd = [_bash_quote("/bin/sh")]
    workdir = _one_line("workdir", config.get("WorkingDir") or "/")
    ep = " ".join(entrypoint)
    return (
        (head + "\n" if head else "")
        + f'mkdir -p "{workdir}" 2> /dev/null\n'
        + f'cd "{workdir}" && unset OLDPWD || exit 1\n'
        + "\n"
        + "if [ -s /etc/rc.local ]; then\n"
        + "    . /etc/rc.local\n"
        + "fi\n"
        + "\n"
        + "if [ $# -gt 0 ]; then\n"
        + f'    exec {ep} "$@"\n'
        + "else\n"
        + f"    exec {ep} {' '.join(cmd)}\n"
        + "fi\n"
    )


def _drop(name: str) -> bool:
    return name in ENROOT_FILES or name == ".dockerenv" or name.startswith("dev/")


# --- export -------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Exported:
    image: str
    image_id: str
    path: str
    sha256: str
    size: int
    mksquashfs: str
    options: tuple[str, ...]
    platform: str = DEFAULT_PLATFORM

    def as_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def squashfs_version(log: Log) -> str:
    out = run([require_tool("mksquashfs", "squashfs-tools"), "-version"], log, capture=True)
    return out.splitlines()[0].strip() if out else "unknown"


def export_image(
    engine: Engine, state: State, build: BuildResult, out_dir: Path, log: Log
) -> Exported:
    """Write ``out_dir/<repo>+<tag>.sqsh``; a partial file never appears under that name."""
    mksquashfs = require_tool("mksquashfs", "squashfs-tools")
    image = engine.inspect(build.image_id)
    if image is None:
        raise EngineError("image not found", where=build.image_id, fix="build it first")
    when = epoch_of(image.created)
    # The image's own mtimes stay (Python's .pyc check them); owners root as enroot makes
    # them; the root directory 0755 as enroot's `mkdir rootfs`.
    options = (*SQUASH_OPTIONS, "-all-root", "-root-mode", "755", "-mkfs-time", str(when))
    out_dir.mkdir(parents=True, exist_ok=True)
    final = out_dir / (build.reference.replace("/", "+").replace(":", "+") + ".sqsh")
    tmp = final.with_name(f".{final.name}.{os.getpid()}.partial")
    append = entries(enroot_files(image.config), when)
    # mksquashfs -tar stamps the root directory with the current time whatever -root-time
    # says (squashfs-tools 4.5.1); a stopped clock keeps the bytes a function of the image.
    # (`faketime -f TIME` stops the clock; `faketime TIME` starts it there and lets it run.)
    clock = [
        require_tool("faketime", "faketime"),
        "-f",
        datetime.fromtimestamp(when, UTC).strftime("%Y-%m-%d %H:%M:%S"),
    ]
    try:
        run_streaming(
            [
                *clock,
                mksquashfs,
                "-",
                str(tmp),
                "-tar",
                "-noappend",
                "-no-progress",
                "-quiet",
                *options,
            ],
            filter_tar(
                engine.export(build.image_id), _drop, append, mtimes={n: when for n in INIT_LAYER}
            ),
            log,
            what=f"mksquashfs ({final})",
            env={"TZ": "UTC"},
        )
        os.replace(tmp, final)
    except ValueError as e:  # the engine's tar stream ended early
        raise EngineError(
            f"the export stream broke off: {e}", where=build.image_id, fix="export again"
        ) from e
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    exported = Exported(
        image=build.image,
        image_id=build.image_id,
        path=str(final),
        sha256=file_sha256(final),
        size=final.stat().st_size,
        mksquashfs=squashfs_version(log),
        options=options,
        platform=build.platform,
    )
    state.write_record(exported.as_json(), "exports", build.image_id)
    return exported


def cluster_commands(spec: ImageSpec, pushed: Pushed | None, exported: Exported | None) -> str:
    """What to run on the cluster, and the srtslurm.yaml mapping, for one image."""
    platform = (pushed.platform if pushed else None) or (exported.platform if exported else None)
    # An index may name the platform with its variant (linux/arm64/v8): one machine either way.
    machine = MACHINES.get("/".join(platform.split("/")[:2]), "?") if platform else None
    on = f" ({platform}, for {machine} nodes)" if platform else ""
    lines = [f"# {spec.name}{on}"]
    # One image per platform under an index: each its own file, its own manifest's digest.
    arch = f".{platform.split('/')[1]}" if pushed and pushed.index and platform else ""
    sqsh = Path(exported.path).name if exported else f"{spec.name}{arch}.sqsh"
    if pushed:
        lines.append(f"ENROOT_ALLOW_HTTP=y enroot import -o {sqsh} '{pushed.enroot_uri}'")
        lines.append(f"k3env export --check {sqsh}   # on a host with this repo and lock")
        lines.append("# srtslurm.yaml")
        lines.append("containers:")
        lines.append(f'  "{pushed.by_digest}": /path/to/{sqsh}')
    if exported:
        lines.append(f"# or copy the exported image: sha256 {exported.sha256}  {sqsh}")
    return "\n".join(lines)


# --- check a squashfs ---------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class CheckItem:
    what: str
    ok: bool
    detail: str


class Squashfs:
    """Read access to a squashfs image through unsquashfs (no mount, no root)."""

    def __init__(self, path: Path, log: Log) -> None:
        self.path = path
        self.log = log
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

    def cat(self, path: str) -> bytes | None:
        return output_or_none([self.unsquashfs, "-cat", str(self.path), path.lstrip("/")], self.log)

    def listing(self) -> list[str]:
        """Every path in the image (relative, no leading ``/``)."""
        out = run([self.unsquashfs, "-lc", "-d", "", str(self.path)], self.log, capture=True)
        return [line.lstrip("/") for line in out.splitlines() if line.strip()]

    def extract(self, dest: Path, paths: Iterable[str]) -> None:
        """Extract ``paths`` (exact names: unsquashfs reads an extract list as globs, so
        ``[`` in a vLLM config file name is escaped) under ``dest``."""
        listed = dest.parent / "extract-list"
        listed.write_text("".join(_glob_escape(p) + "\n" for p in paths))
        run(
            [
                self.unsquashfs,
                "-q",
                "-n",
                "-f",
                "-d",
                str(dest),
                "-ef",
                str(listed),
                str(self.path),
            ],
            self.log,
            capture=True,
            what="unsquashfs",
        )


def _glob_escape(path: str) -> str:
    return re.sub(r"([][*?\\])", r"\\\1", path)


def _provenance(fs: Squashfs) -> tuple[dict[str, Any], bytes]:
    raw = fs.cat(PROVENANCE_PATH)
    if raw is None:
        raise ConfigError(
            f"{PROVENANCE_PATH} is not in the image: it was not built by k3env (or its layer "
            "was removed)",
            where=str(fs.path),
            fix="check an image that `k3env build` made (import it by the digest k3env push "
            "printed)",
        )
    try:
        doc = json.loads(raw)
        if not isinstance(doc, dict) or not isinstance(doc.get("config"), dict):
            raise ValueError("not a k3env provenance document of this format")
    except ValueError as e:
        raise ConfigError(
            f"{PROVENANCE_PATH} is not valid provenance ({e}): the image was altered, or built "
            "by an older k3env",
            where=str(fs.path),
            fix="re-export or re-import the image from the registry digest",
        ) from e
    return doc, raw


def _lines_diff(what: str, expected: list[str], actual: list[str]) -> list[CheckItem]:
    if expected == actual:
        return [CheckItem(what=what, ok=True, detail=f"{len(actual)} line(s) as the config says")]
    items = []
    exp_keys = {line.split("=", 1)[0]: line for line in expected}
    act_keys = {line.split("=", 1)[0]: line for line in actual}
    for key, line in act_keys.items():
        if key not in exp_keys:
            items.append(CheckItem(what=what, ok=False, detail=f"extra line {line!r}"))
        elif exp_keys[key] != line:
            items.append(
                CheckItem(
                    what=what,
                    ok=False,
                    detail=f"changed: {line!r} (image config: {exp_keys[key]!r})",
                )
            )
    for key, line in exp_keys.items():
        if key not in act_keys:
            items.append(CheckItem(what=what, ok=False, detail=f"missing line {line!r}"))
    if not items:
        items.append(CheckItem(what=what, ok=False, detail="lines reordered or repeated"))
    return items


def _short(match: re.Match[bytes] | None) -> str:
    return match.group(1).decode()[:16] if match else "absent"


def _rc_items(expected: str, actual: bytes | None) -> list[CheckItem]:
    if actual is None:
        return [CheckItem(what="etc/rc", ok=False, detail="missing")]
    text = actual.decode(errors="replace")
    if text == expected:
        return [CheckItem(what="etc/rc", ok=True, detail="labels and command as the config says")]
    exp, act = expected.splitlines(), text.splitlines()
    items = [
        CheckItem(what="etc/rc", ok=False, detail=f"unexpected line {line!r}")
        for line in act
        if line not in exp
    ]
    items += [
        CheckItem(what="etc/rc", ok=False, detail=f"missing line {line!r}")
        for line in exp
        if line not in act
    ]
    return items or [CheckItem(what="etc/rc", ok=False, detail="lines reordered")]


def _record_items(fs: Squashfs, listing: list[str], patched: set[str], log: Log) -> list[CheckItem]:
    """Every installed distribution's files against the sha256 in its own RECORD; files
    k3env's layer replaced (patched) are checked against the provenance instead."""
    # Installed distributions live in a site directory on sys.path; a dist-info vendored
    # inside a package (setuptools/_vendor/wheel-*.dist-info) lists files never installed.
    records = [
        p for p in listing if re.search(r"(^|/)(site|dist)-packages/[^/]+\.dist-info/RECORD$", p)
    ]
    if not records:
        return [CheckItem(what="python", ok=True, detail="no installed distributions")]
    present = set(listing)
    with tempfile.TemporaryDirectory(prefix="k3env-check-") as tmp:
        dest = Path(tmp) / "root"
        fs.extract(dest, records)
        wanted: list[tuple[str, str, str]] = []  # (distribution, path, RECORD hash)
        for record in records:
            site = record.rsplit("/", 2)[0]
            dist = record.rsplit("/", 2)[1].removesuffix(".dist-info")
            for row in csv.reader(io.StringIO((dest / record).read_text(errors="replace"))):
                if len(row) >= 2 and row[1].startswith("sha256="):
                    rel = os.path.normpath(os.path.join(site, row[0]))
                    if rel not in patched:
                        wanted.append((dist, rel, row[1].removeprefix("sha256=").rstrip("=")))
        with log.step(f"read {len(wanted)} file(s) of {len(records)} distribution(s)"):
            fs.extract(dest, sorted({rel for _, rel, _ in wanted if rel in present}))
        bad: dict[str, list[str]] = {}
        for dist, rel, want in wanted:
            path = dest / rel
            if rel not in present or not (path.is_file() or path.is_symlink()):
                bad.setdefault(dist, []).append(f"/{rel} is missing")
            elif record_hash(path.read_bytes()) != want:
                bad.setdefault(dist, []).append(f"/{rel} differs from its RECORD sha256")
    items = [
        CheckItem(
            what=f"python {dist}",
            ok=False,
            detail="; ".join(problems[:5])
            + (f"; and {len(problems) - 5} more" if len(problems) > 5 else ""),
        )
        for dist, problems in sorted(bad.items())
    ]
    if not bad:
        items.append(
            CheckItem(
                what="python",
                ok=True,
                detail=f"{len(wanted)} file(s) of {len(records)} distribution(s) match their "
                "RECORD",
            )
        )
    return items


def check_squashfs(
    sqsh: Path, lock: Lock, specs: Mapping[str, ImageSpec], log: Log
) -> list[CheckItem]:
    """Every difference between ``sqsh`` and what its image and this lock say it holds:
    first against the image (its provenance, /etc/rc, /etc/environment, k3env's files, every
    RECORD), then against this checkout (lock, spec, env, patches)."""
    fs = Squashfs(sqsh, log)
    prov, raw = _provenance(fs)
    config = prov["config"]
    labels = dict(config.get("Labels") or {})
    # The provenance file against its hash in the image's labels (/etc/rc carries them).
    labels[PROVENANCE_LABEL] = digest_hex(sha256_digest(raw))
    runtime = {k: config.get(k) for k in RUNTIME_KEYS}
    runtime["Labels"] = dict(sorted(labels.items()))
    try:
        expected = {p: data for p, data, _ in enroot_files(runtime)}
    except ConfigError as e:
        return [CheckItem(what="config", ok=False, detail=e.message)]
    rc = fs.cat("etc/rc")
    items = [_provenance_item(rc, labels[PROVENANCE_LABEL])]
    items += _rc_items(expected["etc/rc"].decode(), rc)
    env_actual = (fs.cat("etc/environment") or b"").decode(errors="replace").splitlines()
    items += _lines_diff("etc/environment", list(config.get("Env") or []), env_actual)
    items += _file_items(fs, prov.get("files") or {})
    patched = {p.lstrip("/") for p in prov.get("files") or {}}
    items += _record_items(fs, fs.listing(), patched, log)
    return items + _checkout_items(fs, prov, lock, specs, set(env_actual))


def _provenance_item(rc: bytes | None, digest: str) -> CheckItem:
    carried = re.search(
        rb"^# " + re.escape(PROVENANCE_LABEL.encode()) + rb" ([0-9a-f]{64})$", rc or b"", re.M
    )
    ok = carried is not None and carried.group(1).decode() == digest
    return CheckItem(
        what="provenance",
        ok=ok,
        detail=f"{PROVENANCE_PATH} has the sha256 the image's config names"
        if ok
        else f"{PROVENANCE_PATH} sha256 {digest[:16]} differs from the image "
        f"config's {PROVENANCE_LABEL} ({_short(carried)})",
    )


def _file_items(fs: Squashfs, files: Mapping[str, str]) -> list[CheckItem]:
    """Every file of k3env's layer, by sha256."""
    items = []
    for path, sha in sorted(files.items()):
        content = fs.cat(path)
        got = digest_hex(sha256_digest(content)) if content is not None else None
        items.append(
            CheckItem(
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
) -> list[CheckItem]:
    """The image against this checkout: the lock and spec it was built from, its env, and
    each patch it applied still present."""
    spec = specs.get(str(prov.get("image", "")))
    lock_sha = str((prov.get("lock") or {}).get("sha256"))
    items = [
        CheckItem(
            what="provenance.lock",
            ok=lock_sha == lock.sha256,
            detail=f"image built from lock {lock_sha[:16]}, this lock is {lock.sha256[:16]}",
        )
    ]
    if spec is None:
        return [*items, CheckItem(what="provenance.spec", ok=False,
                                  detail=f"no spec named {prov.get('image')!r} here")]  # fmt: skip
    spec_sha = str((prov.get("spec") or {}).get("sha256"))
    items.append(
        CheckItem(
            what="provenance.spec",
            ok=spec_sha == spec.sha256,
            detail=f"image built from spec {spec_sha[:16]}, {spec.path} is {spec.sha256[:16]}",
        )
    )
    base_pin = lock.bases.get(str((prov.get("base") or {}).get("pin", "")))
    if base_pin is not None:
        for name, value in sorted(merged_env(lock, spec, base_pin).items()):
            ok = f"{name}={value}" in env_lines
            items.append(
                CheckItem(
                    what=f"env {name}",
                    ok=ok,
                    detail=f"/etc/environment {'has' if ok else 'lacks'} {name}={value}",
                )
            )
    return items + [_patch_item(fs, p, lock) for p in prov.get("patches", [])]


def _patch_item(fs: Squashfs, p: Mapping[str, Any], lock: Lock) -> CheckItem:
    if p.get("status") not in (APPLIED, ALREADY_PRESENT):
        return CheckItem(what=f"patch {p.get('name')}", ok=True, detail=str(p.get("status")))
    pin = lock.container_patches.get(str(p.get("name")))
    if pin is None:
        return CheckItem(what=f"patch {p.get('name')}", ok=False, detail="not in this lock")
    patch = load_patch_file(pin, verify_patch_file(lock, pin))
    text = (fs.cat(str(p["target"])) or b"").decode(errors="replace")
    missing = missing_edits(patch, text)
    return CheckItem(
        what=f"patch {p['name']}",
        ok=not missing,
        detail=f"{p['target']}: "
        + ("; ".join(missing) if missing else f"{len(patch.edits)} edit(s) present"),
    )


def require_ok(sqsh: Path, items: list[CheckItem]) -> None:
    bad = [i for i in items if not i.ok]
    if bad:
        raise CheckFailed(
            f"{len(bad)} check(s) failed: " + "; ".join(f"{i.what}: {i.detail}" for i in bad),
            where=str(sqsh),
            fix="re-import the image by the digest k3env push printed (or re-export it); a "
            "difference you did not make is tampering",
        )
