"""Validate recipes with the materialized srt-slurm's own config loading, and its dry-run.

Recipes are loaded with srt-slurm's own ``load_config`` (its marshmallow schema), not a copy
of it, and the lookups its job makes by the recipe's types (frontend, benchmark runner); a
recipe that passes those goes through srtctl's dry-run (it renders the sbatch script). Each
error comes back with the recipe file, the key path and srt-slurm's message. The srt-slurm
asked is the one ``srt.materialize`` made.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from k3env import jsontext
from k3env.errors import ToolError
from k3env.log import Log
from k3env.runner import attempt
from k3env.srt.materialize import Materialized

# srtctl's own dry-run: loads the recipe and renders the sbatch script, without Slurm.
DRY_RUN = ("-m", "srtctl.cli.submit", "dry-run", "-f")
# srt-slurm names the field at the head of its cross-field messages ("frontend.type: vllm ...",
# "dynamo.wheel must be ..."): the key path of an error that has none.
_KEY_HEAD = re.compile(r"^([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)+):? ")
_NOT_A_KEY = re.compile(r"\.(?:ya?ml|json|py|toml|sh)$")


@dataclass(frozen=True, kw_only=True)
class RecipeError:
    file: str
    key: str
    message: str
    stage: str = "load"  # load (load_config) | job (a lookup the job makes) | dry-run (render)


def _keyed(file: str, key: str, message: str, stage: str) -> RecipeError:
    if not key or key == "_schema":
        m = _KEY_HEAD.match(message)
        key = m.group(1) if m and not _NOT_A_KEY.search(m.group(1)) else ""
    return RecipeError(file=file, key=key, message=message, stage=stage)


@dataclass(frozen=True, kw_only=True)
class Validation:
    errors: list[RecipeError]
    not_checked: list[str]  # what this srt-slurm could not be asked (it has no such function)


def validate(m: Materialized, recipes: list[Path], log: Log) -> Validation:
    """Each recipe through srt-slurm's own ``load_config`` and the lookups its job makes by
    the recipe's types (frontend, benchmark runner); then, for a recipe that passes those,
    srtctl's dry-run (it renders the sbatch script). Errors with key paths.

    Both run in one fresh directory with no ``SRTSLURM_CONFIG``: srt-slurm reads a site
    ``srtslurm.yaml`` from the working directory and two above it, and the verdict must not
    depend on one that happens to be there."""
    paths = [str(r.resolve()) for r in recipes]
    env = _validation_env()
    with tempfile.TemporaryDirectory(prefix="k3env-srt-validate-") as tmp:
        cwd = Path(tmp) / "a" / "b"  # its parents are ours, and empty
        cwd.mkdir(parents=True)
        errors, not_checked = _load_errors(m, paths, cwd, env, log)
        # An error no file owns (the loader itself failed): no recipe loaded, none is rendered.
        failed = set(paths) if any(not e.file for e in errors) else {e.file for e in errors}
        errors += _dry_run_errors(m, paths, failed, cwd, env, log)
    return Validation(errors=errors, not_checked=list(not_checked))


def _validation_env() -> dict[str, str]:
    """This process's environment without ``SRTSLURM_CONFIG``, one line a message."""
    env = {k: v for k, v in os.environ.items() if k != "SRTSLURM_CONFIG"}
    # Rich wraps srtctl's output at 80 columns when it is not a terminal: one line a message.
    env["COLUMNS"] = "10000"
    return env


def _load_errors(
    m: Materialized, paths: Sequence[str], cwd: Path, env: Mapping[str, str], log: Log
) -> tuple[list[RecipeError], list[str]]:
    """The errors of srt-slurm's ``load_config`` and its job's lookups (the probe's verdict),
    and what this srt-slurm could not be asked."""
    with resources.as_file(resources.files("k3env.probes") / "srt_validate.py") as script:
        code, out = attempt([str(m.python), str(script), *paths], log, cwd=cwd, env=env)
    try:
        verdict = jsontext.parse(out.strip().splitlines()[-1])
        rows, not_checked = verdict["errors"], verdict["not_checked"]
    except (ValueError, IndexError, KeyError, TypeError) as e:
        raise ToolError(
            f"srt-slurm's validation printed no verdict (exit {code}): {out[-2000:]}",
            where=str(m.path),
            fix="check that the materialized srt-slurm has srtctl.core.config.load_config",
        ) from e
    errors = [_keyed(r["file"], r["key"], r["message"], r.get("stage", "load")) for r in rows]
    return errors, not_checked


def _dry_run_errors(
    m: Materialized,
    paths: Sequence[str],
    failed: set[str],
    cwd: Path,
    env: Mapping[str, str],
    log: Log,
) -> list[RecipeError]:
    """srtctl's dry-run of each recipe that loaded (``failed``: the files that did not)."""
    errors = []
    for path in paths:
        if path in failed:
            continue
        with log.step(f"srtctl dry-run {Path(path).name}"):
            code, text = attempt([str(m.python), *DRY_RUN, path], log, cwd=cwd, env=env)
        if code != 0:
            errors.append(_keyed(path, "", _dry_run_message(text, path), "dry-run"))
    return errors


def _dry_run_message(output: str, path: str) -> str:
    """srtctl's ``Error: ...`` line (its own words), else the end of what it printed."""
    for line in output.splitlines():
        if line.strip().startswith("Error:"):
            message = line.strip().removeprefix("Error:").strip()
            return message.removeprefix(f"Invalid config in {path}: ")
    return output.strip()[-1500:] or "srtctl dry-run failed and printed nothing"


def record_schema(m: Materialized, log: Log) -> dict[str, Any]:
    """srt-slurm's recipe and cluster-config schema, read from the materialized srt-slurm's
    own classes (``probes/srt_schema.py``)."""
    with (
        resources.as_file(resources.files("k3env.probes") / "srt_schema.py") as script,
        tempfile.TemporaryDirectory(prefix="k3env-srt-schema-") as tmp,
    ):
        code, out = attempt([str(m.python), str(script)], log, cwd=Path(tmp), env=_validation_env())
    try:
        doc = jsontext.parse(out.strip().splitlines()[-1])
        if not isinstance(doc, dict) or not {"recipe", "cluster", "messages"} <= set(doc):
            raise ValueError("no recipe, cluster or messages")
    except (ValueError, IndexError) as e:
        raise ToolError(
            f"srt-slurm's schema probe printed no schema (exit {code}): {out[-2000:]}",
            where=str(m.path),
            fix="check that the materialized srt-slurm has srtctl.core.schema.SrtConfig",
        ) from e
    return doc
