"""Adopt: an image spec (``images/NAME.toml``) from an srt-slurm recipe, and the key-for-key
comparison of a recipe with the one ``k3env srt recipe`` makes from that spec. Pure rendering.

The spec carries what the recipe sets: the env (less what the lock and base bake anyway), the
engine flags as the command line the role runs, the parsers and model type, the benchmark
(less an ``aiperf_package`` equal to the lock's aiperf, which the recipe writer adds back),
the lock's container patches pinned for the base (baked once, where a ``setup_script`` ran
them at every job start) and the components the profile needs (Dynamo for a Dynamo frontend,
aiperf for a benchmark).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from k3env import jsontext
from k3env.checks.recipe_map import FRONTEND_ARGV, frontend_type, json_flag, model_type
from k3env.config.pins import Lock
from k3env.config.spec import RECIPE_REPLACED, RECIPE_WRITTEN
from k3env.config.srtrecipe import Recipe
from k3env.quoting import one_line, toml_key, toml_string, toml_value

PROFILE = "agg"
_INVALID = re.compile(r"[^a-z0-9._-]+")


class _Absent:
    """A key one recipe has and the other does not."""

    def __repr__(self) -> str:
        return "(absent)"


ABSENT: Any = _Absent()


@dataclass(frozen=True, kw_only=True)
class Naming:
    spec: str
    profile: str


def naming(recipe_name: str, stem: str | None = None) -> Naming:
    """Spec and profile names whose recipe name (``SPEC-PROFILE``) is the recipe's own:
    ``kimi-k3-d-agg`` -> spec ``kimi-k3-d``, profile ``agg``. With ``stem`` (``--out``'s file
    name) the spec is named so, and the profile is what is left of the recipe's name."""
    clean = _INVALID.sub("-", recipe_name.lower()).strip("-._") or "adopted"
    if stem is not None:
        rest = clean.removeprefix(f"{stem}-") if clean.startswith(f"{stem}-") else PROFILE
        return Naming(spec=stem, profile=_INVALID.sub("-", rest) or PROFILE)
    if "-" in clean:
        spec, profile = clean.rsplit("-", 1)
        if spec and profile:
            return Naming(spec=spec, profile=profile)
    return Naming(spec=clean, profile=PROFILE)


def _argv_lines(argv: list[str]) -> str:
    """An argv array, one flag and its value a line (as images/*.toml write them)."""
    rows: list[list[str]] = []
    for word in argv:
        if word.startswith("--") or not rows:
            rows.append([word])
        else:
            rows[-1].append(word)
    body = "".join("  " + ", ".join(toml_string(w) for w in row) + ",\n" for row in rows)
    return "argv = [\n" + body + "]\n"


def engine_argv(prefix: tuple[str, ...], flags: Mapping[str, Any], notes: list[str]) -> list[str]:
    """The recipe's engine flags as a command line, each key as the recipe spells it."""
    out = list(prefix)
    for key, value in flags.items():
        flag = f"--{key}"
        if isinstance(value, bool):
            if value:
                out.append(flag)
            else:
                notes.append(f"{key}: false is dropped (srt-slurm renders no flag for it)")
        elif value is None:
            notes.append(f"{key}: null is dropped (srt-slurm renders no flag for it)")
        elif isinstance(value, list):
            out += [flag, *(str(v) for v in value)]
            notes.append(f"{key}: a list becomes {len(value)} words on the command line")
        elif isinstance(value, dict):
            out += [flag, json_flag(flag, value)]
            notes.append(f"{key}: a mapping is written as its JSON string")
        else:
            out += [flag, str(value)]
    return out


def _profile_lines(
    recipe: Recipe,
    p: str,
    mtype: str | None,
    topology: list[str],
    notes: list[str],
    *,
    direct: bool,
) -> list[str]:
    """The spec's ``[profiles.NAME]`` table: model type, parsers, and its command lines (the
    recipe's engine flags on ``vllm serve`` or on Dynamo's worker behind its frontend)."""
    flags = recipe.engine_flags
    out = ["", f"[{p}]", f"description = {toml_string(recipe.name)}"]
    if mtype:
        out.append(f"tokenizer_model_type = {toml_string(mtype)}")
    for field, keys in (
        ("tool_call_parser", ("tool-call-parser", "dyn-tool-call-parser")),
        ("reasoning_parser", ("reasoning-parser", "dyn-reasoning-parser")),
    ):
        value = next((flags[k] for k in keys if isinstance(flags.get(k), str)), None)
        if value:
            out.append(f"{field} = {toml_string(value)}")
    if direct:
        argv = engine_argv(("vllm", "serve", "/model", *topology), flags, notes)
        out += ["", f"[[{p}.commands]]", 'role = "vllm-serve"', _argv_lines(argv).rstrip("\n")]
    else:
        worker = engine_argv(("python3", "-m", "dynamo.vllm", "--model", "/model"), flags, notes)
        out += [
            "",
            f"[[{p}.commands]]",
            'role = "dynamo-frontend"',
            f"argv = {toml_value(list(FRONTEND_ARGV))}",
            "",
            f"[[{p}.commands]]",
            'role = "dynamo-worker"',
            _argv_lines(worker).rstrip("\n"),
        ]
    return out


def _one_worker(recipe: Recipe) -> None:
    """A spec's profile is one aggregate worker's command lines: a disaggregated recipe is
    refused."""
    if len(recipe.workers()) > 1:
        raise recipe.fail(
            "backend.vllm_config",
            f"a disaggregated recipe ({recipe.own('backend.vllm_config')}.prefill / .decode): "
            "k3env adopt writes one aggregate worker's profile",
            "adopt an aggregate form of the recipe; preflight --recipe judges this one as it is",
        )


def spec_text(
    recipe: Recipe,
    lock: Lock,
    base: str,
    names: Naming,
    *,
    model_type_given: str | None,
    notes: list[str],
) -> str:
    """The image spec TOML for ``recipe`` over the lock's ``base``, commented."""
    _one_worker(recipe)
    pin = lock.bases[base]
    baked = {**lock.env, **pin.env}
    env = {k: v for k, v in recipe.env().items() if baked.get(k) != v}
    patches = [n for n, p in lock.container_patches.items() if base in p.bases]
    direct = frontend_type(recipe) == "vllm"
    components = [] if direct else ["dynamo"]
    bench = dict(recipe.benchmark)
    aiperf = f"aiperf=={lock.aiperf.version}" if lock.aiperf else None
    if bench.get("aiperf_package") == aiperf:
        bench.pop("aiperf_package")
    if bench and "aiperf" in lock.components and "aiperf_package" not in bench:
        components.append("aiperf")
    mtype, _ = model_type(recipe, model_type_given)
    nodes = recipe.resources.get("agg_nodes")
    topology: list[str] = []
    if isinstance(nodes, int) and nodes > 1:
        topology = ["--nnodes", str(nodes), "--node-rank", "0", "--master-addr", "node-0"]
    out = [
        "#:schema ../schemas/image-spec.schema.json",
        f"# Adopted by `k3env adopt` from the srt-slurm recipe {one_line(str(recipe.path))}",
        f"# (name: {one_line(recipe.name)}). Edit this spec, then regenerate the recipe:",
        f"#   k3env srt recipe {names.spec} --profile {names.profile}",
        f"description = {toml_string('Adopted from srt-slurm recipe ' + recipe.name)}",
        f"base = {toml_string(base)}",
    ]
    if patches:
        script = (
            f" (the recipe's setup_script {one_line(recipe.setup_script)} ran a patch at "
            "every job start)"
            if recipe.setup_script
            else ""
        )
        out.append(f"# The lock's container patches pinned for {base}, baked once{script}.")
    out.append(f"patches = {toml_value(patches)}")
    if components:
        out.append("# Baked from the lock's pinned wheels (nothing installed at job start).")
    out.append(f"components = {toml_value(components)}")
    if env:
        out += [
            "",
            "[env]",
            "# From the recipe's backend.aggregated_environment and environment "
            "(values the lock and base bake anyway left out).",
        ]
        out += [f"{toml_key(k)} = {toml_string(v)}" for k, v in env.items()]
    p = f"profiles.{toml_key(names.profile)}"
    out += _profile_lines(recipe, p, mtype, topology, notes, direct=direct)
    job = {k: v for k, v in recipe.data.items() if k not in (*RECIPE_WRITTEN, *RECIPE_REPLACED)}
    job.pop("lock", None)  # a lockfile's record of a run, not a key of the job
    out += _table(
        f"{p}.job",
        "# The recipe's job keys the image does not decide, as written: `k3env srt "
        "recipe` copies them back.",
        job,
    )
    out += _table(
        f"{p}.benchmark",
        "# The recipe's benchmark, in srt-slurm's field names; `k3env srt recipe` adds "
        "the lock's aiperf as aiperf_package.",
        bench,
    )
    return "\n".join(out) + "\n"


def _table(name: str, comment: str, items: Mapping[str, Any]) -> list[str]:
    """A ``[name]`` table of the spec, its comment first (no lines when it is empty)."""
    if not items:
        return []
    return ["", comment, f"[{name}]", *(f"{toml_key(str(k))} = {toml_value(v)}"
                                        for k, v in items.items())]  # fmt: skip


# --- the round trip ----------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Difference:
    key: str
    original: Any  # ABSENT when only the regenerated recipe has the key
    regenerated: Any  # ABSENT when only the original has it

    def text(self) -> str:
        original, regenerated = _shown(self.original), _shown(self.regenerated)
        return f"{one_line(self.key)}: {original} in the original, {regenerated} regenerated"

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key}
        for side in ("original", "regenerated"):
            value = getattr(self, side)
            out[side] = None if value is ABSENT else value
            out[f"in_{side}"] = value is not ABSENT
        return out


def _shown(value: Any) -> str:
    if value is ABSENT:
        return "absent"
    try:
        return jsontext.dumps(value, sort_keys=False, default=str)
    except jsontext.NotFinite:  # a line for a person, not a document: Python's spelling
        return repr(value)


def recipe_diff(original: Any, regenerated: Any, prefix: str = "") -> list[Difference]:
    """Every key whose value differs between two recipes (type included: ``"8"`` is not
    ``8``), or that only one has; mappings compared key by key, dotted."""
    if isinstance(original, Mapping) and isinstance(regenerated, Mapping):
        out = []
        for key in [*original, *(k for k in regenerated if k not in original)]:
            dotted = f"{prefix}.{key}" if prefix else str(key)
            a = original.get(key, ABSENT)
            b = regenerated.get(key, ABSENT)
            if a is ABSENT or b is ABSENT:
                out.append(Difference(key=dotted, original=a, regenerated=b))
            else:
                out += recipe_diff(a, b, dotted)
        return out
    if type(original) is type(regenerated) and original == regenerated:
        return []
    return [Difference(key=prefix, original=original, regenerated=regenerated)]
