"""An arm64 container under qemu-user on this amd64 engine sees a Grace CPU's identity (not
the build host's x86 one, which crashes PyTorch's aarch64 build as it loads); an amd64
container sees the host's own."""

from __future__ import annotations

import pytest

from k3env.config.lock import load_lock
from k3env.engine.dockerd import DockerEngine
from k3env.image import twin
from k3env.log import Log
from k3env.state import State

from ..conftest import REPO

pytestmark = [pytest.mark.engine]

READ = (
    "uname -m; cat /sys/devices/system/cpu/cpu0/regs/identification/midr_el1; "
    "grep -m1 '^CPU part' /proc/cpuinfo || echo 'no CPU part'"
)


def _stage1(engine: DockerEngine, platform: str) -> str:
    lock = load_lock(REPO / "pins/k3.lock.toml")
    return twin.ensure_stage1(lock, twin.plan(lock, platform), engine, Log(quiet=True), State())


def _arm64_twin(engine: DockerEngine) -> str:
    """The arm64 twin as `k3env twin --platform linux/arm64` builds it: its first stage under
    emulation and its second layer natively, at once. (Stage 1 alone would be built here
    first and the layer after it, serially, by CI's Grace step: minutes more on a cold host.)"""
    lock = load_lock(REPO / "pins/k3.lock.toml")
    return twin.build_twin(lock, engine, State(), Log(quiet=True), "linux/arm64")


def test_an_emulated_arm64_container_reads_a_neoverse_v2_midr(engine: DockerEngine) -> None:
    result = engine.run(_arm64_twin(engine), ["sh", "-c", READ], timeout=300)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines() == ["aarch64", "0x00000000410fd4f0", "CPU part\t: 0xd4f"]


def test_a_native_container_keeps_the_hosts_cpu(engine: DockerEngine) -> None:
    result = engine.run(_stage1(engine, "linux/amd64"), ["sh", "-c", READ], timeout=300)
    lines = result.stdout.splitlines()
    assert lines[0] == "x86_64" and lines[-1] == "no CPU part", result
    assert "410fd4f0" not in result.stdout
