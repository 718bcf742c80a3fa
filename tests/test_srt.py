"""srt-slurm materialize / recipe / validate against a real local git "upstream"."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from k3env.cli import main
from k3env.config.cluster import load_cluster
from k3env.config.lock import load_lock
from k3env.config.spec import load_spec
from k3env.errors import SpecError
from k3env.log import Log
from k3env.srt import materialize as srt
from k3env.srt.fates import patch_fates
from k3env.srt.materialize import MARKER
from k3env.srt.recipe import recipe
from k3env.state import State

from .conftest import replace_in
from .fake_srt.upstream import Upstream

pytestmark = pytest.mark.srt

LOCK = Path("pins/k3.lock.toml")
LIST_INSTALLED = (
    "import importlib.metadata as m, json; "
    "print(json.dumps({d.metadata['Name'].lower(): d.version for d in m.distributions()}))"
)


def materialize(capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[dict[str, object], str]:
    code = main(["srt", "materialize", "--json", *extra])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    out: dict[str, object] = json.loads(captured.out)
    return out, captured.err


def refused(capsys: pytest.CaptureFixture[str], path: Path | None = None, data: bytes = b"") -> str:
    """What `srt materialize` prints as it exits 2, with ``path`` holding ``data`` meanwhile."""
    original = path.read_bytes() if path else b""
    if path:
        path.write_bytes(data)
    try:
        assert main(["srt", "materialize"]) == 2
        return capsys.readouterr().err
    finally:
        if path:
            path.write_bytes(original)


def test_materialize_applies_patches_in_order_and_reuses_the_cache(
    srt_repo: Path, upstream: Upstream, capsys: pytest.CaptureFixture[str]
) -> None:
    first, _ = materialize(capsys)
    assert first["commit"] == upstream.v1036 and first["version"] == "v1.0.36"
    assert first["patches"] == ["PR #278", "direct vllm frontend: vLLM-native multi-node serve"]
    src = Path(str(first["path"])) / "src/src/srtctl"
    assert '"vllm")' in (src / "frontends/base.py").read_text()
    assert "exactly one aggregate worker" in (src / "core/schema.py").read_text()
    python = str(first["python"])
    assert subprocess.run([python, "-c", "import srtctl.core.config"], check=False).returncode == 0
    # The srtctl the command prints runs from where the cache entry lives (its first line
    # used to name the temporary directory that was renamed).
    srtctl = Path(python).parent / "srtctl"
    assert ".partial" not in srtctl.read_text().splitlines()[0]
    assert subprocess.run([str(srtctl), "--help"], capture_output=True).returncode == 0
    second, err = materialize(capsys)
    assert second["reused"] is True and second["head"] == first["head"]
    assert "git clone" not in err  # the second materialize does not clone


def generated_recipe(srt_repo: Path) -> Path:
    """`k3env srt recipe` of variant F (with its profile's benchmark) in recipes/f.yaml."""
    good = srt_repo / "recipes" / "f.yaml"
    assert main(["srt", "recipe", "kimi-k3-direct-f", "--container", "reg/img@sha256:" + "0" * 64,
                 "--out", str(good), "-q"]) == 0  # fmt: skip
    assert 'benchmark:\n  type: "mooncake-router"\n' in good.read_text()
    return good


def test_valid_generated_recipe_passes_and_unknown_field_is_reported(
    srt_repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipes = srt_repo / "recipes"
    good = generated_recipe(srt_repo)
    capsys.readouterr()
    assert main(["srt", "validate", str(good), "-q"]) == 0
    assert "1 recipe(s) valid for srt-slurm v1.0.36" in capsys.readouterr().out
    bad = recipes / "bad.yaml"
    # The field the bring-up's recipe carried, which v1.0.36 does not know.
    workload = '  mooncake_workload: "toolagent"'
    bad.write_text(good.read_text().replace(workload, "  aiperf_server_metrics: true"))
    assert main(["srt", "validate", str(recipes), "--json", "-q"]) == 4
    out = json.loads(capsys.readouterr().out)
    assert out["errors"] == [
        {
            "file": str(bad.resolve()),
            "key": "benchmark.aiperf_server_metrics",
            "message": "Unknown field.",
            "stage": "load",
        }
    ]


def test_job_time_lookups_and_the_dry_run_catch_what_loading_does_not(
    srt_repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipes = srt_repo / "recipes"
    text = generated_recipe(srt_repo).read_text()
    # Loads (benchmark.type is a free string in the schema); the job's runner lookup fails.
    runner = recipes / "runner.yaml"
    runner.write_text(text.replace('type: "mooncake-router"', 'type: "aiperf"'))
    # Loads; srtctl's dry-run cannot render the sbatch script's output path.
    render = recipes / "render.yaml"
    render.write_text(text + 'output:\n  log_dir: "./outputs/{job}/logs"\n')
    # Two Dynamo install sources: srt-slurm's plain ValueError, in its own words.
    two = recipes / "two.yaml"
    two.write_text(text + 'dynamo:\n  hash: "abc"\n  wheel: "1.6.1"\n')
    capsys.readouterr()
    assert main(["srt", "validate", str(recipes), "--json", "-q"]) == 4
    errors = {Path(e["file"]).name: e for e in json.loads(capsys.readouterr().out)["errors"]}
    assert sorted(errors) == ["render.yaml", "runner.yaml", "two.yaml"]  # f.yaml is valid
    assert errors["runner.yaml"]["stage"] == "job"
    assert errors["runner.yaml"]["key"] == "benchmark.type"
    assert errors["runner.yaml"]["message"].startswith("Unknown benchmark type: aiperf. Available:")
    assert errors["render.yaml"]["stage"] == "dry-run"
    assert errors["render.yaml"]["key"] == "output.log_dir"
    assert "unknown placeholder 'job'" in errors["render.yaml"]["message"]
    assert errors["two.yaml"] == {
        "file": str(two.resolve()),
        "key": "",
        "message": "Cannot specify both Dynamo install sources: hash, wheel",
        "stage": "load",
    }


def test_dynamo_recipe_asks_for_no_install_when_dynamo_is_baked(srt_repo: Path) -> None:
    lock = load_lock(LOCK)
    spec = load_spec(srt_repo / "images/kimi-k3-dynamo.toml", lock)
    assert spec.dynamo_install == "baked"
    cluster = load_cluster(srt_repo / "clusters/b200-dgxc.toml")
    args: dict[str, Any] = dict(container="c", model_path="/m", precision="fp4",
                                dynamo_commit="a" * 40, aiperf_version="0.13.0")  # fmt: skip
    baked = recipe(spec, spec.profiles["agg"], cluster, {}, dynamo_baked=True, **args)
    assert baked["dynamo"] == {"install": False} and baked["frontend"]["type"] == "dynamo"
    flags = baked["backend"]["vllm_config"]["aggregated"]
    assert flags["dyn-tool-call-parser"] == "kimi_k3" and "setup_script" not in baked
    # The profile's benchmark, with the lock's pinned aiperf as its client.
    assert baked["benchmark"] == {
        "type": "mooncake-router",
        "mooncake_workload": "toolagent",
        "ttft_threshold_ms": 2000,
        "itl_threshold_ms": 25,
        "aiperf_package": "aiperf==0.13.0",
    }
    # Not in the image: never a silent fallback to a job-start build.
    with pytest.raises(SpecError, match="verify found no Dynamo in its image"):
        recipe(spec, spec.profiles["agg"], cluster, {}, dynamo_baked=False, **args)
    # Only when the spec asks for it, and only with a resolved commit.
    from_commit = dataclasses.replace(spec, dynamo_install="from-commit")
    built = recipe(from_commit, spec.profiles["agg"], cluster, {}, dynamo_baked=False, **args)
    assert built["dynamo"] == {"hash": "a" * 40}
    with pytest.raises(SpecError, match="commit is unresolved"):
        recipe(from_commit, spec.profiles["agg"], cluster, {}, dynamo_baked=False,
               **{**args, "dynamo_commit": None})  # fmt: skip


def test_a_benchmark_whose_image_has_no_aiperf_is_refused_unless_it_names_its_client(
    srt_repo: Path,
) -> None:
    spec = load_spec(srt_repo / "images/kimi-k3-direct-d.toml", load_lock(LOCK))
    bare = dataclasses.replace(spec, components=())
    cluster = load_cluster(srt_repo / "clusters/b200-dgxc.toml")
    args: dict[str, Any] = dict(container="c", model_path="/m", precision="fp4",
                                dynamo_baked=False, dynamo_commit=None,
                                aiperf_version="0.13.0")  # fmt: skip
    with pytest.raises(SpecError, match="carries no aiperf"):
        recipe(bare, spec.profiles["agg"], cluster, {}, **args)
    own = dataclasses.replace(
        spec.profiles["agg"], benchmark={**spec.profiles["agg"].benchmark, "aiperf_package": "x"}
    )
    assert recipe(bare, own, cluster, {}, **args)["benchmark"]["aiperf_package"] == "x"


def test_a_spec_with_an_unknown_dynamo_install_mode_is_refused(srt_repo: Path) -> None:
    path = srt_repo / "images/kimi-k3-dynamo.toml"
    path.write_text('dynamo_install = "at-job-start"\n' + path.read_text())
    with pytest.raises(SpecError, match="unknown Dynamo install mode") as e:
        load_spec(path, load_lock(LOCK))
    assert e.value.where is not None and e.value.where.endswith("dynamo_install")


def test_patch_whose_sha256_differs_is_refused(
    srt_repo: Path, srt_state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    patch = srt_repo / "patches/srt-slurm/pr278-direct-vllm-multinode.patch"
    patch.write_text(patch.read_text() + "\n")
    err = refused(capsys)
    assert "srt_slurm.patches[1].sha256" in err and "--update-hashes" in err


def test_conflicting_patch_is_refused_naming_the_hunk(
    srt_repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The multi-node patch alone (without PR #278 under it) does not apply to v1.0.36.
    text = LOCK.read_text()
    start = text.index("[[srt_slurm.patches]]")
    second = text.index("[[srt_slurm.patches]]", start + 1)
    LOCK.write_text(text[:start] + text[second:])
    err = refused(capsys)
    assert "does not apply" in err and "src/srtctl/core/schema.py, hunk @@" in err
    assert not list(State().path("srt").glob(".*partial"))  # nothing half-materialized


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('version = "v1.0.36"', 'version = "v9.9.9"', "tag v9.9.9 does not exist"),
        ("COMMIT", "PR278", "the lock pins"),
        ("GIT", "/nonexistent/srt-slurm", "git clone"),
    ],
    ids=["unknown-tag", "commit-not-on-tag", "missing-repository"],
)
def test_bad_input_leaves_nothing_behind(
    srt_repo: Path,
    upstream: Upstream,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    old: str,
    new: str,
    message: str,
) -> None:
    monkeypatch.setenv("K3ENV_STATE_DIR", str(srt_repo / "fresh-state"))  # no cache to hit
    old = {"COMMIT": f'commit = "{upstream.v1036}"', "GIT": str(upstream.path)}.get(old, old)
    new = {"PR278": f'commit = "{upstream.pr278}"'}.get(new, new)
    replace_in(LOCK, old, new)
    before = set(State().path("srt").glob("*")) if State().path("srt").exists() else set()
    assert main(["srt", "materialize"]) in (2, 3)
    assert message in capsys.readouterr().err
    after = set(State().path("srt").glob("*")) if State().path("srt").exists() else set()
    assert after == before


def test_srtctl_gets_the_pinned_closure_and_an_edit_to_it_is_found(
    srt_repo: Path, srtctl_requirements: str, capsys: pytest.CaptureFixture[str]
) -> None:
    first, _ = materialize(capsys)
    python = str(first["python"])
    # What the venv's own interpreter finds installed (it has no pip: k3env's installed it).
    listed = subprocess.run([python, "-c", LIST_INSTALLED],
                            capture_output=True, text=True, check=True).stdout  # fmt: skip
    installed: dict[str, str] = json.loads(listed)
    for line in srtctl_requirements.splitlines():
        if "==" in line and not line.startswith((" ", "#")):
            name, version = line.split(" ")[0].split("==")
            assert installed[name.lower()] == version, name
    # An edit to the installed srtctl (not to the checkout) is found on the next use.
    site = next(Path(python).parent.parent.glob("lib/python3*/site-packages"))
    config = site / "srtctl/core/config.py"
    edited = config.read_bytes().replace(b"def load_config(path):", b"def load_config(path):  #")
    err = refused(capsys, config, edited)
    assert "srtctl's environment changed since k3env installed it" in err
    assert "srtctl/core/config.py" in err
    materialize(capsys)
    # Bytecode runs without its source being read: an edited .pyc is found too; one Python
    # writes later for a module pip did not compile is not an edit.
    (pyc,) = (site / "srtctl/core/__pycache__").glob("config.*.pyc")
    data = pyc.read_bytes()
    assert "__pycache__/config." in refused(capsys, pyc, data[:-1] + bytes([data[-1] ^ 1]))
    (site / "srtctl/__pycache__/later.cpython-311.pyc").write_bytes(b"written at run time")
    materialize(capsys)


def test_a_pinned_closure_that_does_not_satisfy_srtctl_is_refused(
    srt_repo: Path, srtctl_requirements: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """srtctl needs pyyaml; a requirements file without it installs (--no-deps) and then
    fails pip's own check, naming what is missing. Nothing is left in the cache."""
    blocks = srtctl_requirements.split("\n")
    kept, skipping = [], False
    for line in blocks:
        if line and not line.startswith((" ", "#")):
            skipping = line.lower().startswith("pyyaml==")
        if not skipping:
            kept.append(line)
    (srt_repo / "pins/srtctl.requirements.txt").write_text("\n".join(kept))
    assert main(["lock", "--update-hashes", "-q"]) == 0
    capsys.readouterr()
    err = refused(capsys)
    assert "srtctl's pinned requirements do not satisfy srt-slurm v1.0.36" in err
    assert "pyyaml" in err.lower() and "srt_slurm.requirements" in err
    entries = list((Path(os.environ["K3ENV_STATE_DIR"]) / "srt").iterdir())
    assert not [e for e in entries if e.name.endswith(".partial")]


def test_dirty_cache_is_an_error(srt_repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first, _ = materialize(capsys)
    schema = Path(str(first["path"])) / "src/src/srtctl/core/schema.py"
    edited = schema.read_bytes() + b"# local edit\n"
    assert "the srt-slurm cache is dirty" in refused(capsys, schema, edited)
    materialize(capsys)


@pytest.mark.parametrize("text", ["{not json", "[]", '{"head": 1}', "{}"])
def test_a_rewritten_cache_marker_is_an_error_not_a_traceback(
    srt_repo: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    first, _ = materialize(capsys)
    marker = Path(str(first["path"])) / MARKER
    assert "the srt-slurm cache's marker" in refused(capsys, marker, text.encode())


def test_srt_patch_fates_after_a_version_bump(
    srt_repo: Path, upstream: Upstream, capsys: pytest.CaptureFixture[str]
) -> None:
    fates = patch_fates(load_lock(LOCK), Log(quiet=True))
    assert [f.status for f in fates] == ["applies", "applies"]
    # v1.0.37 carries PR #278: bump to it, and the PR patch is reported upstream.
    assert main(["bump", "srt-slurm", "v1.0.37", "--edit-only", "-q"]) == 0
    assert f'commit = "{upstream.pr278}"' in LOCK.read_text()
    fates = patch_fates(load_lock(LOCK), Log(quiet=True))
    assert [(f.label, f.status) for f in fates] == [
        ("PR #278", "upstream"),
        ("direct vllm frontend: vLLM-native multi-node serve", "applies"),
    ]
    assert "drop it" in fates[0].detail
    # v1.0.38 changed PR #278's lines again (it neither applies nor reverses): still upstream,
    # by history; the multi-node commit is in it too, found by its patch-id.
    assert main(["bump", "srt-slurm", "v1.0.38", "--edit-only", "-q"]) == 0
    fates = patch_fates(load_lock(LOCK), Log(quiet=True))
    assert [(f.label, f.status) for f in fates] == [
        ("PR #278", "upstream"),
        ("direct vllm frontend: vLLM-native multi-node serve", "upstream"),
    ]


@pytest.mark.parametrize("host_pip", [True, False], ids=["k3env's pip", "the venv's own"])
def test_srtctls_venv_gets_a_pip_that_installs_into_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host_pip: bool
) -> None:
    """k3env's own pip installs into a venv made without one; where k3env has no pip (or one
    older than ``--python``), the venv gets its own. Either way pip reports the venv's site."""
    if not host_pip:
        real = importlib.metadata.version

        def version(name: str) -> str:
            return "22.2" if name == "pip" else real(name)

        monkeypatch.setattr(importlib.metadata, "version", version)
    argv = srt.venv_pip(tmp_path / "venv", Log(quiet=True))
    assert (argv[0] == sys.executable) is host_pip
    assert (tmp_path / "venv/bin/pip").exists() is not host_pip
    shown = subprocess.run([*argv, "list", "--format", "json"], capture_output=True, text=True,
                           check=True).stdout  # fmt: skip
    names = {d["name"] for d in json.loads(shown)}
    assert "k3env" not in names and "pytest" not in names  # the venv's, not k3env's
