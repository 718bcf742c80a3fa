"""pyxis's importer for k3env's staged images (``k3env-pyxis-importer``; pyxis >= 0.21
``importer=`` in plugstack.conf; the interface of pyxis 0.24's importers/README.md).

``get IMAGE_URI``: for ``docker://[REGISTRY#]REPO@sha256:HEX``, the staged ``.sqsh`` of that
manifest digest for this node's platform (``handoff.stage``), after checking its bytes: its
size against the stage's record, then its sha256, in full the first time this node hands it
out (and whenever the file's device, inode, size, mtime or ctime changed since), so a tampered or
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

import os
import platform
import re
import stat
import sys
from pathlib import Path

from k3env import jsontext
from k3env.handoff.cachefs import CacheRefused, Dir, Identity, blocks, open_root
from k3env.handoff.stage import (
    ATTESTED,
    HOLDS,
    MAX_ATTESTED,
    SQSH,
    Entry,
    digest_hex_of,
    digest_lock,
    entry_dir,
    platform_dir,
    read_entry,
    shared_lock,
    stage_locked,
    trusted,
)
from k3env.hashing import file_sha256, sha256_stream
from k3env.log import Log
from k3env.quoting import one_line
from k3env.runner import attempt

URI_RE = re.compile(
    r"^docker://(?:(?P<registry>[A-Za-z0-9.-]+(?::[0-9]+)?)#)?(?P<repo>[a-z0-9._/-]+)"
    r"(?::(?P<tag>[A-Za-z0-9_.-]{1,128}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?$"
)
MACHINES = {"x86_64": "linux/amd64", "aarch64": "linux/arm64", "arm64": "linux/arm64"}
MAX_RECORD = 4 << 10


class Refused(Exception):
    """The importer's words on why the step must not start."""


def say(text: str) -> None:
    """One line on stderr, which pyxis shows the job's user: what others wrote (an image name,
    a path, an error) with its control characters escaped, so no line can be forged."""
    print(f"k3env-pyxis-importer: {one_line(text)}", file=sys.stderr, flush=True)


def _job() -> str:
    job = os.environ.get("SLURM_JOB_ID", "0")
    step = os.environ.get("SLURM_STEP_ID", "0")
    return re.sub(r"[^0-9A-Za-z_.-]", "_", f"{job}.{step}")[:64]


def _runtime() -> Path:
    """pyxis's runtime path (it sets ``PYXIS_RUNTIME_PATH``; /run/pyxis is its default)."""
    return Path(os.environ.get("PYXIS_RUNTIME_PATH") or "/run/pyxis")


def _private() -> Dir:
    """This node's record of what this user's importer checked, and its imports: a directory
    ``k3env-<uid>`` that only this user owns and can write (0700), opened by descriptor, under
    the first base that takes it: pyxis's runtime path (root's, 0755: a job's user cannot write
    there), ``$XDG_RUNTIME_DIR``, ``$TMPDIR`` or /tmp. A directory of that name another user
    made is refused (never used), and the next base tried."""
    me = os.geteuid()
    bases = [str(_runtime()), os.environ.get("XDG_RUNTIME_DIR") or "",
             os.environ.get("TMPDIR") or "/tmp"]  # fmt: skip
    why = []
    for base in dict.fromkeys(b for b in bases if b):
        try:
            root = open_root(Path(base))
            if root is None:
                continue
            with root:
                where = root.child(f"k3env-{me}", frozenset({me}), create=0o700)
            if where is not None and where.mode & 0o077 == 0:
                return where
            if where is not None:
                where.close()
        except (CacheRefused, OSError) as e:
            why.append(f"{base}: {getattr(e, 'message', None) or e}")
    raise Refused(f"no private directory for this node's records ({'; '.join(why)[:600]})")


def signed(where: Dir, entry: Entry, owners: frozenset[int], key_path: str) -> str:
    """The stage's SBOM and statement checked with the key at ``key_path``, or Refused."""
    from k3env.errors import K3envError
    from k3env.hashing import digest_hex, sha256_digest
    from k3env.signing import load_verify_key, open_envelope

    try:
        key = load_verify_key(Path(key_path))
    except K3envError as e:
        raise Refused(f"K3ENV_STAGE_KEY: {e.message}") from e
    found = {n: where.read(n, owners, limit=MAX_ATTESTED) for n in ATTESTED.values()}
    missing = [n for n, data in found.items() if data is None]
    if missing:
        raise Refused(f"{where.shown} has no signed SBOM and provenance ({', '.join(missing)}): "
                      "export it with `k3env export --sign-key`, then stage it")  # fmt: skip
    sbom = found[ATTESTED[".cdx.json"]] or b""
    sig = (found[ATTESTED[".cdx.json.sig"]] or b"").decode(errors="replace")
    if not key.verify(sbom, sig):
        raise Refused(f"{where.shown}: the SBOM is not signed by K3ENV_STAGE_KEY ({key_path})")
    try:
        said, _ = open_envelope(key, found[ATTESTED[".intoto.json"]] or b"")
        subject = said["subject"][0]["digest"]["sha256"]
        product = said["predicate"]["runDetails"]["byproducts"][0]["digest"]["sha256"]
    except K3envError as e:
        raise Refused(f"{where.shown}: the provenance statement is refused: {e.message}") from e
    except (ValueError, KeyError, IndexError, TypeError, RecursionError) as e:
        raise Refused(f"{where.shown}: the provenance statement is refused: "
                      f"{type(e).__name__} {str(e)[:200]}") from e  # fmt: skip
    if subject != entry.sha256 or product != digest_hex(sha256_digest(sbom)):
        raise Refused(f"{where.shown}: the signed statement names another file or SBOM")
    return "SBOM and provenance signed by K3ENV_STAGE_KEY"


def verify(where: Dir, entry: Entry, owners: frozenset[int], policy: str) -> str:
    """The staged file's evidence, or Refused: a regular file of a trusted owner, one link, its
    recorded size, then its sha256 (on first use on this node, when its identity changed, or
    always), read from the descriptor that was checked."""
    got = where.open_file(SQSH, owners)
    if got is None:
        raise Refused(f"{where.path(SQSH)} is missing: stage it again (`k3env stage`)")
    fd, st = got
    try:
        if st.st_size != entry.size:
            raise Refused(f"{where.path(SQSH)} has {st.st_size} bytes, the stage recorded "
                          f"{entry.size}")  # fmt: skip
        seen = {"sha256": entry.sha256, **Identity.of(st).__dict__}
        with _private() as private:
            record = f"checked-{digest_hex_of(entry.digest)}.json"
            if policy != "always" and _known(private, record) == seen:
                return (
                    "size and file identity (inode, ctime) unchanged since this node checked its "
                    "sha256"
                )
            got_sha = sha256_stream(blocks(fd)).hex()
            if got_sha != entry.sha256:
                raise Refused(
                    f"{where.path(SQSH)} has sha256 {got_sha}, the stage recorded "
                    f"{entry.sha256}: refusing to start it (re-stage it from the build host: "
                    "`k3env stage`)"
                )
            try:
                private.write_bytes(record, jsontext.dumps(seen).encode(), mode=0o600)
            except OSError as e:
                say(f"could not record the check ({e.strerror}): the next use hashes it again")
    finally:
        os.close(fd)
    return "sha256 checked"


def _known(private: Dir, record: str) -> object:
    try:
        data = private.read(record, frozenset({os.geteuid()}), limit=MAX_RECORD)
        return None if data is None else jsontext.loads(data, where=record, limit=MAX_RECORD)
    except Exception:  # any doubt about the record: hash again
        return None


def _hold(where: Dir, owners: frozenset[int], image: str) -> None:
    """This step's hold file in the entry's ``holds/`` (created by descriptor, never through a
    link; a name another user planted is left alone, and said)."""
    holds = where.child(HOLDS, owners)
    if holds is None:
        say("no holds/ in the entry: garbage collection cannot see this job")
        return
    with holds:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK
        try:
            fd = os.open(_job(), flags | os.O_CLOEXEC, 0o644, dir_fd=holds.fd)
        except OSError as e:
            say(f"no hold written ({e.strerror}): garbage collection cannot see this job")
            return
        try:
            st = os.fstat(fd)
            if st.st_uid != os.geteuid() or st.st_nlink != 1 or not stat.S_ISREG(st.st_mode):
                say("no hold written (the name is another's file): garbage collection cannot "
                    "see this job")  # fmt: skip
                return
            os.write(fd, f"{image}\n".encode())
        finally:
            os.close(fd)


def get(uri: str, cache: Path, mode: str, policy: str) -> str:
    m = URI_RE.match(uri)
    if m is None:
        raise Refused(f"{uri!r} is not an image URI k3env stages (docker://REGISTRY#REPO@sha256:)")
    digest = m.group("digest")
    if digest is None:
        if mode == "required":
            raise Refused(f"{uri} names a tag, no digest: k3env stages and serves images by digest")
        return _enroot_import(uri, "it names no digest")
    plat = MACHINES.get(platform.machine(), "unknown/unknown")
    try:
        return _get_staged(uri, m.group("repo"), cache, mode, policy, plat, digest)
    except CacheRefused as e:
        if mode == "auto":  # another user's entry: this step imports its own, and says why
            return _enroot_import(uri, f"the staged entry is refused ({e.message})")
        raise Refused(e.render().replace("\n", " ")) from e


def _get_staged(
    uri: str, repo: str, cache: Path, mode: str, policy: str, plat: str, digest: str
) -> str:
    root = open_root(cache)
    if root is None:
        raise Refused(f"the cache {cache} is not there (K3ENV_STAGE_CACHE)")
    with root:
        owners = trusted(root, me=mode == "auto")
        fd = shared_lock(root, digest, owners)  # garbage collection waits for the hold
        try:
            found = _lookup(root, owners, plat, digest)
            if found is None:
                if mode == "required":
                    raise Refused(
                        f"{digest} is not staged for {plat} in {cache}: run `k3env stage IMAGE "
                        f"--cache {cache}` on the build host (mode required: no import here)"
                    )
                if fd is not None:  # the import takes the digest's lock itself
                    os.close(fd)
                    fd = None
                evidence = _import_and_stage(uri, repo, root, owners, plat, digest, policy)
                fd = shared_lock(root, digest, owners)
                found = _lookup(root, owners, plat, digest)
                if found is None:
                    raise Refused(f"{digest}: staged, then gone before this job held it")
                where, entry = found
            else:
                where, entry = found
                evidence = verify(where, entry, owners, policy)
            with where:
                if key := os.environ.get("K3ENV_STAGE_KEY"):
                    evidence = f"{signed(where, entry, owners, key)}; {evidence}"
                _hold(where, owners, entry.image)
        finally:
            if fd is not None:
                os.close(fd)
    say(f"{entry.image} ({digest[:19]}): staged, {evidence}")
    return str(entry_dir(cache, plat, digest) / SQSH)


def _lookup(root: Dir, owners: frozenset[int], plat: str, digest: str) -> tuple[Dir, Entry] | None:
    """The entry of ``digest`` for ``plat`` (its directory open: the caller closes it) and its
    record; None when it is not staged. What is there and not trusted is refused."""
    p = root.child(platform_dir(plat), owners)
    if p is None:
        return None
    with p:
        where = p.child(digest_hex_of(digest), owners)
    if where is None:
        return None
    try:
        entry = read_entry(where, owners)
    except BaseException:
        where.close()
        raise
    if entry is None or entry.digest != digest:
        where.close()
        return None
    return where, entry


def _import_and_stage(
    uri: str, repo: str, root: Dir, owners: frozenset[int], plat: str, digest: str, policy: str
) -> str:
    """Mode auto, on a miss: enroot imports the image (into this user's private directory on
    the node) and it is staged for the next job (under the digest's lock: of two jobs that miss
    at once, one imports, the other waits and finds it staged)."""
    with digest_lock(root, digest, owners):
        found = _lookup(root, owners, plat, digest)
        if found is not None:
            with found[0] as where:
                return "staged by another job meanwhile, " + verify(where, found[1], owners, policy)
        with _private() as private:
            tmp = Path(private.shown) / f"import-{_job()}.sqsh"
            try:
                _enroot_run(uri, tmp, "not staged")
                staged = stage_locked(
                    root, owners, platform=plat, digest=digest, sqsh=tmp, sha256=file_sha256(tmp),
                    meta={"image": repo, "image_id": "",
                          "lock": "", "uri": uri, "imported_on": platform.node()},
                )  # fmt: skip
            finally:
                tmp.unlink(missing_ok=True)
    return f"imported by enroot and staged ({staged.size} bytes)"


def _enroot_run(uri: str, out: Path, why: str) -> None:
    say(f"{uri}: {why}; importing with enroot (mode auto)")
    code, words = attempt(["enroot", "import", "--output", str(out), uri], Log(quiet=True))
    if code != 0:
        raise Refused(f"enroot import of {uri} failed (exit {code}): {words[-2000:]}")


def _enroot_import(uri: str, why: str) -> str:
    """Mode auto, a tag (or an entry this user may not trust): imported for this step only."""
    with _private() as private:
        out = Path(private.shown) / f"import-{_job()}.sqsh"
    _enroot_run(uri, out, why)
    return str(out)


def release(cache: Path) -> None:
    """This step's hold removed (only a hold file this user owns, found by descriptor), and its
    own import; idempotent."""
    job = _job()
    root = open_root(cache)
    if root is not None:
        with root:
            _release_holds(root, trusted(root, me=True), job)
    with _private() as private:
        if private.lstat(f"import-{job}.sqsh") is not None:
            private.unlink(f"import-{job}.sqsh")


def _release_holds(root: Dir, owners: frozenset[int], job: str) -> None:
    for pname in root.names():
        try:
            plat = root.child(pname, owners)
        except CacheRefused:
            continue
        if plat is None:
            continue
        with plat:
            for name in plat.names():
                try:
                    where = plat.child(name, owners)
                    holds = where.child(HOLDS, owners) if where is not None else None
                except CacheRefused:
                    continue
                if where is not None:
                    where.close()
                if holds is None:
                    continue
                with holds:
                    st = holds.lstat(job)
                    if st is not None and st.st_uid == os.geteuid():
                        holds.unlink(job)


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
