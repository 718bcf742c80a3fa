"""`k3env twin --resolve` against the real package index, with uv (no engine).

The lock's `resolved_before` bounds the resolution to what was released before it, so the
committed requirements file is what the lock resolves to on any day.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from k3env.cli import main

from .conftest import replace_in

REQ = Path("pins/cpu-twin.requirements.txt")
WHEELS = "/opt/wheels"  # where this build host keeps the CPU torch wheel (not on PyPI)


@pytest.fixture
def cpu_torch() -> str:
    if not any(Path(WHEELS).glob("torch-2.13.0+cpu-*.whl")):
        if os.environ.get("CI") or os.environ.get("K3ENV_REQUIRE_ENGINE"):
            pytest.fail(f"the CPU torch wheel is expected in {WHEELS} on this build host")
        pytest.skip(f"no CPU torch wheel in {WHEELS}")
    return WHEELS


def test_a_component_pin_whose_sha256_is_not_the_releases_is_refused(
    repo: Path, cpu_torch: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = REQ.read_bytes()
    replace_in(Path("pins/k3.lock.toml"),
               'sha256 = "a20100fd127f1d10ea45d4946b1658a186030e86770344c80dfd256a60192f34"',
               'sha256 = "' + "0" * 64 + '"')  # fmt: skip
    assert main(["twin", "--resolve", "--find-links", cpu_torch]) == 2
    err = capsys.readouterr().err
    assert "the lock pins aiperf 0.13.0 sha256 0000000000000000..." in err
    assert REQ.read_bytes() == before  # nothing written
