"""What a container of another architecture must see of its CPU, run under qemu-user.

Under binfmt_misc and qemu-user a container's programs are aarch64, but ``/proc/cpuinfo``
and ``/sys/devices/system/cpu`` are still the build host's (x86_64): no aarch64 machine has
them. PyTorch's aarch64 build reads its CPU's identity as it loads (oneDNN's xbyak_aarch64
reads ``MIDR_EL1`` from sysfs; the cpuinfo library parses ``/proc/cpuinfo``). Measured here
with torch 2.13.0 under Debian's qemu-user 7.2: ``import torch`` prints "Can't open MIDR_EL1
sysfs entry", dies of SIGSEGV, and qemu then hangs writing the core, so a probe never
answers. With a Grace CPU's identity in their place, ``import torch`` takes 14 s and the
vLLM serve CLI 27 s.

So an emulated container sees the identity of the CPU its platform's clusters have (Grace:
Arm Neoverse V2), one entry per build-host core, from files k3env writes and binds read-only
over those two paths. It changes what the CPU says it is, never a file of the image: verify's
evidence about the image's files, parsers and environment is unaffected.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from k3env.files import write_atomic
from k3env.state import State


@dataclass(frozen=True, kw_only=True)
class CpuIdentity:
    name: str
    implementer: int
    part: int
    features: str  # /proc/cpuinfo's Features line

    @property
    def midr(self) -> str:
        """``MIDR_EL1`` as sysfs prints it (implementer, architecture 0xf, part)."""
        return f"0x{(self.implementer << 24) | (0xF << 16) | (self.part << 4):016x}"


# By image architecture (the OCI config's ``architecture``).
IDENTITIES = {
    "arm64": CpuIdentity(
        name="Arm Neoverse V2 (NVIDIA Grace)",
        implementer=0x41,
        part=0xD4F,
        features="fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid "
        "asimdrdm jscvt fcma lrcpc dcpop sha3 sm3 sm4 asimddp sha512 asimdfhm dit uscat ilrcpc "
        "flagm ssbs sb dcpodp flagm2 frint i8mm bf16 bti",
    ),
}
CPUINFO, CPU_SYSFS = "/proc/cpuinfo", "/sys/devices/system/cpu"


def cpuinfo_text(cpu: CpuIdentity, cores: int) -> str:
    return "".join(
        f"processor\t: {i}\nBogoMIPS\t: 2000.00\nFeatures\t: {cpu.features}\n"
        f"CPU implementer\t: 0x{cpu.implementer:02x}\nCPU architecture: 8\n"
        f"CPU variant\t: 0x0\nCPU part\t: 0x{cpu.part:03x}\nCPU revision\t: 0\n\n"
        for i in range(cores)
    )


def sysfs_files(cpu: CpuIdentity, cores: int) -> dict[str, str]:
    """Relative path -> content of the ``/sys/devices/system/cpu`` tree."""
    every = f"0-{cores - 1}\n"
    out = {"possible": every, "present": every, "online": every, "kernel_max": "4095\n"}
    for i in range(cores):
        at = f"cpu{i}"
        out |= {
            f"{at}/online": "1\n",
            f"{at}/regs/identification/midr_el1": cpu.midr + "\n",
            f"{at}/regs/identification/revidr_el1": f"0x{0:016x}\n",
            f"{at}/topology/core_id": f"{i}\n",
            f"{at}/topology/physical_package_id": "0\n",
            f"{at}/topology/thread_siblings_list": f"{i}\n",
            f"{at}/topology/core_siblings_list": every,
        }
    return out


def cpu_binds(architecture: str, native: str, state: State | None = None) -> dict[str, str]:
    """Host path -> container path to bind read-only into a container of ``architecture``
    on an engine whose own is ``native``: nothing for the native one, or for an architecture
    k3env has no identity of."""
    cpu = IDENTITIES.get(architecture)
    if architecture == native or cpu is None:
        return {}
    cores = os.cpu_count() or 1
    root = (state or State()).path("emulation", f"{architecture}-{cores}")
    files = {"cpuinfo": cpuinfo_text(cpu, cores)} | {
        f"sys/{k}": v for k, v in sysfs_files(cpu, cores).items()
    }
    for rel, text in files.items():
        path = root / rel
        if not path.is_file() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, text.encode())
    return {str(root / "cpuinfo"): CPUINFO, str(Path(root, "sys")): CPU_SYSFS}
