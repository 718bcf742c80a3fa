"""Pinned wheels into a layer for another architecture: pip run natively with the base's
platform tags gives the very tree (files, modes, mtimes, RECORD, scripts, .pyc bytes) that
the same install gives under qemu-user in the base itself; and without the tags the native
pip refuses the foreign wheel, so the tags are what makes it install."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import zipfile
from pathlib import Path

import pytest

from k3env.config.lock import load_lock
from k3env.engine.dockerd import DockerEngine
from k3env.errors import EngineError
from k3env.image import twin, twindebian
from k3env.image.install import Native, install_tree
from k3env.image.wheels import platform_tags
from k3env.log import Log
from k3env.state import State

from ..conftest import REPO

pytestmark = [pytest.mark.engine]

ARM, AMD = "linux/arm64", "linux/amd64"
NAME, VERSION, TAG = "k3arch", "1.0", "cp311-cp311-manylinux_2_17_aarch64"
FILES = {
    "k3arch/__init__.py": "VALUE = {'a': (1, 2.5, 'x' * 3), 'b': frozenset({1, 2})}\n\n"
    "def main():\n    print('k3arch', VALUE)\n",
    "k3arch/sub/mod.py": "import sys\n\nclass C:\n    def f(self, *a, **k):\n"
    "        return [x for x in a if x] or sys.version\n",
    f"{NAME}-{VERSION}.data/scripts/k3arch-tool": "#!python\nprint('tool')\n",
    f"{NAME}-{VERSION}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {NAME}\n"
    f"Version: {VERSION}\n",
    f"{NAME}-{VERSION}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: k3env-test\n"
    f"Root-Is-Purelib: false\nTag: {TAG}\n",
    f"{NAME}-{VERSION}.dist-info/entry_points.txt": "[console_scripts]\nk3arch = k3arch:main\n",
}


def _wheel(directory: Path) -> Path:
    """A compiled-looking wheel for aarch64 only (its tag is all that makes it foreign)."""
    path = directory / f"{NAME}-{VERSION}-{TAG}.whl"
    record = []
    with zipfile.ZipFile(path, "w") as z:
        for name, text in FILES.items():
            data = text.encode()
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            record.append(f"{name},sha256={digest.decode()},{len(data)}")
            z.writestr(name, data)
        record.append(f"{NAME}-{VERSION}.dist-info/RECORD,,")
        z.writestr(f"{NAME}-{VERSION}.dist-info/RECORD", "\n".join(record) + "\n")
    return path


def _tree(root: Path) -> dict[str, tuple[int, int, bytes]]:
    """Path -> (mode, mtime, bytes); a directory's mtime is left out (the layer writer dates
    every directory itself)."""
    out = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        data = os.readlink(path).encode() if path.is_symlink() else b""
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
        mtime = 0 if path.is_dir() and not path.is_symlink() else int(st.st_mtime)
        out[path.relative_to(root).as_posix()] = (st.st_mode, mtime, data)
    return out


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory, engine: DockerEngine) -> tuple[Path, Path]:
    """A wheelhouse of the pinned pip and the aarch64 wheel, and its requirements file."""
    lock = load_lock(REPO / "pins/k3.lock.toml")
    held = sorted(State().path("wheels").glob("pip-*.whl"))
    if not held:  # the twin's wheelhouse holds the pinned pip once the twin was built
        from k3env.image.wheels import download_wheels

        download_wheels(twin.plan(lock, ARM).requirements, State(), Log(quiet=True), ARM)
        held = sorted(State().path("wheels").glob("pip-*.whl"))
    house = tmp_path_factory.mktemp("wheels")
    shutil.copy(held[-1], house)
    wheel = _wheel(house)
    req = tmp_path_factory.mktemp("req") / "requirements.txt"
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    req.write_text(f"{NAME}=={VERSION} --hash=sha256:{sha}\n")
    return house, req


def _install(engine: DockerEngine, wheels: tuple[Path, Path], tmp: Path, image: str,
             native: Native | None) -> tuple[Path, dict[str, object]]:  # fmt: skip
    house, req = wheels
    out, meta = tmp / "out", tmp / "meta"
    out.mkdir(parents=True)
    meta.mkdir()
    info = install_tree(
        engine, image, "python3", requirements=req, wheelhouse=house, out=out, meta=meta,
        epoch=1764460800, pyc="TIMESTAMP", pip_from_wheel=True, replace=(),
        log=Log(quiet=True), where="test", native=native,
    )  # fmt: skip
    return out, info


def test_a_native_install_for_arm64_is_the_emulated_one_byte_for_byte(
    engine: DockerEngine, wheelhouse: tuple[Path, Path], tmp_path: Path
) -> None:
    lock = load_lock(REPO / "pins/k3.lock.toml")
    arm = twin.ensure_stage1(lock, twin.plan(lock, ARM), engine, Log(quiet=True), State())
    amd = twin.ensure_stage1(lock, twin.plan(lock, AMD), engine, Log(quiet=True), State())
    emulated, info_e = _install(engine, wheelhouse, tmp_path / "e", arm, None)
    native = Native(image=amd, platform_tags=tuple(platform_tags(ARM)))
    natively, info_n = _install(engine, wheelhouse, tmp_path / "n", arm, native)
    a, b = _tree(emulated), _tree(natively)
    assert a == b
    assert info_e == info_n and info_n["dirs"]  # the arm64 base's own directory modes
    pycs = [p for p in b if p.endswith(".pyc")]
    assert len(pycs) == 2, sorted(b)  # both modules compiled, to the same bytes
    script = b["usr/local/bin/k3arch-tool"][2]
    assert script.startswith(b"#!/usr/bin/python3\n")  # the shebang pip writes for the base
    assert "usr/local/bin/k3arch" in b and any(p.endswith("/RECORD") for p in b)


def test_without_the_platform_tags_the_native_pip_refuses_the_arm64_wheel(
    engine: DockerEngine, wheelhouse: tuple[Path, Path], tmp_path: Path
) -> None:
    lock = load_lock(REPO / "pins/k3.lock.toml")
    amd = twin.ensure_stage1(lock, twin.plan(lock, AMD), engine, Log(quiet=True), State())
    with pytest.raises(EngineError, match=r"No matching distribution found for k3arch==1\.0"):
        _install(engine, wheelhouse, tmp_path, amd, None)


def test_the_committed_twins_share_one_debian_python_release() -> None:
    """What lets the arm64 twin's install run natively: the same Debian Python packages."""
    lock = load_lock(REPO / "pins/k3.lock.toml")
    arm, amd = twin.plan(lock, ARM), twin.plan(lock, AMD)
    assert arm.debian is not None and amd.debian is not None
    a = twindebian.python_release(twindebian.read_debian_list(arm.debian))
    b = twindebian.python_release(twindebian.read_debian_list(amd.debian))
    assert a == b and a["python3.11-minimal"].startswith("3.11.")
