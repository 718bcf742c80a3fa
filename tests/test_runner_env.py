"""A sealed build step sees the host's PATH and proxies, then what k3env gives it; nothing
else of the shell k3env was started from (a real child, /usr/bin/env, prints what it got).

The real paths: the twin built on a second engine from a hostile shell
(``tests/engine/test_twin_engines.py``) and an export from `nix develop`'s
SOURCE_DATE_EPOCH (``tests/engine/test_handoff_engine.py``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from k3env.errors import ToolError
from k3env.log import Log
from k3env.runner import HOST_KEYS, run, run_streaming

ENV = "/usr/bin/env"

# What a developer's or a CI's shell carries that changes a build step's output.
SHELL = {
    "PYTHONDONTWRITEBYTECODE": "1",
    "SOURCE_DATE_EPOCH": "315532800",
    "TAR_OPTIONS": "--mtime=@0",
    "GIT_DIR": "/elsewhere/.git",
    "LANG": "de_DE.UTF-8",
    "TZ": "America/New_York",
    "http_proxy": "http://proxy.example:3128",
    "PATH": "/usr/local/bin:/usr/bin:/bin",
}


def _env(text: str) -> dict[str, str]:
    got = dict(line.split("=", 1) for line in text.splitlines() if line)
    got.pop("PYTEST_CURRENT_TEST", None)  # pytest's own, set after the fixture
    return got


@pytest.fixture
def shell(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        monkeypatch.delenv(name)
    for name, value in SHELL.items():
        monkeypatch.setenv(name, value)


def test_a_sealed_step_sees_the_hosts_path_and_proxy_then_its_own(shell: None) -> None:
    got = _env(run([ENV], Log(), capture=True, env={"TZ": "UTC", "LC_ALL": "C.UTF-8"},
                   sealed=True))  # fmt: skip
    assert got == {
        "PATH": SHELL["PATH"],
        "http_proxy": SHELL["http_proxy"],
        "TZ": "UTC",
        "LC_ALL": "C.UTF-8",
    }


def test_a_sealed_step_without_its_own_env_still_drops_the_shells(shell: None) -> None:
    got = _env(run([ENV], Log(), capture=True, sealed=True))
    assert set(got) == {"PATH", "http_proxy"} <= set(HOST_KEYS)


def test_an_unsealed_step_keeps_the_shell_under_its_own(shell: None) -> None:
    # (what else the test process has set meanwhile passes too: COLUMNS under -vv)
    got = _env(run([ENV], Log(), capture=True, env={"TZ": "UTC"}))
    assert got.items() >= {**SHELL, "TZ": "UTC"}.items()
    assert _env(run([ENV], Log(), capture=True)).items() >= SHELL.items()


def test_a_sealed_streaming_step_is_sealed_too(shell: None) -> None:
    got = _env(run_streaming([ENV], [b""], Log(), env={"TZ": "UTC"}, sealed=True))
    assert got == {"PATH": SHELL["PATH"], "http_proxy": SHELL["http_proxy"], "TZ": "UTC"}


def test_mksquashfs_refuses_the_shells_epoch_beside_its_own_time(
    shell: None, tmp_path: Path
) -> None:
    """The fact the sealing answers (squashfs-tools 4.5.1's own words): unsealed, an export's
    mksquashfs fails in a shell that exports SOURCE_DATE_EPOCH; sealed, it writes."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_text("a")
    argv = ["mksquashfs", str(src), str(tmp_path / "x.sqsh"), "-noappend", "-quiet",
            "-no-progress", "-mkfs-time", "5"]  # fmt: skip
    with pytest.raises(ToolError, match="SOURCE_DATE_EPOCH and command line options can't"):
        run(argv, Log(), capture=True, env={"TZ": "UTC"})
    run(argv, Log(), capture=True, env={"TZ": "UTC"}, sealed=True)
    assert (tmp_path / "x.sqsh").stat().st_size > 0
