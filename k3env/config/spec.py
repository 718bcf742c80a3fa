"""Image specs (``images/*.toml``): what a person edits.

Each names its base pin, the container patches and environment to bake, and its serve
profiles: the exact command lines that will run in the image, with the parser names and the
tokenizer ``model_type`` they rely on.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from k3env.config.pins import Lock
from k3env.config.reader import NAME_RE, Table, each_entry, env_table, free_table, load_toml
from k3env.config.secrets import credential_reason, refuse_credentials
from k3env.config.shapes import REPOSITORY_FIX, REPOSITORY_RE, control_character
from k3env.errors import SecretError, SpecError
from k3env.hashing import canonical_sha256

ROLES = ("vllm-serve", "dynamo-frontend", "dynamo-worker")
DEFAULT_IMAGES = Path("images")


@dataclass(frozen=True, kw_only=True)
class Command:
    role: str
    argv: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class ServeProfile:
    name: str
    description: str
    tokenizer_model_type: str | None
    tool_call_parser: str | None
    reasoning_parser: str | None
    commands: tuple[Command, ...]
    # srt-slurm's benchmark: section for this profile (its field names; its loader checks them)
    benchmark: Mapping[str, Any] = field(default_factory=dict)
    # srt-slurm recipe keys the image does not decide (its Slurm limits, health check, mounts):
    # copied into the recipe as written; srt-slurm's recorded schema and loader judge them.
    job: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class ImageSpec:
    name: str
    path: Path
    sha256: str  # canonical hash of the parsed spec
    description: str
    base: str
    repository: str
    patches: tuple[str, ...]
    components: tuple[str, ...]  # pinned Python components baked in (lock sections)
    env: Mapping[str, str]
    env_readers: Mapping[str, str]  # env var -> what reads it, for vars no engine registry lists
    allow_credentials: tuple[str, ...]
    profiles: Mapping[str, ServeProfile]
    # How a Dynamo frontend job gets Dynamo: baked in the image (components), or built from
    # the lock's commit at job start, which only happens when the spec asks for it.
    dynamo_install: str = "baked"


def load_spec(path: Path, lock: Lock) -> ImageSpec:
    data = load_toml(path, SpecError)
    t = Table(data, file=path, path="", error=SpecError)
    name = path.stem
    if not NAME_RE.match(name):
        raise SpecError(
            f"image name {name!r} (from the file name) is not valid",
            where=str(path),
            fix="rename the file: lowercase letters, digits, '.', '_', '-'",
        )
    base = t.string("base")
    if base not in lock.bases:
        raise t.fail(
            "base",
            f"base {base!r} is not pinned in {lock.path}",
            f"use one of {sorted(lock.bases)} or add [bases.{base}] to the lock",
        )
    patches = _names(t, "patches", lock.container_patches, "container patch",
                     "is not in the lock", "add it under [container_patches]", lock)  # fmt: skip
    components = _names(t, "components", lock.components, "component",
                        "has no pinned wheels in the lock", "pin NAME's wheels", lock)  # fmt: skip
    env_t = t.table("env", required=False)
    env = env_table(env_t)
    readers = env_table(t.table("env_readers", required=False))
    allow = t.str_list("allow_credentials")
    for i, a in enumerate(allow):
        if a not in env and a not in lock.env and a not in lock.bases[base].env:
            raise t.fail(f"allow_credentials[{i}]", f"{a!r} is not set in [env]", "remove it")
    refuse_credentials(env_t, env, allow)
    profiles = each_entry(t.table("profiles", required=False), _profile)
    description = t.string("description", required=False, default="")
    repository = _repository(t, name)
    dynamo_install = _dynamo_install(t)
    t.done()  # every key read and checked (a NaN refused in the reader's words) before the hash
    return ImageSpec(
        name=name,
        path=path,
        sha256=canonical_sha256(data),
        description=description,
        base=base,
        repository=repository,
        patches=patches,
        components=components,
        env=env,
        env_readers=readers,
        allow_credentials=allow,
        profiles=profiles,
        dynamo_install=dynamo_install,
    )


DYNAMO_INSTALLS = ("baked", "from-commit")


def _dynamo_install(t: Table) -> str:
    mode = str(t.string("dynamo_install", required=False, default="baked"))
    if mode not in DYNAMO_INSTALLS:
        raise t.fail("dynamo_install", f"unknown Dynamo install mode {mode!r}",
                     f"use one of {list(DYNAMO_INSTALLS)}")  # fmt: skip
    return mode


def _names(
    t: Table, key: str, known: Mapping[str, object], what: str, missing: str, add: str, lock: Lock
) -> tuple[str, ...]:
    """A list of names the lock defines, each once."""
    names = t.str_list(key)
    for i, name in enumerate(names):
        if name not in known:
            raise t.fail(
                f"{key}[{i}]",
                f"{what} {name!r} {missing} {lock.path}",
                f"use one of {sorted(known)} or {add.replace('NAME', name)}",
            )
    if len(set(names)) != len(names):
        raise t.fail(key, f"a {what} is listed twice", f"list each {what} once")
    return names


def _repository(t: Table, name: str) -> str:
    repository = str(t.string("repository", required=False, default=f"k3env/{name}"))
    if not REPOSITORY_RE.match(repository):
        raise t.fail("repository", f"{repository!r} is not an image repository", REPOSITORY_FIX)
    return repository


def load_specs(directory: Path, lock: Lock, only: tuple[str, ...] = ()) -> list[ImageSpec]:
    files = sorted(directory.glob("*.toml"))
    if not files:
        raise SpecError(
            "no image specs found",
            where=str(directory),
            fix="add images/NAME.toml, or pass --images",
        )
    specs = [load_spec(f, lock) for f in files]
    if only:
        known = {s.name for s in specs}
        missing = [n for n in only if n not in known]
        if missing:
            raise SpecError(
                f"unknown image(s) {missing}",
                where=str(directory),
                fix=f"choose from {sorted(known)}",
            )
        specs = [s for s in specs if s.name in only]
    return specs


_SCALARS = (str, int, float, bool)
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


def _benchmark(t: Table) -> dict[str, Any]:
    """srt-slurm's ``benchmark:`` section, in its field names (its loader judges them): plain
    values, lists of them, or tables of them (``env``, ``aiperf_args``); a credential in its
    ``env`` is refused as in ``[env]``."""
    if not t.has("benchmark"):
        return {}
    bench = t.table("benchmark")
    if not isinstance(bench.data.get("type"), str):
        raise bench.fail(
            "type",
            "a benchmark needs its srt-slurm type",
            'set type = "mooncake-router" (or another srt-slurm benchmark type)',
        )
    data = free_table(bench, "benchmark")

    def plain(value: Any) -> bool:
        return isinstance(value, _SCALARS) or (
            isinstance(value, list) and all(isinstance(v, _SCALARS) for v in value)
        )

    for key, value in data.items():
        nested = value.items() if isinstance(value, dict) else [(None, value)]
        for sub, v in nested:
            where = f"{key}.{sub}" if sub is not None else key
            if not plain(v) or (sub is not None and not _KEY.match(sub)):
                raise bench.fail(
                    where,
                    f"benchmark.{where} is not a plain value (a string, number, boolean or "
                    "a list of them) under a plain key",
                    "write it as srt-slurm's recipe field takes it",
                )
            for s in v if isinstance(v, list) else [v]:
                if isinstance(s, str) and (bad := control_character(s)):
                    raise bench.fail(
                        where,
                        f"benchmark.{where} holds a control character ({bad}): it would "
                        "reach a line of the generated recipe",
                        "write it on one line, without control characters",
                    )
        if key == "env" and isinstance(value, dict):
            for name, v in value.items():
                reason = credential_reason(name, str(v))
                if reason:
                    raise SecretError(
                        f"refusing benchmark.env.{name}: {reason}; it would be written into "
                        "every recipe generated from here",
                        where=bench.where(f"env.{name}"),
                        fix="pass it at run time (srun --export, a Slurm env file)",
                    )
    return data


def _profile(name: str, t: Table) -> ServeProfile:
    commands = []
    for c in t.tables("commands"):
        role = c.string("role")
        if role not in ROLES:
            raise c.fail("role", f"unknown role {role!r}", f"use one of {list(ROLES)}")
        argv = c.str_list("argv", required=True)
        if not argv:
            raise c.fail("argv", "empty command line", "write the full command line")
        commands.append(Command(role=role, argv=argv))
        c.done()
    if not commands:
        raise t.fail("commands", "a serve profile needs at least one command", "add [[commands]]")
    profile = ServeProfile(
        name=name,
        description=t.string("description", required=False, default=""),
        tokenizer_model_type=t.string("tokenizer_model_type", required=False),
        tool_call_parser=t.string("tool_call_parser", required=False),
        reasoning_parser=t.string("reasoning_parser", required=False),
        commands=tuple(commands),
        benchmark=_benchmark(t),
        job=_job(t),
    )
    t.done()
    return profile


# The recipe keys `k3env srt recipe` writes from the spec and the lock (a `[job]` key may not
# set them: the image decides them), and the ones it never writes (baked instead).
# ... and in schema 2 (srt-slurm 2.x): the schema itself, the engine and the roles.
RECIPE_WRITTEN = ("name", "model", "resources", "frontend", "backend", "dynamo", "benchmark",
                  "schema", "engine", "roles")  # fmt: skip
RECIPE_REPLACED = ("setup_script", "environment")


def _job(t: Table) -> dict[str, Any]:
    """The profile's ``[job]``: srt-slurm recipe keys the image does not decide, as written."""
    if not t.has("job"):
        return {}
    job = t.table("job")
    data = free_table(job, "job")
    for key, value in data.items():
        if key in RECIPE_WRITTEN or key in RECIPE_REPLACED:
            raise job.fail(
                key,
                f"job.{key} is a recipe key k3env writes from the spec and the lock (or bakes "
                "into the image instead)",
                "set it in the spec itself (its env, its commands, its benchmark)",
            )
        for s in _strings(value):
            if bad := control_character(s):
                raise job.fail(
                    key,
                    f"job.{key} holds a control character ({bad}): it would reach a line of "
                    "the generated recipe",
                    "write it on one line, without control characters",
                )
    return data


def _strings(value: Any) -> list[str]:
    """Every string in a TOML value (keys of its tables too)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (str(k), *_strings(v))]
    return []
