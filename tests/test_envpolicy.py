from __future__ import annotations

from pathlib import Path

import pytest

from k3env.config.lock import load_lock
from k3env.config.secrets import credential_reason
from k3env.config.spec import load_spec
from k3env.errors import SecretError
from k3env.image.envpolicy import baked_env, merge_env


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("HF_TOKEN", "hf_abcdefghijklmnopqrstuvwxyz0123"),
        ("SOME_VAR", "hf_abcdefghijklmnopqrstuvwxyz0123"),
        ("WANDB_API_KEY", "0123456789abcdef"),
        ("DB_PASSWORD", "hunter2"),
        ("GH", "ghp_abcdefghijklmnopqrstuvwxyz0123456789"),
        ("AWS_ID", "AKIAABCDEFGHIJKLMNOP"),
        ("PROXY", "http://user:secret@proxy:3128"),
        ("NGC", "nvapi-abcdefghijklmnopqrstuvwxyz"),
    ],
)
def test_credentials_are_detected(name: str, value: str) -> None:
    assert credential_reason(name, value) is not None


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),
        ("VLLM_MAX_TOKENS_PER_BATCH", "8192"),
        ("NCCL_CUMEM_ENABLE", "1"),
        ("PYTHONHASHSEED", "42"),
        ("HF_TOKEN", ""),
        ("HTTP_PROXY", "http://proxy:3128"),
    ],
)
def test_ordinary_env_is_not_flagged(name: str, value: str) -> None:
    assert credential_reason(name, value) is None


def test_credential_env_refused_unless_deliberate(repo: Path) -> None:
    spec_path = Path("images/kimi-k3-direct-d.toml")
    text = spec_path.read_text().replace(
        "[env]\n", '[env]\nHF_TOKEN = "hf_abcdefghijklmnopqrstuvwxyz0123"\n'
    )
    spec_path.write_text(text)
    lock = load_lock(Path("pins/k3.lock.toml"))
    with pytest.raises(SecretError) as e:
        baked_env(lock, load_spec(spec_path, lock))
    assert "HF_TOKEN" in str(e.value) and "allow_credentials" in str(e.value)
    assert "images/kimi-k3-direct-d.toml: env.HF_TOKEN" in str(e.value)
    spec_path.write_text('allow_credentials = ["HF_TOKEN"]\n' + text)
    env = baked_env(lock, load_spec(spec_path, lock))
    assert env["HF_TOKEN"].startswith("hf_")


def test_merge_env_overrides_in_place_and_appends_sorted() -> None:
    out = merge_env(["PATH=/bin", "A=1"], {"Z": "9", "A": "2", "B": "3"})
    assert out == ["PATH=/bin", "A=2", "B=3", "Z=9"]


def test_base_env_is_baked_over_its_base_only() -> None:
    from .conftest import REPO

    lock = load_lock(REPO / "pins/k3.lock.toml")
    spec = load_spec(REPO / "images/kimi-k3-direct-f.toml", lock)
    gpu = baked_env(lock, spec)
    assert gpu["VLLM_ENABLE_K3_LATENT_MOE_TAIL_FUSION"] == "1"  # [bases.vllm-kimi-k3.env]
    assert gpu["PYTHONHASHSEED"] == "42"  # the spec's
    twin = baked_env(lock, spec, lock.bases["cpu-twin"])
    assert "VLLM_ENABLE_K3_LATENT_MOE_TAIL_FUSION" not in twin
    assert twin["PYTHONHASHSEED"] == "42"


def test_a_credential_the_lock_allows_is_baked_with_that_one_override(repo: Path) -> None:
    """The lock's own allow_credentials lets its [env] value through load and bake alike."""
    lock_path = Path("pins/k3.lock.toml")
    text = lock_path.read_text().replace(
        "[env]\n", '[env]\nNGC_API_KEY = "nvapi-abcdefghijklmnopqrstuvwxyz0123"\n', 1
    )
    lock_path.write_text(text)
    with pytest.raises(SecretError, match="refusing NGC_API_KEY"):
        load_lock(lock_path)
    lock_path.write_text(
        text.replace("version = 1\n", 'version = 1\nallow_credentials = ["NGC_API_KEY"]\n', 1)
    )
    lock = load_lock(lock_path)
    env = baked_env(lock, load_spec(Path("images/kimi-k3-direct-d.toml"), lock))
    assert env["NGC_API_KEY"].startswith("nvapi-")
