"""Check any squashfs, an ``enroot import`` made on the cluster or a ``k3env export``, against
what the image itself carries, then against the lock and spec in this checkout.

Against the image: its provenance file (in k3env's layer, its sha256 in the config's labels),
every file of k3env's layer, every installed Python distribution's files against its own
``RECORD``, each /etc/environment line and the /etc/rc script enroot derives from the config
(rendered by ``enroot``), its first line enroot >= 4.2's provenance line naming this image
(``enroot_uri``: required or refused as the cluster profile's enroot writes it, else either).
Against this checkout: the lock and spec the image was built from,
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
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from k3env import untrusted
from k3env.config.patchfile import load_patch_file
from k3env.config.pinned_files import verify_patch_file
from k3env.config.pins import Lock
from k3env.config.shapes import MACHINES
from k3env.config.spec import ImageSpec
from k3env.errors import ConfigError, UntrustedFileError
from k3env.handoff.enroot import enroot_files
from k3env.handoff.enroot_uri import PREFIX, Release, ThisImage, names, parse_uri, provenance_line
from k3env.handoff.provenance import (
    provenance_document,
)
from k3env.handoff.squashfs import Squashfs, installed_records
from k3env.hashing import digest_hex, record_b64, sha256_digest
from k3env.image.build import PROVENANCE_LABEL, PROVENANCE_PATH, RUNTIME_KEYS
from k3env.image.envpolicy import merged_env
from k3env.image.patches import ALREADY_PRESENT, APPLIED, missing_edits
from k3env.image.records import Build, build_key, shipped
from k3env.image.records import read as records_read
from k3env.log import Log
from k3env.quoting import one_line
from k3env.state import State
from k3env.verdict import FAILED, NOT_CHECKED, PASSED, Gate, exit_code


# --- check a squashfs ---------------------------------------------------------------------------
def _item(*, what: str, ok: bool, detail: str) -> Gate:
    """One check of the squashfs, as a gate: passed with its evidence, or failed."""
    return Gate(name=what, status=PASSED if ok else FAILED, detail=detail)


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


def _rc_items(
    expected: str, actual: bytes | None, this: ThisImage, release: Release | None = None
) -> list[Gate]:
    """/etc/rc against the config (the labels and command), and enroot's provenance line on
    its own gate: checked to name this image, required or refused as ``release`` writes it."""
    if actual is None:
        return [_item(what="etc/rc", ok=False, detail="missing")]
    text = actual.decode(errors="replace")
    line = provenance_line(text)
    body = text if line is None else text[len(line) + 1 :]
    # enroot >= 4.2 writes the labels after the line, and a blank line even when there are none.
    items = [_line_item(line, this, release)]
    if body == expected or (line is not None and body == "\n" + expected):
        return [_item(what="etc/rc", ok=True, detail="labels and command as the config says"),
                *items]  # fmt: skip
    exp, act = expected.splitlines(), body.splitlines()
    items += [
        _item(what="etc/rc", ok=False, detail=f"unexpected line {x!r}") for x in act if x not in exp
    ]
    items += [
        _item(what="etc/rc", ok=False, detail=f"missing line {x!r}") for x in exp if x not in act
    ]
    return items if len(items) > 1 else [*items, _item(what="etc/rc", ok=False,
                                                       detail="lines reordered")]  # fmt: skip


PROVENANCE_GATE = "etc/rc enroot-provenance"


def _line_item(line: str | None, this: ThisImage, release: Release | None) -> Gate:
    """enroot's provenance line (enroot >= 4.2: NVIDIA/enroot 8b3a130): its URI names this
    image, whatever the release; its presence as ``release`` writes it (None: either)."""
    if line is None:
        if release is not None and release.writes_line:
            return _item(what=PROVENANCE_GATE, ok=False, detail=(
                f"no provenance line: removed, or the file is not that enroot's import (a k3env "
                "export: check it without --cluster), or [runtime.enroot] names a newer enroot "
                f"than the nodes run; {release} writes '{PREFIX}<uri>' first on every "
                "import"))  # fmt: skip
        said = (
            f"as {release} writes it" if release else "as enroot < 4.2 writes it (or k3env export)"
        )
        return _item(what=PROVENANCE_GATE, ok=True, detail=f"no provenance line: /etc/rc {said}")
    shown = f"'{one_line(line)[:300]}'"
    if release is not None and not release.writes_line:
        return _item(what=PROVENANCE_GATE, ok=False, detail=(
            "a provenance line: tampering, or the profile's [runtime.enroot] is out of date (the "
            f"nodes run enroot >= 4.2: set its version and commit); {release} never writes "
            f"the first line {shown}"))  # fmt: skip
    try:
        how = names(parse_uri(line), this)
    except ConfigError as e:
        return _item(what=PROVENANCE_GATE, ok=False, detail=f"first line {e.message}")
    said = f"as {release} writes it" if release else "as enroot >= 4.2 writes it"
    return _item(what=PROVENANCE_GATE, ok=True,
                 detail=f"first line {shown}, {said}: names this image {how}")  # fmt: skip


def _read(fs: Squashfs, path: str) -> tuple[bytes | None, str | None]:
    """(the bytes of ``path`` or None when missing, why it was refused or None)."""
    try:
        return fs.read(path), None
    except UntrustedFileError as e:
        return None, e.message


def _record_items(fs: Squashfs, listing: list[str], patched: set[str], log: Log) -> list[Gate]:
    """Every installed distribution's files against the sha256 in its own RECORD; files
    k3env's layer replaced (patched) are checked against the provenance instead."""
    records = installed_records(listing)
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


def check_squashfs(
    sqsh: Path,
    lock: Lock,
    specs: Mapping[str, ImageSpec],
    log: Log,
    *,
    state: State | None = None,
    release: Release | None = None,
) -> list[Gate]:
    """Every difference between ``sqsh`` and what its image and this lock say it holds:
    first against the image (its provenance, /etc/rc, /etc/environment, k3env's files, every
    RECORD), then against this checkout (lock, spec, env, patches). ``state``: this host's
    build and push records (what enroot's provenance line may name the image by); ``release``:
    the enroot that imported it (its provenance line required or refused)."""
    with tempfile.TemporaryDirectory(prefix="k3env-check-") as work:
        fs = Squashfs(sqsh, log, Path(work))
        return check_image(fs, lock, specs, log, state=state, release=release)


def check_image(
    fs: Squashfs,
    lock: Lock,
    specs: Mapping[str, ImageSpec],
    log: Log,
    *,
    state: State | None = None,
    release: Release | None = None,
) -> list[Gate]:
    """``check_squashfs`` of an image already open (its listing read once, shared)."""
    prov, raw = provenance_document(fs)
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
        else _rc_items(expected_rc, rc, this_image(prov, lock, specs, state), release)
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


def this_image(
    prov: Mapping[str, Any], lock: Lock, specs: Mapping[str, ImageSpec], state: State | None
) -> ThisImage:
    """What names the image ``prov`` describes: its reference (its spec's repository, the tag
    its inputs give), and where this host recorded them its build's digests and its push."""
    spec = specs.get(str(prov.get("image", "")))
    inputs = prov.get("inputs")
    if spec is None or not isinstance(inputs, str) or not inputs:
        return ThisImage(reference=None)
    reference = f"{spec.repository}:{inputs[:20]}"
    records = [records_read(state, Build, build_key(lock, spec, twin, platform))
               for platform in MACHINES for twin in (False, True)] if state else []  # fmt: skip
    build = next((r for r in records if r is not None and r.reference == reference), None)
    if state is None or build is None:
        return ThisImage(reference=reference)
    digests: dict[str, str] = {}  # the first name wins: the engine's ID is one of the others
    for value, what in ((build.image_id, "config digest"), (build.manifest, "manifest digest"),
                        (build.engine_id, "engine's image ID")):  # fmt: skip
        digests.setdefault(str(value), what)
    pushed = shipped(state, build.image_id).pushed
    return ThisImage(
        reference=reference,
        digests=tuple((what, d) for d, what in digests.items() if _DIGEST.fullmatch(d)),
        pushed=pushed.reference if pushed else None,
        pushed_digests=tuple((what, d) for what, d in (
            ("manifest digest", pushed.digest if pushed else ""),
            ("index digest", (pushed.index if pushed else None) or "")) if _DIGEST.fullmatch(d)),
    )  # fmt: skip


_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


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


def require_ok(sqsh: Path, items: list[Gate]) -> int:
    return exit_code(
        items,
        what="the file is not the image",
        where=str(sqsh),
        fix="re-import the image by the digest k3env push printed (or re-export it); a "
        "difference you did not make is tampering",
    )
