"""A recipe's flags, parser names and VLLM_ names are always judged or said: by `vllm serve`'s
own parser as k3env has it (verify's facts of this image, or the parser of the vLLM release
the lock's twin pins, recorded from the real vLLM 0.31.0 in schemas/engine-cli/ and replayed
through argparse), else a `not checked` entry naming each flag and name, and why.

The expectations are vLLM 0.31.0's own behaviour, recorded from its parser and registries (and
checked against the live parser in tests/engine/test_engine_cli_live.py): an unknown flag is
"vllm: error: unrecognized arguments: ..."; a unique prefix of a flag is taken as that flag
(argparse's allow_abbrev, which vLLM leaves on); an unknown tool-call parser is "invalid tool
call parser: ..." at server setup; an unknown reasoning parser "Reasoning parser '...' not
found. Available parsers: ..." when the engine builds its reasoner."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from k3env.checks.engine_cli import REFUSED, judge_serve, load_cli
from k3env.checks.engine_rules import engine_args

from .conftest import REPO
from .rules_context import context
from .test_recipe_numbers import Judge, findings, judge
from .test_recipes_in import RECIPES, line_of

F = RECIPES / "f.yaml"
RECORD = REPO / "schemas/engine-cli/vllm-0.31.0.json"
__all__ = ["judge"]  # the fixture, used by name
TWIN = (
    "judged by vLLM 0.31.0's own parser, from the twin, not by this image (vllm-0.31.0.json; "
    "the lock's stand-in for base vllm-kimi-k3)"
)


def recorded() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(RECORD.read_text())
    return doc


def unchecked(out: dict[str, Any]) -> list[dict[str, Any]]:
    (result,) = out["recipes"]
    return [n for n in result["not_checked"] if n["rule"] == "K3-ENGINE-ARGS"]


def test_the_record_is_vllm_0_31_0s_own_and_the_twins() -> None:
    doc = recorded()
    cli = doc["cli"]
    assert doc["pinned"]["version"] == cli["version"] == "0.31.0"
    assert cli["serve"]["prog"] == "vllm serve" and cli["serve"]["allow_abbrev"] is True
    assert (
        cli["messages"]["unrecognized"]
        == "vllm: error: unrecognized arguments: --k3env-sentinel-zz"
    )
    assert {"kimi_k3", "hermes"} <= set(cli["tool_parsers"])
    assert "kimi_k3" in cli["reasoning_parsers"]
    assert "VLLM_PREFIX_CACHE_RETENTION_INTERVAL" not in cli["env_vars"]  # 0.31.0 reads it not
    pins = (REPO / "pins/cpu-twin.requirements.txt").read_text()
    (line,) = [x for x in pins.splitlines() if x.startswith("vllm==0.31.0 ")]
    assert all(f"sha256:{h}" in line for h in doc["pinned"]["sha256"])


@pytest.mark.parametrize("name", ["d.yaml", "f.yaml"])
def test_the_runs_that_served_pass_the_parser_and_say_what_it_did_not_judge(
    judge: Judge, name: str
) -> None:
    code, out = judge(RECIPES / name)
    assert code == 0 and findings(out, "K3-ENGINE-ARGS") == []
    said = {n["what"]: n["why"] for n in unchecked(out)}
    values = "the values of --host, --device-ids, --kv-transfer-config, --served-model-name"
    assert values in said or name == "d.yaml"
    # The twin's vLLM does not read the K3 image's own names: not judged by a stand-in.
    names = [w for w in said if w.startswith("the VLLM_ names")]
    assert names and "VLLM_ENABLE_K3_LATENT_MOE_TAIL_FUSION" in names[0]
    assert "it is not this image's vLLM" in said[names[0]]


def test_an_unknown_flag_is_refused_in_vllms_words_on_its_key_and_line(judge: Judge) -> None:
    path, code, out = judge.mutated(
        "typo.yaml", "enable-prefix-caching: true", "enable-prefix-cachingg: true"
    )
    assert code == 4
    (f,) = findings(out, "K3-ENGINE-ARGS")
    assert (f["severity"], f["key"], f["line"]) == (
        "error", "backend.vllm_config.aggregated.enable-prefix-cachingg",
        line_of(path, "enable-prefix-cachingg"))  # fmt: skip
    assert f["message"] == (
        "vllm: error: unrecognized arguments: --enable-prefix-cachingg "
        f"({TWIN}): vLLM exits 2 at job start"
    )


def test_a_prefix_of_a_flag_is_taken_as_that_flag_and_said(judge: Judge) -> None:
    """The issue's `enable-prefix-cachin: true`: vLLM 0.31.0's parser (allow_abbrev on) takes
    it as --enable-prefix-caching, so the job starts with prefix caching on; said, a warning."""
    path, code, out = judge.mutated(
        "cachin.yaml", "enable-prefix-caching: true", "enable-prefix-cachin: true"
    )
    assert code == 0
    (f,) = findings(out, "K3-ENGINE-ARGS")
    assert (f["severity"], f["key"], f["line"]) == (
        "warning", "backend.vllm_config.aggregated.enable-prefix-cachin",
        line_of(path, "enable-prefix-cachin"))  # fmt: skip
    assert f["message"].startswith(
        "vllm serve takes --enable-prefix-cachin as --enable-prefix-caching: its parser accepts "
        "a unique prefix of a flag (argparse allow_abbrev)"
    )
    assert f["fix"] == "spell the flag in full"


@pytest.mark.parametrize(
    ("key", "old", "new", "said"),
    [
        ("reasoning-parser", "reasoning-parser: kimi_k3", "reasoning-parser: bogus_xyz",
         "--reasoning-parser bogus_xyz: Reasoning parser 'bogus_xyz' not found. Available "
         "parsers: cohere_command3, "),
        ("tool-call-parser", "tool-call-parser: kimi_k3", "tool-call-parser: kimi_k9",
         "--tool-call-parser kimi_k9: invalid tool call parser: kimi_k9 (chose from { apertus,"),
    ],
)  # fmt: skip
def test_an_unknown_parser_name_is_refused_in_vllms_words(
    judge: Judge,
    key: str,
    old: str,
    new: str,
    said: str,
) -> None:
    path, code, out = judge.mutated(f"{key}.yaml", old, new)
    assert code == 4
    (f,) = findings(out, "K3-ENGINE-ARGS")
    assert (f["severity"], f["key"], f["line"]) == (
        "error", f"backend.vllm_config.aggregated.{key}", line_of(path, new))  # fmt: skip
    assert f["message"].startswith(said)
    assert f["message"].endswith(f"({TWIN}): the server refuses to start")


def test_a_tool_parser_without_auto_tool_choice_is_a_warning(judge: Judge) -> None:
    text = F.read_text().replace("tool-call-parser: kimi_k3", "tool-call-parser: kimi_k9")
    _, code, out = judge.mutated(
        "no-auto.yaml",
        "      enable-auto-tool-choice: true\n",
        "",
        source=_write(judge.root / "src.yaml", text),
    )
    (f,) = findings(out, "K3-ENGINE-ARGS")
    assert code == 0 and f["severity"] == "warning"
    assert "vLLM checks it only with --enable-auto-tool-choice" in f["message"]


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_without_a_parser_every_flag_and_parser_name_is_named_not_checked(judge: Judge) -> None:
    shutil.rmtree(judge.root / "schemas/engine-cli")
    path, code, out = judge.mutated(
        "reason.yaml", "reasoning-parser: kimi_k3", "reasoning-parser: bogus_xyz"
    )
    assert code == 0 and findings(out, "K3-ENGINE-ARGS") == []
    n, env = unchecked(out)
    assert n["what"].startswith("`vllm serve` flags and parser names: --host 0.0.0.0, --port 8000")
    # No parser: the VLLM_ names are unjudged too, named with the rest of the recipe's env.
    assert "VLLM_PREFIX_CACHE_RETENTION_INTERVAL" in env["what"]
    assert "--reasoning-parser bogus_xyz" in n["what"] and "--tool-call-parser kimi_k3" in n["what"]
    assert n["why"].startswith("no recorded parser of vLLM 0.31.0 (the twin's) at ")
    assert "`k3env preflight --record-engine-cli PYTHON`" in n["why"]
    # The same entry for a person, a line of its own.
    from k3env.cli import main

    judge.capsys.readouterr()
    assert main(["preflight", "-q", "--recipe", str(path)]) == 0
    human = judge.capsys.readouterr().out
    assert f"{path}: K3-ENGINE-ARGS: not checked: `vllm serve` flags and parser names: " in human
    assert "--reasoning-parser bogus_xyz" in human


def test_a_record_of_another_release_is_not_used(judge: Judge) -> None:
    record = judge.root / "schemas/engine-cli/vllm-0.31.0.json"
    doc = json.loads(record.read_text())
    doc["pinned"]["version"] = "0.30.0"
    record.write_text(json.dumps(doc))
    _, out = judge(F)
    (n,) = [n for n in unchecked(out) if n["what"].startswith("`vllm serve` flags")]
    assert "was recorded for vLLM 0.30.0, not the twin's 0.31.0: record it again" in n["why"]


def test_the_dynamo_workers_flags_are_named_not_checked(judge: Judge) -> None:
    _, out = judge(RECIPES / "c.yaml")
    n, _ = unchecked(out)
    assert n["what"].startswith(
        "the dynamo-worker (`python -m dynamo.vllm`) flags and parser names"
    )
    assert "--dyn-tool-call-parser kimi_k3" in n["what"]
    assert "k3env records no parser of the Dynamo worker" in n["why"]


def test_an_image_k3env_cannot_place_is_not_judged_by_a_stand_in(judge: Judge) -> None:
    _, _, out = judge.mutated(
        "elsewhere.yaml", "container: vllm/vllm-openai:kimi-k3", "container: example.org/other:1"
    )
    (n,) = [n for n in unchecked(out) if n["what"].startswith("`vllm serve` flags")]
    assert n["why"].startswith("k3env cannot place example.org/other:1: which vLLM it runs")


# --- the rule on a context: the image's own parser (verify's facts) judges its env names too ------
def own_cli(**messages: str) -> Any:
    cli = recorded()["cli"]
    return load_cli(cli, "vLLM 0.31.0's own parser, in this image", own=True)


@pytest.mark.parametrize(("hard", "severity"), [(False, "warning"), (True, "error")])
def test_vllm_names_the_images_vllm_does_not_read(hard: bool, severity: str) -> None:
    argv = ["vllm", "serve", "/model", *(["--fail-on-environ-validation"] if hard else [])]
    ctx = replace(context(("vllm-serve", argv), env={"VLLM_NOT_A_NAME": "1"}), engine_cli=own_cli())
    hits = [h for h in engine_args(ctx) if h.key.startswith("env.")]
    assert [(h.key, h.severity) for h in hits] == [("env.VLLM_NOT_A_NAME", severity)]
    assert hits[0].message.startswith(
        "Unknown vLLM environment variable detected: VLLM_NOT_A_NAME (judged by "
    )


# --- the replay through argparse, case by case --------------------------------------------------
@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--tensor-parallel-size", "eight"],
         "vllm serve: error: argument --tensor-parallel-size/-tp: invalid int value: 'eight'"),
        (["--enable-prefix"], None),  # a unique prefix: taken
        (["--enable"], "vllm serve: error: ambiguous option: --enable could match "),
        (["--gpu-memory-utilization"],
         "vllm serve: error: argument --gpu-memory-utilization/--device-memory-utilization: "
         "expected one argument"),
        (["--no-enable-prefix-caching", "--tensor_parallel_size", "2"], None),
        (["--not-a-flag", "x"], "vllm: error: unrecognized arguments: --not-a-flag x"),
    ],
)  # fmt: skip
def test_the_replay_says_what_vllms_parser_says(args: list[str], said: str | None) -> None:
    cli = load_cli(recorded()["cli"], "r")
    j = judge_serve(cli, ["vllm", "serve", "/model", *args])
    refused = [v for v in j.verdicts if v.status == REFUSED]
    if said is None:
        assert refused == []
    else:
        (v,) = refused
        assert v.message.startswith(said)


def test_an_image_verify_knows_is_judged_by_its_own_parser_env_names_too(judge: Judge) -> None:
    """A container k3env pushed, whose verify facts carry `vllm.cli` (the probe's cli.py, run
    in that image): its flags and its VLLM_ names are judged by the image's own vLLM."""
    from k3env.config.lock import load_lock
    from k3env.config.spec import load_spec
    from k3env.image.records import Build, Facts, Pushed, build_key, write
    from k3env.state import State

    lock = load_lock(Path("pins/k3.lock.toml"))
    spec = load_spec(Path("images/kimi-k3-direct-f.toml"), lock)
    state, image_id, digest = State(), "sha256:" + "cd" * 32, "sha256:" + "ef" * 32
    write(state, Build(image_id=image_id, reference="k3env/kimi-k3-direct-f:abc", twin=False),
          build_key(lock, spec, twin=False))  # fmt: skip
    write(state, Pushed(image=spec.name, image_id=image_id, digest=digest, layers_sent=1,
                        layers_skipped=0, reference="127.0.0.1:5000/k3env/kimi-k3-direct-f:abc"),
          image_id)  # fmt: skip
    write(state, Facts(facts={"vllm": {"cli": recorded()["cli"]}}), image_id)
    text = F.read_text().replace("vllm/vllm-openai:kimi-k3",
                                 f"127.0.0.1:5000/k3env/kimi-k3-direct-f@{digest}")  # fmt: skip
    source = _write(judge.root / "src.yaml", text)
    _, code, out = judge.mutated(
        "own.yaml", "enable-prefix-caching: true", "enable-prefix-cachingg: true", source=source
    )
    assert code == 4
    by_key = {f["key"]: f for f in findings(out, "K3-ENGINE-ARGS")}
    flag = by_key["backend.vllm_config.aggregated.enable-prefix-cachingg"]
    assert (
        "(judged by vLLM 0.31.0's own parser, in this image (verify's facts of " in flag["message"]
    )
    env = by_key["backend.aggregated_environment.VLLM_PREFIX_CACHE_RETENTION_INTERVAL"]
    assert env["severity"] == "warning" and env["message"].startswith(
        "Unknown vLLM environment variable detected: VLLM_PREFIX_CACHE_RETENTION_INTERVAL"
    )
    assert not [n for n in unchecked(out) if n["what"].startswith("the VLLM_ names")]


def test_a_misspelt_env_name_the_recipe_sets_is_named_not_checked(judge: Judge) -> None:
    _, code, out = judge.mutated("nccl.yaml", "NCCL_CUMEM_ENABLE:", "NCCL_CUMEM_ENABLEE:")
    (n,) = [n for n in unchecked(out) if n["what"].startswith("whether the image reads")]
    assert code == 0
    assert n["what"] == (
        "whether the image reads NCCL_CUMEM_ENABLEE, PYTHONHASHSEED, PYTORCH_CUDA_ALLOC_CONF"
    )
    assert "not baked" in n["why"]
