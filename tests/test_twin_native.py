"""When the arm64 twin's wheels may be unpacked and byte-compiled natively: only when this
host's twin has the very Debian Python release the arm64 twin pins (the .pyc bytes depend on
the CPython release, not on the CPU); otherwise every step runs under emulation."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from k3env.cli import main
from k3env.config.lock import load_lock
from k3env.image import twin, twindebian
from k3env.log import Log

from .conftest import replace_in

ARM = "linux/arm64"


def test_the_python_packages_are_told_apart_from_the_rest() -> None:
    debs = twindebian.read_debian_list(Path(__file__).parent.parent / "pins/cpu-twin.debian.txt")
    release = twindebian.python_release(debs)
    assert set(release) == {
        "libpython3-stdlib", "libpython3.11-minimal", "libpython3.11-stdlib", "python3",
        "python3-minimal", "python3.11", "python3.11-minimal",
    }  # fmt: skip
    assert "perl-base" not in release and "libc6" not in release


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the helper is for an x86_64 host")
def test_another_python_release_on_arm64_installs_under_emulation(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    arm = repo / "pins/cpu-twin.arm64.debian.txt"
    replace_in(
        arm,
        "python3.11-minimal 3.11.2-6+deb12u8 arm64",
        "python3.11-minimal 3.11.2-6+deb12u9 arm64",
    )
    assert main(["lock", "--update-hashes", "-q"]) == 0
    lock = load_lock(repo / "pins/k3.lock.toml")
    log = Log()
    # No engine is asked: the releases differ, so there is no native image to run in.
    assert twin.native_helper(lock, twin.plan(lock, ARM), engine=None, log=log) is None  # type: ignore[arg-type]
    assert (
        "Debian Python is not linux/arm64's: installing under emulation" in capsys.readouterr().err
    )
