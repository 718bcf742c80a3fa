"""pyxis's importer for k3env's staged images (``k3env-pyxis-importer``; pyxis >= 0.21
``importer=`` in plugstack.conf; the interface of pyxis 0.24's importers/README.md).

``get IMAGE_URI``: for ``docker://[REGISTRY#]REPO@sha256:HEX``, the staged ``.sqsh`` of that
manifest digest for this node's platform (``handoff.stage``), after checking its bytes: its
size against the stage's record, then its sha256, in full the first time this node hands it
out (and whenever the file's inode, size or modification time changed since), so a tampered or
swapped file is refused before the job's container starts. A hold file says a job uses it
(garbage collection skips it) until ``release``. Prints the path on stdout; what it did on
stderr (pyxis shows it when the importer fails).

A miss, in mode ``required`` (the default), fails the step before its engine starts: "not
staged: run `k3env stage ...`"; a tag without a digest is refused. Mode ``auto`` imports the
image with enroot and stages it (under the digest's lock: of jobs that miss at once, one
imports, the others find it staged; the cache must then be writable by the jobs' users); a
tag is imported for its step only.

Configured by the environment slurmd gives it (a wrapper named in plugstack.conf exports them):
``K3ENV_STAGE_CACHE`` (the cache directory), ``K3ENV_STAGE_MODE`` (required | auto),
``K3ENV_STAGE_VERIFY`` (first-use | always), ``K3ENV_STAGE_KEY`` (a public key, PEM: the
staged export's SBOM and provenance statement must be signed by it, the statement's subject
must be the staged file's sha256 and its SBOM the staged one; checked at every start). It
runs on the nodes: k3env installed there.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import re
import sys
from pathlib import Path
from typing import Any

from k3env.handoff.stage import (
    ATTESTED,
    HOLDS,
    SQSH,
    digest_lock,
    entry_dir,
    lock_path,
    read_entry,
    stage_locked,
)
from k3env.hashing import file_sha256
from k3env.log import Log
from k3env.runner import attempt

URI_RE = re.compile(
    r"^docker://(?:(?P<registry>[A-Za-z0-9.-]+(?::[0-9]+)?)#)?(?P<repo>[a-z0-9._/-]+)"
    r"(?::(?P<tag>[A-Za-z0-9_.-]{1,128}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?$"
)
MACHINES = {"x86_64": "linux/amd64", "aarch64": "linux/arm64", "arm64": "linux/arm64"}


class Refused(Exception):
    """The importer's words on why the step must not start."""


def say(text: str) -> None:
    print(f"k3env-pyxis-importer: {text}", file=sys.stderr, flush=True)


def _job() -> str:
    job = os.environ.get("SLURM_JOB_ID", "0")
    step = os.environ.get("SLURM_STEP_ID", "0")
    return re.sub(r"[^0-9A-Za-z_.-]", "_", f"{job}.{step}")[:64]


def _runtime() -> Path:
    """pyxis's runtime path (it sets ``PYXIS_RUNTIME_PATH``; /run/pyxis is its default)."""
    return Path(os.environ.get("PYXIS_RUNTIME_PATH") or "/run/pyxis")


def _state_dir() -> Path:
    """This node's record of what it checked (under pyxis's runtime path)."""
    return _runtime() / "k3env-checked"


def signed(where: Path, entry: dict[str, Any], key_path: str) -> str:
    """The stage's SBOM and statement checked with the key at ``key_path``, or Refused."""
    from k3env.errors import K3envError
    from k3env.hashing import digest_hex, sha256_digest
    from k3env.signing import load_verify_key, open_envelope

    try:
        key = load_verify_key(Path(key_path))
    except K3envError as e:
        raise Refused(f"K3ENV_STAGE_KEY: {e.message}") from e
    missing = [n for n in ATTESTED.values() if not (where / n).is_file()]
    if missing:
        raise Refused(f"{where} has no signed SBOM and provenance ({', '.join(missing)}): export "
                      "it with `k3env export --sign-key`, then stage it")  # fmt: skip
    sbom = (where / ATTESTED[".cdx.json"]).read_bytes()
    sig = (where / ATTESTED[".cdx.json.sig"]).read_text(errors="replace")
    if not key.verify(sbom, sig):
        raise Refused(f"{where}: the SBOM is not signed by K3ENV_STAGE_KEY ({key_path})")
    try:
        said, _ = open_envelope(key, (where / ATTESTED[".intoto.json"]).read_bytes())
        subject = said["subject"][0]["digest"]["sha256"]
        product = said["predicate"]["runDetails"]["byproducts"][0]["digest"]["sha256"]
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise Refused(f"{where}: the provenance statement is refused: {str(e)[:200]}") from e
    if subject != entry["sha256"] or product != digest_hex(sha256_digest(sbom)):
        raise Refused(f"{where}: the signed statement names another file or SBOM")
    return "SBOM and provenance signed by K3ENV_STAGE_KEY"


def verify(where: Path, entry: dict[str, Any], policy: str) -> str:
    """The staged file's evidence, or Refused: size, then sha256 (first use on this node, a
    changed file, or always)."""
    path = where / SQSH
    try:
        st = os.lstat(path)
    except OSError as e:
        raise Refused(f"{path}: {e.strerror}") from e
    if not os.path.isfile(path) or os.path.islink(path):
        raise Refused(f"{path} is not a regular file")
    if st.st_size != entry["size"]:
        raise Refused(f"{path} has {st.st_size} bytes, the stage recorded {entry['size']}")
    seen = {"sha256": entry["sha256"], "size": st.st_size, "ino": st.st_ino,
            "mtime_ns": st.st_mtime_ns, "dev": st.st_dev}  # fmt: skip
    record = _state_dir() / f"{where.name}.json"
    try:
        known = json.loads(record.read_text()[:4096])
    except (OSError, ValueError):
        known = None
    if policy != "always" and known == seen:
        return "size and file unchanged since this node checked its sha256"
    got = file_sha256(path)
    if got != entry["sha256"]:
        raise Refused(
            f"{path} has sha256 {got}, the stage recorded {entry['sha256']}: refusing to start "
            "it (re-stage it from the build host: `k3env stage`)"
        )
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps(seen))
    except OSError as e:
        say(f"could not record the check ({e.strerror}): the next use hashes it again")
    return "sha256 checked"


def get(uri: str, cache: Path, mode: str, policy: str) -> str:
    m = URI_RE.match(uri)
    if m is None:
        raise Refused(f"{uri!r} is not an image URI k3env stages (docker://REGISTRY#REPO@sha256:)")
    digest = m.group("digest")
    if digest is None:
        if mode == "required":
            raise Refused(f"{uri} names a tag, no digest: k3env stages and serves images by digest")
        return _enroot_import(uri, "it names no digest")
    plat = MACHINES.get(platform.machine(), "")
    where = entry_dir(cache, plat or "unknown/unknown", digest)
    lock = lock_path(cache, digest)
    fd = os.open(lock, os.O_RDONLY) if lock.exists() else None
    try:
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_SH)  # garbage collection waits for the hold
        entry = read_entry(where)
        if entry is None or entry.get("digest") != digest:
            if mode == "required":
                raise Refused(
                    f"{digest} is not staged for {plat} in {cache}: run `k3env stage IMAGE "
                    f"--cache {cache}` on the build host (mode required: no import here)"
                )
            if fd is not None:  # the import takes the digest's lock itself
                os.close(fd)
                fd = None
            entry, evidence = _import_and_stage(uri, m.group("repo"), cache, plat, digest, policy)
            fd = os.open(lock, os.O_RDONLY)
            fcntl.flock(fd, fcntl.LOCK_SH)
        else:
            evidence = verify(where, entry, policy)
        if key := os.environ.get("K3ENV_STAGE_KEY"):
            evidence = f"{signed(where, entry, key)}; {evidence}"
        try:
            (where / HOLDS / _job()).write_text(f"{entry['image']}\n")
        except OSError as e:
            say(f"no hold written ({e.strerror}): garbage collection cannot see this job")
    finally:
        if fd is not None:
            os.close(fd)
    say(f"{entry['image']} ({digest[:19]}): staged, {evidence}")
    return str(where / SQSH)


def _import_and_stage(
    uri: str, repo: str, cache: Path, plat: str, digest: str, policy: str
) -> tuple[dict[str, Any], str]:
    """Mode auto, on a miss: enroot imports the image and it is staged for the next job
    (under the digest's lock: of two jobs that miss at once, one imports, the other waits and
    finds it staged)."""
    where = entry_dir(cache, plat, digest)
    with digest_lock(cache, digest):
        entry = read_entry(where)
        if entry is not None:
            return entry, "staged by another job meanwhile, " + verify(where, entry, policy)
        where.parent.mkdir(parents=True, exist_ok=True)
        tmp = where.parent / f".{where.name}.{_job()}.import.sqsh"
        try:
            _enroot_run(uri, tmp, "not staged")
            staged = stage_locked(
                cache, platform=plat, digest=digest, sqsh=tmp, sha256=file_sha256(tmp),
                meta={"image": repo, "image_id": "",
                      "lock": "", "uri": uri, "imported_on": platform.node()},
            )  # fmt: skip
        finally:
            tmp.unlink(missing_ok=True)
    entry = read_entry(where) or {}
    return entry, f"imported by enroot and staged ({staged.size} bytes)"


def _enroot_run(uri: str, out: Path, why: str) -> None:
    say(f"{uri}: {why}; importing with enroot (mode auto)")
    code, words = attempt(["enroot", "import", "--output", str(out), uri], Log(quiet=True))
    if code != 0:
        raise Refused(f"enroot import of {uri} failed (exit {code}): {words[-2000:]}")


def _enroot_import(uri: str, why: str) -> str:
    """Mode auto, a tag: imported for this step only (a tag is not a stage's key)."""
    out = _runtime() / f"k3env-import-{_job()}.sqsh"
    _enroot_run(uri, out, why)
    return str(out)


def release(cache: Path) -> None:
    """This step's hold removed, and its own import; idempotent."""
    job = _job()
    for hold in cache.glob(f"*_*/*/{HOLDS}/{job}"):
        hold.unlink(missing_ok=True)
    (_runtime() / f"k3env-import-{job}.sqsh").unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    cache = Path(os.environ.get("K3ENV_STAGE_CACHE") or "/var/cache/k3env/stage")
    mode = os.environ.get("K3ENV_STAGE_MODE") or "required"
    policy = os.environ.get("K3ENV_STAGE_VERIFY") or "first-use"
    try:
        if mode not in ("required", "auto") or policy not in ("first-use", "always"):
            raise Refused(f"K3ENV_STAGE_MODE={mode!r} / K3ENV_STAGE_VERIFY={policy!r}: unknown")
        if args[:1] == ["get"] and len(args) == 2:
            print(get(args[1], cache, mode, policy))
            return 0
        if args == ["release"]:
            release(cache)
            return 0
        raise Refused("usage: k3env-pyxis-importer get IMAGE_URI | release")
    except Refused as e:
        say(str(e))
        return 1
    except Exception as e:  # the node's words, never a silent start
        say(f"{type(e).__name__}: {e}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
