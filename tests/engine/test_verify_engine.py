"""Verify on the real engine, against the real vLLM and Dynamo wheels inside the CPU twin.

Each verdict below comes from the image's own parsers, registries and Rust frontend; the
second Dynamo runtime release (1.2.1, the one that 404'd Kimi-K3 in the bring-up) shows that
version-dependent answers come from the image, not from a table in k3env.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from k3env.checks.probe_plan import ENTRYPOINTS, ENV_DEFAULT_SOURCES, ENV_FAMILIES
from k3env.checks.probe_run import probe_env, run_probe
from k3env.checks.verdicts import COMPONENTS
from k3env.cli import main
from k3env.config.patchfile import Edit, PatchFile
from k3env.engine.dockerd import DockerEngine
from k3env.image.patches import missing_edits
from k3env.image.records import Facts, ProbeOutput, read
from k3env.state import State

pytestmark = [pytest.mark.engine, pytest.mark.registry, pytest.mark.twin]

GOOD_SERVE = [
    "vllm", "serve", "/model",
    "--tensor-parallel-size", "8",
    "--gpu-memory-utilization", "0.90",
    "--enable-auto-tool-choice", "--tool-call-parser", "kimi_k3",
    "--reasoning-parser", "kimi_k3",
]  # fmt: skip
WORKER = ["python3", "-m", "dynamo.vllm", "--model", "/model", "--tensor-parallel-size", "8"]
FRONTEND = ["python3", "-m", "dynamo.frontend", "--http-port", "8000"]


def profile(name: str, *commands: tuple[str, list[str]], **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "tokenizer_model_type": extra.get("model_type"),
        "tool_call_parser": extra.get("tool"),
        "reasoning_parser": extra.get("reasoning"),
        "commands": [{"role": role, "argv": argv} for role, argv in commands],
    }


def plan(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "image": "probe-test",
        "profiles": [],
        "patches": [],
        "env": {},
        "env_families": {k: list(v) for k, v in ENV_FAMILIES.items()},
        "env_default_sources": list(ENV_DEFAULT_SOURCES),
        "versions": {},
        "components": COMPONENTS,
        "tokenizer_candidates": [],
    }
    base.update(overrides)
    # The entrypoints the profiles' processes import, as probe_plan.plan_for names them.
    roles = {c["role"] for p in base["profiles"] for c in p["commands"]}
    base.setdefault("imports", sorted({m for r in roles for m in ENTRYPOINTS[r]}))
    return base


def results_by(rows: list[dict[str, Any]]) -> dict[tuple[str | None, str, str], dict[str, Any]]:
    return {(r["profile"], r["check"], r["subject"]): r for r in rows}


Verdicts = dict[tuple[str | None, str, str], dict[str, Any]]


@pytest.fixture(scope="session")
def twin_probe(engine: DockerEngine, dynamo_161_image: str) -> tuple[Verdicts, dict[str, Any]]:
    """Every probe of the twin with Dynamo 1.6.1 installed, in one container start:
    (verdicts, facts)."""
    p = plan(
        profiles=[
            profile("good", ("vllm-serve", GOOD_SERVE), tool="kimi_k3", reasoning="kimi_k3"),
            profile("unknown-flag", ("vllm-serve", [*GOOD_SERVE, "--no-such-flag"])),
            profile(
                "unknown-tool-parser",
                ("vllm-serve", [a if a != "kimi_k3" else "no_such_parser" for a in GOOD_SERVE]),
                tool="no_such_parser",
            ),
            profile(
                "worker-frontend-flags",
                (
                    "dynamo-worker",
                    [*WORKER, "--enable-auto-tool-choice", "--tool-call-parser", "kimi_k3"],
                ),
            ),
            profile(
                "worker-dyn-flags",
                (
                    "dynamo-worker",
                    [
                        *WORKER,
                        "--dyn-tool-call-parser",
                        "kimi_k3",
                        "--dyn-reasoning-parser",
                        "kimi_k3",
                    ],
                ),
                ("dynamo-frontend", FRONTEND),
                tool="kimi_k3",
                model_type="kimi_k3",
            ),
            profile("unknown-model-type", ("dynamo-frontend", FRONTEND), model_type="kimi_k9"),
        ],
        patches=[{"name": "never-applied", "module": "vllm.version", "path": None}],
        env={
            "VLLM_TARGET_DEVICE": None,
            "K3ENV_NOTHING_READS_THIS": None,
            # A declared reader that is not in the image (aiperf is not installed in the twin).
            "AIPERF_USE_DYNAMO_CONV_AWARE_ROUTING": "aiperf (settings)",
            # torch reads PYTORCH_CUDA_ALLOC_CONF; the misspelling is read by nothing.
            "PYTORCH_CUDA_ALLOC_CONF": None,
            "PYTORCH_CUDA_ALLOC_CONFIG": None,
            # Read with os.environ.get outside vllm/envs.py.
            "VLLM_SNAPSHOT_TIMEOUT_S": None,
            # vLLM 0.31.0 has --prefix-cache-retention-interval instead.
            "VLLM_PREFIX_CACHE_RETENTION_INTERVAL": None,
            "PYTHONHASHSEED": None,
        },
        versions={"vllm": "0.31.0", "dynamo": "1.6.1", "torch": "2.99.0"},
        tokenizer_candidates=["kimi_k2", "kimi_k3"],
    )
    (out,) = run_probe(engine, dynamo_161_image, "python3", [p], [{}], timeout=300)
    assert not isinstance(out, str)
    return results_by(out.rows), {**out.facts, "patch_targets": out.patch_targets}


@pytest.fixture(scope="session")
def twin_verdicts(twin_probe: tuple[Verdicts, dict[str, Any]]) -> Verdicts:
    return twin_probe[0]


def test_known_good_vllm_serve_line_is_accepted(twin_verdicts: dict[Any, Any]) -> None:
    r = twin_verdicts[("good", "args", "commands[0] vllm-serve")]
    assert r["status"] == "pass", r["output"]
    assert twin_verdicts[("good", "parsers", "tool_call_parser kimi_k3")]["status"] == "pass"
    assert twin_verdicts[("good", "parsers", "reasoning_parser kimi_k3")]["component"] == "vllm"


def test_unknown_flag_is_rejected_with_the_parsers_own_message(
    twin_verdicts: dict[Any, Any],
) -> None:
    r = twin_verdicts[("unknown-flag", "args", "commands[0] vllm-serve")]
    assert r["status"] == "fail"
    assert "unrecognized arguments: --no-such-flag" in r["output"]
    assert r["version"] == "0.31.0"


def test_unknown_tool_parser_passes_argparse_but_fails_server_setup(
    twin_verdicts: dict[Any, Any],
) -> None:
    r = twin_verdicts[("unknown-tool-parser", "args", "commands[0] vllm-serve")]
    assert r["status"] == "fail"
    assert "invalid tool call parser: no_such_parser" in r["output"]
    reg = twin_verdicts[("unknown-tool-parser", "parsers", "tool_call_parser no_such_parser")]
    assert reg["status"] == "fail" and "kimi_k3" in reg["output"]


def test_dynamo_worker_rejects_frontend_flags_and_takes_dyn_spelling(
    twin_verdicts: dict[Any, Any],
) -> None:
    bad = twin_verdicts[("worker-frontend-flags", "args", "commands[0] dynamo-worker")]
    assert bad["status"] == "fail"
    assert (
        "unrecognized arguments" in bad["output"] and "--enable-auto-tool-choice" in bad["output"]
    )
    good = twin_verdicts[("worker-dyn-flags", "args", "commands[0] dynamo-worker")]
    assert good["status"] == "pass", good["output"]
    assert (
        twin_verdicts[("worker-dyn-flags", "args", "commands[1] dynamo-frontend")]["status"]
        == "pass"
    )
    # The parsers check reads the command lines too: the worker's vLLM-style flag fails there.
    flag = twin_verdicts[
        ("worker-frontend-flags", "parsers", "commands[0] --tool-call-parser kimi_k3")
    ]
    assert flag["status"] == "fail" and "use --dyn-tool-call-parser kimi_k3" in flag["output"]
    dyn = twin_verdicts[
        ("worker-dyn-flags", "parsers", "commands[0] --dyn-tool-call-parser kimi_k3")
    ]
    assert dyn["status"] == "pass" and dyn["component"] == "dynamo"
    # Chat parsing happens in the Dynamo frontend: its registry answers.
    assert (
        twin_verdicts[("worker-dyn-flags", "parsers", "tool_call_parser kimi_k3")]["component"]
        == "dynamo"
    )


def test_tokenizer_model_type_known_accepted_unknown_rejected(
    twin_verdicts: dict[Any, Any],
) -> None:
    ok = twin_verdicts[("worker-dyn-flags", "tokenizer", "model_type kimi_k3")]
    assert ok["status"] == "pass", ok["output"]
    assert "/v1/models lists the model" in ok["output"]
    bad = twin_verdicts[("unknown-model-type", "tokenizer", "model_type kimi_k9")]
    assert bad["status"] == "fail"
    assert "tiktoken" in bad["output"]


def test_patch_presence_is_judged_on_the_images_own_file(
    twin_probe: tuple[Verdicts, dict[str, Any]],
) -> None:
    target = twin_probe[1]["patch_targets"]["never-applied"]
    assert target["path"].endswith("/vllm/version.py")
    never = PatchFile(
        name="never-applied",
        path=Path("never.toml"),
        description="",
        edits=(Edit(anchor="no such anchor in vllm", replacement="nor such a replacement"),),
    )
    assert missing_edits(never, target["text"]) == [
        "edit 1: neither the replacement nor the anchor is there"
    ]
    line = target["text"].splitlines()[0]
    present = PatchFile(
        name="present",
        path=Path("p.toml"),
        description="",
        edits=(Edit(anchor="@@no such anchor@@", replacement=line),),
    )
    assert missing_edits(present, target["text"]) == []


def test_unread_env_is_reported(twin_verdicts: dict[Any, Any]) -> None:
    nothing = twin_verdicts[(None, "env", "K3ENV_NOTHING_READS_THIS")]
    assert nothing["status"] == "fail" and "searched vllm 0.31.0" in nothing["output"]
    assert twin_verdicts[(None, "env", "VLLM_TARGET_DEVICE")]["component"] == "vllm"


def test_every_env_verdict_cites_its_evidence(twin_verdicts: dict[Any, Any]) -> None:
    def env(name: str) -> dict[str, Any]:
        result: dict[str, Any] = twin_verdicts[(None, "env", name)]
        return result

    lie = env("AIPERF_USE_DYNAMO_CONV_AWARE_ROUTING")
    assert lie["status"] == "fail" and "declared reader 'aiperf' is not installed" in lie["output"]
    conf = env("PYTORCH_CUDA_ALLOC_CONF")
    assert conf["status"] == "pass" and "torch/lib/libc10.so" in conf["output"]
    typo = env("PYTORCH_CUDA_ALLOC_CONFIG")
    assert typo["status"] == "fail" and "did you mean PYTORCH_CUDA_ALLOC_CONF" in typo["output"]
    snapshot = env("VLLM_SNAPSHOT_TIMEOUT_S")
    assert snapshot["status"] == "pass" and "vllm/snapshot/runtime.py" in snapshot["output"]
    retention = env("VLLM_PREFIX_CACHE_RETENTION_INTERVAL")
    assert retention["status"] == "fail"
    assert "takes --prefix-cache-retention-interval instead" in retention["output"]
    seed = env("PYTHONHASHSEED")
    assert seed["status"] == "pass" and "python3" in seed["output"]


def test_versions_come_from_the_image(
    twin_verdicts: dict[Any, Any], twin_probe: tuple[Verdicts, dict[str, Any]]
) -> None:
    assert twin_verdicts[(None, "versions", "vllm")]["status"] == "pass"
    torch = twin_verdicts[(None, "versions", "torch")]
    assert torch["status"] == "fail" and "installed 2.13.0+cpu, lock 2.99.0" in torch["output"]
    facts = twin_probe[1]
    assert facts["versions"]["dynamo"] == "1.6.1"
    assert facts["dynamo"]["tiktoken_model_types"] == ["kimi_k2", "kimi_k3"]
    assert "kimi_k3" in facts["vllm"]["tool_parsers"]


def test_a_second_dynamo_release_answers_from_its_own_code(
    engine: DockerEngine, old_dynamo_image: str
) -> None:
    p = plan(
        profiles=[
            profile("k3", ("dynamo-frontend", FRONTEND), model_type="kimi_k3", tool="kimi_k3")
        ],
        tokenizer_candidates=["kimi_k2", "kimi_k3"],
    )
    (out,) = run_probe(engine, old_dynamo_image, "python3", [p], [{}], timeout=300)
    assert not isinstance(out, str)
    r, facts = results_by(out.rows), out.facts
    assert facts["versions"]["dynamo-runtime"] == "1.2.1"
    tok = r[("k3", "tokenizer", "model_type kimi_k3")]
    assert tok["status"] == "fail" and tok["version"] == "1.2.1"
    # The cause, from the runtime itself: the model types its frontend supports.
    assert "its frontend supports kimi, kimi_k2, kimi_k25, deepseek_v3" in tok["output"]
    assert facts["dynamo"]["tiktoken_supported"] == ["kimi", "kimi_k2", "kimi_k25", "deepseek_v3"]
    assert facts["dynamo"]["tiktoken_model_types"] == ["kimi_k2"]


def test_worker_args_never_touch_the_model_path_on_dynamo_1_4_2(
    engine: DockerEngine, dynamo_142_image: str
) -> None:
    """Dynamo 1.4.2's worker parser builds the engine args, which resolve --model and ask the
    Hub for a path that is not on disk (HFValidationError '/model'): a false failure."""
    p = plan(profiles=[profile("w", ("dynamo-worker", WORKER))])
    (out,) = run_probe(engine, dynamo_142_image, "python3", [p], [{}], timeout=300)
    assert not isinstance(out, str)
    r = results_by(out.rows)[("w", "args", "commands[0] dynamo-worker")]
    assert out.facts["versions"]["dynamo"] == "1.4.2"
    assert r["status"] == "pass", r["output"]


def test_verify_cli_on_a_twin_image_writes_matrix_and_facts(
    repo: Path, engine: DockerEngine, twin_image: str, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = repo / "images/kimi-k3-direct-d.toml"
    for other in (repo / "images").glob("*.toml"):
        if other != spec:
            other.unlink()
    md = repo / "matrix.md"
    code = main(["verify", "--twin", "--json", "--markdown", str(md)])
    out = json.loads(capsys.readouterr().out)
    image = out["images"][0]
    assert image["matrix"]["args"] == "passed", image["results"]
    assert image["matrix"]["patches"] == "not checked"  # written for the GPU image, not the twin
    # Variant D serves with `vllm serve`, whose parsers, env registry and versions the twin
    # carries for real: every check it can answer passes there, and every planned one ran.
    failing = [(r["check"], r["subject"], r["status"]) for r in image["results"]
               if r["status"] in ("failed", "not run")]  # fmt: skip
    assert failing == [] and code == 0 and "error" not in out, failing
    assert {r["check"] for r in image["results"] if r["status"] == "passed"} >= {
        "versions",
        "imports",
        "args",
        "parsers",
        "env",
    }
    assert "| `kimi-k3-direct-d` |" in md.read_text()
    recorded = read(State(), Facts, image["image_id"])
    assert recorded is not None and (facts := recorded.facts)["versions"]["vllm"] == "0.31.0"
    assert facts["versions"]["aiperf"] == "0.13.0"  # baked from the lock's wheel


def test_a_group_shares_one_import_and_each_image_keeps_its_own_environment(
    engine: DockerEngine, dynamo_161_image: str
) -> None:
    inspected = engine.inspect(dynamo_161_image)
    assert inspected is not None
    env = probe_env(inspected.config.get("Env") or [])
    p = plan(
        profiles=[profile("good", ("vllm-serve", GOOD_SERVE), tool="kimi_k3", reasoning="kimi_k3")],
        env={"PYTHONHASHSEED": None, "VLLM_SNAPSHOT_TIMEOUT_S": None, "HF_HOME": None},
    )
    names = ("same", "hash-seed", "alloc-conf", "hf-home", "loader")
    plans = [{**p, "image": name} for name in names]
    envs = [
        env,
        # Unset, the hash seed is drawn at random: the group's interpreter starts with 42,
        # one of those draws.
        {**env, "PYTHONHASHSEED": "42"},
        # Looked up by nothing while vLLM's CLI imports (libc10 has it as a C string: said).
        {**env, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
        # huggingface_hub looks HF_HOME up while vLLM's CLI imports.
        {**env, "HF_HOME": "/srv/hf"},
        # The dynamic loader reads it when the process starts, from C.
        {**env, "LD_LIBRARY_PATH": "/opt/elsewhere"},
    ]
    same, seeded, alloc, hf_home, loader = run_probe(
        engine, dynamo_161_image, "python3", plans, envs, timeout=300
    )
    assert isinstance(same, ProbeOutput) and isinstance(seeded, ProbeOutput)
    assert isinstance(alloc, ProbeOutput)
    assert isinstance(hf_home, str) and "looked up HF_HOME" in hf_home
    assert isinstance(loader, str) and "LD_LIBRARY_PATH differently, read from C" in loader

    def rows(out: ProbeOutput) -> list[tuple[str, str, str, str]]:
        return [(r["check"], r["subject"], r["status"], r["output"]) for r in out.rows]

    assert seeded.facts["shared_import"]["env_differs"] == []
    assert seeded.facts["shared_import"]["images"] == list(names)
    shared = alloc.facts["shared_import"]
    assert shared["env_differs"] == ["PYTORCH_CUDA_ALLOC_CONF"]
    assert "libc10" in shared["c_strings"]["PYTORCH_CUDA_ALLOC_CONF"]
    assert ("args", "commands[0] vllm-serve", "pass", "accepted\n") in rows(seeded)
    assert rows(same) == rows(seeded) == rows(alloc)
    # The same plan on its own, in its own container: the same verdicts.
    (alone,) = run_probe(engine, dynamo_161_image, "python3", [plans[1]], [envs[1]], timeout=300)
    assert not isinstance(alone, str)
    assert rows(alone) == rows(seeded)
    assert "shared_import" not in alone.facts
