"""Handoff over the in-memory engine: push records, the enroot URI, enroot's image files."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from k3env.errors import ConfigError, EngineError
from k3env.handoff.enroot import enroot_files
from k3env.handoff.enroot_export import export_image
from k3env.handoff.push import push_image
from k3env.handoff.squashfs_check import check_squashfs
from k3env.hashing import file_sha256
from k3env.image.build import BuildResult, make_builder
from k3env.image.records import Pushed, shipped
from k3env.log import Log

from .fake_engine import FakeEngine, PushRecord, manifest_digest
from .project import MODULE_FILE, Project

QUIET = Log(quiet=True)
REGISTRY = "127.0.0.1:5000"
SQUASHFS_TOOLS = pytest.mark.skipif(
    shutil.which("mksquashfs") is None or shutil.which("unsquashfs") is None,
    reason="squashfs-tools not installed",
)
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def built(engine: FakeEngine, project: Project) -> BuildResult:
    lock = project.lock()
    return make_builder(lock, engine, project.state, QUIET, False).build(project.spec(lock))


def test_push_records_the_registry_digest_by_image_id(
    fake_engine: FakeEngine, fake_project: Project
) -> None:
    build = built(fake_engine, fake_project)
    state = fake_project.state
    assert shipped(state, build.image_id).pushed is None

    pushed = push_image(fake_engine, state, build, REGISTRY, QUIET)
    tag = build.reference.rsplit(":", 1)[1]
    digest = manifest_digest(build.image_id)
    assert pushed == Pushed(
        image="probe",
        image_id=build.image_id,
        reference=f"{REGISTRY}/k3env-test/probe:{tag}",
        digest=digest,
        layers_sent=3,  # two base layers and ours: none was in this repository yet
        layers_skipped=0,
    )
    assert fake_engine.pushes == [
        PushRecord(
            repository=f"{REGISTRY}/k3env-test/probe",
            tag=tag,
            image_id=build.image_id,
            digest=digest,
        )
    ]
    assert fake_engine.resolve(pushed.reference) == build.image_id  # tagged for the registry
    assert shipped(state, build.image_id).pushed == pushed
    assert pushed.by_digest == f"{REGISTRY}/k3env-test/probe@{digest}"
    assert pushed.enroot_uri == f"docker://{REGISTRY}#k3env-test/probe@{digest}"
    assert pushed.as_json()["enroot_uri"] == pushed.enroot_uri

    # Pushed again: the registry has every layer, and the digest is the same.
    again = push_image(fake_engine, state, build, REGISTRY, QUIET)
    assert (again.digest, again.layers_sent, again.layers_skipped) == (digest, 0, 3)


def test_a_registry_with_a_path_keeps_it_in_the_enroot_image_name() -> None:
    pushed = Pushed(
        image="x",
        image_id="sha256:" + "1" * 64,
        reference="registry.example.com:443/team/k3env/x:abc",
        digest="sha256:" + "2" * 64,
        layers_sent=1,
        layers_skipped=0,
    )
    assert pushed.enroot_uri == "docker://registry.example.com:443#team/k3env/x@sha256:" + "2" * 64


def test_a_failed_push_leaves_no_record(fake_engine: FakeEngine, fake_project: Project) -> None:
    build = built(fake_engine, fake_project)
    fake_engine.fail_next("push")
    with pytest.raises(EngineError, match="push failed"):
        push_image(fake_engine, fake_project.state, build, REGISTRY, QUIET)
    assert shipped(fake_project.state, build.image_id).pushed is None
    assert fake_engine.pushes == []


def files_of(config: dict[str, Any]) -> dict[str, tuple[str, int]]:
    return {path: (data.decode(), mode) for path, data, mode in enroot_files(config)}


def rc_script(workdir: str, entrypoint: str, default: str) -> str:
    """enroot's /etc/rc below the labels: into the working directory, rc.local, then exec."""
    return (
        f'mkdir -p "{workdir}" 2> /dev/null\n'
        f'cd "{workdir}" && unset OLDPWD || exit 1\n'
        "\n"
        "if [ -s /etc/rc.local ]; then\n"
        "    . /etc/rc.local\n"
        "fi\n"
        "\n"
        "if [ $# -gt 0 ]; then\n"
        f'    exec {entrypoint} "$@"\n'
        "else\n"
        f"    exec {entrypoint} {default}\n"
        "fi\n"
    )


def test_enroot_files_for_a_config_with_entrypoint_cmd_workdir_volumes_labels() -> None:
    files = files_of(
        {
            "Env": ["PATH=/usr/bin:/bin", "A=1 2"],
            "Entrypoint": ["/opt/nvidia/entrypoint.sh"],
            "Cmd": ["python3", "-c", "print('hi there')"],
            "WorkingDir": "/workspace",
            "Volumes": {"/data": {}, "/cache": {}},
            "Labels": {"a.label": "one", "b.label": "two words"},
        }
    )
    assert list(files) == ["etc/environment", "etc/fstab", "etc/rc", "etc/rc.local"]
    assert files["etc/environment"] == ("PATH=/usr/bin:/bin\nA=1 2\n", 0o644)
    assert files["etc/fstab"] == (
        "${ENROOT_ROOTFS}/cache /cache none x-create=dir,bind,rw,nosuid,nodev\n"
        "${ENROOT_ROOTFS}/data /data none x-create=dir,bind,rw,nosuid,nodev\n",
        0o644,
    )
    script = rc_script("/workspace", "'/opt/nvidia/entrypoint.sh'",
                       "'python3' '-c' 'print('\\''hi there'\\'')'")  # fmt: skip
    assert files["etc/rc"] == ("# a.label one\n# b.label two words\n\n" + script, 0o644)
    assert files["etc/rc.local"] == (
        "# This file is sourced by /etc/rc when the container starts.\n"
        "# It can be used to manipulate the entrypoint or the command of the container.\n",
        0o644,
    )


def test_enroot_files_default_to_a_shell_without_entrypoint_or_cmd() -> None:
    files = files_of({"Env": None, "Cmd": None, "Entrypoint": None, "Labels": None})
    assert files["etc/environment"] == ("", 0o644)
    assert files["etc/fstab"] == ("", 0o644)
    assert files["etc/rc"][0] == rc_script("/", "", "'/bin/sh'")


def test_enroot_files_for_the_built_image(fake_engine: FakeEngine, fake_project: Project) -> None:
    build = built(fake_engine, fake_project)
    image = fake_engine.inspect(build.image_id)
    assert image is not None
    files = files_of(dict(image.config))
    # The base's env, then the baked env, sorted.
    assert files["etc/environment"][0] == f"{PATH_ENV}\nA=1\nSTACK_WIDE=1\n"
    assert files["etc/fstab"][0] == ""
    head, script = files["etc/rc"][0].split("\n\n", 1)
    labels = image.config["Labels"]
    assert head.splitlines() == [f"# {k} {v}" for k, v in sorted(labels.items())]
    assert f"# io.k3env.inputs {build.inputs}" in head.splitlines()
    assert labels["io.k3env.patch.int64"] == "applied"
    # No entrypoint: arguments run as given, else the base's CMD.
    assert script == rc_script("/", "", "'python3'")


@pytest.mark.parametrize(
    ("config", "what"),
    [
        ({"Cmd": ["python3"], "Labels": {"description": "CUDA\ntouch /tmp/owned"}}, "label"),
        ({"Env": ["A=1\ntouch /tmp/owned"]}, "env"),
        ({"Cmd": ["python3", "-c", "1\r"]}, "cmd"),
    ],
    ids=["label", "env", "cmd"],
)
def test_a_control_character_never_becomes_a_line_of_etc_rc_or_environment(
    config: dict[str, Any], what: str
) -> None:
    """A base image's multi-line label would otherwise put its second line into /etc/rc,
    which `enroot start` runs."""
    with pytest.raises(ConfigError, match="control character") as e:
        enroot_files(config)
    assert e.value.where is not None and e.value.where.startswith(what)


@SQUASHFS_TOOLS
def test_export_streams_the_image_into_a_squashfs_that_passes_its_check(
    fake_engine: FakeEngine, fake_project: Project, tmp_path: Path
) -> None:
    build = built(fake_engine, fake_project)
    exported = export_image(fake_engine, fake_project.state, build, tmp_path / "out", QUIET)
    assert Path(exported.path).name == "k3env-test+probe+" + build.inputs[:20] + ".sqsh"
    assert ("export", (build.image_id,)) in fake_engine.calls
    lock = fake_project.lock()
    items = check_squashfs(Path(exported.path), lock, {"probe": fake_project.spec(lock)}, QUIET)
    assert [(i.name, i.detail) for i in items if i.status != "passed"] == []
    assert {"etc/rc", "etc/environment", "provenance.lock", "env A", "patch int64"} <= {
        i.name for i in items
    }
    listing = subprocess.run(
        ["unsquashfs", "-l", "-d", "", exported.path], capture_output=True, text=True, check=True
    ).stdout.split()
    assert MODULE_FILE in listing and "/etc/rc" in listing
    assert "/.dockerenv" not in listing and "/dev/console" not in listing


@SQUASHFS_TOOLS
def test_an_export_depends_on_the_image_only(
    fake_engine: FakeEngine, fake_project: Project, tmp_path: Path
) -> None:
    build = built(fake_engine, fake_project)
    first = export_image(fake_engine, fake_project.state, build, tmp_path / "1", QUIET)
    # Exported again a second later, from another container created an hour later.
    time.sleep(1.1)
    fake_engine.container_created += 3600
    again = export_image(fake_engine, fake_project.state, build, tmp_path / "2", QUIET)
    assert again.sha256 == first.sha256


@SQUASHFS_TOOLS
def test_an_export_already_on_disk_is_not_written_again_unless_its_bytes_differ(
    fake_engine: FakeEngine, fake_project: Project, tmp_path: Path
) -> None:
    build = built(fake_engine, fake_project)
    first = export_image(fake_engine, fake_project.state, build, tmp_path / "out", QUIET)
    mark = fake_engine.mark()
    again = export_image(fake_engine, fake_project.state, build, tmp_path / "out", QUIET)
    assert "export" not in fake_engine.verbs_since(mark)  # the file on disk is the export
    assert again == first
    # Another directory has no export yet: written there.
    elsewhere = export_image(fake_engine, fake_project.state, build, tmp_path / "other", QUIET)
    assert "export" in fake_engine.verbs_since(mark) and elsewhere.sha256 == first.sha256
    # A file whose bytes are not the recorded export (same size) is written again.
    path = Path(first.path)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    mark = fake_engine.mark()
    fixed = export_image(fake_engine, fake_project.state, build, tmp_path / "out", QUIET)
    assert "export" in fake_engine.verbs_since(mark)
    assert fixed.sha256 == first.sha256 == file_sha256(path)


def test_export_check_passes_only_on_evidence(fake_project: Project) -> None:
    """A patch the build did not apply is not checked (never passed); a check with nothing
    passed, or with a failure, refuses the file; a not-checked gate beside passes does not."""
    from k3env.errors import CheckFailed
    from k3env.handoff.squashfs_check import _patch_item, require_ok
    from k3env.verdict import Gate

    skipped = _patch_item(None, {"name": "int64", "status": "skipped"}, fake_project.lock())  # type: ignore[arg-type]
    assert skipped == Gate(
        name="patch int64", status="not checked", detail="not applied by the build (skipped)"
    )
    passed = Gate(name="provenance", status="passed", detail="as built")
    assert require_ok(Path("x.sqsh"), [passed, skipped]) == 0
    for items in ([], [skipped]):
        with pytest.raises(CheckFailed, match="the file is not the image: nothing passed"):
            require_ok(Path("x.sqsh"), items)
    failed = Gate(name="file /a", status="failed", detail="missing")
    with pytest.raises(CheckFailed, match=r"1 of 3 failed or did not run: file /a failed: missing"):
        require_ok(Path("x.sqsh"), [passed, skipped, failed])


@SQUASHFS_TOOLS
def test_an_enroot_42_import_names_this_image_by_what_this_host_recorded(
    fake_engine: FakeEngine,
    fake_project: Project,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`export --check --cluster` of a squashfs with enroot >= 4.2's first /etc/rc line (the
    line before k3env's own /etc/rc, as tests/test_enroot_releases.py shows enroot main writes
    it): the line names the image by its recorded push digest or image ID, or fails naming
    another registry; a profile on enroot 4.1.2 refuses the line."""
    from k3env.cli import main
    from k3env.image.build import build_all

    lock = fake_project.lock()
    builder = make_builder(lock, fake_engine, fake_project.state, QUIET, False)
    (build,) = build_all(builder, [fake_project.spec(lock)])
    pushed = push_image(fake_engine, fake_project.state, build, REGISTRY, QUIET)
    exported = export_image(fake_engine, fake_project.state, build, tmp_path / "out", QUIET)
    root = tmp_path / "root"
    subprocess.run(["unsquashfs", "-q", "-d", str(root), exported.path], check=True,
                   capture_output=True)  # fmt: skip
    rc = (root / "etc/rc").read_bytes()
    profile = tmp_path / "cluster.toml"
    text = Path(__file__).parent.parent.joinpath("clusters/b200-dgxc.toml").read_text()

    def check(uri: str, version: str) -> dict[str, Any]:
        (root / "etc/rc").write_bytes(f"# enroot-provenance: {uri}\n".encode() + rc)
        sqsh = tmp_path / "imported.sqsh"
        subprocess.run(["mksquashfs", str(root), str(sqsh), "-noappend", "-all-root", "-quiet"],
                       check=True, capture_output=True)  # fmt: skip
        profile.write_text(text.replace('version = "4.1.2"', f'version = "{version}"', 1))
        args = ["export", "--check", str(sqsh), "--cluster", str(profile), "--lock",
                "pins/test.lock.toml", "--images", "images", "--json"]  # fmt: skip
        code = main(args)
        out = json.loads(capsys.readouterr().out) if code == 0 else {}
        return {"code": code, **{g["gate"]: g for g in out.get("checks", [])}}

    registry, repository = pushed.reference.rsplit(":", 1)[0].split("/", 1)
    got = check(f"docker://{registry}#{repository}:{pushed.digest}", "4.2.0")
    assert got["code"] == 0
    assert got["etc/rc enroot-provenance"]["detail"].endswith(
        f"names this image by its pushed manifest digest {pushed.digest}"
    )
    got = check(f"dockerd://{build.image_id}", "4.2.0")
    assert got["etc/rc enroot-provenance"]["detail"].endswith(f"config digest {build.image_id}")
    assert check(f"docker://10.1.1.1:5000#{repository}:{pushed.digest}", "4.2.0")["code"] == 4
    said = capsys.readouterr().err
    assert f"registry 10.1.1.1:5000, not {registry} it was pushed to" in said
    assert check(f"dockerd://{build.reference}", "4.1.2")["code"] == 4
    assert "enroot 4.1.2" in capsys.readouterr().err
