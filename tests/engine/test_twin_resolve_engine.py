"""`k3env twin --resolve` against the real package index (uv), at the lock's cut-off: the committed
files are what the lock resolves to on any day, whatever was uploaded since (the cut-off and the
sticky versions, offline, are tests/test_cutoff.py). In the real-parts suite, not the unit
suite: it needs the network and takes ~20 s of downloads and resolution. The Debian package set
is not compared with the mirror here: a mirror that drops a pinned .deb (a point release) is
drift, reported by `k3env outdated` with the bump that takes it, not a failure of an unchanged
commit; the committed set's shape is checked offline, and the twin built from it is checked for
reproducibility by tests/engine/test_twin_engines.py."""

from __future__ import annotations

from pathlib import Path

from k3env.cli import main

from ..conftest import REPO
from ..test_twin_resolve import REQ, cpu_torch

__all__ = ["cpu_torch"]  # the fixture, used by name


def test_the_committed_twin_requirements_are_what_the_lock_resolves_to(
    repo: Path, cpu_torch: str
) -> None:
    """`twin --resolve` on the committed lock gives the committed bytes: its cut-off, and the
    committed versions kept where the inputs allow (an index may show a release later that
    claims an upload time before the cut-off; that is drift, for `outdated` and a bump)."""
    closures = sorted(Path("pins/variants").glob("*.requirements.txt"))
    assert len(closures) == 2  # dynamo-1.5.1 over vLLM 0.28.0, vllm-0.29.0
    arm = Path("pins/cpu-twin.arm64.requirements.txt")
    assert main(["twin", "--resolve", "--find-links", cpu_torch, "-q"]) == 0
    assert REQ.read_bytes() == (REPO / REQ).read_bytes()
    # Each vLLM variant's closure, resolved against the twin's file just written.
    for f in closures:
        assert f.read_bytes() == (REPO / f).read_bytes(), f
    # The Grace twin's, at the same cut-off.
    assert main(["twin", "--resolve", "--platform", "linux/arm64", "-q"]) == 0
    assert arm.read_bytes() == (REPO / arm).read_bytes()
    assert main(["lock", "--check", "-q"]) == 0
