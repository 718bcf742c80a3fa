"""The builder over the in-memory engine: patches, image IDs, the cache, bad input."""

from __future__ import annotations

import dataclasses
import io
import json
import tarfile
from pathlib import Path

import pytest

from k3env.config.pins import BasePin
from k3env.engine.protocol import RunResult
from k3env.errors import EngineError, PatchError, SecretError
from k3env.hashing import sha256_digest
from k3env.image import twin, twinlayer
from k3env.image.bases import ResolvedBase
from k3env.image.blobs import LAYER_MEDIA_TYPE, Descriptor
from k3env.image.build import PROVENANCE_PATH, Builder, BuildResult, _located, make_builder
from k3env.image.layer import LayerFile, assemble, load_archive
from k3env.log import Log

from .conftest import TEST_BASE_REPOSITORY
from .fake_engine import FakeEngine, Published, layer_tar, manifest_digest, python_base
from .project import BUGGY, FIXED, MODULE_FILE, REPOSITORY, PatchPin, Project, write_project

QUIET = Log(quiet=True)


def build(engine: FakeEngine, project: Project) -> BuildResult:
    """One ``k3env build`` run: a fresh builder over the project's lock and state."""
    lock = project.lock()
    builder = make_builder(lock, engine, project.state, QUIET, False)
    return builder.build(project.spec(lock))


def archive_members(archive: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]


def test_build_applies_the_patch_and_the_image_id_is_the_config_digest(
    fake_engine: FakeEngine, fake_project: Project
) -> None:
    base = fake_project.bases["testbase"]
    result = build(fake_engine, fake_project)

    assert result.cached is False
    assert [(p.name, p.status) for p in result.patches] == [("int64", "applied")]
    assert result.reference == f"{REPOSITORY}:{result.inputs[:20]}"
    # The base was pulled by digest, and the patched file is in the loaded image.
    assert ("pull", (base.reference,)) in fake_engine.calls
    assert fake_engine.text(result.reference, MODULE_FILE) == FIXED
    assert fake_engine.text(base.reference, MODULE_FILE) == BUGGY
    # The ID is the sha256 of the config JSON the builder wrote into the archive.
    (archive,) = fake_engine.archives
    members = archive_members(archive)
    (entry,) = json.loads(members["manifest.json"])
    config = members[entry["Config"]]
    assert result.image_id == sha256_digest(config) == result.engine_id
    assert entry["Config"] == "blobs/sha256/" + result.image_id.removeprefix("sha256:")
    # Only the new layer travels; the base's layers are named by diff ID. (The base's
    # manifest is not known here: no OCI layout beside the docker-archive, no manifest digest.)
    assert result.manifest is None
    assert sorted(members) == sorted(["manifest.json", entry["Config"], entry["Layers"][-1]])
    image = fake_engine.inspect(result.image_id)
    assert image is not None
    assert image.diff_ids[:-1] == base.image.image.diff_ids
    assert len(image.diff_ids) == len(base.image.image.diff_ids) + 1
    assert image.created == base.image.image.created
    assert "A=1" in image.config["Env"] and "STACK_WIDE=1" in image.config["Env"]
    labels = image.config["Labels"]
    assert labels["io.k3env.patch.int64"] == "applied"
    assert labels["io.k3env.inputs"] == result.inputs
    assert labels["org.opencontainers.image.base.digest"] == base.digest
    provenance = json.loads(fake_engine.text(result.reference, PROVENANCE_PATH) or "")
    assert provenance["base"]["digest"] == base.digest
    assert provenance["lock"]["path"] == "pins/test.lock.toml"
    assert provenance["patches"][0]["status"] == "applied"
    assert fake_engine.tags(REPOSITORY) == [result.reference]


def test_rebuild_with_nothing_changed_is_a_cache_hit_without_a_load(
    fake_engine: FakeEngine, fake_project: Project
) -> None:
    first = build(fake_engine, fake_project)
    mark = fake_engine.mark()
    again = build(fake_engine, fake_project)
    assert again.cached is True
    assert again.image_id == first.image_id and again.reference == first.reference
    assert [p.status for p in again.patches] == ["applied"]  # read back from the labels
    # The base is found by inspect, the derived image by one lookup: nothing else.
    assert fake_engine.verbs_since(mark) == ["inspect", "lookup"]


def test_a_tag_without_our_inputs_label_is_not_a_cache_hit(
    fake_engine: FakeEngine, fake_project: Project
) -> None:
    first = build(fake_engine, fake_project)
    # Someone else's image under our tag: the label does not match, so it is rebuilt.
    fake_engine.tag(fake_project.bases["testbase"].reference, REPOSITORY, first.inputs[:20])
    again = build(fake_engine, fake_project)
    assert again.cached is False and again.image_id == first.image_id
    assert fake_engine.resolve(first.reference) == first.image_id


def test_spec_env_change_gives_a_new_image_id_and_tag(
    fake_engine: FakeEngine, fake_project: Project
) -> None:
    first = build(fake_engine, fake_project)
    write_project(fake_project.root, fake_project.bases, env={"A": "2"})
    second = build(fake_engine, fake_project)
    assert second.cached is False
    assert second.image_id != first.image_id
    assert second.reference != first.reference
    image = fake_engine.inspect(second.image_id)
    assert image is not None and "A=2" in image.config["Env"] and "A=1" not in image.config["Env"]
    assert fake_engine.tags(REPOSITORY) == sorted([first.reference, second.reference])


def test_same_inputs_on_a_fresh_engine_give_the_same_image_id(
    fake_engine: FakeEngine, fake_project: Project, tmp_path: Path
) -> None:
    first = build(fake_engine, fake_project)
    other = FakeEngine()
    base = other.publish(TEST_BASE_REPOSITORY, python_base(BUGGY))
    assert base == fake_project.bases["testbase"]
    elsewhere = write_project(tmp_path / "elsewhere", {"testbase": base})
    again = build(other, elsewhere)
    assert again.cached is False  # nothing shared: new engine, new state
    assert again.image_id == first.image_id
    assert again.reference == first.reference


def test_the_same_spec_read_from_another_directory_is_another_tag(
    fake_engine: FakeEngine, fake_project: Project
) -> None:
    """The provenance names the spec by its path in the project: a copy elsewhere (as
    `--images DIR` reads it) is another image, never a cache hit on the first one's tag."""
    from k3env.config.spec import load_spec

    first = build(fake_engine, fake_project)
    other = fake_project.root / "only-this" / fake_project.spec_path.name
    other.parent.mkdir()
    other.write_bytes(fake_project.spec_path.read_bytes())
    lock = fake_project.lock()
    builder = make_builder(lock, fake_engine, fake_project.state, QUIET, False)
    again = builder.build(load_spec(other, lock))
    assert again.cached is False
    assert again.reference != first.reference and again.image_id != first.image_id
    provenance = json.loads(fake_engine.text(again.reference, PROVENANCE_PATH) or "")
    assert provenance["spec"]["path"] == f"only-this/{other.name}"
    # The first image keeps its tag and its own provenance.
    assert fake_engine.resolve(first.reference) == first.image_id
    assert build(fake_engine, fake_project).cached is True


def test_builder_over_a_resolved_base_needs_no_registry(
    fake_engine: FakeEngine, tmp_path: Path
) -> None:
    """``Builder`` with its own resolver: the base is only in the engine, never pulled."""
    local = python_base(BUGGY)
    base_image = fake_engine.add(local, "local/base:1")
    pin = Published(repository="local/base", tag="1", digest=manifest_digest(local.id), image=local)
    project = write_project(tmp_path, {"testbase": pin})
    lock = project.lock()

    def resolve(pin: BasePin, platform: str) -> ResolvedBase:
        return ResolvedBase(
            pin=pin, reference="local/base:1", name="local/base:1", digest=None, image=base_image
        )

    builder = Builder(
        lock=lock, engine=fake_engine, state=project.state, log=QUIET, resolve_base=resolve
    )
    result = builder.build(project.spec(lock))
    assert "pull" not in fake_engine.verbs
    assert fake_engine.text(result.image_id, MODULE_FILE) == FIXED
    image = fake_engine.inspect(result.image_id)
    assert image is not None
    assert "org.opencontainers.image.base.digest" not in image.config["Labels"]


@pytest.mark.parametrize(
    ("base_text", "anchor", "message"),
    [
        (BUGGY, "index_fill_(0, idx_map,", "edit 1: anchor not found"),
        (BUGGY + BUGGY, "index_fill_(0, idx_mapping,", "edit 1: anchor found 2 times"),
    ],
    ids=["anchor-absent", "anchor-twice"],
)
def test_a_patch_that_does_not_fit_raises_and_nothing_is_loaded_or_tagged(
    fake_engine: FakeEngine, tmp_path: Path, base_text: str, anchor: str, message: str
) -> None:
    base = fake_engine.publish(TEST_BASE_REPOSITORY, python_base(base_text))
    patch = PatchPin(text=f'[[edits]]\nanchor = "{anchor}"\nreplacement = "fixed()"\n')
    project = write_project(tmp_path, {"testbase": base}, patches={"int64": patch})
    with pytest.raises(PatchError) as e:
        build(fake_engine, project)
    assert message in str(e.value)
    assert "container patch int64" in str(e.value) and MODULE_FILE in str(e.value)
    assert "load" not in fake_engine.verbs and "tag" not in fake_engine.verbs
    assert fake_engine.tags(REPOSITORY) == []


def test_a_patch_target_module_missing_from_the_image_raises(
    fake_engine: FakeEngine, tmp_path: Path
) -> None:
    base = fake_engine.publish(TEST_BASE_REPOSITORY, python_base(BUGGY))
    project = write_project(
        tmp_path, {"testbase": base}, patches={"int64": PatchPin(module="k3test.moved")}
    )
    with pytest.raises(PatchError, match=r"target module k3test\.moved is not on the image's"):
        build(fake_engine, project)
    assert fake_engine.tags(REPOSITORY) == []


def test_a_credential_in_the_spec_env_is_refused_before_any_engine_call(
    fake_engine: FakeEngine, fake_project: Project
) -> None:
    write_project(
        fake_project.root,
        fake_project.bases,
        env={"A": "1", "HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz0123"},
    )
    with pytest.raises(SecretError) as e:
        build(fake_engine, fake_project)
    assert "images/probe.toml: env.HF_TOKEN" in str(e.value)
    assert "Hugging Face token" in str(e.value) and "allow_credentials" in str(e.value)
    assert fake_engine.calls == []


def test_the_builder_itself_refuses_a_credential_before_any_engine_call(
    fake_engine: FakeEngine, fake_project: Project
) -> None:
    """Defence in depth: a spec that got past the reader still never reaches the engine."""
    lock = fake_project.lock()
    spec = fake_project.spec(lock)
    spec = dataclasses.replace(spec, env={**spec.env, "HF_TOKEN": "hf_" + "a1" * 16})
    builder = make_builder(lock, fake_engine, fake_project.state, QUIET, False)
    with pytest.raises(SecretError, match="refusing to bake HF_TOKEN into image probe"):
        builder.build(spec)
    assert fake_engine.calls == []


def test_an_engine_that_rewrites_the_config_is_refused_and_nothing_is_tagged(
    fake_engine: FakeEngine, fake_project: Project
) -> None:
    fake_engine.rewrite_configs = True
    with pytest.raises(EngineError, match="the engine stored sha256:") as e:
        build(fake_engine, fake_project)
    assert "expected sha256:" in str(e.value)
    assert "tag" not in fake_engine.verbs
    assert fake_engine.tags(REPOSITORY) == []
    # The image the engine made of our archive was removed again.
    removed = [args[0] for verb, args in fake_engine.calls if verb == "remove"]
    assert len(removed) == 1 and fake_engine.inspect(removed[0]) is None


def test_the_fake_refuses_an_archive_over_a_base_it_lacks_like_dockerd() -> None:
    """The fake is only useful if it fails where dockerd fails: a docker-archive carries
    only the new layer, so the base's layers must already be in the engine."""
    base = python_base(BUGGY)
    assembled = assemble(
        base.image,
        [LayerFile(path="/etc/x", content=b"x")],
        env=[],
        labels={},
        created_by="test",
        comment="",
    )
    own = Descriptor(digest=assembled.diff_id, size=len(assembled.layer_tar),
                     media_type=LAYER_MEDIA_TYPE)  # fmt: skip
    _names, _manifest, parts = load_archive(assembled.config_json,
                                            [*base.image.diff_ids, assembled.diff_id], own,
                                            assembled.layer_tar, None)  # fmt: skip
    archive = b"".join(p for p in parts if isinstance(p, bytes))
    engine = FakeEngine()
    with pytest.raises(EngineError, match="no such file or directory"):
        engine.load(archive)
    engine.add(base)
    assert engine.load(archive) == assembled.image_id
    assert engine.text(assembled.image_id, "/etc/x") == "x"
    assert engine.text(assembled.image_id, MODULE_FILE) == BUGGY


TWIN = """
[bases.cpu-twin]
kind = "twin"
[twin]
debian_suite = "bookworm"
debian_mirror = "http://deb.debian.org/debian"
debian_packages = ["python3"]
requirements = "pins/twin.requirements.txt"
requirements_sha256 = "unresolved"
registry = "127.0.0.1:5000"
repository = "k3env/cpu-twin"
"""


def test_build_over_the_cpu_twin_assembles_its_layer_and_pushes_it(
    fake_engine: FakeEngine, fake_project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The twin path end to end over the fake: stage 1 present, the wheels installed by a
    throwaway container into a host directory (the test plays pip), that tree assembled by
    k3env as one layer dated the lock's instant, pushed, then the derived image over it."""
    root = fake_project.root
    base = fake_project.bases["testbase"]
    write_project(
        root, fake_project.bases, patches={"int64": PatchPin(bases=("testbase", "cpu-twin"))}
    )
    lock_text = fake_project.lock_path.read_text()
    fake_project.lock_path.write_text(
        lock_text.replace(
            f'digest = "{base.digest}"\n', f'digest = "{base.digest}"\ntwin = "cpu-twin"\n'
        )
        + TWIN
        + 'resolved_before = "2026-11-30T00:00:00Z"\n'
    )
    (root / "pins/twin.requirements.txt").write_text(
        "vllm==0.33.0 --hash=sha256:" + "0" * 64 + "\n"
    )
    lock = fake_project.lock()
    plan = twin.plan(lock)
    assert plan.epoch == 1795996800  # 2026-11-30T00:00:00Z
    # Stage 1 as an earlier run left it: Python, no k3test yet.
    rootfs = root / "rootfs.tar"
    rootfs.write_bytes(
        layer_tar({"/usr/bin/python3": b"\x7fELF", "/usr/lib/python3/dist-packages/README": ""})
    )
    stage1 = fake_engine.import_rootfs(rootfs, *plan.stage1_ref.split(":"))
    wheels = root / "wheels"
    wheels.mkdir()
    monkeypatch.setattr(twinlayer, "download_wheels", lambda p, state, log, platform: wheels)
    installs: list[dict[str, str]] = []

    def pip_install(
        image: str, argv: list[str], env: dict[str, str], mounts: dict[str, str]
    ) -> RunResult | None:
        if "/k3env/out" not in mounts.values():
            return None
        installs.append(mounts)
        host = {v: Path(k) for k, v in mounts.items()}
        assert env["SOURCE_DATE_EPOCH"] == str(plan.epoch)
        target = host["/k3env/out"] / MODULE_FILE.lstrip("/")
        target.parent.mkdir(parents=True)
        target.write_text(BUGGY)
        (target.parent / "__init__.py").write_text("")
        (host["/k3env/meta"] / "meta.json").write_text(
            json.dumps({"dirs": {"/usr/lib/python3/dist-packages": [0o755, 0, 0]}})
        )
        return RunResult(exit_code=0, stdout="installing 1 pinned wheels\n", stderr="")

    fake_engine.on_run(pip_install)
    result = make_builder(lock, fake_engine, fake_project.state, QUIET, True).build(
        fake_project.spec(lock)
    )

    assert [m[str(wheels)] for m in installs] == ["/k3env/wheels"]
    twin_image = fake_engine.inspect(plan.reference)
    stage1_image = fake_engine.inspect(stage1)
    assert twin_image is not None and stage1_image is not None
    assert twin_image.diff_ids[:-1] == stage1_image.diff_ids  # one layer over stage 1
    assert twin_image.config["Labels"] == {twin.LABEL: plan.inputs}
    assert twin_image.config["Cmd"] == ["python3"]
    assert twin_image.created == "2026-11-30T00:00:00Z"  # the lock's instant, not the clock
    assert [p.repository for p in fake_engine.pushes] == [plan.reference.rsplit(":", 1)[0]]
    assert "pull" not in fake_engine.verbs
    assert result.twin is True and result.base == plan.reference
    assert result.base_id == twin_image.id
    assert [(p.name, p.status) for p in result.patches] == [("int64", "applied")]
    assert fake_engine.text(result.image_id, MODULE_FILE) == FIXED
    image = fake_engine.inspect(result.image_id)
    assert image is not None and image.config["Labels"]["io.k3env.twin"] == "true"


def test_a_cold_build_locates_and_reads_the_target_in_one_container(
    fake_engine: FakeEngine, fake_project: Project
) -> None:
    result = build(fake_engine, fake_project)
    verbs = [verb for verb, _ in fake_engine.calls]
    assert verbs.count("run") == 1 and "read_files" not in verbs
    assert fake_engine.text(result.reference, MODULE_FILE) == FIXED


def test_the_locate_script_reads_what_it_finds(tmp_path: Path) -> None:
    """The real script, run by this host's Python over a package of its own."""
    import os
    import subprocess
    import sys

    from k3env.image.build import find_modules_script

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg/__init__.py").write_text("")
    (tmp_path / "pkg/mod.py").write_bytes(b"x = 1\n\xff")
    os.chmod(tmp_path / "pkg/mod.py", 0o640)
    out = subprocess.run(
        [sys.executable, "-c", find_modules_script(), "--read", "pkg.mod", "pkg.none"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    found, files = _located(out, ["pkg.mod", "pkg.none"], "here")
    real = str((tmp_path / "pkg/mod.py").resolve())
    assert found == {"pkg.mod": real, "pkg.none": None}
    assert files[real].content == b"x = 1\n\xff" and files[real].mode == 0o640
    assert files[real].uid == os.getuid()


@pytest.mark.parametrize(
    "stdout",
    [
        "",
        "not json",
        '{"m": "/a.py"}',  # the old shape: no "modules"
        '{"modules": {"other": null}, "files": {}}',  # not the module asked for
        '{"modules": {"m": "a.py"}, "files": {}}',  # not an absolute path
        '{"modules": {"m": "/a.py"}, "files": {"/a.py": {"b64": "!!", "mode": 1, "uid": 0, '
        '"gid": 0}}}',  # not base64
        '{"modules": {"m": "/a.py"}, "files": {"/a.py": {"b64": "", "mode": "x", "uid": 0, '
        '"gid": 0}}}',  # not a number
    ],
)
def test_a_locate_answer_of_another_shape_is_refused(stdout: str) -> None:
    with pytest.raises(EngineError, match="unexpected module probe output"):
        _located(stdout, ["m"], "here")


def test_a_locate_answer_keeps_only_the_files_it_located() -> None:
    out = json.dumps({"modules": {"m": "/a.py"}, "files": {
        "/a.py": {"b64": "eA==", "mode": 420, "uid": 0, "gid": 0},
        "/etc/shadow": {"b64": "eA==", "mode": 420, "uid": 0, "gid": 0},
        "/big.py": None}})  # fmt: skip
    found, files = _located(out, ["m"], "here")
    assert found == {"m": "/a.py"} and list(files) == ["/a.py"] and files["/a.py"].content == b"x"
