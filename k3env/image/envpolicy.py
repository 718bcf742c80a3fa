"""Which environment gets baked: the lock's stack-wide env, then the spec's, and no secrets.

An image is pushed to a registry and imported on a shared cluster; a token baked into its
config is readable by anyone who can pull it. Values that look like credentials are refused
unless the spec lists the variable under ``allow_credentials``.
"""

from __future__ import annotations

from collections.abc import Mapping

from k3env.config.pins import BasePin, Lock
from k3env.config.secrets import credential_reason
from k3env.config.spec import ImageSpec
from k3env.errors import SecretError


def merged_env(lock: Lock, spec: ImageSpec, base: BasePin | None = None) -> dict[str, str]:
    """The lock's stack-wide env, then the base's, then the spec's (later wins)."""
    base = base or lock.bases[spec.base]
    return {**lock.env, **base.env, **spec.env}


def baked_env(lock: Lock, spec: ImageSpec, base: BasePin | None = None) -> dict[str, str]:
    """The env to bake (``merged_env``) over ``base``; refuses credentials. The override is
    the one of the file the value comes from (as at load time): the spec's
    ``allow_credentials`` for its own env, the lock's (or the spec's) for the lock's."""
    base = base or lock.bases[spec.base]
    env = merged_env(lock, spec, base)
    for name, value in env.items():
        reason = credential_reason(name, value)
        allowed = spec.allow_credentials
        if name not in spec.env:
            allowed = (*allowed, *lock.allow_credentials)
        if reason and name not in allowed:
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
