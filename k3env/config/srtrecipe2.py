"""srt-slurm 2.x recipes (``schema: 2``) read as the schema-1 recipe they say the same as, and
where each thing is written: one recipe model for the rules, two spellings for the findings.

Schema 2 groups a role under ``roles.<role>`` (``nodes``, ``workers``, ``gpus``, ``env``,
``args``, ``extra_args``, ``container``, ``engine``), names the engine with a top-level
``engine:`` (a type, or a mapping of the type and engine-wide knobs such as ``connector``), and
Dynamo with ``dynamo.source`` (exactly one of ``git`` + ``rev``, ``pypi``, ``wheel``). srt-slurm
2.x's own loader expands those into the internal fields named as schema 1 names its keys
(``roles.agg.env`` -> ``backend.aggregated_environment``, ``roles.agg.args`` ->
``backend.<engine>_config.aggregated``, ...: ``src/srtctl/core/roles.py`` ``expand_roles``), so
a schema-2 recipe is read here as that schema-1 view, and every key a rule names is said back in
the recipe's own spelling (``Spelling.own``). The env reaches the same places in both: a role's
``env`` its engine, the top-level ``environment`` every worker after it (it wins), the
benchmark client the top-level ``environment`` (and ``benchmark.env`` where its runner passes
it), ``frontend.env`` the frontend.

Nothing of 2.x's typed schema (its field lists, its value checks) is read or guessed here: a
key this view does not know is carried through unchanged, for srt-slurm's own loader to judge
where it runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from k3env.errors import ConfigError

# srt-slurm 2.x's role names and the schema-1 mode each expands to.
ROLE_MODES = (("agg", "aggregated"), ("prefill", "prefill"), ("decode", "decode"))
# roles.<role>.<key> -> the schema-1 resources key (``{r}``: the role).
_ROLE_RESOURCES = (("nodes", "{r}_nodes"), ("workers", "{r}_workers"), ("gpus", "gpus_per_{r}"),
                   ("critical", "{r}_critical"))  # fmt: skip
# roles.<role>.<key> -> the schema-1 backend key (``{m}``: the mode; ``{e}``: the engine).
_ROLE_BACKEND = (("env", "{m}_environment"), ("args", "{e}_config.{m}"),
                 ("extra_args", "{m}_extra_args"))  # fmt: skip
# dynamo.source.<key> -> schema 1's dynamo key (DynamoSourceConfig: a git rev is built, a PyPI
# release or a staged wheel installed).
_DYNAMO_SOURCE = (("rev", "hash"), ("pypi", "version"), ("wheel", "wheel"))
SUPPORTED = (1, 2)
# srt-slurm 2.x's expansion on a role it does not start (src/srtctl/core/roles.py
# `expand_roles`, its ROLE_NAMES in that order); tests/test_recipe_disagg.py runs the real one.
UNKNOWN_ROLE = "unknown role {role!r}; valid roles are prefill, decode, agg"


@dataclass(frozen=True)
class Spelling:
    """Where a recipe writes what schema 1 names ``old``: ``(old, own)`` pairs, longest first."""

    pairs: tuple[tuple[str, str], ...] = ()

    def own(self, key: str) -> str:
        """``key`` (schema 1's name, as the rules and the mapping use it) as this recipe spells
        it; a key it does not move (``environment.X``, ``model.path``) is its own."""
        for old, new in self.pairs:
            if key == old or key.startswith(old + "."):
                return new + key[len(old) :]
        return key


def unknown_role(data: Mapping[str, Any]) -> str | None:
    """The first ``roles:`` entry srt-slurm 2.x does not start (its flags and env would reach
    no worker), or None."""
    roles = data.get("roles")
    names = dict(ROLE_MODES)
    return (
        next((str(r) for r in roles if r not in names), None)
        if isinstance(roles, Mapping)
        else None
    )


def schema_of(data: Mapping[str, Any], where: str) -> int:
    """The recipe's schema: 1 without a ``schema:`` key (the pre-2.0 layout), else its value."""
    if "schema" not in data:
        return 1
    value = data["schema"]
    if isinstance(value, bool) or not isinstance(value, int) or value not in SUPPORTED:
        raise ConfigError(
            f"schema: {value!r} is not a schema k3env reads (srt-slurm recipes are schema 1, "
            "with no schema: key, or schema: 2)",
            where=where,
            fix="write schema: 2 (srt-slurm 2.x) or drop the key (a schema-1 recipe)",
        )
    return value


def _engine(data: Mapping[str, Any], roles: Mapping[str, Any]) -> tuple[dict[str, Any], str, str]:
    """The engine as schema 1's ``backend`` mapping, the key that names it and the key of its
    type: the top-level ``engine`` (a type, or a mapping), else a role's own (per-role
    engines; the agg role's first)."""
    engine, key = data.get("engine"), "engine"
    if engine is None:
        for role, _ in ROLE_MODES:
            spec = roles.get(role)
            if isinstance(spec, Mapping) and spec.get("engine") is not None:
                engine, key = spec["engine"], f"roles.{role}.engine"
                break
    if isinstance(engine, Mapping):
        return dict(engine), key, f"{key}.type"
    return ({"type": engine} if isinstance(engine, str) else {}), key, key


def _roles(
    roles: Mapping[str, Any], backend: dict[str, Any], resources: dict[str, Any]
) -> list[tuple[str, str]]:
    """Fold ``roles.<role>`` into schema 1's ``resources`` and ``backend`` keys, in place;
    returns the (schema-1 key, own key) pairs."""
    engine = str(backend.get("type", "sglang"))
    pairs: list[tuple[str, str]] = []
    for role, mode in ROLE_MODES:
        spec = roles.get(role)
        if not isinstance(spec, Mapping):
            continue
        for key, name in _ROLE_RESOURCES:
            old = name.format(r=role)
            pairs.append((f"resources.{old}", f"roles.{role}.{key}"))
            if key in spec:
                resources[old] = 0 if spec[key] == "colocate" else spec[key]
        for key, name in _ROLE_BACKEND:
            old = name.format(m=mode, e=engine)
            pairs.append((f"backend.{old}", f"roles.{role}.{key}"))
            if key in spec:
                first, _, second = old.partition(".")
                if second:
                    backend.setdefault(first, {})[second] = spec[key]
                else:
                    backend[first] = spec[key]
        if role == "agg" and "container" in spec:
            pairs.append(("model.container", "roles.agg.container"))
    return pairs


def _dynamo(dynamo: Any) -> tuple[Any, list[tuple[str, str]]]:
    """``dynamo:`` with ``source`` said as schema 1 says it (``rev`` -> ``hash``, ``pypi`` ->
    ``version``, ``wheel`` -> ``wheel``); a ``sha`` srt-slurm pinned the rev to is the commit."""
    if not isinstance(dynamo, Mapping) or not isinstance(dynamo.get("source"), Mapping):
        return dynamo, []
    source = dynamo["source"]
    view = {k: v for k, v in dynamo.items() if k != "source"}
    pairs = []
    for key, old in _DYNAMO_SOURCE:
        pairs.append((f"dynamo.{old}", f"dynamo.source.{key}"))
        if source.get(key) is not None:
            view[old] = source[key]
    if source.get("sha") and source.get("rev") is not None:
        view["hash"] = source["sha"]
        pairs.insert(0, ("dynamo.hash", "dynamo.source.sha"))
    return view, pairs


def as_schema1(data: Mapping[str, Any]) -> tuple[dict[str, Any], Spelling]:
    """A ``schema: 2`` recipe as the schema-1 recipe srt-slurm 2.x expands it to (the keys
    k3env reads), and the spelling that names each of those keys in the recipe."""
    roles = data.get("roles")
    roles = roles if isinstance(roles, Mapping) else {}
    backend, engine_key, type_key = _engine(data, roles)
    # A schema-1 `backend:` left under `schema: 2` (2.x's gate refuses it, in its words): still
    # read, and said on its own keys, so the rules judge the recipe all the same.
    legacy = data.get("backend") if isinstance(data.get("backend"), Mapping) else None
    backend = {**(legacy or {}), **backend}
    resources = dict(data["resources"]) if isinstance(data.get("resources"), Mapping) else {}
    pairs = _roles(roles, backend, resources)
    view = {k: v for k, v in data.items() if k not in ("schema", "engine", "roles")}
    view["backend"] = backend
    if resources or "resources" in data:
        view["resources"] = resources
    view["dynamo"], dynamo_pairs = _dynamo(data.get("dynamo"))
    if "dynamo" not in data:
        view.pop("dynamo")
    agg = roles.get("agg")
    if isinstance(agg, Mapping) and "container" in agg and isinstance(data.get("model"), Mapping):
        view["model"] = {**data["model"], "container": agg["container"]}
    engine = str(backend.get("type", "sglang"))
    pairs += dynamo_pairs
    if legacy is None or engine_key in data:
        pairs += [("backend.type", type_key), ("backend.connector", f"{engine_key}.connector"),
                  (f"backend.{engine}_config", "roles"), ("backend", engine_key)]  # fmt: skip
    pairs.sort(key=lambda p: -len(p[0]))
    return view, Spelling(tuple(pairs))


def as_schema2(data: Mapping[str, Any]) -> dict[str, Any]:
    """A recipe k3env renders in schema 1 (``srt.recipe``: one aggregate role, a vLLM
    backend, Dynamo by commit or not installed) written as ``schema: 2``, in the key order
    srt-slurm 2.x's ``srtctl migrate`` gives it (``engine`` where ``backend`` was, ``roles``
    right after it; a role's nodes, workers, gpus, then env, then args). Keys it does not move
    (a profile's own job keys) stay as written, for 2.x's loader to judge."""
    out: dict[str, Any] = {"schema": 2}
    resources = data.get("resources")
    resources = resources if isinstance(resources, Mapping) else {}
    backend = data.get("backend")
    backend = backend if isinstance(backend, Mapping) else {}
    engine = str(backend.get("type", "sglang"))
    for key, value in data.items():
        if key == "resources":
            moved = {old.format(r=r) for r, _ in ROLE_MODES for _, old in _ROLE_RESOURCES}
            out[key] = {k: v for k, v in value.items() if k not in moved}
        elif key == "backend":
            knobs = {k: v for k, v in backend.items() if k != "type" and not _per_role(k, engine)}
            out["engine"] = {"type": engine, **knobs} if knobs else engine
            out["roles"] = _role_specs(resources, backend, engine)
        elif key == "dynamo" and isinstance(value, Mapping):
            out[key] = _dynamo_source(value)
        else:
            out[key] = value
    return out


def _per_role(key: str, engine: str) -> bool:
    return key == f"{engine}_config" or any(
        key == name.format(m=mode, e=engine) for _, mode in ROLE_MODES for _, name in _ROLE_BACKEND
    )


def _role_specs(
    resources: Mapping[str, Any], backend: Mapping[str, Any], engine: str
) -> dict[str, Any]:
    roles: dict[str, Any] = {}
    config = backend.get(f"{engine}_config")
    config = config if isinstance(config, Mapping) else {}
    for role, mode in ROLE_MODES:
        spec: dict[str, Any] = {}
        for key, old in _ROLE_RESOURCES:
            if old.format(r=role) in resources:
                value = resources[old.format(r=role)]
                spec[key] = "colocate" if key == "nodes" and value == 0 else value
        for key, old in _ROLE_BACKEND:
            name = old.format(m=mode, e=engine)
            if key == "args" and mode in config:
                spec[key] = config[mode]
            elif key != "args" and name in backend:
                spec[key] = backend[name]
        if spec:
            roles[role] = spec
    return roles


def _dynamo_source(dynamo: Mapping[str, Any]) -> dict[str, Any]:
    """``dynamo:`` with schema 1's ``hash`` / ``version`` / ``wheel`` as ``source``, placed
    after ``install`` when the section has one."""
    # One source, as srt-slurm's loader takes it: a commit built, else a wheel, else a release.
    chosen = [(new, dynamo[old]) for new, old in (("rev", "hash"), ("wheel", "wheel"),
              ("pypi", "version")) if dynamo.get(old) is not None]  # fmt: skip
    source = dict(chosen[:1])
    out: dict[str, Any] = {}
    for key, value in dynamo.items():
        if key in {old for _, old in _DYNAMO_SOURCE}:
            continue
        out[key] = value
        if key == "install" and source:
            out["source"] = source
    if source and "source" not in out:
        out["source"] = source
    return out
