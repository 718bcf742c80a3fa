"""Cluster handoff on a real registry and real squashfs-tools: push by digest, export, check."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from pathlib import Path

import pytest

from k3env.cli import main
from k3env.engine.dockerd import DockerEngine
from k3env.state import State

from .conftest import REGISTRY

pytestmark = [pytest.mark.engine, pytest.mark.registry]

LOCK = "pins/test.lock.toml"


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    code = main([*argv, "--lock", LOCK, "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    out: dict[str, object] = json.loads(captured.out)
    return out


def registry_digest(reference: str) -> str:
    repo, tag = reference.split("/", 1)[1].rsplit(":", 1)
    request = urllib.request.Request(
        f"http://{REGISTRY}/v2/{repo}/manifests/{tag}",
        method="HEAD",
        headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return str(response.headers["Docker-Content-Digest"])


def test_push_records_the_registry_digest_and_skips_present_layers(
    project: Path, capsys: pytest.CaptureFixture[str], clean_probe_images: None
) -> None:
    first = run_json(capsys, "push")["images"][0]  # type: ignore[index]
    assert first["digest"] == registry_digest(first["reference"])
    # The base was pushed before (by digest, as the lock pins it): only the new layer is sent.
    assert first["layers_sent"] <= 1 and first["layers_skipped"] >= 1
    record = State().read_json("pushed", first["image_id"].removeprefix("sha256:") + ".json")
    assert record["digest"] == first["digest"]
    assert first["enroot_uri"] == f"docker://{REGISTRY}#{first['by_digest'].split('/', 1)[1]}"
    again = run_json(capsys, "push")["images"][0]  # type: ignore[index]
    assert again["digest"] == first["digest"] and again["layers_sent"] == 0


def test_push_to_a_registry_that_is_down_leaves_no_record(
    project: Path, capsys: pytest.CaptureFixture[str], clean_probe_images: None
) -> None:
    assert main(["push", "--lock", LOCK, "--registry", "127.0.0.1:5999"]) == 3
    assert "push failed" in capsys.readouterr().err
    assert not State().path("pushed").exists() or not any(State().path("pushed").iterdir())


def test_export_is_deterministic_and_carries_env_and_patches(
    project: Path, capsys: pytest.CaptureFixture[str], clean_probe_images: None
) -> None:
    a = run_json(capsys, "export", "--out", "a")["images"][0]  # type: ignore[index]
    b = run_json(capsys, "export", "--out", "b")["images"][0]  # type: ignore[index]
    assert a["sha256"] == b["sha256"]
    assert Path(a["path"]).read_bytes() == Path(b["path"]).read_bytes()
    sqsh = a["path"]

    def cat(path: str) -> str:
        return subprocess.run(
            ["unsquashfs", "-cat", sqsh, path], capture_output=True, text=True, check=True
        ).stdout

    env = cat("etc/environment").splitlines()
    assert "A=1" in env and "STACK_WIDE=1" in env
    assert "idx_mapping.long()" in cat("usr/lib/python3/dist-packages/k3test/mod.py")
    rc = cat("etc/rc")
    assert rc.startswith("# enroot-provenance: ") and "exec python3" in rc
    listing = subprocess.run(["unsquashfs", "-l", sqsh], capture_output=True, text=True).stdout
    assert "squashfs-root/dev/" not in listing and ".dockerenv" not in listing
    assert main(["export", "--lock", LOCK, "--check", sqsh]) == 0


def _tamper(sqsh: str, tmp: Path, path: str, old: str, new: str) -> Path:
    root = tmp / "unpacked"
    subprocess.run(["unsquashfs", "-q", "-d", str(root), sqsh], check=True, capture_output=True)
    target = root / path
    target.write_text(target.read_text().replace(old, new))
    out = tmp / "tampered.sqsh"
    subprocess.run(["mksquashfs", str(root), str(out), "-noappend", "-quiet"], check=True)
    subprocess.run(["rm", "-rf", str(root)], check=True)
    return out


@pytest.mark.parametrize(
    ("path", "old", "new", "needle"),
    [
        ("etc/environment", "A=1", "A=2", "env A"),
        (
            "usr/lib/python3/dist-packages/k3test/mod.py",
            "idx_mapping.long()",
            "idx_mapping",
            "patch int64",
        ),
    ],
    ids=["env-differs", "patch-differs"],
)
def test_check_catches_a_squashfs_that_differs(
    project: Path,
    capsys: pytest.CaptureFixture[str],
    clean_probe_images: None,
    path: str,
    old: str,
    new: str,
    needle: str,
) -> None:
    sqsh = run_json(capsys, "export", "--out", "a")["images"][0]["path"]  # type: ignore[index]
    tampered = _tamper(sqsh, project, path, old, new)
    assert main(["export", "--lock", LOCK, "--check", str(tampered)]) == 4
    captured = capsys.readouterr()
    assert f"FAIL {needle}" in captured.out and "check(s) failed" in captured.err


def test_unknown_image_is_a_clear_error(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "--lock", LOCK, "nope"]) == 2
    assert "unknown image(s) ['nope']" in capsys.readouterr().err


def test_disk_full_leaves_no_partial_sqsh(
    project: Path, capsys: pytest.CaptureFixture[str], clean_probe_images: None
) -> None:
    full = project / "full"
    full.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(full)]).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        assert main(["export", "--lock", LOCK, "--out", str(full)]) == 3
        assert "mksquashfs" in capsys.readouterr().err
        assert os.listdir(full) == []
    finally:
        subprocess.run(["umount", str(full)], check=True)


def test_engine_export_removes_its_container(engine: DockerEngine, project: Path) -> None:
    before = _containers()
    stream = engine.export("k3env/debian-python:" + _stage1_tag(engine))
    next(stream)
    stream.close()
    assert _containers() == before


def _containers() -> set[str]:
    listing = subprocess.run(["docker", "ps", "-aq", "--no-trunc"], capture_output=True, text=True)
    return set(listing.stdout.split())


def _stage1_tag(engine: DockerEngine) -> str:
    listing = subprocess.run(
        ["docker", "images", "--format", "{{.Tag}}", "k3env/debian-python"],
        capture_output=True,
        text=True,
    )
    return listing.stdout.split()[0]
