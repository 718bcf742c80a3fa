"""Which environment gets baked: the lock's stack-wide env, then the spec's, and no secrets.

An image is pushed to a registry and imported on a shared cluster; a token baked into its
config is readable by anyone who can pull it. Values that look like credentials are refused
unless the spec lists the variable under ``allow_credentials``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from k3env.config.lock import BasePin, Lock
from k3env.config.spec import ImageSpec
from k3env.errors import SecretError

# Variable names that carry credentials by convention. Matched on word parts, so that
# PYTORCH_CUDA_ALLOC_CONF or VLLM_..._TOKENS are not flagged by accident.
_NAME_PARTS = re.compile(
    r"(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|PASS|APIKEY|API_KEY|ACCESS_KEY|PRIVATE_KEY|CREDENTIALS?|AUTH)($|_)"
)
# Values shaped like well-known credential formats.
_VALUE_PATTERNS = (
    ("Hugging Face token", re.compile(r"\bhf_[A-Za-z0-9]{20,}\b")),
    ("GitHub token", re.compile(r"\b(gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{40,})\b")),
    ("OpenAI-style API key", re.compile(r"\bsk-[A-Za-z0-9_-]{20,}\b")),
    ("AWS access key id", re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("private key", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")),
    ("JSON web token", re.compile(r"\beyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.")),
    ("NGC API key", re.compile(r"\bnvapi-[A-Za-z0-9_-]{20,}\b")),
    ("URL with a password", re.compile(r"://[^/\s:@]+:[^/\s@]+@")),
)


def credential_reason(name: str, value: str) -> str | None:
    """Why ``name=value`` looks like a credential, or ``None``."""
    for label, pattern in _VALUE_PATTERNS:
        if pattern.search(value):
            return f"its value looks like a {label}"
    if _NAME_PARTS.search(name.upper()) and value.strip():
        return "its name marks it as a credential"
    return None


def merged_env(lock: Lock, spec: ImageSpec, base: BasePin | None = None) -> dict[str, str]:
    """The lock's stack-wide env, then the base's, then the spec's (later wins)."""
    base = base or lock.bases[spec.base]
    return {**lock.env, **base.env, **spec.env}


def baked_env(lock: Lock, spec: ImageSpec, base: BasePin | None = None) -> dict[str, str]:
    """The env to bake (``merged_env``) over ``base``; refuses credentials."""
    base = base or lock.bases[spec.base]
    env = merged_env(lock, spec, base)
    for name, value in env.items():
        reason = credential_reason(name, value)
        if reason and name not in spec.allow_credentials:
            if name in spec.env:
                source = f"{spec.path}: env.{name}"
            elif name in base.env:
                source = f"{lock.path}: bases.{base.name}.env.{name}"
            else:
                source = f"{lock.path}: env.{name}"
            raise SecretError(
                f"refusing to bake {name} into image {spec.name}: {reason}",
                where=source,
                fix=(
                    "pass it at run time instead (srun --export, a Slurm env file, or a mounted "
                    f'secret); if baking it is deliberate, add allow_credentials = ["{name}"] '
                    f"to {spec.path}"
                ),
            )
    return env


def merge_env(base_env: list[str], baked: Mapping[str, str]) -> list[str]:
    """The image's ``Config.Env``: the base's entries, overridden in place, then new ones sorted."""
    out = []
    seen = set()
    for entry in base_env:
        key = entry.split("=", 1)[0]
        if key in baked:
            out.append(f"{key}={baked[key]}")
            seen.add(key)
        else:
            out.append(entry)
    out.extend(f"{k}={baked[k]}" for k in sorted(baked) if k not in seen)
    return out
