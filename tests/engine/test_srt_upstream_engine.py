"""The real srt-slurm: the committed lock's v1.0.36 + PR #278 + the PR #296 back-port,
materialized from the lock's own URL (served on a host without GitHub from the real history,
`../shared/upstream/srt-slurm.bundle`, which `scripts/host-setup.sh` mirrors and points git's
`insteadOf` at), its own loader judging the bring-up's recipes.

The stand-in upstream of tests/fake_srt stays for the unit suite (conflicts, bumps, fates:
histories the real one does not have); here the verdicts are srt-slurm's, in its own words.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml  # type: ignore[import-untyped]

from k3env.cli import main

from ..conftest import REPO

RECIPES = REPO / "tests/data/recipes"
SRT_URL = "https://github.com/NVIDIA/srt-slurm.git"
# srt-slurm's own words (src/srtctl/core/schema.py at 6fd60000, PR #278): the 2-node direct
# frontend is refused without the multi-node patch.
SINGLE_NODE_ONLY = "frontend.type: vllm currently supports single-node aggregate jobs only"
# marshmallow's, as srt-slurm's loader reports a key its schema does not have.
UNKNOWN_FIELD = "Unknown field."


def _mirrored() -> None:
    """The lock's srt-slurm URL must resolve without GitHub: through git's insteadOf."""
    got = subprocess.run(["git", "ls-remote", SRT_URL, "refs/tags/v1.0.36"],
                         capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    if got.returncode != 0 or not got.stdout.startswith("cb651682117df129162cd276cf567ec70dc57b36"):
        if os.environ.get("CI") or os.environ.get("K3ENV_REQUIRE_ENGINE"):
            pytest.fail(f"{SRT_URL} does not resolve here: run scripts/host-setup.sh")
        pytest.skip(f"{SRT_URL} does not resolve here (no GitHub, no mirror)")


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    _mirrored()
    for d in ("pins", "images", "patches", "clusters", "schemas"):
        shutil.copytree(REPO / d, tmp_path / d)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("K3ENV_STATE_DIR", str(tmp_path / "state"))
    return tmp_path


def test_the_pinned_srt_slurm_judges_the_bring_up_recipes_in_its_own_words(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["lock", "--check", "--json", "-q"]) == 0
    unresolved = {u["key"] for u in json.loads(capsys.readouterr().out)["unresolved"]}
    assert not {k for k in unresolved if k.startswith("srt_slurm")}, unresolved
    assert main(["srt", "materialize", "--json", "-q"]) == 0
    m = json.loads(capsys.readouterr().out)
    assert m["version"] == "v1.0.36" and len(m["patches"]) == 2
    recipes = sorted(str(p) for p in RECIPES.glob("*.yaml"))
    assert main(["srt", "validate", "--json", "-q", *recipes]) == 4
    errors = json.loads(capsys.readouterr().out)["errors"]
    # Attempt A's real failure on the cquil11 fork's field, and nothing else.
    assert [(Path(e["file"]).name, e["key"], e["message"]) for e in errors] == [
        ("a1-fork.yaml", "benchmark.aiperf_server_metrics", UNKNOWN_FIELD)
    ]
    # The recipe that served (2-node direct vLLM, TP8 x PP2): preflight's exit is usable.
    assert main(["preflight", "--recipe", str(RECIPES / "f.yaml"), "--json", "-q"]) == 0
    (f,) = json.loads(capsys.readouterr().out)["recipes"]
    assert f["srt_slurm_loader"]["status"] == "passed"
    _what_k3env_writes_loads(project, capsys)
    _the_recorded_schema_agrees(project, capsys)


def _what_k3env_writes_loads(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The recipes k3env writes (`srt recipe` of each committed direct spec, and the one
    `adopt` regenerates from the served recipe F with the job's own keys) load and dry-run
    in the pinned srt-slurm."""
    container = "reg.example/k3env/x@sha256:" + "ab" * 32
    written = []
    for spec in ("kimi-k3-direct-d", "kimi-k3-direct-f"):
        out = project / f"{spec}.yaml"
        assert main(["srt", "recipe", spec, "--container", container, "--out", str(out),
                     "-q"]) == 0  # fmt: skip
        written.append(out)
    f = yaml.safe_load((RECIPES / "f.yaml").read_text())
    f["slurm"] = {"time_limit": "04:00:00"}
    f["extra_mount"] = ["/lustre/traces:/traces"]
    source = project / "f-traces.yaml"
    source.write_text(yaml.safe_dump(f, sort_keys=False))
    assert main(["adopt", str(source), "--out", str(project / "images/adopted.toml"), "-q"]) == 0
    regenerated = project / "adopted.yaml"
    assert main(["srt", "recipe", "adopted", "--container", container, "--out",
                 str(regenerated), "-q"]) == 0  # fmt: skip
    written.append(regenerated)
    capsys.readouterr()
    assert main(["srt", "validate", "--json", "-q", *map(str, written)]) == 0
    assert json.loads(capsys.readouterr().out)["errors"] == []


def _the_recorded_schema_agrees(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The committed schema is what this srt-slurm's loader reads; a typo, an unknown key and
    a wrong type are refused by both, at the same keys, in the same words."""
    from k3env.config.srtschema import check, load_srt_schema

    assert main(["srt", "schema", "--check", "--json", "-q"]) == 0, capsys.readouterr()
    capsys.readouterr()
    recipe = yaml.safe_load((RECIPES / "f.yaml").read_text())
    backend = recipe["backend"]
    backend["aggregated_enviroment"] = backend.pop("aggregated_environment", {"A": "1"})
    recipe["benchmark"]["type_"] = "aiperf"
    recipe["name"] = 123
    bad = project / "typos.yaml"
    bad.write_text(yaml.safe_dump(recipe))
    assert main(["srt", "validate", "--json", "-q", str(bad)]) == 4
    loader = {(e["key"], e["message"]) for e in json.loads(capsys.readouterr().out)["errors"]}
    schema = load_srt_schema(REPO / "schemas/srt-slurm.schema.json")
    recorded = set(check(recipe, schema.recipe, schema))
    assert (
        recorded
        == loader
        == {
            ("backend.aggregated_enviroment", UNKNOWN_FIELD),
            ("benchmark.type_", UNKNOWN_FIELD),
            ("name", "Not a valid string."),
        }
    )


def test_without_the_multi_node_back_port_the_2_node_recipe_is_refused(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lock = project / "pins/k3.lock.toml"
    text = lock.read_text()
    start = text.index("[[srt_slurm.patches]]", text.index("[[srt_slurm.patches]]") + 1)
    end = text.index("# ----", start)
    lock.write_text(text[:start] + text[end:])  # only PR #278
    assert main(["srt", "materialize", "-q"]) == 0
    capsys.readouterr()
    assert main(["srt", "validate", "--json", "-q", str(RECIPES / "d.yaml")]) == 4
    (error,) = json.loads(capsys.readouterr().out)["errors"]
    assert SINGLE_NODE_ONLY in error["message"] and error["key"] == "frontend.type"


@pytest.mark.twin
def test_a_bump_to_v1_0_68_finds_both_patches_upstream_by_ancestry(
    project: Path, twin_image: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`k3env bump srt-slurm v1.0.68` on the real history: PR #278's commits and the commit
    the multi-node patch back-ports (e32e5910, PR #296) are both in v1.0.68's history, so
    both are reported upstream (drop them), in the JSON and the PR body; the bring-up's
    recipes still load."""
    images = project / "only-d"
    images.mkdir()
    shutil.copy(project / "images/kimi-k3-direct-d.toml", images)
    body = project / "body.md"
    code = main(["bump", "srt-slurm", "v1.0.68", "--twin", "--images", str(images),
                 "--body", str(body), "--json", "-q"])  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    changes = {c["key"]: c["new"] for c in out["changes"]}
    assert changes == {"srt_slurm.version": "v1.0.68",
                       "srt_slurm.commit": "c88ef731636890ff6385a783e152c1790e15b194"}  # fmt: skip
    fates = {p["name"]: p for p in out["after"]["patches"] if p["base"].startswith("srt-slurm")}
    pr278 = fates["PR #278"]
    assert pr278["status"] == "upstream" and "6fd6000035c8" in pr278["detail"], pr278
    multi = fates["direct vllm frontend: vLLM-native multi-node serve"]
    assert multi["status"] == "upstream", multi
    assert "the commit it back-ports (e32e591067fa) is in v1.0.68's history" in multi["detail"]
    text = body.read_text()
    assert text.count("upstream: drop it") >= 2, text
    assert code == 0, json.dumps(out, indent=1)[:4000]
    assert out["lock_written"] is True
    assert 'version = "v1.0.68"' in (project / "pins/k3.lock.toml").read_text()
