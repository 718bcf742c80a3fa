"""The builder on a real dockerd: reproducible IDs, shared base layers, patches, bad input."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from k3env.cli import main
from k3env.engine.dockerd import DockerEngine

from ..conftest import replace_in
from ..project import FIXED
from .conftest import BaseFixture, probe_tags, write_project

pytestmark = [pytest.mark.engine, pytest.mark.registry]

LOCK = "pins/test.lock.toml"


def build(capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, object]:
    code = main(["build", "--lock", LOCK, "--json", *extra])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    out: dict[str, object] = json.loads(captured.out)["images"][0]
    return out


def layer_dirs(ref: str) -> tuple[str, ...]:
    """Where the engine keeps the image's layers (overlay2: lower dirs then upper, base first)."""
    inspected = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{json .GraphDriver.Data}}", ref],
        check=True,
        capture_output=True,
        text=True,
    )
    data = json.loads(inspected.stdout) or {}
    lower = [d for d in (data.get("LowerDir") or "").split(":") if d]
    upper = [data["UpperDir"]] if data.get("UpperDir") else []
    return (*reversed(lower), *upper)


def test_same_inputs_same_image_id_after_removal(
    project: Path,
    engine: DockerEngine,
    capsys: pytest.CaptureFixture[str],
    clean_probe_images: None,
) -> None:
    first = build(capsys)
    assert first["cached"] is False
    again = build(capsys)
    assert again["cached"] is True and again["image_id"] == first["image_id"]

    # Remove the image and every cached fact, as on a clean engine: same ID again.
    engine.remove(str(first["reference"]))
    assert engine.inspect(str(first["image_id"])) is None
    shutil.rmtree(project / "state")
    rebuilt = build(capsys)
    assert rebuilt["cached"] is False
    assert rebuilt["image_id"] == first["image_id"]
    assert rebuilt["reference"] == first["reference"]


def test_env_change_gives_new_id_and_leaves_base_layers_untouched(
    project: Path,
    engine: DockerEngine,
    test_base: BaseFixture,
    capsys: pytest.CaptureFixture[str],
    clean_probe_images: None,
) -> None:
    base_ref = f"{test_base.repository}@{test_base.digest}"
    base_before = engine.inspect(base_ref)
    base_dirs_before = layer_dirs(base_ref)
    assert base_before is not None

    first = build(capsys)
    replace_in(project / "images/probe.toml", 'A = "1"', 'A = "2"')
    second = build(capsys)
    assert second["image_id"] != first["image_id"]
    assert second["reference"] != first["reference"]

    base_after = engine.inspect(base_ref)
    assert base_after == base_before  # the base image is not rewritten
    derived = engine.inspect(str(second["image_id"]))
    assert derived is not None
    # Every base layer is reused by diff ID, plus exactly one new layer.
    assert derived.diff_ids[:-1] == base_before.diff_ids
    assert len(derived.diff_ids) == len(base_before.diff_ids) + 1
    # ... and on disk: the derived image stacks on the base's own layer directories.
    derived_dirs = layer_dirs(str(second["image_id"]))
    assert layer_dirs(base_ref) == base_dirs_before
    assert derived_dirs[: len(base_dirs_before)] == base_dirs_before
    assert len(derived_dirs) == len(base_dirs_before) + 1
    assert "A=2" in derived.config["Env"] and "STACK_WIDE=1" in derived.config["Env"]


def test_patch_env_labels_and_provenance_are_in_the_image(
    project: Path,
    engine: DockerEngine,
    test_base: BaseFixture,
    capsys: pytest.CaptureFixture[str],
    clean_probe_images: None,
) -> None:
    result = build(capsys)
    patches = result["patches"]
    assert isinstance(patches, list) and patches[0]["status"] == "applied"
    ref = str(result["reference"])
    run = engine.run(
        ref,
        ["python3", "-c", "import k3test.mod, inspect; print(inspect.getsource(k3test.mod))"],
        timeout=60,
    )
    assert run.exit_code == 0, run.stderr
    assert "idx_mapping.long()" in run.stdout
    prov = engine.run(ref, ["cat", "/etc/k3env/provenance.json"], timeout=60)
    doc = json.loads(prov.stdout)
    assert doc["lock"]["path"] == LOCK
    assert doc["base"]["digest"] == test_base.digest
    assert doc["patches"][0]["status"] == "applied"
    found = engine.lookup(ref)
    assert found is not None
    labels = found.labels
    assert labels["org.opencontainers.image.base.digest"] == test_base.digest
    assert labels["org.opencontainers.image.base.name"] == f"{test_base.repository}:1"
    assert labels["io.k3env.lock.sha256"] == doc["lock"]["sha256"]
    assert labels["io.k3env.patch.int64"] == "applied"


def test_patch_already_upstream_is_detected_not_applied_twice(
    project: Path,
    fixed_base: BaseFixture,
    engine: DockerEngine,
    capsys: pytest.CaptureFixture[str],
    clean_probe_images: None,
) -> None:
    write_project(project, fixed_base)
    result = build(capsys)
    patches = result["patches"]
    assert isinstance(patches, list) and patches[0]["status"] == "already-present"
    run = engine.run(
        str(result["reference"]),
        ["cat", "/usr/lib/python3/dist-packages/k3test/mod.py"],
        timeout=60,
    )
    assert run.stdout == FIXED


@pytest.mark.parametrize(
    ("file", "old", "new", "code", "needles"),
    [
        (
            LOCK,
            'module = "k3test.mod"',
            'module = "k3test.moved"',
            2,
            ["container patch int64", "k3test.moved", "not on the image's sys.path"],
        ),
        (
            "patches/container/int64.toml",
            'anchor = "index_fill_(0, idx_mapping,"',
            'anchor = "index_fill_(0, idx_map,"',
            2,
            ["container_patches.int64", "sha256", "--update-hashes"],
        ),
        (
            "images/probe.toml",
            'A = "1"',
            'A = "1"\nHF_TOKEN = "hf_abcdefghijklmnopqrstuvwxyz0123"',
            2,
            ["images/probe.toml: env.HF_TOKEN", "allow_credentials"],
        ),
    ],
    ids=["target-missing", "patch-sha256-differs", "credential"],
)
def test_bad_input_fails_cleanly(
    project: Path,
    engine: DockerEngine,
    capsys: pytest.CaptureFixture[str],
    clean_probe_images: None,
    file: str,
    old: str,
    new: str,
    code: int,
    needles: list[str],
) -> None:
    replace_in(project / file, old, new)
    lock_before = (project / LOCK).read_bytes()
    assert main(["build", "--lock", LOCK]) == code
    err = capsys.readouterr().err
    for needle in needles:
        assert needle in err, err
    assert "fix:" in err
    assert probe_tags(engine) == []
    assert (project / LOCK).read_bytes() == lock_before


@pytest.mark.parametrize(
    ("anchor", "message"),
    [
        ("index_fill_(0, idx_map,", "anchor not found"),
        ("idx_mapping", "anchor found 2 times"),
    ],
    ids=["anchor-not-found", "anchor-found-twice"],
)
def test_patch_anchor_problems_fail_cleanly(
    project: Path,
    engine: DockerEngine,
    capsys: pytest.CaptureFixture[str],
    clean_probe_images: None,
    anchor: str,
    message: str,
) -> None:
    patch = project / "patches/container/int64.toml"
    replace_in(patch, 'anchor = "index_fill_(0, idx_mapping,"', f'anchor = "{anchor}"')
    assert main(["lock", "--lock", LOCK, "--update-hashes"]) == 0
    lock_before = (project / LOCK).read_bytes()
    assert main(["build", "--lock", LOCK]) == 2
    err = capsys.readouterr().err
    assert message in err and "container patch int64" in err and "k3test/mod.py" in err
    assert probe_tags(engine) == []
    assert (project / LOCK).read_bytes() == lock_before
