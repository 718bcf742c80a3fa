"""srt-slurm recipes a person wrote (``k3env preflight --recipe``, ``k3env adopt``): the YAML
read into checked values under srt-slurm's own key names.

Only what a recipe says is read here; what srt-slurm fills in for a key left out is applied by
``checks.recipe_map`` from ``checks.known.SRT_DEFAULTS``. A value srt-slurm's loader would
refuse for its type (an env value that is not a string, a section that is not a mapping) is
refused here too, naming the key and its line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from k3env.config.reader import ENV_NAME_RE
from k3env.config.srtrecipe2 import UNKNOWN_ROLE, Spelling, as_schema1, schema_of, unknown_role
from k3env.config.yamlread import YamlDoc, load_yaml
from k3env.errors import ConfigError

# The engine flags k3env maps: the aggregate worker's (srt-slurm's `vllm_config.aggregated`).
ENGINE_KEY = "backend.vllm_config.aggregated"
AGG_ENV_KEY = "backend.aggregated_environment"
DISAGG_MODES = ("prefill", "decode")  # srt-slurm's disaggregated worker modes
ENV_KEY = "environment"
FRONTEND_ENV_KEY = "frontend.env"  # the frontend's own (srt-slurm's frontends export it)
BENCH_ENV_KEY = "benchmark.env"  # the benchmark client's own (where its runner passes it)
CLUSTER_CONFIG = "srtslurm.yaml"  # the cluster config's file name, as srt-slurm looks for it
_MISSING: Any = object()


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """A recipe as srt-slurm reads it, under schema 1's key names whatever its schema (a
    ``schema: 2`` recipe through ``srtrecipe2.as_schema1``); ``own`` names each key as the
    recipe itself writes it, and ``doc`` holds its own lines."""

    doc: YamlDoc
    name: str
    model_path: str
    container: str
    precision: str | None
    resources: Mapping[str, Any]
    frontend: Mapping[str, Any]
    backend: Mapping[str, Any]  # the section as written (type, connector, ...)
    engine_flags: Mapping[str, Any]  # backend.vllm_config.aggregated, as written
    agg_env: Mapping[str, str]  # backend.aggregated_environment
    environment: Mapping[str, str]  # the top-level environment (exported after agg_env)
    dynamo: Mapping[str, Any] | None  # the section, or None when the recipe has none
    benchmark: Mapping[str, Any]
    setup_script: str | None
    schema: int = 1
    spelling: Spelling = field(default_factory=Spelling)
    frontend_env: Mapping[str, str] = field(default_factory=dict)  # frontend.env
    benchmark_env: Mapping[str, str] = field(default_factory=dict)  # benchmark.env
    # The worker mode this view is (srt-slurm's ``aggregated``, ``prefill`` or ``decode``), and
    # each disaggregated mode's ``backend.<mode>_environment`` (``workers`` reads them).
    mode: str = "aggregated"
    mode_env: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def workers(self) -> tuple[Recipe, ...]:
        """One view per worker mode srt-slurm starts: the recipe itself for an aggregate job;
        for a disaggregated one (``resources.prefill_nodes`` / ``decode_nodes``, or flags under
        ``vllm_config.prefill`` / ``decode`` and none under ``aggregated``), a view each for
        prefill and decode with that mode's flags and env in the aggregate worker's place,
        ``own`` naming them where the recipe writes them."""
        config = self.backend.get("vllm_config")
        config = config if isinstance(config, Mapping) else {}
        disagg = any(self.resources.get(f"{m}_nodes") is not None for m in DISAGG_MODES)
        if self.engine_flags or not (disagg or any(config.get(m) for m in DISAGG_MODES)):
            return (self,)
        views = []
        for mode in DISAGG_MODES:
            flags = config.get(mode)
            if not flags and not _count(self.resources.get(f"{mode}_workers")):
                continue
            moved = (
                (ENGINE_KEY, self.own(f"backend.vllm_config.{mode}")),
                (AGG_ENV_KEY, self.own(f"backend.{mode}_environment")),
                ("resources.agg_nodes", self.own(f"resources.{mode}_nodes")),
                ("resources.agg_workers", self.own(f"resources.{mode}_workers")),
            )
            views.append(
                replace(
                    self,
                    mode=mode,
                    engine_flags=flags if isinstance(flags, Mapping) else {},
                    agg_env=self.mode_env.get(mode, {}),
                    spelling=Spelling(moved + self.spelling.pairs),
                )
            )
        return tuple(views) or (self,)

    @property
    def path(self) -> Path:
        return self.doc.path

    @property
    def data(self) -> Mapping[str, Any]:
        return self.doc.data  # type: ignore[no-any-return]

    def own(self, key: str) -> str:
        """``key`` (schema 1's name) as this recipe writes it (``roles.agg.args.X`` for
        ``backend.vllm_config.aggregated.X`` in a schema-2 recipe)."""
        return self.spelling.own(key)

    def env(self) -> dict[str, str]:
        """What srt-slurm exports in the worker's container, in its order (the mode's
        environment, then the recipe's ``environment``: later wins)."""
        return {**self.agg_env, **self.environment}

    def env_key(self, name: str) -> str:
        """The recipe key that sets ``name`` (the one that wins), else where to add it."""
        if name in self.environment:
            return f"{ENV_KEY}.{name}"
        return self.own(f"{AGG_ENV_KEY}.{name}")

    @property
    def benchmark_env_read(self) -> bool:
        """Whether ``benchmark.env`` reaches the client: srt-slurm v1.0.36 passes it for a
        ``custom`` benchmark only (``benchmarks/custom.py``; the base runner's
        ``get_environment`` is empty); 2.x's runners that read it pass it, and its typed
        schema refuses it for a type that does not (its loader judges that, not k3env)."""
        return self.schema == 2 or self.benchmark.get("type") == "custom"

    def client_env(self) -> dict[str, str]:
        """What the benchmark client gets of the recipe: the top-level ``environment``, then
        ``benchmark.env`` where it reaches the client (srt-slurm applies the runner's env
        after the job's: it wins)."""
        return {**self.environment, **(self.benchmark_env if self.benchmark_env_read else {})}

    def client_env_key(self, name: str) -> str:
        if self.benchmark_env_read and name in self.benchmark_env:
            return f"{BENCH_ENV_KEY}.{name}"
        return f"{ENV_KEY}.{name}"

    def fail(self, key: str, message: str, fix: str) -> ConfigError:
        return ConfigError(message, where=self.doc.where(self.own(key)), fix=fix)


def _not_a_cluster_config(path: Path, data: Mapping[str, Any]) -> None:
    """Refuse srt-slurm's cluster config given as a recipe, naming it."""
    if "name" not in data and (path.name == CLUSTER_CONFIG or "model_paths" in data):
        why = f"named {CLUSTER_CONFIG}" if path.name == CLUSTER_CONFIG else "it has model_paths"
        raise ConfigError(
            f"this is srt-slurm's cluster config, not a recipe ({why}, and no name)",
            where=str(path),
            fix=f"pass it with --srtslurm {path}, and the recipe with --recipe",
        )


@dataclass(frozen=True)
class _Reader:
    """Reads checked values out of a recipe's schema-1 view, naming its own keys and lines."""

    doc: YamlDoc
    data: Mapping[str, Any]  # the schema-1 view
    spelling: Spelling

    def section(self, key: str, required: bool = False) -> dict[str, Any]:
        node: Any = self.data
        for part in key.split("."):
            node = node.get(part, _MISSING) if isinstance(node, dict) else _MISSING
        own = self.spelling.own(key)
        if node is _MISSING or node is None:
            if required:
                raise ConfigError(
                    f"the recipe has no {own}: srt-slurm's loader requires it",
                    where=self.doc.where(own.split(".")[0]) if "." in own else str(self.doc.path),
                    fix=f"add {own}:",
                )
            return {}
        if not isinstance(node, dict):
            raise ConfigError(
                f"{own} is not a mapping",
                where=self.doc.where(own),
                fix="write it as srt-slurm's recipe takes it (key: value lines)",
            )
        return node

    def string(self, table: Mapping[str, Any], key: str, dotted: str, required: bool) -> str | None:
        value = table.get(key)
        own = self.spelling.own(dotted)
        if value is None:
            if required:
                raise ConfigError(
                    f"the recipe has no {own}: srt-slurm's loader requires it",
                    where=self.doc.where(own),
                    fix=f"add {own}",
                )
            return None
        if not isinstance(value, str):
            raise ConfigError(
                f"{own} is not a string (srt-slurm's loader refuses it)",
                where=self.doc.where(own),
                fix="quote the value",
            )
        return value

    def env(self, key: str) -> dict[str, str]:
        return _env(self.section(key), self.spelling.own(key), self.doc)


def load_recipe(
    path: Path,
    *,
    containers: Mapping[str, str] | None = None,
    model_paths: Mapping[str, str] | None = None,
) -> Recipe:
    """Read ``path`` (schema 1, or ``schema: 2``); ``containers`` / ``model_paths``: a
    cluster's ``srtslurm.yaml`` aliases, resolved as srt-slurm resolves them (an alias that
    names a key of the mapping)."""
    doc = load_yaml(path)
    if not isinstance(doc.data, dict):
        raise ConfigError(
            "an srt-slurm recipe is a mapping at the top level",
            where=str(path),
            fix="pass a recipe file (name:, model:, resources:, backend:, ...)",
        )
    data: dict[str, Any] = doc.data
    _not_a_cluster_config(path, data)
    schema = schema_of(data, doc.where("schema"))
    role = unknown_role(data) if schema == 2 else None
    if role is not None:
        raise ConfigError(
            f"roles.{role}: srt-slurm 2.x refuses it: {UNKNOWN_ROLE.format(role=role)}",
            where=doc.where(f"roles.{role}"),
            fix="name the role agg, prefill or decode",
        )
    view, spelling = as_schema1(data) if schema == 2 else (data, Spelling())
    read = _Reader(doc, view, spelling)
    name = read.string(view, "name", "name", True)
    model = read.section("model", required=True)
    model_path = read.string(model, "path", "model.path", True)
    container = read.string(model, "container", "model.container", True)
    assert name is not None and model_path is not None and container is not None
    return Recipe(
        doc=doc,
        name=name,
        model_path=(model_paths or {}).get(model_path, model_path),
        container=(containers or {}).get(container, container),
        precision=read.string(model, "precision", "model.precision", False),
        resources=read.section("resources"),
        frontend=read.section("frontend"),
        backend=read.section("backend"),
        engine_flags=read.section(ENGINE_KEY),
        agg_env=read.env(AGG_ENV_KEY),
        environment=read.env(ENV_KEY),
        dynamo=read.section("dynamo") if "dynamo" in view else None,
        benchmark=read.section("benchmark"),
        setup_script=read.string(view, "setup_script", "setup_script", False),
        schema=schema,
        spelling=spelling,
        frontend_env=read.env(FRONTEND_ENV_KEY),
        benchmark_env=read.env(BENCH_ENV_KEY),
        mode_env={m: read.env(f"backend.{m}_environment") for m in DISAGG_MODES},
    )


def _env(table: dict[str, Any], key: str, doc: YamlDoc) -> dict[str, str]:
    out = {}
    for name, value in table.items():
        dotted = f"{key}.{name}"
        if not isinstance(name, str) or not ENV_NAME_RE.match(name):
            raise ConfigError(
                f"{name!r} is not an environment variable name",
                where=doc.where(dotted),
                fix="use letters, digits and _",
            )
        if not isinstance(value, str):
            raise ConfigError(
                f"{dotted} is {type(value).__name__} {value!r}, not a string: srt-slurm's "
                "loader refuses it (its env values are strings)",
                where=doc.where(dotted),
                fix=f'quote it: {name}: "{value}"',
            )
        out[name] = value
    return out


def load_cluster_config(path: Path) -> YamlDoc:
    """A cluster's ``srtslurm.yaml`` as written (``checks.known`` holds the keys srt-slurm's
    schema takes; the caller checks them)."""
    doc = load_yaml(path)
    if doc.data is None:
        return YamlDoc(path=path, data={}, lines={})
    if not isinstance(doc.data, dict):
        raise ConfigError(
            "srtslurm.yaml is a mapping at the top level",
            where=str(path),
            fix="write key: value lines (default_account:, containers:, ...)",
        )
    return doc


def str_mapping(doc: YamlDoc, key: str) -> dict[str, str]:
    """``key`` of a cluster config as a mapping of strings (``containers``, ``model_paths``)."""
    table = doc.data.get(key) if isinstance(doc.data, dict) else None
    if table is None:
        return {}
    if not isinstance(table, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in table.items()
    ):
        raise ConfigError(
            f"{key} is not a mapping of names to strings",
            where=doc.where(key),
            fix='write NAME: "VALUE" lines',
        )
    return dict(table)


# --- what the job asks of Slurm: nodes, GPUs and each role's parallel sizes --------------------
# srt-slurm's roles and their v1 mode names (``backend.<engine>_config.<mode>``).
ROLES = (("agg", "aggregated"), ("prefill", "prefill"), ("decode", "decode"))
# srt-slurm's ResourceConfig.gpus_per_node default (src/srtctl/core/schema.py, v1.0.36 and 2.x).
SRT_GPUS_PER_NODE = 4
# vLLM's parallel sizes, as a recipe spells the flags (srt-slurm turns `_` into `-`).
PARALLEL = {
    "tensor": "tensor-parallel-size",
    "pipeline": "pipeline-parallel-size",
    "data": "data-parallel-size",
}
_ASKS = ("nodes", "workers", "gpus")


@dataclass(frozen=True, kw_only=True)
class RoleAsk:
    """One role's workers as srt-slurm places them: nodes (``None``: on the prefill role's
    nodes), workers, the GPUs each worker gets (srt-slurm's ``gpus_per_<role>``) and how that
    was derived, and the parallel sizes its engine flags give (``None``: not a whole number)."""

    role: str  # agg | prefill | decode
    nodes: int | None
    workers: int
    gpus: int
    gpus_said: str
    keys: Mapping[str, str]  # nodes / workers / gpus -> the recipe key (written, or to write)
    written: frozenset[str]  # which of those the recipe writes itself
    flags_key: str
    parallel: Mapping[str, int | None]  # tensor / pipeline / data -> size
    parallel_keys: Mapping[str, str]  # -> the recipe key of the flag (or where to add it)
    nnodes: tuple[str, Any] | None = None  # (key, value) of an `nnodes` flag the recipe sets

    @property
    def ranks(self) -> int | None:
        """TP x PP x DP of one worker (``None``: a size is not a whole number)."""
        out = 1
        for size in self.parallel.values():
            if size is None:
                return None
            out *= size
        return out

    def key(self, what: str) -> str:
        """The recipe key that decides ``what`` (nodes / workers / gpus)."""
        return self.keys[what]


@dataclass(frozen=True, kw_only=True)
class JobShape:
    """What a recipe asks of the cluster, in either srt-slurm schema."""

    schema: int
    gpu_type: str | None
    gpus_per_node: int
    gpus_per_node_written: bool
    roles: tuple[RoleAsk, ...]

    def role(self, name: str) -> RoleAsk | None:
        return next((r for r in self.roles if r.role == name), None)


@dataclass(frozen=True, kw_only=True)
class _Layout:
    """One role of a recipe in srt-slurm's internal (v1) names, with its own keys."""

    role: str
    keys: Mapping[str, str]  # nodes / workers / gpus
    written: frozenset[str]
    flags_key: str
    flags: Any


def _count(value: Any) -> int | None:
    """A whole number as srt-slurm's marshmallow Integer takes it (a bool is not one)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def _spelled(flags: Mapping[str, Any], flag: str) -> str | None:
    return next((str(k) for k in flags if str(k).replace("_", "-") == flag), None)


def _derive_gpus(
    role: str, res: Mapping[str, Any], gpn: int, prefill: RoleAsk | None
) -> tuple[int, str]:
    """srt-slurm's ``ResourceConfig.gpus_per_<role>``, and how it got there."""
    explicit = _count(res.get(f"gpus_per_{role}"))
    nodes, workers = _count(res.get(f"{role}_nodes")), _count(res.get(f"{role}_workers"))
    if explicit is not None:
        return explicit, f"{explicit} as written"
    if nodes and workers:
        gpus = (nodes * gpn) // workers
        return gpus, f"{nodes} node(s) x {gpn} GPUs / {workers} worker(s)"
    if role == "decode" and nodes == 0 and workers and prefill is not None:
        return prefill.gpus, "as prefill's: decode shares its nodes"
    return gpn, "gpus_per_node: srt-slurm's fallback"


def _role(lay: _Layout, res: Mapping[str, Any], gpn: int, prefill: RoleAsk | None) -> RoleAsk:
    flags = lay.flags if isinstance(lay.flags, Mapping) else {}
    gpus, said = _derive_gpus(lay.role, res, gpn, prefill)
    nodes = _count(res.get(f"{lay.role}_nodes"))
    if lay.role == "agg":
        nodes = nodes or 1  # srt-slurm's total_nodes: `agg_nodes or 1`
    parallel: dict[str, int | None] = {}
    parallel_keys = {}
    for what, flag in PARALLEL.items():
        spelled = _spelled(flags, flag)
        parallel_keys[what] = f"{lay.flags_key}.{spelled or flag}"
        parallel[what] = 1 if spelled is None else _count(flags[spelled])  # vLLM's default: 1
    nn = _spelled(flags, "nnodes")
    return RoleAsk(
        role=lay.role,
        nodes=nodes or None,
        workers=_count(res.get(f"{lay.role}_workers")) or 0,  # srt-slurm: `<role>_workers or 0`
        gpus=gpus,
        gpus_said=said,
        keys=lay.keys,
        written=lay.written,
        flags_key=lay.flags_key,
        parallel=parallel,
        parallel_keys=parallel_keys,
        nnodes=None if nn is None else (f"{lay.flags_key}.{nn}", flags[nn]),
    )


def job_shape(doc: YamlDoc) -> JobShape:
    """What a recipe (schema 1 or ``schema: 2``) asks of the cluster, as srt-slurm reads it:
    schema 2's ``roles.<role>.{nodes,workers,gpus,args}`` are schema 1's
    ``resources.<role>_nodes|_workers``, ``gpus_per_<role>``, ``backend.<engine>_config.<mode>``
    (srt-slurm 2.x's ``expand_roles``), each keyed on the recipe's own spelling."""
    data = doc.data if isinstance(doc.data, Mapping) else {}
    resources = data.get("resources")
    resources = resources if isinstance(resources, Mapping) else {}
    schema = 2 if data.get("schema") == 2 else 1
    gpn = _count(resources.get("gpus_per_node"))
    gpn = SRT_GPUS_PER_NODE if gpn is None else gpn
    res, layout = _v2_layout(data) if schema == 2 else _v1_layout(data, resources)
    roles: list[RoleAsk] = []
    for lay in layout:
        roles.append(_role(lay, res, gpn, next((r for r in roles if r.role == "prefill"), None)))
    gpu_type = resources.get("gpu_type")
    return JobShape(
        schema=schema,
        gpu_type=None if gpu_type is None else str(gpu_type),
        gpus_per_node=gpn,
        gpus_per_node_written="gpus_per_node" in resources,
        roles=tuple(roles),
    )


def _v1_layout(
    data: Mapping[str, Any], res: Mapping[str, Any]
) -> tuple[Mapping[str, Any], list[_Layout]]:
    backend = data.get("backend")
    backend = backend if isinstance(backend, Mapping) else {}
    engine = str(backend.get("type", "sglang"))
    config = backend.get(f"{engine}_config")
    config = config if isinstance(config, Mapping) else {}
    disagg = res.get("prefill_nodes") is not None or res.get("decode_nodes") is not None
    layout = []
    for role, mode in ROLES:
        if (role == "agg") == disagg:
            continue
        names = {"nodes": f"{role}_nodes", "workers": f"{role}_workers", "gpus": f"gpus_per_{role}"}
        layout.append(
            _Layout(
                role=role,
                keys={k: f"resources.{n}" for k, n in names.items()},
                written=frozenset(k for k, n in names.items() if n in res),
                flags_key=f"backend.{engine}_config.{mode}",
                flags=config.get(mode),
            )
        )
    return res, layout


def _v2_layout(data: Mapping[str, Any]) -> tuple[Mapping[str, Any], list[_Layout]]:
    """Schema 2's roles in the v1 names srt-slurm 2.x expands them to (``colocate``: 0)."""
    roles = data.get("roles")
    roles = roles if isinstance(roles, Mapping) else {}
    res: dict[str, Any] = {}
    layout = []
    for role, _ in ROLES:
        spec = roles.get(role)
        if not isinstance(spec, Mapping):
            continue
        for key, name in zip(
            _ASKS, (f"{role}_nodes", f"{role}_workers", f"gpus_per_{role}"), strict=True
        ):
            if key in spec:
                res[name] = 0 if spec[key] == "colocate" else spec[key]
        layout.append(
            _Layout(
                role=role,
                keys={k: f"roles.{role}.{k}" for k in _ASKS},
                written=frozenset(k for k in _ASKS if k in spec),
                flags_key=f"roles.{role}.args",
                flags=spec.get("args"),
            )
        )
    return res, layout
