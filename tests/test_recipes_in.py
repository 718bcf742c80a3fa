"""Recipes in: the bring-up's srt-slurm recipes (tests/data/recipes, written from its history)
get from `preflight --recipe` the verdicts the history recorded, with the rule IDs of k3env's
own specs; adopt round-trips; an unknown srtslurm.yaml key fails naming it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

from k3env.cli import main
from k3env.config.lock import load_lock
from k3env.config.spec import load_spec
from k3env.image.records import Build, Exported, Facts, Pushed, build_key, write
from k3env.srt.adopt import ABSENT, Difference, naming, recipe_diff
from k3env.state import State

from .conftest import REPO

RECIPES = REPO / "tests/data/recipes"
LOCK = Path("pins/k3.lock.toml")
E, W = "error", "warning"
# The bring-up image carries no int64 index fix: its first decode crashes (an error), unless the
# recipe's setup_script (from the sixth sweep on) may apply it at job start (said: a warning).
DROPPED = {"K3-DROPPED-PATCH": W}
CRASHES = {"K3-DROPPED-PATCH": E}

# recipe -> {rule: worst severity}: the failures its cluster run hit (tests/data/recipes/README).
VERDICTS: dict[str, dict[str, str]] = {
    # Attempt A's own failure, `benchmark.aiperf_server_metrics: Unknown field.`: srt-slurm's
    # recorded schema refuses it without srt-slurm materialized (SRT-LOADER).
    "a1-fork.yaml": {"K3-PARSER-FLAGS": E, "K3-TOKENIZER-MODEL-TYPE": E, "SRT-LOADER": E,
                     "K3-GPU-MEM-HEADROOM": E, "K3-ALLOC-FRAGMENTATION": E, **CRASHES},
    "a2-dynamo-1.2.1.yaml": {"K3-TOKENIZER-MODEL-TYPE": E, "K3-GPU-MEM-HEADROOM": E,
                             "K3-ALLOC-FRAGMENTATION": E, **CRASHES},
    "a3-session-control.yaml": {"K3-AIPERF-SESSION-CONTROL": E, "K3-GPU-MEM-HEADROOM": E,
                                "K3-ALLOC-FRAGMENTATION": E, **CRASHES},
    "a4-mamba.yaml": {"K3-GPU-MEM-HEADROOM": E, "K3-ALLOC-FRAGMENTATION": E, **CRASHES},
    "c.yaml": {"K3-ALLOC-FRAGMENTATION": E, **DROPPED},
    "d1-mem-095.yaml": {"K3-GPU-MEM-HEADROOM": E, "K3-ALLOC-FRAGMENTATION": W, **DROPPED},
    "d2-retention.yaml": {"K3-RETENTION-BLOCK": E, "K3-ALLOC-FRAGMENTATION": W, **DROPPED},
    "d.yaml": {"K3-ALLOC-FRAGMENTATION": W, **DROPPED},
    "e1-cross-layer.yaml": {"K3-CROSS-LAYER-HYBRID": E, "K3-ALLOC-FRAGMENTATION": E, **DROPPED},
    "e.yaml": {"K3-ALLOC-FRAGMENTATION": E, **DROPPED},
    "f1-no-cumem.yaml": {"K3-SIMPLECPU-CUMEM": E, **DROPPED},
    "f2-custom-ar.yaml": {"K3-CUMEM-CUSTOM-AR": E, **DROPPED},
    "f.yaml": {**DROPPED},
}  # fmt: skip


def preflight(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = main(["preflight", "--json", "-q", *args])
    return code, json.loads(capsys.readouterr().out)


def worst(result: dict[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for f in result["findings"]:
        if out.get(f["rule"]) != E:
            out[f["rule"]] = f["severity"]
    return out


def line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


@pytest.mark.parametrize("name", sorted(VERDICTS))
def test_each_recipe_gets_the_verdict_its_run_recorded(
    resolved: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    code, out = preflight(capsys, "--recipe", str(RECIPES / name))
    (result,) = out["recipes"]
    assert worst(result) == VERDICTS[name]
    assert code == (4 if E in VERDICTS[name].values() else 0)
    # srt-slurm is not materialized here: its recorded schema refuses, it never passes.
    loader = result["srt_slurm_loader"]
    assert loader["status"] == ("failed" if "SRT-LOADER" in VERDICTS[name] else "not checked")
    assert (
        "not materialized" in loader["detail"] and "srt-slurm v1.0.36's schema" in loader["detail"]
    )


def test_findings_name_the_recipes_own_keys_and_lines(
    resolved: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = [
        ("d1-mem-095.yaml", "K3-GPU-MEM-HEADROOM",
         "backend.vllm_config.aggregated.gpu-memory-utilization", "gpu-memory-utilization:"),
        ("d2-retention.yaml", "K3-RETENTION-BLOCK",
         "backend.aggregated_environment.VLLM_PREFIX_CACHE_RETENTION_INTERVAL",
         "VLLM_PREFIX_CACHE_RETENTION_INTERVAL:"),
        ("e1-cross-layer.yaml", "K3-CROSS-LAYER-HYBRID",
         "backend.vllm_config.aggregated.kv-transfer-config", "kv-transfer-config:"),
        ("f2-custom-ar.yaml", "K3-CUMEM-CUSTOM-AR",
         "backend.vllm_config.aggregated.enable-cumem-allocator", "enable-cumem-allocator:"),
        ("a1-fork.yaml", "K3-PARSER-FLAGS",
         "backend.vllm_config.aggregated.enable-auto-tool-choice", "enable-auto-tool-choice:"),
        # Where srt-slurm's benchmark step reads it: the top-level `environment` (the recipe
        # has none yet, so no line).
        ("a3-session-control.yaml", "K3-AIPERF-SESSION-CONTROL",
         "environment.AIPERF_USE_DYNAMO_CONV_AWARE_ROUTING", None),
    ]  # fmt: skip
    for name, rule, key, text in cases:
        path = RECIPES / name
        _, out = preflight(capsys, "--recipe", str(path))
        hits = [f for f in out["recipes"][0]["findings"] if f["rule"] == rule and f["key"] == key]
        assert hits, (name, out["recipes"][0]["findings"])
        line = None if text is None else line_of(path, text)
        assert hits[0]["file"] == str(path) and hits[0]["line"] == line
    # The fix put where only the engine reads it: aiperf still sends session_control.
    engine_only = resolved / "a3-engine-only.yaml"
    engine_only.write_text((RECIPES / "a3-session-control.yaml").read_text().replace(
        "  aggregated_environment:\n",
        '  aggregated_environment:\n    AIPERF_USE_DYNAMO_CONV_AWARE_ROUTING: "0"\n'))  # fmt: skip
    _, out = preflight(capsys, "--recipe", str(engine_only))
    (hit,) = [f for f in out["recipes"][0]["findings"] if f["rule"] == "K3-AIPERF-SESSION-CONTROL"]
    assert hit["key"] == "environment.AIPERF_USE_DYNAMO_CONV_AWARE_ROUTING"
    assert "is set for the engine only" in hit["message"]
    # The human form is a linter's: FILE:LINE: KEY: RULE severity.
    path = RECIPES / "d1-mem-095.yaml"
    assert main(["preflight", "--recipe", str(path)]) == 4
    line = line_of(path, "gpu-memory-utilization:")
    assert (f"{path}:{line}: backend.vllm_config.aggregated.gpu-memory-utilization: "
            "K3-GPU-MEM-HEADROOM error:") in capsys.readouterr().out  # fmt: skip


def test_the_committed_lock_is_judged_on_its_own_keys(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The committed lock pins both PR patch files: the 2-node direct recipe that served
    passes the lock's rules (exit 0, usable), and where srt-slurm is not materialized its
    loader is said not to have run, naming why, never passed. With the patch pins unresolved
    (a lock written where the files could not be made), the recipe fails on the lock's keys."""
    shutil.copytree(REPO / "clusters", repo / "clusters")
    code, out = preflight(capsys, "--recipe", str(RECIPES / "f.yaml"))
    assert code == 0
    (result,) = out["recipes"]
    assert not [f for f in result["findings"] if f["rule"] == "K3-SRT-FRONTEND"]
    loader = result["srt_slurm_loader"]
    assert loader["status"] == "not checked" and "not materialized" in loader["detail"]
    assert main(["preflight", "--recipe", str(RECIPES / "f.yaml")]) == 0
    assert "srt-slurm's loader and dry-run: not checked (" in capsys.readouterr().out
    text = LOCK.read_text()
    LOCK.write_text(text.replace('sha256 = "253af8dc0d1c4348b85e6c9851cd3e68e2cccf9ea77d61d6feaa'
                                 '91702f7aea9d"', 'sha256 = "unresolved"'))  # fmt: skip
    code, out = preflight(capsys, "--recipe", str(RECIPES / "f.yaml"))
    assert code == 4
    (result,) = out["recipes"]
    srt = {(f["file"], f["key"]) for f in result["findings"] if f["rule"] == "K3-SRT-FRONTEND"}
    assert srt == {("pins/k3.lock.toml", "srt_slurm.patches[0]")}
    assert "unresolved" in result["srt_slurm_loader"]["detail"]


def test_the_effective_env_lists_each_baked_value_a_recipe_changes(
    resolved: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = (RECIPES / "d.yaml").read_text()
    changed = resolved / "d-off.yaml"
    changed.write_text(
        text.replace('K3_LATENT_MOE_TAIL_FUSION: "1"', 'K3_LATENT_MOE_TAIL_FUSION: "0"')
    )
    _, out = preflight(capsys, "--recipe", str(changed))
    (result,) = out["recipes"]
    assert result["env_changed"] == ["VLLM_ENABLE_K3_LATENT_MOE_TAIL_FUSION"]
    (entry,) = [e for e in result["env"] if e["changed"]]
    assert entry["baked"] == "1" and entry["value"] == "0"
    assert entry["key"] == "backend.aggregated_environment.VLLM_ENABLE_K3_LATENT_MOE_TAIL_FUSION"
    # `environment:` is exported after the mode's env: it wins, and is the key named.
    changed.write_text(text + 'environment:\n  NCCL_CUMEM_ENABLE: "0"\n')
    _, out = preflight(capsys, "--recipe", str(changed))
    env = {e["name"]: e for e in out["recipes"][0]["env"]}
    assert env["NCCL_CUMEM_ENABLE"]["value"] == "0"
    assert env["NCCL_CUMEM_ENABLE"]["key"] == "environment.NCCL_CUMEM_ENABLE"
    assert main(["preflight", "--recipe", str(changed)]) == 0


def test_a_container_k3env_pushed_is_its_image_with_its_patches_and_facts(
    resolved: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lock = load_lock(LOCK)
    spec = load_spec(Path("images/kimi-k3-direct-f.toml"), lock)
    state, image_id = State(), "sha256:" + "cd" * 32
    ref, digest = "127.0.0.1:5000/k3env/kimi-k3-direct-f:abc", "sha256:" + "ef" * 32
    write(state, Build(image_id=image_id, reference="k3env/kimi-k3-direct-f:abc", twin=False),
          build_key(lock, spec, twin=False))  # fmt: skip
    write(state, Pushed(image=spec.name, image_id=image_id, reference=ref, digest=digest,
                        layers_sent=1, layers_skipped=0), image_id)  # fmt: skip
    write(state, Facts(facts={"vllm": {"scheduler_block_size": 3145728}}), image_id)
    recipe = resolved / "f-pushed.yaml"
    by_digest = f"127.0.0.1:5000/k3env/kimi-k3-direct-f@{digest}"
    final = (RECIPES / "f.yaml").read_text()
    recipe.write_text(final.replace("vllm/vllm-openai:kimi-k3", by_digest))
    code, out = preflight(capsys, "--recipe", str(recipe))
    (result,) = out["recipes"]
    assert code == 0 and result["findings"] == [] and result["lacked_facts"] == []
    assert result["image"]["spec"] == "kimi-k3-direct-f" and result["image"]["known"]
    assert result["image"]["how"] == f"pushed by k3env as {by_digest}"
    # enroot's own spelling of the same digest, and an export found by its file name.
    recipe.write_text(
        recipe.read_text().replace(
            by_digest, f"docker://127.0.0.1:5000#k3env/kimi-k3-direct-f@{digest}"
        )
    )
    assert preflight(capsys, "--recipe", str(recipe))[1]["recipes"][0]["image"]["known"]
    sqsh = "k3env+kimi-k3-direct-f+abc.sqsh"
    write(state, Exported(image=spec.name, image_id=image_id, sha256="0" * 64, path=f"out/{sqsh}",
                          size=1, mksquashfs="4.6.1", options=()), image_id)  # fmt: skip
    recipe.write_text(final.replace("vllm/vllm-openai:kimi-k3", f"/lustre/containers/{sqsh}"))
    image = preflight(capsys, "--recipe", str(recipe))[1]["recipes"][0]["image"]
    assert image["spec"] == "kimi-k3-direct-f" and "by file name" in image["how"]
    assert "k3env export --check" in image["how"]


def test_an_unknown_container_is_said_and_what_it_carries_not_checked(
    resolved: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = resolved / "other.yaml"
    recipe.write_text((RECIPES / "d.yaml").read_text().replace(
        "vllm/vllm-openai:kimi-k3", "/shared/containers/someones.sqsh"))  # fmt: skip
    code, out = preflight(capsys, "--recipe", str(recipe))
    (result,) = out["recipes"]
    image = result["image"]
    assert not image["known"] and "an image k3env cannot place" in image["how"]
    # No guess: the lock base's patches and env are not judged as this image's.
    assert "K3-DROPPED-PATCH" not in {f["rule"] for f in result["findings"]}
    assert any(n.startswith("not checked: what /shared/containers/someones.sqsh carries")
               for n in result["notes"])  # fmt: skip
    assert code == 0
    # Named as a lock base, it is judged as that base, and said.
    code, out = preflight(capsys, "--recipe", str(recipe), "--base", "vllm-kimi-k3")
    (result,) = out["recipes"]
    assert "judged as lock base vllm-kimi-k3 (--base)" in result["image"]["how"]
    assert "K3-DROPPED-PATCH" in {f["rule"] for f in result["findings"]}


def test_srt_slurm_defaults_are_applied_and_said(
    resolved: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No `dynamo:` section: srt-slurm installs Dynamo 0.8.0 at job start, and judges that;
    no `connector:`: the aggregate Dynamo worker gets NixlConnector."""
    text = (RECIPES / "c.yaml").read_text()
    bare = resolved / "bare.yaml"
    bare.write_text(text.split("dynamo:\n", 1)[0].replace("  connector: none\n", "")
                    + "benchmark:" + text.split("benchmark:", 1)[1])  # fmt: skip
    _, out = preflight(capsys, "--recipe", str(bare))
    (result,) = out["recipes"]
    notes = " ".join(result["notes"])
    assert "installs Dynamo 0.8.0 at every job start (srt-slurm's default)" in notes
    assert "NixlConnector" in notes
    rules = worst(result)
    assert rules["K3-TOKENIZER-MODEL-TYPE"] == E and rules["K3-ALLOC-FRAGMENTATION"] == E
    # A recipe without backend.type is an SGLang recipe to srt-slurm: refused, said why.
    bare.write_text(text.replace("  type: vllm\n", "", 1))
    assert main(["preflight", "--recipe", str(bare)]) == 2
    assert "srt-slurm's default" in capsys.readouterr().err


def test_a_key_given_twice_and_a_non_string_env_value_are_refused(
    resolved: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = resolved / "bad.yaml"
    bad.write_text((RECIPES / "d.yaml").read_text() + "name: again\n")
    assert main(["preflight", "--recipe", str(bad)]) == 2
    assert "key 'name' is given twice" in capsys.readouterr().err
    bad.write_text(
        (RECIPES / "d.yaml").read_text().replace('NCCL_CUMEM_ENABLE: "1"', "NCCL_CUMEM_ENABLE: 1")
    )
    assert main(["preflight", "--recipe", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "backend.aggregated_environment.NCCL_CUMEM_ENABLE is int" in err
    assert f"{bad}:{line_of(bad, 'NCCL_CUMEM_ENABLE: 1')}" in err


SRTSLURM = """\
default_account: "gpu-account"
default_partition: "batch"
containers:
  kimi-k3: "vllm/vllm-openai:kimi-k3"
model_paths:
  kimi-k3: "/lustre/fsw/models/Kimi-K3"
"""


def test_an_unknown_srtslurm_yaml_key_fails_naming_it(
    resolved: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = resolved / "srtslurm.yaml"
    cfg.write_text(SRTSLURM + 'default_container: "/shared/containers/old.sqsh"\n'
                   "reporting:\n  status:\n    endpoint: http://x\n    token: t\n")  # fmt: skip
    assert main(["preflight", "--srtslurm", str(cfg)]) == 2
    err = capsys.readouterr().err
    # marshmallow's words, as srt-slurm's recorded schema (schemas/srt-slurm.schema.json) has them.
    assert "2 refusal(s) by srt-slurm v1.0.36's schema" in err
    assert "default_container (line 7): Unknown field." in err
    assert "reporting.status.token (line 11): Unknown field." in err
    assert f"{cfg}:7: default_container" in err and "ignore the whole file" in err
    cfg.write_text(SRTSLURM + "reporting:\n  status:\n    endpoint: http://x\n  token: t\n")
    assert main(["preflight", "--srtslurm", str(cfg), "--json"]) == 2
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["exit_code"] == 2 and error["message"].startswith("1 refusal(s)")
    assert "reporting.token (line 10): Unknown field." in error["message"]
    # Given as a recipe, it is named for what it is.
    assert main(["preflight", "--recipe", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "this is srt-slurm's cluster config, not a recipe (named srtslurm.yaml" in err
    assert f"--srtslurm {cfg}" in err
    # Every key known: the aliases resolve as srt-slurm resolves them.
    cfg.write_text(SRTSLURM)
    recipe = resolved / "aliased.yaml"
    recipe.write_text((RECIPES / "f.yaml").read_text()
                      .replace("container: vllm/vllm-openai:kimi-k3", "container: kimi-k3")
                      .replace("path: /lustre/fsw/models/Kimi-K3", "path: kimi-k3"))  # fmt: skip
    code, out = preflight(capsys, "--srtslurm", str(cfg), "--recipe", str(recipe))
    assert code == 0
    assert out["recipes"][0]["image"]["container"] == "vllm/vllm-openai:kimi-k3"
    assert out["srtslurm"]["containers"][0]["alias"] == "kimi-k3"


# --- adopt ---------------------------------------------------------------------------------------
def adopt_and_regenerate(
    name: str, capsys: pytest.CaptureFixture[str], tmp: Path, path: Path | None = None
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """`k3env adopt` a recipe, then `k3env srt recipe` of the spec it wrote: (adopt's JSON,
    the original, the regenerated recipe)."""
    path = path or RECIPES / name
    original = yaml.safe_load(path.read_text())
    capsys.readouterr()
    assert main(["adopt", str(path), "--json", "-q"]) == 0
    adopted = json.loads(capsys.readouterr().out)
    out = tmp / f"{adopted['spec']}.yaml"
    assert main(["srt", "recipe", adopted["spec"], "--profile", adopted["profile"],
                 "--container", original["model"]["container"], "--model-path",
                 original["model"]["path"], "--out", str(out), "-q"]) == 0  # fmt: skip
    return adopted, original, yaml.safe_load(out.read_text())


@pytest.mark.parametrize("name", ["d.yaml", "e.yaml", "f.yaml"])
def test_adopt_then_srt_recipe_gives_the_recipe_back_key_for_key(
    resolved: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    adopted, original, regenerated = adopt_and_regenerate(name, capsys, resolved)
    # The one difference: the container patch is baked, no setup_script runs it at job start.
    assert recipe_diff(original, regenerated) == [
        Difference(key="setup_script", original="patch-mamba-hybrid-index.sh", regenerated=ABSENT)
    ]
    assert [d["key"] for d in adopted["differences"]] == ["setup_script"]
    assert "bakes the lock's container patches" in adopted["differences"][0]["why"]
    spec = Path(adopted["out"])
    text = spec.read_text()
    assert text.startswith("#:schema ../schemas/image-spec.schema.json\n# Adopted by `k3env adopt`")
    assert 'patches = ["mamba-hybrid-index-int64"]' in text
    # The adopted spec passes preflight as the recipe did, without the dropped patch.
    assert main(["preflight", adopted["spec"]]) == (0 if name != "e.yaml" else 4)


def test_adopt_keeps_the_jobs_own_keys(resolved: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Slurm's time limit, the health check and the /traces mount a trace-replay benchmark
    reads are the job's, not the image's: kept in the spec's [job] and written back."""
    recipe = yaml.safe_load((RECIPES / "f.yaml").read_text())
    recipe["slurm"] = {"time_limit": "04:00:00"}
    recipe["health_check"] = {"max_attempts": 360, "interval_seconds": 10}
    recipe["extra_mount"] = ["/lustre/traces:/traces"]
    path = resolved / "f-traces.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    adopted, original, regenerated = adopt_and_regenerate("", capsys, resolved, path)
    assert [d.key for d in recipe_diff(original, regenerated)] == ["setup_script"]
    assert "[profiles.agg.job]" in Path(adopted["out"]).read_text()
    # A key k3env writes from the spec is refused in [job], naming it.
    spec = Path(adopted["out"])
    spec.write_text(
        spec.read_text().replace("[profiles.agg.job]\n", '[profiles.agg.job]\nname = "x"\n')
    )
    assert main(["preflight", adopted["spec"]]) == 2
    assert "job.name is a recipe key k3env writes" in capsys.readouterr().err


def test_adopt_of_a_dynamo_recipe_lists_what_it_bakes_instead(
    resolved: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    adopted, _, regenerated = adopt_and_regenerate("c.yaml", capsys, resolved)
    keys = {d["key"]: d for d in adopted["differences"]}
    assert keys["dynamo.hash"]["in_original"] and not keys["dynamo.hash"]["in_regenerated"]
    assert keys["dynamo.install"]["regenerated"] is False
    assert "bakes the lock's Dynamo" in keys["dynamo.hash"]["why"]
    assert regenerated["frontend"]["type"] == "dynamo"
    assert regenerated["backend"]["vllm_config"]["aggregated"]["dyn-tool-call-parser"] == "kimi_k3"
    # Never over an existing spec.
    assert main(["adopt", str(RECIPES / "c.yaml")]) == 2
    assert "refusing to overwrite" in capsys.readouterr().err


def test_recipe_diff_and_naming() -> None:
    assert recipe_diff({"a": {"b": 8, "c": "x"}}, {"a": {"b": "8", "d": 1}}) == [
        Difference(key="a.b", original=8, regenerated="8"),
        Difference(key="a.c", original="x", regenerated=ABSENT),
        Difference(key="a.d", original=ABSENT, regenerated=1),
    ]
    assert recipe_diff({"t": True}, {"t": 1}) == [Difference(key="t", original=True, regenerated=1)]
    assert recipe_diff({"x": [1, 2]}, {"x": [1, 2]}) == []
    assert naming("kimi-k3-d-agg") == naming("Kimi-K3-D-agg")
    assert (naming("kimi-k3-d-agg").spec, naming("kimi-k3-d-agg").profile) == ("kimi-k3-d", "agg")
    assert naming("kimi-k3-d-agg", "mine").profile == "agg"
    assert naming("mine-fast", "mine").profile == "fast"


def test_a_loader_error_no_file_owns_fails_every_recipe(tmp_path: Path) -> None:
    """srt-slurm's loader that fails to import names no file: no recipe loaded, none passes."""
    from k3env.srt.recipe_check import errors_of
    from k3env.srt.validate import RecipeError

    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    broken = RecipeError(file="", key="", message="ImportError: srtctl.core.config", stage="load")
    own = RecipeError(file=str(a.resolve()), key="x.y", message="Unknown field.", stage="load")
    assert errors_of(a, [broken, own]) == (
        ("", "ImportError: srtctl.core.config", "load"), ("x.y", "Unknown field.", "load"),
    )  # fmt: skip
    assert errors_of(b, [broken, own]) == (("", "ImportError: srtctl.core.config", "load"),)
    assert errors_of(b, [own]) == ()


def test_an_alias_bomb_is_refused_before_it_is_built(
    repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A "billion laughs" as a flag's value: `preflight --recipe` and `adopt` died with
    MemoryError (2 GiB) or hung; now both refuse the file, naming it, and write nothing."""
    import shutil

    from k3env.config.yamlread import MAX_EXPANDED, load_yaml

    shutil.copytree(REPO / "clusters", repo / "clusters")
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    bomb = tmp_path / "bomb.yaml"
    recipe = (RECIPES / "d.yaml").read_text()
    flag = "      served-model-name: Kimi-K3"
    assert flag in recipe
    bomb.write_text("\n".join(lines) + "\n" + recipe.replace(flag, f"      bomb: *a8\n{flag}", 1))
    with pytest.raises(Exception, match=f"more than {MAX_EXPANDED:,} values"):
        load_yaml(bomb)
    assert main(["preflight", "--recipe", str(bomb)]) == 2
    assert "billion laughs" in capsys.readouterr().err
    out = tmp_path / "adopted.toml"
    assert main(["adopt", str(bomb), "--out", str(out)]) == 2
    assert not out.exists()
    # Anchors used as YAML means them (a table reused) still read.
    fine = tmp_path / "fine.yaml"
    fine.write_text("base: &b {x: 1, y: [1, 2]}\none: *b\ntwo: *b\n")
    assert load_yaml(fine).data["two"] == {"x": 1, "y": [1, 2]}
