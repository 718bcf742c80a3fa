from __future__ import annotations

from pathlib import Path

import pytest

from k3env.config.lock import load_lock
from k3env.config.spec import load_spec, load_specs
from k3env.errors import SecretError, SpecError

from .conftest import REPO, replace_in


def test_all_shipped_specs_load() -> None:
    lock = load_lock(REPO / "pins/k3.lock.toml")
    specs = {s.name: s for s in load_specs(REPO / "images", lock)}
    assert {"kimi-k3-dynamo", "kimi-k3-direct-d", "kimi-k3-direct-e", "kimi-k3-direct-f"} <= set(
        specs
    )
    f = specs["kimi-k3-direct-f"]
    assert f.env["VLLM_PREFIX_CACHE_RETENTION_INTERVAL"] == "0"
    argv = f.profiles["agg"].commands[0].argv
    assert "--enable-cumem-allocator" in argv and "--disable-custom-all-reduce" in argv
    roles = [c.role for c in specs["kimi-k3-dynamo"].profiles["agg"].commands]
    assert roles == ["dynamo-frontend", "dynamo-worker"]


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('patches = ["mamba-hybrid-index-int64"]', 'patches = ["nope"]', r"patches\[0\]"),
        ('base = "vllm-kimi-k3"', 'base = "nope"', "base 'nope' is not pinned"),
        ('role = "vllm-serve"', 'role = "sglang"', "unknown role"),
        ('description = "Kimi', 'descripton = "Kimi', "unknown key"),
        ('type = "mooncake-router"', 'kind = "mooncake-router"', "needs its srt-slurm type"),
        (
            "ttft_threshold_ms = 2000",
            "ttft_threshold_ms = 2026-11-30T00:00:00Z",
            r"benchmark.ttft_threshold_ms is not a plain value",
        ),
        (
            "itl_threshold_ms = 25",
            'itl_threshold_ms = 25\nenv = { HF_TOKEN = "hf_abcdefghijklmnopqrstuvwxyz1234" }',
            "refusing benchmark.env.HF_TOKEN",
        ),
    ],
)
def test_bad_spec(repo: Path, old: str, new: str, message: str) -> None:
    spec = Path("images/kimi-k3-direct-d.toml")
    replace_in(spec, old, new)
    lock = load_lock(Path("pins/k3.lock.toml"))
    with pytest.raises((SpecError, SecretError), match=message) as e:
        load_spec(spec, lock)
    assert "images/kimi-k3-direct-d.toml" in str(e.value)
