"""The CPU identity an emulated arm64 container sees (engine.emulation)."""

from __future__ import annotations

import os
from pathlib import Path

from k3env.engine.emulation import CPU_SYSFS, CPUINFO, IDENTITIES, cpu_binds
from k3env.state import State


def test_the_native_architecture_and_unknown_ones_get_nothing(tmp_path: Path) -> None:
    state = State(tmp_path)
    assert cpu_binds("amd64", "amd64", state) == {}
    assert cpu_binds("arm64", "arm64", state) == {}
    assert cpu_binds("s390x", "amd64", state) == {}
    assert not (tmp_path / "emulation").exists()


def test_an_arm64_container_on_amd64_sees_a_grace_cpu(tmp_path: Path) -> None:
    state = State(tmp_path)
    binds = cpu_binds("arm64", "amd64", state)
    by_target = {v: Path(k) for k, v in binds.items()}
    assert set(by_target) == {CPUINFO, CPU_SYSFS}
    cores = os.cpu_count() or 1
    # Neoverse V2: implementer 0x41 (Arm), part 0xd4f, as the kernel's sysfs prints MIDR_EL1.
    assert IDENTITIES["arm64"].midr == "0x00000000410fd4f0"
    sysfs = by_target[CPU_SYSFS]
    for i in range(cores):
        midr = sysfs / f"cpu{i}/regs/identification/midr_el1"
        assert midr.read_text() == "0x00000000410fd4f0\n"
    assert not (sysfs / f"cpu{cores}").exists()
    assert (sysfs / "possible").read_text() == f"0-{cores - 1}\n"
    info = by_target[CPUINFO].read_text()
    assert info.count("CPU implementer\t: 0x41\n") == cores
    assert info.count("CPU part\t: 0xd4f\n") == cores
    assert "\nFeatures\t: fp asimd " in info
    # Written once; a second call leaves the files (and their mtimes) as they are.
    before = {p: p.stat().st_mtime_ns for p in sysfs.rglob("*") if p.is_file()}
    assert cpu_binds("arm64", "amd64", state) == binds
    assert {p: p.stat().st_mtime_ns for p in sysfs.rglob("*") if p.is_file()} == before
