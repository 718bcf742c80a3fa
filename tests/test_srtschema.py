"""srt-slurm's recorded schema (schemas/srt-slurm.schema.json, `k3env srt schema` from the
pinned v1.0.36 + patches' own marshmallow schemas) checking recipes without srt-slurm: each
refusal in marshmallow's words, keyed as srt-slurm keys it. tests/engine/test_srt_upstream_
engine.py checks that srt-slurm's own loader refuses the same keys with the same words."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

from k3env.config.lock import load_lock
from k3env.config.srtschema import SrtSchema, check, load_srt_schema
from k3env.errors import LockError

from .conftest import REPO

RECIPES = REPO / "tests/data/recipes"


@pytest.fixture(scope="module")
def schema() -> SrtSchema:
    return load_srt_schema(REPO / "schemas/srt-slurm.schema.json")


def _recipe(name: str = "f.yaml") -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((RECIPES / name).read_text())
    return data


def test_the_recorded_schema_is_the_pinned_srt_slurms(schema: SrtSchema) -> None:
    lock = load_lock(REPO / "pins/k3.lock.toml")
    assert lock.srt_slurm is not None and schema.of(lock.srt_slurm)
    assert schema.messages["unknown"] == "Unknown field."  # marshmallow's own, recorded


def test_the_working_recipes_pass_and_attempt_a_is_refused(schema: SrtSchema) -> None:
    for name in ("d.yaml", "f.yaml"):
        assert check(_recipe(name), schema.recipe, schema) == [], name
    assert ("benchmark.aiperf_server_metrics", "Unknown field.") in check(
        _recipe("a1-fork.yaml"), schema.recipe, schema
    )


def test_typos_types_nulls_and_required_keys(schema: SrtSchema) -> None:
    r = _recipe()
    backend = r["backend"]
    r["backend"] = {**backend, "aggregated_enviroment": backend.get("aggregated_environment", {})}
    r["topline"] = 1
    r["name"] = 123
    r["slurm"] = None
    r["enable_config_dump"] = "maybe"
    r["lock"] = {"anything": True}  # popped by load_config before the schema
    del r["model"]
    got = dict(check(r, schema.recipe, schema))
    assert got == {
        "backend.aggregated_enviroment": "Unknown field.",
        "topline": "Unknown field.",
        "name": "Not a valid string.",
        "slurm": "Field may not be null.",
        "enable_config_dump": "Not a valid boolean.",
        "model": "Missing data for required field.",
    }
    # Not strict, as marshmallow is not: "yes" is a boolean, "8" an integer.
    ok = _recipe()
    ok["enable_config_dump"] = "yes"
    ok["resources"] = {**ok["resources"], "gpus_per_node": "8"}
    assert check(ok, schema.recipe, schema) == []


def test_a_cluster_config_key_srt_slurm_drops_the_file_for(schema: SrtSchema) -> None:
    cfg = {"default_container": "/x.sqsh", "containers": {"a": "b"}, "gpus_per_node": "eight"}
    assert dict(check(cfg, schema.cluster, schema)) == {
        "default_container": "Unknown field.",
        "gpus_per_node": "Not a valid integer.",
    }


def test_a_schema_file_k3env_did_not_write_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "s.json"
    bad.write_text(json.dumps({"srt_slurm": {}, "recipe": []}))
    with pytest.raises(LockError, match="not one k3env wrote"):
        load_srt_schema(bad)


def test_lock_check_names_a_schema_recorded_from_another_srt_slurm(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from k3env.cli import main

    from .conftest import replace_in

    # A bump moved srt-slurm and not its recorded schema.
    replace_in(Path("pins/k3.lock.toml"), 'version = "v1.0.36"', 'version = "v1.0.68"')
    replace_in(Path("pins/k3.lock.toml"), "cb651682117df129162cd276cf567ec70dc57b36",
               "c88ef731636890ff6385a783e152c1790e15b194")  # fmt: skip
    assert main(["lock", "--check", "--json", "-q"]) == 4
    out = json.loads(capsys.readouterr().out)
    assert out["srt_schema_stale"].startswith(
        "schemas/srt-slurm.schema.json was recorded from srt-slurm v1.0.36 (cb651682117d"
    )
    assert "the lock pins v1.0.68 (c88ef7316368" in out["srt_schema_stale"]
