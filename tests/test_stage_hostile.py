"""The stage cache as strangers share it (docs/threat-model.md "Staged images: who may write
where"): at each path the stager and pyxis's importer touch, a planted symlink, FIFO, hard link or
another user's file is refused or replaced, never followed, opened, served or changed; nothing
outside the cache is created, written or chmodded; nothing hangs; no traceback. The importer runs
as a second, unprivileged user (``runuser``), as a job's importer does; the planted files are a
third user's. tests/engine/test_pyxis_engine.py runs the same importer under Slurm and pyxis.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import REPO

DIGEST = "sha256:" + "ab" * 32
MACHINE = {"x86_64": "linux_amd64", "aarch64": "linux_arm64"}.get(platform.machine(), "")
JOB, STRANGER = "k3env-job", "k3env-stranger"
SYSTEM_PYTHON = "/usr/bin/python3"  # a job's user cannot run the test's (root's) interpreter
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not MACHINE or not shutil.which("runuser")
    or not Path(SYSTEM_PYTHON).is_file(),
    reason="plants other users' files and runs the importer as another user: root, runuser, "
    "x86_64/aarch64, the system's python3",
)  # fmt: skip


def _user(name: str) -> int:
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/bin/sh", name],
                       check=True)  # fmt: skip
        return pwd.getpwnam(name).pw_uid


@pytest.fixture(scope="module")
def users() -> dict[str, int]:
    return {JOB: _user(JOB), STRANGER: _user(STRANGER)}


@pytest.fixture(scope="module")
def package() -> Iterator[Path]:
    """k3env's source where any user can read it (a job's importer is installed on the nodes)."""
    where = Path(tempfile.mkdtemp(prefix="k3env-pkg-"))
    shutil.copytree(REPO / "k3env", where / "k3env",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    for d, _, files in os.walk(where):
        os.chmod(d, 0o755)
        for f in files:
            os.chmod(os.path.join(d, f), 0o644)
    yield where
    shutil.rmtree(where)


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory every user can reach (pytest's tmp_path is root's, 0700): the cache's
    parent, the outside directory the planted links point at, and the job's TMPDIR."""
    where = Path(tempfile.mkdtemp(prefix="k3env-shared-"))
    where.chmod(0o755)
    (where / "tmp").mkdir(mode=0o1777)
    (where / "tmp").chmod(0o1777)
    (where / "runtime").mkdir(mode=0o755)  # pyxis's runtime path: root's, 0755
    outside = where / "outside"
    outside.mkdir(mode=0o700)
    (outside / "secret").write_bytes(b"not the cache's\n")
    yield where
    shutil.rmtree(where)


def _env(shared: Path, package: Path, cache: Path, **extra: str) -> dict[str, str]:
    return {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONPATH": str(package),
            "K3ENV_STAGE_CACHE": str(cache), "PYXIS_RUNTIME_PATH": str(shared / "runtime"),
            "TMPDIR": str(shared / "tmp"), "SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0",
            "PYTHONDONTWRITEBYTECODE": "1", **extra}  # fmt: skip


def importer(
    shared: Path, package: Path, cache: Path, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    """``k3env-pyxis-importer ARGS`` as the job's user (a FIFO's hang fails the timeout)."""
    argv = ["runuser", "-u", JOB, "--", SYSTEM_PYTHON, "-m", "k3env.handoff.importer", *args]
    return subprocess.run(argv, env=_env(shared, package, cache, **env), capture_output=True,
                          text=True, timeout=60, cwd="/")  # fmt: skip


_STAGER = """
import json, sys
from pathlib import Path
from k3env.errors import K3envError
from k3env.handoff.stage import stage
cache, sqsh, sha = sys.argv[1:4]
try:
    s = stage(Path(cache), platform=sys.argv[4], digest=sys.argv[5], sqsh=Path(sqsh), sha256=sha,
              meta={"image": "img", "image_id": "", "lock": "l"})
except K3envError as e:
    print(e.render(), file=sys.stderr)
    sys.exit(e.return_code)
print(json.dumps(s.as_json()))
"""


def stager(
    shared: Path, package: Path, cache: Path, sqsh: Path
) -> subprocess.CompletedProcess[str]:
    """``stage`` as root (the cache's owner), in a process of its own (a hang fails the
    timeout)."""
    sha = hashlib.sha256(sqsh.read_bytes()).hexdigest()
    argv = [sys.executable, "-c", _STAGER, str(cache), str(sqsh), sha, "linux/" + MACHINE[6:],
            DIGEST]  # fmt: skip
    return subprocess.run(argv, env=_env(shared, package, cache), capture_output=True, text=True,
                          timeout=60)  # fmt: skip


def k3env(shared: Path, package: Path, cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "k3env", *args]
    return subprocess.run(argv, env=_env(shared, package, cache), capture_output=True, text=True,
                          timeout=60, cwd=shared)  # fmt: skip


def snapshot(where: Path) -> dict[str, tuple[int, int, int, bytes]]:
    """Every entry under ``where`` (and itself): mode, owner, size, and a regular file's
    bytes; links not followed."""
    out = {}
    for d, dirs, files in os.walk(where):
        for name in [".", *dirs, *files]:
            p = Path(d) / name
            st = p.lstat()
            data = p.read_bytes() if stat.S_ISREG(st.st_mode) else b""
            out[str(p)] = (st.st_mode, st.st_uid, st.st_size, data)
    return out


@pytest.fixture
def sqsh(shared: Path) -> Path:
    path = shared / "x.sqsh"
    path.write_bytes(os.urandom(1 << 20))
    return path


PLACES = {  # the place -> its path under the cache ("" is the cache root)
    "root": "",
    "platform": MACHINE,
    "entry": f"{MACHINE}/{'ab' * 32}",
    "entry.json": f"{MACHINE}/{'ab' * 32}/entry.json",
    "image.sqsh": f"{MACHINE}/{'ab' * 32}/image.sqsh",
    "holds": f"{MACHINE}/{'ab' * 32}/holds",
    ".locks": ".locks",
    "lock": f".locks/{'ab' * 32}.lock",
}
DIRS = {"root", "platform", "entry", "holds", ".locks"}
CASES = [(p, k) for p in PLACES for k in ("symlink", "fifo", "hardlink", "owner")
         if not (k == "hardlink" and p in DIRS)]  # fmt: skip


def plant(cache: Path, place: str, how: str, outside: Path, stranger: int) -> None:
    target = cache / PLACES[place] if PLACES[place] else cache
    if how == "owner":
        os.chown(target, stranger, stranger, follow_symlinks=False)
        return
    if target.is_dir():
        shutil.rmtree(target)
    else:
        target.unlink()
    if how == "symlink":
        target.symlink_to(outside if place in DIRS else outside / "secret")
    elif how == "fifo":
        os.mkfifo(target, 0o666)
    else:  # a hard link to a file of the cache's owner outside the cache
        os.link(outside / "secret", target)


@pytest.mark.parametrize(("place", "how"), CASES)
def test_a_planted_file_is_refused_or_replaced_never_followed(
    place: str, how: str, shared: Path, package: Path, sqsh: Path, users: dict[str, int]
) -> None:
    cache = shared / "cache"
    first = stager(shared, package, cache, sqsh)
    assert first.returncode == 0, first.stderr
    os.chmod(cache / PLACES["holds"], 0o1777)
    uri = f"docker://127.0.0.1:5000#k3env/img@{DIGEST}"
    served = importer(shared, package, cache, "get", uri)
    assert served.returncode == 0, served.stderr  # the cache as staged: served
    assert importer(shared, package, cache, "release").returncode == 0
    outside = shared / "outside"
    plant(cache, place, how, outside, users[STRANGER])
    before = snapshot(outside)

    got = importer(shared, package, cache, "get", uri)
    for done in (got,):
        assert "Traceback" not in done.stderr, done.stderr
    if (place, how) == ("root", "owner"):  # its owner is the cache's owner (docs): trusted
        assert got.returncode == 0, got.stderr
    else:
        assert got.returncode == 1 and got.stdout == "", (got.stdout, got.stderr)
        assert "refused" in got.stderr or "not staged" in got.stderr, got.stderr
    released = importer(shared, package, cache, "release")
    again = stager(shared, package, cache, sqsh)
    replaced = (cache / PLACES[place]).is_file() and not (cache / PLACES[place]).is_symlink()
    listed = k3env(shared, package, cache, "stage", "--list", "--cache", str(cache), "--json")
    gc = k3env(shared, package, cache, "stage", "--gc", "--max-age", "0", "--cache", str(cache),
               "--json")  # fmt: skip
    for done in (released, again, listed, gc):
        assert "Traceback" not in done.stderr, done.stderr
    assert snapshot(outside) == before  # nothing outside created, written or chmodded
    assert stat.S_IMODE(outside.stat().st_mode) == 0o700
    if place in ("entry.json", "image.sqsh"):  # in a directory the stager owns: staged again
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout)["copied"] is True
        assert replaced
    else:  # a directory it would write into: refused, with why
        assert again.returncode == 4, (again.stdout, again.stderr)
        assert "refused" in again.stderr
    for done in (listed, gc):
        if done.returncode == 0:
            json.loads(done.stdout, parse_constant=_strict)


def _strict(name: str) -> Any:
    raise AssertionError(f"{name} in JSON output")


def _staged(shared: Path, package: Path, sqsh: Path) -> tuple[Path, Path, str]:
    cache = shared / "cache"
    done = stager(shared, package, cache, sqsh)
    assert done.returncode == 0, done.stderr
    return cache, cache / PLACES["entry"], f"docker://127.0.0.1:5000#k3env/img@{DIGEST}"


def test_a_file_rewritten_in_place_with_its_mtime_set_back_is_hashed_again(
    shared: Path, package: Path, sqsh: Path, users: dict[str, int]
) -> None:
    cache, entry, uri = _staged(shared, package, sqsh)
    assert "sha256 checked" in importer(shared, package, cache, "get", uri).stderr
    assert "unchanged since" in importer(shared, package, cache, "get", uri).stderr
    image = entry / "image.sqsh"
    st = image.stat()
    with open(image, "r+b") as f:  # same inode, same size, mtime restored: only ctime moves
        f.seek(4096)
        f.write(b"\xff" * 16)
    os.utime(image, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (image.stat().st_ino, image.stat().st_mtime_ns) == (st.st_ino, st.st_mtime_ns)
    got = importer(shared, package, cache, "get", uri)
    assert got.returncode == 1 and "refusing to start it" in got.stderr, got.stderr


def _rewrite_entry(entry: Path, **fields: Any) -> None:
    doc = json.loads((entry / "entry.json").read_text())
    text = json.dumps({**doc, **fields})  # json.dumps writes NaN: what a forger can write
    (entry / "entry.json").write_text(text)


def test_a_non_finite_number_or_an_escape_in_an_entry_never_reaches_output(
    shared: Path, package: Path, sqsh: Path, users: dict[str, int]
) -> None:
    cache, entry, uri = _staged(shared, package, sqsh)
    forged = "img\x1b[2K\r\nk3env-pyxis-importer: all good\x07"
    _rewrite_entry(entry, image=forged)
    got = importer(shared, package, cache, "get", uri)
    assert got.returncode == 0, got.stderr
    assert "\x1b" not in got.stderr and "\x07" not in got.stderr
    assert got.stderr.count("\n") == 1 and "\\x1b[2K\\r\\n" in got.stderr
    human = k3env(shared, package, cache, "stage", "--list", "--cache", str(cache))
    assert human.returncode == 0 and "\x1b" not in human.stdout and "\\x1b" in human.stdout
    for value in (float("nan"), float("-inf"), 1e999):
        _rewrite_entry(entry, image="img", staged_at=value)
        for args in (["--list"], ["--gc", "--max-age", "0"]):
            done = k3env(shared, package, cache, "stage", *args, "--cache", str(cache), "--json")
            assert done.returncode == 0, done.stderr
            doc = json.loads(done.stdout, parse_constant=_strict)
            if args == ["--list"]:
                (refused,) = doc["refused"]
                assert "not a finite number" in refused["why"] and doc["staged"] == []
        got = importer(shared, package, cache, "get", uri)
        assert got.returncode == 1 and "not a finite number" in got.stderr, got.stderr
    bad = k3env(shared, package, cache, "stage", "--gc", "--max-age", "nan", "--cache", str(cache))
    assert bad.returncode == 2 and "not a bound" in bad.stderr


_MEASURED = """
import resource, runpy, sys
sys.argv = ["k3env-pyxis-importer", *sys.argv[1:]]
try:
    runpy.run_module("k3env.handoff.importer", run_name="__main__")
finally:
    print(f"maxrss_kib={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}", file=sys.stderr)
"""


def _measured(shared: Path, package: Path, cache: Path, *args: str, **env: str) -> tuple[
    subprocess.CompletedProcess[str], int
]:  # fmt: skip
    argv = ["runuser", "-u", JOB, "--", SYSTEM_PYTHON, "-c", _MEASURED, *args]
    done = subprocess.run(argv, env=_env(shared, package, cache, **env), capture_output=True,
                          text=True, timeout=60, cwd="/")  # fmt: skip
    rss = int(done.stderr.rsplit("maxrss_kib=", 1)[1])
    return done, rss


def test_with_a_key_a_huge_sbom_or_a_deep_statement_is_refused_within_memory(
    shared: Path, package: Path, sqsh: Path, users: dict[str, int]
) -> None:
    """K3ENV_STAGE_KEY: the staged SBOM and statement are read; a 1 GiB SBOM (sparse) and a
    10,000-deep statement are refused in words, peak RSS under 512 MB, no traceback."""
    from .test_attest import keypair

    cache, entry, uri = _staged(shared, package, sqsh)
    key, _, pub = keypair(shared, "k3env")
    pub.chmod(0o644)
    for name in ("sbom.cdx.json.sig", "statement.intoto.json"):
        (entry / name).write_text("{}\n")
    with open(entry / "sbom.cdx.json", "wb") as f:
        f.truncate(1 << 30)
    done, rss = _measured(shared, package, cache, "get", uri, K3ENV_STAGE_KEY=str(pub))
    assert done.returncode == 1 and "over the" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and rss < 512 << 10, rss
    (entry / "sbom.cdx.json").write_bytes(b"{}\n")
    (entry / "sbom.cdx.json.sig").write_text(key.sign(b"{}\n") + "\n")
    (entry / "statement.intoto.json").write_text("[" * 10_000 + "]" * 10_000)
    done, rss = _measured(shared, package, cache, "get", uri, K3ENV_STAGE_KEY=str(pub))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "the provenance statement is refused" in done.stderr, done.stderr
    assert rss < 512 << 10, rss
