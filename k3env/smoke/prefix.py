"""The CPU engine a smoke run mounts over the image's pinned one, made once per pin.

``site/``: the lock's CPU build of the engine (``[smoke].wheels``, hash-checked), installed by
the image's own pip with ``--target`` (so the layout and byte-code are the image Python's).
``lib/``: the shared libraries of the lock's ``[smoke.debs]`` (each .deb fetched from the
twin's Debian mirror and checked against its sha256; only regular ``.so`` files and symlinks
between them are taken, by base name: a package's paths never leave ``lib/``).
"""

from __future__ import annotations

import io
import re
import shutil
import tarfile
import tempfile
from pathlib import Path

from k3env.config.pins import DebPin, Lock, SmokePin
from k3env.engine.protocol import Engine
from k3env.engine.registry import download
from k3env.errors import ConfigError, EngineError
from k3env.hashing import digest_hex, sha256_digest
from k3env.image.wheels import download_wheels
from k3env.log import Log
from k3env.state import State

MAX_DEB = 64 << 20  # a shared-library package is a few hundred KB
SONAME = re.compile(r"^lib[A-Za-z0-9_+.-]*\.so(\.[0-9]+)*$")


def _hex(data: bytes) -> str:
    return digest_hex(sha256_digest(data))


def smoke_pin(lock: Lock, platform: str) -> SmokePin:
    pin = lock.smoke
    if pin is None:
        raise ConfigError(
            "the lock pins no smoke engine",
            where=f"{lock.path} [smoke]",
            fix="pin the CPU build of the twin's engine in [smoke] (see pins/k3.lock.toml)",
        )
    if platform != pin.platform:
        raise ConfigError(
            f"the lock's smoke engine is pinned for {pin.platform}, not {platform}",
            where=f"{lock.path} [smoke]",
            fix=f"smoke on {pin.platform}; verify covers {platform}",
        )
    # The CPU build must be the release the image holds: another would smoke another engine.
    if (overlay := lock.overlay) is not None:
        want, have = overlay.wheels[0].version, pin.engine.wheels[0].version
        if want != have:
            raise ConfigError(
                f"variant {lock.variant} lays {overlay.name} {want} over the twin, and the smoke "
                f"engine is {pin.engine.wheels[0].name} {have}",
                where=f'{lock.path} [variants."{lock.variant}"]',
                fix=f'pin the CPU build of {overlay.name} {want} in [variants."{lock.variant}".'
                "smoke] (wheels = [{ name = ..., version = ..., sha256 = ... }])",
            )
    return pin


def _members(data: bytes, where: str) -> dict[str, bytes]:
    """The members of an ar archive (a .deb), by name."""
    if not data.startswith(b"!<arch>\n"):
        raise EngineError("not a Debian package (no ar header)", where=where, fix="re-pin it")
    out, pos = {}, 8
    while pos + 60 <= len(data):
        head = data[pos : pos + 60]
        name = head[:16].decode("ascii", "replace").strip().rstrip("/")
        try:
            size = int(head[48:58].decode("ascii").strip())
        except ValueError as e:
            raise EngineError("a malformed ar member header", where=where, fix="re-pin it") from e
        out[name] = data[pos + 60 : pos + 60 + size]
        pos += 60 + size + (size & 1)
    return out


def libraries_of(deb: bytes, where: str) -> dict[str, tuple[str, bytes | str]]:
    """``.so`` base name -> ("file", bytes) or ("link", target base name), from a .deb."""
    members = _members(deb, where)
    data = next((v for k, v in members.items() if k.startswith("data.tar")), None)
    if data is None:
        raise EngineError("no data.tar in the package", where=where, fix="re-pin it")
    out: dict[str, tuple[str, bytes | str]] = {}
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for m in tar.getmembers():
            base = m.name.rsplit("/", 1)[-1]
            if not SONAME.match(base):
                continue
            if m.isfile():
                f = tar.extractfile(m)
                if f is not None:
                    out[base] = ("file", f.read())
            elif m.issym() and "/" not in m.linkname and SONAME.match(m.linkname):
                out[base] = ("link", m.linkname)
    return out


def _fetch(mirror: str, deb: DebPin, log: Log) -> bytes:
    url = f"{mirror.rstrip('/')}/{deb.file}"
    with log.step(f"fetch {deb.name} ({url})"):
        data = download(url, limit=MAX_DEB)
    got = _hex(data)
    if got != deb.sha256:
        raise EngineError(
            f"{deb.name}: sha256 {got} is not the pinned {deb.sha256}",
            where=url,
            fix="the mirror serves another file: re-pin it after checking why",
        )
    return data


def ensure_prefix(
    lock: Lock,
    pin: SmokePin,
    engine: Engine,
    state: State,
    image: str,
    log: Log,
    *,
    engine_id: str,
) -> Path:
    """The engine directory (site/, lib/) for ``pin``, made with ``image``'s pip once (kept by
    ``image``, its config digest; the engine runs it as ``engine_id``, ``naming.engine_id``)."""
    wheel = pin.engine.wheels[0]
    if lock.twin is None:
        raise ConfigError("the lock pins no [twin]", where=str(lock.path), fix="add [twin]")
    mirror = lock.twin.debian_mirror
    key = _hex("\n".join([wheel.sha256, *(d.sha256 for d in pin.debs), image]).encode())[:20]
    done = state.path("smoke") / key
    if (done / "site").is_dir():
        log.info(f"    smoke engine {wheel.name} {wheel.version}: cached ({done})")
        return done
    done.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="k3env-smoke-req-") as tmp:
        req = Path(tmp) / "requirements.txt"
        req.write_text(wheel.requirement + "\n")
        wheelhouse = download_wheels(req, state, log, pin.platform)
    from k3env.image.wheels import held_files

    path = held_files(wheelhouse).get(wheel.sha256)
    if path is None:
        raise EngineError(
            f"{wheel.name} {wheel.version} is not in the wheelhouse after download",
            where=str(wheelhouse),
            fix="check the pinned sha256",
        )
    build = Path(tempfile.mkdtemp(prefix="k3env-smoke-", dir=done.parent))
    try:
        lib = build / "lib"
        lib.mkdir()
        for deb in pin.debs:
            for base, (kind, value) in libraries_of(_fetch(mirror, deb, log), deb.file).items():
                if kind == "file":
                    assert isinstance(value, bytes)
                    (lib / base).write_bytes(value)
                else:
                    (lib / base).symlink_to(str(value))
        (build / "site").mkdir()
        with log.step(f"install {wheel.name} {wheel.version} with the image's pip (--target)"):
            result = engine.run(
                engine_id,
                ["python3", "-m", "pip", "install", "--no-deps", "--no-index", "--quiet",
                 "--disable-pip-version-check", "--target", "/out/site", f"/wheels/{path.name}"],
                timeout=600,
                mounts={str(wheelhouse): "/wheels"},
                writable={str(build): "/out"},
            )  # fmt: skip
        if result.exit_code != 0:
            raise EngineError(
                f"pip could not install {wheel.name}: {result.stderr.strip()[-600:]}",
                where=image,
                fix="check that the image has pip and the wheel fits its Python",
            )
        build.rename(done)
    finally:
        shutil.rmtree(build, ignore_errors=True)
    return done
