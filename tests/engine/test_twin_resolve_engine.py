"""`k3env twin --resolve` against the outside world: the real package index (uv) and the
Debian mirror (debootstrap --download-only). In the real-parts suite, not the unit suite:
it needs the network and takes ~20 s of downloads and resolution."""

from __future__ import annotations

from pathlib import Path

from k3env.cli import main

from ..conftest import REPO
from ..test_twin_resolve import REQ, cpu_torch

__all__ = ["cpu_torch"]  # the fixture, used by name


def test_the_committed_twin_requirements_are_what_the_lock_resolves_to(
    repo: Path, cpu_torch: str
) -> None:
    debs = Path("pins/cpu-twin.debian.txt")
    closures = sorted(Path("pins/variants").glob("*.requirements.txt"))
    assert len(closures) == 2  # dynamo-1.5.1 over vLLM 0.28.0, vllm-0.29.0
    for f in (REQ, debs, *closures):
        f.unlink()
    assert main(["twin", "--resolve", "--find-links", cpu_torch, "-q"]) == 0
    assert REQ.read_bytes() == (REPO / REQ).read_bytes()
    # Each vLLM variant's closure, resolved against the twin's file just written.
    for f in closures:
        assert f.read_bytes() == (REPO / f).read_bytes(), f
    # The Debian set as the mirror serves it (debootstrap --download-only), each .deb by
    # sha256: a bookworm point release shows here first, naming what moved.
    assert debs.read_text() == (REPO / debs).read_text()
    assert main(["lock", "--check", "-q"]) == 0
