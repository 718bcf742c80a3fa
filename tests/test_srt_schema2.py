"""srt-slurm 2.x's schema 2: one recipe model, two schemas. The bring-up's recipes
(tests/data/recipes), each rewritten to ``schema: 2`` by srt-slurm 2.x's real ``migrate.py``, get
from ``preflight --recipe`` the rule IDs, severities, lines and exit codes of their schema-1
forms, on the keys of their own schema; the pinned srt-slurm decides which schema loads, and
refuses the other in its own words (2.x's gate, run here from upstream's code, says them)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

from k3env.checks.known import SRT2_GATE_NO_SCHEMA, SRT2_GATE_UNSUPPORTED
from k3env.cli import main
from k3env.config.yamlread import load_yaml

from .conftest import REPO
from .srt2_upstream import Srt2, srt2
from .test_recipes_in import VERDICTS, line_of

__all__ = ["srt2"]  # the session fixture, used by name

RECIPES = REPO / "tests/data/recipes"
LOCK = Path("pins/k3.lock.toml")
SRT1, SRT2 = 'version = "v1.0.36"', 'version = "v2.18.0"'
# Spellings only schema 1 has: no schema-2 finding may be keyed on one of them.
SCHEMA1_ONLY = ("backend", "resources.agg_", "vllm_config", "aggregated_environment",
                "dynamo.hash", "dynamo.version", "dynamo.wheel")  # fmt: skip


def pin(version: str) -> None:
    """Pin srt-slurm ``version`` (SRT1 / SRT2) in the test repository's lock."""
    text = LOCK.read_text()
    LOCK.write_text(text.replace(SRT2 if version == SRT1 else SRT1, version))


def preflight(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = main(["preflight", "--json", "-q", *args])
    out = json.loads(capsys.readouterr().out)
    return code, out["recipes"][0]


def lookup(data: Any, key: str) -> tuple[Any, str]:
    """The value at ``key``'s deepest part that ``data`` has, and the rest of the key (None
    and the whole key: the recipe has none of it)."""
    parts = key.split(".")
    for cut in range(len(parts), 0, -1):
        node: Any = data
        for part in parts[:cut]:
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            return node, ".".join(parts[cut:])
    return None, key


def findings(result: dict[str, Any]) -> list[tuple[str, str, str, int | None, str]]:
    return sorted((f["rule"], f["severity"], f["key"], f["line"], f["file"])
                  for f in result["findings"] if f["rule"] != "SRT-LOADER")  # fmt: skip


@pytest.mark.parametrize("name", sorted(VERDICTS))
def test_a_recipe_migrated_by_srt_slurm_2x_is_judged_as_its_schema_1_form(
    resolved: Path, srt2: Srt2, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    v1 = RECIPES / name
    v2 = resolved / "schema2" / name
    v2.parent.mkdir(exist_ok=True)
    v2.write_text(srt2.migrated(v1.read_text()))
    assert srt2.gate(yaml.safe_load(v2.read_text())) is None  # 2.x's own gate loads it
    code1, r1 = preflight(capsys, "--recipe", str(v1))
    pin(SRT2)
    code2, r2 = preflight(capsys, "--recipe", str(v2))
    assert code2 == code1
    one, two = findings(r1), findings(r2)
    assert [f[:2] for f in two] == [f[:2] for f in one]  # same rules, same severities
    data1, data2 = yaml.safe_load(v1.read_text()), yaml.safe_load(v2.read_text())
    doc2 = load_yaml(v2)
    for (rule, _, key1, line1, file1), (_, _, key2, line2, file2) in zip(one, two, strict=True):
        if file1 == str(LOCK):  # a finding on the lock keeps the lock's key
            assert (key2, line2, file2) == (key1, line1, file1)
            continue
        assert file2 == str(v2)
        assert not any(key2.startswith(old) or f".{old}" in key2 for old in SCHEMA1_ONLY), key2
        # The same thing as migrate moved it: the same value (or, for a key to add, the same
        # section), with the same rest of the key.
        value1, rest1 = lookup(data1, key1)
        value2, rest2 = lookup(data2, key2)
        assert (value2, rest2) == (value1, rest1), (rule, key1, key2)
        assert (line1 is None) == (line2 is None) and line2 == doc2.line(key2), (rule, key2)
        if line2 is not None and not rest2:
            text = v2.read_text().splitlines()[line2 - 1]
            assert text.strip().startswith(key2.rsplit(".", 1)[-1] + ":"), (key2, text)
    # 2.x's own loader is not here: said not checked, never passed.
    assert r2["srt_slurm_loader"]["status"] == "not checked"
    assert "v2.18.0 is not materialized" in r2["srt_slurm_loader"]["detail"]


def test_the_gate_words_k3env_says_are_srt_slurm_2x_s_own(srt2: Srt2) -> None:
    assert srt2.gate({"name": "x"}) == SRT2_GATE_NO_SCHEMA
    for value in (1, 3, "2", True):
        assert srt2.gate({"schema": value}) == SRT2_GATE_UNSUPPORTED.format(value=value)
    assert srt2.gate({"schema": 2}) is None


def test_the_pinned_srt_slurm_decides_the_schema_and_the_rules_judge_both(
    resolved: Path, srt2: Srt2, capsys: pytest.CaptureFixture[str]
) -> None:
    v1 = RECIPES / "d1-mem-095.yaml"
    v2 = resolved / "d1-v2.yaml"
    v2.write_text(srt2.migrated(v1.read_text()))
    # A schema-1 recipe against srt-slurm 2.x: refused in its gate's words, migrate the fix.
    pin(SRT2)
    code, r = preflight(capsys, "--recipe", str(v1))
    assert code == 4
    (gate,) = [f for f in r["findings"] if f["rule"] == "SRT-LOADER"]
    assert gate["key"] == "schema" and gate["line"] is None
    assert gate["message"].endswith(srt2.gate(yaml.safe_load(v1.read_text())) or "?")
    assert gate["fix"].startswith(f"k3env srt migrate {v1}")
    assert r["srt_slurm_loader"]["status"] == "failed"
    assert "K3-GPU-MEM-HEADROOM" in {f["rule"] for f in r["findings"]}  # still judged
    # `schema: 1` says its value, as the gate does.
    one = resolved / "d1-schema1.yaml"
    one.write_text("schema: 1\n" + v1.read_text())
    _, r = preflight(capsys, "--recipe", str(one))
    (gate,) = [f for f in r["findings"] if f["rule"] == "SRT-LOADER"]
    assert gate["line"] == 1
    assert gate["message"].endswith(srt2.gate(yaml.safe_load(one.read_text())) or "?")
    # A schema-2 recipe against srt-slurm 1.x: its recorded loader refuses 2.x's keys, in its
    # words (marshmallow's, recorded from v1.0.36); the rules judge it all the same.
    pin(SRT1)
    code, r = preflight(capsys, "--recipe", str(v2))
    assert code == 4
    refused = {f["key"]: f["message"] for f in r["findings"] if f["rule"] == "SRT-LOADER"}
    assert set(refused) == {"schema", "engine", "roles"}
    assert all(m.endswith(": Unknown field.") and "v1.0.36" in m for m in refused.values())
    (mem,) = [f for f in r["findings"] if f["rule"] == "K3-GPU-MEM-HEADROOM"]
    assert mem["key"] == "roles.agg.args.gpu-memory-utilization"
    # With no recorded schema to say it, the 1.x refusal is still said, on `schema`.
    text = LOCK.read_text()
    LOCK.write_text("\n".join(line for line in text.splitlines()
                              if not line.startswith("schema")) + "\n")  # fmt: skip
    _, r = preflight(capsys, "--recipe", str(v2))
    (gate,) = [f for f in r["findings"] if f["rule"] == "SRT-LOADER"]
    assert gate["key"] == "schema" and "loads schema-1 recipes only" in gate["message"]
    assert "bump srt-slurm" in gate["fix"]


V2 = """schema: 2
name: x
model: {path: /models/Kimi-K3, container: vllm/vllm-openai:kimi-k3}
resources: {gpu_type: b200, gpus_per_node: 8}
frontend: {type: dynamo, env: {DYN_LOG: debug}}
engine: {type: vllm, connector: none}
roles:
  agg:
    nodes: 2
    workers: 1
    env:
      AIPERF_USE_DYNAMO_CONV_AWARE_ROUTING: "0"
    args:
      tensor-parallel-size: 8
      pipeline-parallel-size: 2
      dyn-tool-call-parser: kimi_k3
      dyn-reasoning-parser: kimi_k3
dynamo:
  source:
    rev: ba83080ecd31c1ce918559e576d3c5bc9e092ff1
benchmark:
  type: mooncake-router
  aiperf_package: aiperf==0.13.0
"""


def test_env_as_srt_slurm_2x_places_it(resolved: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pin(SRT2)
    recipe = resolved / "v2.yaml"
    recipe.write_text(V2)
    _, r = preflight(capsys, "--recipe", str(recipe))
    hits = {f["rule"]: f for f in r["findings"]}
    # roles.agg.env reaches the engine only: aiperf still sends session_control.
    session = hits["K3-AIPERF-SESSION-CONTROL"]
    assert session["key"] == "environment.AIPERF_USE_DYNAMO_CONV_AWARE_ROUTING"
    assert "is set for the engine only" in session["message"]
    assert any(n.startswith("frontend.env (DYN_LOG) reaches the frontend only") for n in r["notes"])
    env = {e["name"]: e["key"] for e in r["env"]}
    assert env["AIPERF_USE_DYNAMO_CONV_AWARE_ROUTING"] == (
        "roles.agg.env.AIPERF_USE_DYNAMO_CONV_AWARE_ROUTING"
    )
    # benchmark.env reaches the client (2.x's runners pass it after the job's environment).
    recipe.write_text(V2 + "  env:\n    AIPERF_USE_DYNAMO_CONV_AWARE_ROUTING: '0'\n")
    _, r = preflight(capsys, "--recipe", str(recipe))
    assert "K3-AIPERF-SESSION-CONTROL" not in {f["rule"] for f in r["findings"]}
    # ... and the top-level environment reaches both, after the role's env (it wins).
    recipe.write_text(V2.replace('      AIPERF_USE_DYNAMO_CONV_AWARE_ROUTING: "0"\n', "")
                      + "environment:\n  AIPERF_USE_DYNAMO_CONV_AWARE_ROUTING: '0'\n")  # fmt: skip
    _, r = preflight(capsys, "--recipe", str(recipe))
    assert "K3-AIPERF-SESSION-CONTROL" not in {f["rule"] for f in r["findings"]}
    env = {e["name"]: e["key"] for e in r["env"]}
    assert env["AIPERF_USE_DYNAMO_CONV_AWARE_ROUTING"] == (
        "environment.AIPERF_USE_DYNAMO_CONV_AWARE_ROUTING"
    )


def test_schema_2_engine_container_and_dynamo_source_are_its_own_keys(
    resolved: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pin(SRT2)
    recipe = resolved / "v2.yaml"
    # A role's own container is the image its engine runs.
    recipe.write_text(V2.replace("    nodes: 2\n", "    nodes: 2\n    container: /c/other.sqsh\n"))
    _, r = preflight(capsys, "--recipe", str(recipe))
    assert r["image"]["container"] == "/c/other.sqsh"
    assert "an image k3env cannot place" in r["image"]["how"]
    # dynamo.source.rev: a commit k3env knows is that Dynamo; one it does not know is said on
    # its own key.
    recipe.write_text(V2.replace("ba83080ecd31c1ce918559e576d3c5bc9e092ff1", "deadbeef" * 5))
    _, r = preflight(capsys, "--recipe", str(recipe))
    assert any(n.startswith("dynamo.source.rev deadbeef") for n in r["notes"])
    # dynamo.source.pypi: that release is what the rules judge, on the recipe's own key.
    recipe.write_text(V2.replace("rev: ba83080ecd31c1ce918559e576d3c5bc9e092ff1", 'pypi: "1.2.1"'))
    _, r = preflight(capsys, "--recipe", str(recipe))
    (tokenizer,) = [f for f in r["findings"] if f["rule"] == "K3-TOKENIZER-MODEL-TYPE"]
    assert "Dynamo 1.2.1" in tokenizer["message"]
    assert any("installs Dynamo 1.2.1" in n and "[dynamo]" in n for n in r["notes"])
    # No engine: srt-slurm's default engine (SGLang), said on `engine`.
    recipe.write_text(V2.replace("engine: {type: vllm, connector: none}\n", ""))
    assert main(["preflight", "--recipe", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert "engine is 'sglang' (srt-slurm's default: the recipe sets none)" in err
    assert "set engine: vllm" in err
    # A schema k3env does not read is refused, naming it.
    recipe.write_text(V2.replace("schema: 2", "schema: 3"))
    assert main(["preflight", "--recipe", str(recipe)]) == 2
    assert f"{recipe}:1: schema" in capsys.readouterr().err


def write_recipe(spec: str, profile: str, original: dict[str, Any], out: Path) -> dict[str, Any]:
    assert main(["srt", "recipe", spec, "--profile", profile, "--container",
                 original["model"]["container"], "--model-path", original["model"]["path"],
                 "--out", str(out), "-q"]) == 0  # fmt: skip
    return dict(yaml.safe_load(out.read_text()))


@pytest.mark.parametrize("name", ["c.yaml", "d.yaml", "f.yaml"])
def test_k3env_writes_schema_2_for_srt_slurm_2x_as_its_own_migrate_would(
    resolved: Path, srt2: Srt2, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    """`k3env srt recipe` (and adopt's round trip) with a 2.x pin: the recipe passes 2.x's real
    gate and roles/engine expansion, and is what 2.x's own migrate makes of the schema-1
    recipe k3env writes for 1.x, key for key and in its key order."""
    source = RECIPES / name
    original = yaml.safe_load(source.read_text())
    assert main(["adopt", str(source), "--json", "-q"]) == 0
    adopted = json.loads(capsys.readouterr().out)
    spec, profile = adopted["spec"], adopted["profile"]
    one = resolved / "one.yaml"
    schema1 = write_recipe(spec, profile, original, one)
    pin(SRT2)
    schema2 = write_recipe(spec, profile, original, resolved / "two.yaml")
    migrated = yaml.safe_load(srt2.migrated(one.read_text()))
    assert schema2 == migrated and list(schema2) == list(migrated)
    assert list(schema2["roles"]["agg"]) == list(migrated["roles"]["agg"])
    assert srt2.gate(schema2) is None
    expanded = srt2.config.resolve_config_with_defaults(schema2, None)
    assert {**expanded, "schema": None} == {**schema1, "schema": None}  # the same job
    # adopt's round trip of the schema-2 recipe, under the 2.x pin: the same one difference.
    v2 = resolved / "schema2" / name
    v2.parent.mkdir()
    v2.write_text(srt2.migrated(source.read_text()))
    Path(adopted["out"]).unlink()
    assert main(["adopt", str(v2), "--json", "-q"]) == 0
    again = json.loads(capsys.readouterr().out)
    moved = {"backend.connector": "engine.connector", "dynamo.hash": "dynamo.source",
             "backend.aggregated_environment.": "roles.agg.env."}  # fmt: skip
    expected = []
    for d in adopted["differences"]:
        key = d["key"]
        for old, new in moved.items():
            key = key.replace(old, new) if key.startswith(old) else key
        expected.append((key, d["why"]))
    assert [(d["key"], d["why"]) for d in again["differences"]] == expected


def test_the_cluster_smokes_recipe_is_schema_2_for_srt_slurm_2x(
    repo: Path, srt2: Srt2, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copytree(REPO / "clusters", repo / "clusters")
    container = "reg.example:5000/k3env/kimi-k3-direct-f@sha256:" + "ab" * 32
    args = ["smoke", "--cluster", "clusters/b200-dgxc.toml", "kimi-k3-direct-f", "--container",
            container, "--json", "-q"]  # fmt: skip
    assert main([*args, "--out", "one"]) == 0
    pin(SRT2)
    assert main([*args, "--out", "two"]) == 0
    capsys.readouterr()
    two = Path("two/recipe.yaml").read_text()
    one = Path("one/recipe.yaml").read_text().replace("/one/bin", "/two/bin")  # its --out
    schema2 = yaml.safe_load(two)
    assert schema2 == yaml.safe_load(srt2.migrated(one)) and schema2["schema"] == 2
    assert srt2.gate(schema2) is None
    expanded = srt2.config.resolve_config_with_defaults(schema2, None)
    assert {**expanded, "schema": None} == {**yaml.safe_load(one), "schema": None}


def test_a_half_migrated_recipe_is_refused_in_2xs_words_and_still_judged(
    resolved: Path, srt2: Srt2, capsys: pytest.CaptureFixture[str]
) -> None:
    """`schema: 2` over a schema-1 body (the key added by hand): 2.x's gate names each v1 key
    it still carries; k3env says that in the gate's words, and the rules judge it anyway."""
    pin(SRT2)
    half = resolved / "half.yaml"
    text = (RECIPES / "d1-mem-095.yaml").read_text()
    half.write_text("schema: 2\n" + text + "dynamo:\n  version: 1.2.1\n")
    code, r = preflight(capsys, "--recipe", str(half))
    assert code == 4
    (gate,) = [f for f in r["findings"] if f["rule"] == "SRT-LOADER"]
    assert gate["message"].endswith(srt2.gate(yaml.safe_load(half.read_text())) or "?")
    assert gate["key"] == "backend" and gate["fix"].startswith(f"k3env srt migrate {half}")
    (mem,) = [f for f in r["findings"] if f["rule"] == "K3-GPU-MEM-HEADROOM"]
    assert mem["key"] == "backend.vllm_config.aggregated.gpu-memory-utilization"
    assert mem["line"] == 1 + line_of(RECIPES / "d1-mem-095.yaml", "gpu-memory-utilization:")
