"""What looks like a credential: the one rule, applied wherever env can be set (the lock's
``[env]`` and ``[bases.NAME.env]``, a spec's ``[env]``) and again when env is baked.

An image is pushed to a registry and imported on a shared cluster; a token baked into its
config is readable by anyone who can pull it. The one override is ``allow_credentials`` in
the file that sets the variable.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from k3env.config.reader import Table
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


def refuse_credentials(t: Table, env: Mapping[str, str], allowed: tuple[str, ...]) -> None:
    """Raise (naming file and key) for the first credential-looking entry of ``env`` (read
    from the table ``t``) that ``allowed`` does not list."""
    for name, value in env.items():
        reason = credential_reason(name, value)
        if reason and name not in allowed:
            raise SecretError(
                f"refusing {name}: {reason}; it would be baked into every image built from here",
                where=t.where(name),
                fix="pass it at run time instead (srun --export, a Slurm env file, or a mounted "
                f'secret); if baking it is deliberate, add allow_credentials = ["{name}"] at '
                "the top of this file",
            )
