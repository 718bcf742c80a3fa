"""srt-slurm recipes a person wrote (``k3env preflight --recipe``, ``k3env adopt``): the YAML
read into checked values under srt-slurm's own key names.

Only what a recipe says is read here; what srt-slurm fills in for a key left out is applied by
``checks.recipe_map`` from ``checks.known.SRT_DEFAULTS``. A value srt-slurm's loader would
refuse for its type (an env value that is not a string, a section that is not a mapping) is
refused here too, naming the key and its line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from k3env.config.reader import ENV_NAME_RE
from k3env.config.yamlread import YamlDoc, load_yaml
from k3env.errors import ConfigError

# The engine flags k3env maps: the aggregate worker's (srt-slurm's `vllm_config.aggregated`).
ENGINE_KEY = "backend.vllm_config.aggregated"
AGG_ENV_KEY = "backend.aggregated_environment"
ENV_KEY = "environment"
CLUSTER_CONFIG = "srtslurm.yaml"  # the cluster config's file name, as srt-slurm looks for it
_MISSING: Any = object()


@dataclass(frozen=True, kw_only=True)
class Recipe:
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

    @property
    def path(self) -> Path:
        return self.doc.path

    @property
    def data(self) -> Mapping[str, Any]:
        return self.doc.data  # type: ignore[no-any-return]

    def env(self) -> dict[str, str]:
        """What srt-slurm exports in the worker's container, in its order (the mode's
        environment, then the recipe's ``environment``: later wins)."""
        return {**self.agg_env, **self.environment}

    def env_key(self, name: str) -> str:
        """The recipe key that sets ``name`` (the one that wins), else where to add it."""
        if name in self.environment:
            return f"{ENV_KEY}.{name}"
        return f"{AGG_ENV_KEY}.{name}"

    def fail(self, key: str, message: str, fix: str) -> ConfigError:
        return ConfigError(message, where=self.doc.where(key), fix=fix)


def _not_a_cluster_config(path: Path, data: Mapping[str, Any]) -> None:
    """Refuse srt-slurm's cluster config given as a recipe, naming it."""
    if "name" not in data and (path.name == CLUSTER_CONFIG or "model_paths" in data):
        why = f"named {CLUSTER_CONFIG}" if path.name == CLUSTER_CONFIG else "it has model_paths"
        raise ConfigError(
            f"this is srt-slurm's cluster config, not a recipe ({why}, and no name)",
            where=str(path),
            fix=f"pass it with --srtslurm {path}, and the recipe with --recipe",
        )


def load_recipe(
    path: Path,
    *,
    containers: Mapping[str, str] | None = None,
    model_paths: Mapping[str, str] | None = None,
) -> Recipe:
    """Read ``path``; ``containers`` / ``model_paths``: a cluster's ``srtslurm.yaml`` aliases,
    resolved as srt-slurm resolves them (an alias that names a key of the mapping)."""
    doc = load_yaml(path)
    if not isinstance(doc.data, dict):
        raise ConfigError(
            "an srt-slurm recipe is a mapping at the top level",
            where=str(path),
            fix="pass a recipe file (name:, model:, resources:, backend:, ...)",
        )
    data: dict[str, Any] = doc.data
    _not_a_cluster_config(path, data)

    def section(key: str, required: bool = False) -> dict[str, Any]:
        node: Any = data
        for part in key.split("."):
            node = node.get(part, _MISSING) if isinstance(node, dict) else _MISSING
        if node is _MISSING or node is None:
            if required:
                raise ConfigError(
                    f"the recipe has no {key}: srt-slurm's loader requires it",
                    where=doc.where(key.split(".")[0]) if "." in key else str(path),
                    fix=f"add {key}:",
                )
            return {}
        if not isinstance(node, dict):
            raise ConfigError(
                f"{key} is not a mapping",
                where=doc.where(key),
                fix="write it as srt-slurm's recipe takes it (key: value lines)",
            )
        return node

    def string(table: dict[str, Any], key: str, dotted: str, required: bool) -> str | None:
        value = table.get(key)
        if value is None:
            if required:
                raise ConfigError(
                    f"the recipe has no {dotted}: srt-slurm's loader requires it",
                    where=doc.where(dotted),
                    fix=f"add {dotted}",
                )
            return None
        if not isinstance(value, str):
            raise ConfigError(
                f"{dotted} is not a string (srt-slurm's loader refuses it)",
                where=doc.where(dotted),
                fix="quote the value",
            )
        return value

    name = string(data, "name", "name", True)
    model = section("model", required=True)
    model_path = string(model, "path", "model.path", True)
    container = string(model, "container", "model.container", True)
    assert name is not None and model_path is not None and container is not None
    backend = section("backend")
    return Recipe(
        doc=doc,
        name=name,
        model_path=(model_paths or {}).get(model_path, model_path),
        container=(containers or {}).get(container, container),
        precision=string(model, "precision", "model.precision", False),
        resources=section("resources"),
        frontend=section("frontend"),
        backend=backend,
        engine_flags=section(ENGINE_KEY),
        agg_env=_env(section(AGG_ENV_KEY), AGG_ENV_KEY, doc),
        environment=_env(section(ENV_KEY), ENV_KEY, doc),
        dynamo=section("dynamo") if "dynamo" in data else None,
        benchmark=section("benchmark"),
        setup_script=string(data, "setup_script", "setup_script", False),
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
