"""Staged images (k3env/handoff/stage.py) and pyxis's importer of them
(k3env/handoff/importer.py), on files: what a job is handed, what is refused in whose words.
tests/engine/test_pyxis_engine.py runs the importer under the real pyxis and Slurm."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import stat
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from k3env.errors import StateError
from k3env.handoff.stage import collect_garbage, stage, staged

DIGEST = "sha256:" + "ab" * 32
PLATFORM = {"x86_64": "linux/amd64", "aarch64": "linux/arm64"}.get(platform.machine(), "")


@pytest.fixture
def sqsh(tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "x.sqsh"
    path.write_bytes(os.urandom(3 << 20))
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def _stage(cache: Path, sqsh: tuple[Path, str], digest: str = DIGEST):  # type: ignore[no-untyped-def]
    return stage(cache, platform=PLATFORM, digest=digest, sqsh=sqsh[0], sha256=sqsh[1],
                 meta={"image": "img", "image_id": "sha256:" + "0" * 64, "lock": "l"})  # fmt: skip


def _importer(cache: Path, tmp: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {"PATH": os.environ["PATH"], "K3ENV_STAGE_CACHE": str(cache),
            "PYXIS_RUNTIME_PATH": str(tmp / "runtime"), "SLURM_JOB_ID": "7",
            "SLURM_STEP_ID": "0", **env}  # fmt: skip
    return subprocess.run([sys.executable, "-m", "k3env.handoff.importer", *args], env=full,
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def test_a_stage_is_written_once_whole_and_world_readable(
    tmp_path: Path, sqsh: tuple[Path, str]
) -> None:
    cache = tmp_path / "cache"
    with ThreadPoolExecutor(4) as pool:  # four stagers of one digest at once
        results = list(pool.map(lambda _: _stage(cache, sqsh), range(4)))
    assert sum(r.copied for r in results) == 1
    (entry,) = staged(cache)
    assert entry.path.read_bytes() == sqsh[0].read_bytes() and entry.size == 3 << 20
    assert stat.S_IMODE(entry.path.stat().st_mode) == 0o644
    assert stat.S_IMODE(entry.path.parent.stat().st_mode) == 0o755
    assert not list(cache.rglob("*.partial"))
    # Bytes that are not the export's are refused, and nothing is left half-written.
    with pytest.raises(StateError, match="its export recorded"):
        _stage(cache, (sqsh[0], "0" * 64), "sha256:" + "cd" * 32)
    assert not list(cache.rglob("*.partial")) and len(staged(cache)) == 1
    # A staged file whose bytes changed is replaced by staging again (the importer's fix).
    entry.path.write_bytes(b"\0" * entry.size)
    assert _stage(cache, sqsh).copied and entry.path.read_bytes() == sqsh[0].read_bytes()


@pytest.mark.skipif(not PLATFORM, reason="the importer knows x86_64 and aarch64 nodes")
def test_the_importer_hands_out_checked_files_and_refuses_the_rest(
    tmp_path: Path, sqsh: tuple[Path, str]
) -> None:
    cache = tmp_path / "cache"
    entry = _stage(cache, sqsh)
    uri = f"docker://127.0.0.1:5000#k3env/img@{DIGEST}"
    got = _importer(cache, tmp_path, "get", uri)
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == str(entry.path) and "sha256 checked" in got.stderr
    assert (entry.path.parent / "holds/7.0").is_file()
    again = _importer(cache, tmp_path, "get", uri)  # this node checked it: size and stat only
    assert "unchanged since this node checked" in again.stderr
    for _ in range(2):  # idempotent
        assert _importer(cache, tmp_path, "release").returncode == 0
    assert not (entry.path.parent / "holds/7.0").exists()
    # A byte changed in place (same size): refused in the importer's words, before any start.
    data = bytearray(entry.path.read_bytes())
    data[1000] ^= 0xFF
    entry.path.write_bytes(bytes(data))
    bad = _importer(cache, tmp_path, "get", uri)
    assert bad.returncode == 1 and bad.stdout == ""
    assert f"the stage recorded {sqsh[1]}: refusing to start it" in bad.stderr
    # Not staged (mode required): fails fast, naming the command that stages it.
    miss = _importer(cache, tmp_path, "get", uri.replace("ab" * 32, "ef" * 32))
    assert miss.returncode == 1 and "is not staged for" in miss.stderr
    assert "run `k3env stage IMAGE --cache" in miss.stderr
    tag = _importer(cache, tmp_path, "get", "docker://127.0.0.1:5000#k3env/img:latest")
    assert tag.returncode == 1 and "names a tag, no digest" in tag.stderr


def test_with_a_key_the_importer_starts_only_a_signed_stage(
    tmp_path: Path, sqsh: tuple[Path, str]
) -> None:
    """K3ENV_STAGE_KEY: the staged SBOM and statement must be the key's, the statement's
    subject the staged file; a stage without them, another key, an edited SBOM: refused."""
    from k3env.handoff.attest import SBOM_SUFFIX, SIG_SUFFIX, STATEMENT_SUFFIX, statement
    from k3env.hashing import digest_hex, sha256_digest
    from k3env.signing import envelope

    from .test_attest import keypair

    key, _, pub = keypair(tmp_path, "k3env")
    _, _, other = keypair(tmp_path, "other")
    uri = f"docker://127.0.0.1:5000#k3env/img@{DIGEST}"
    bare = tmp_path / "bare"
    _stage(bare, sqsh)
    refused = _importer(bare, tmp_path, "get", uri, K3ENV_STAGE_KEY=str(pub))
    assert refused.returncode == 1 and "has no signed SBOM and provenance" in refused.stderr
    assert _importer(bare, tmp_path, "get", uri).returncode == 0  # no key: as before
    sbom = b'{"bomFormat": "CycloneDX"}\n'
    path = sqsh[0]
    path.with_name(path.name + SBOM_SUFFIX).write_bytes(sbom)
    path.with_name(path.name + SIG_SUFFIX).write_text(key.sign(sbom) + "\n")
    said = statement(path, sqsh[1], {"image": "img"}, digest_hex(sha256_digest(sbom)))
    path.with_name(path.name + STATEMENT_SUFFIX).write_bytes(envelope(key, said))
    cache = tmp_path / "cache"
    entry = _stage(cache, sqsh)
    staged = json.loads((entry.path.parent / "entry.json").read_text())
    assert staged["attested"] == ["sbom.cdx.json", "sbom.cdx.json.sig", "statement.intoto.json"]
    good = _importer(cache, tmp_path, "get", uri, K3ENV_STAGE_KEY=str(pub))
    assert good.returncode == 0, good.stderr
    assert "SBOM and provenance signed by K3ENV_STAGE_KEY; sha256 checked" in good.stderr
    wrong = _importer(cache, tmp_path, "get", uri, K3ENV_STAGE_KEY=str(other))
    assert wrong.returncode == 1 and "the SBOM is not signed by K3ENV_STAGE_KEY" in wrong.stderr
    (entry.path.parent / "sbom.cdx.json").write_bytes(sbom.replace(b"Cyclone", b"Other"))
    edited = _importer(cache, tmp_path, "get", uri, K3ENV_STAGE_KEY=str(pub))
    assert edited.returncode == 1 and "not signed by K3ENV_STAGE_KEY" in edited.stderr


def test_garbage_collection_keeps_what_a_job_holds(tmp_path: Path, sqsh: tuple[Path, str]) -> None:
    cache = tmp_path / "cache"
    held = _stage(cache, sqsh)
    free = _stage(cache, sqsh, "sha256:" + "cd" * 32)
    (held.path.parent / "holds/9.0").write_text("img\n")
    removed, kept = collect_garbage(cache, max_age=0.0, max_bytes=None, now=free.staged_at + 10)
    assert [s.digest for s in removed] == [free.digest]
    assert [s.digest for s in kept] == [held.digest] and held.path.is_file()
