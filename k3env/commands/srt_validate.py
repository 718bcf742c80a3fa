"""Load recipes with the materialized srt-slurm's own `load_config` (its marshmallow schema), ask
its job-time registries for the recipe's frontend and benchmark types (`get_frontend`,
`get_runner`), then run `srtctl dry-run` (renders the sbatch script); each error with file, key
path, srt-slurm's message and the stage that found it
"""

from __future__ import annotations

import argparse
from pathlib import Path

from k3env.commands.app import SOURCE_HELP, App
from k3env.config.lock import load_lock
from k3env.errors import CheckFailed, ConfigError
from k3env.quoting import one_line

NAME = "srt validate"
HELP = "validate recipes with srt-slurm's own config loading"


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("recipe", nargs="+", type=Path, help="recipe YAML files or directories")
    p.add_argument("--source", help=SOURCE_HELP)


def run(args: argparse.Namespace, app: App) -> int:
    log = app.log
    from k3env.srt.materialize import materialize
    from k3env.srt.validate import validate

    recipes: list[Path] = []
    for r in args.recipe:
        recipes += sorted(r.glob("*.yaml")) if r.is_dir() else [r]
    if not recipes:
        raise ConfigError("no recipes given", where="k3env srt validate", fix="pass RECIPE.yaml")
    missing = [str(r) for r in recipes if not r.is_file()]
    if missing:
        raise ConfigError(f"recipe(s) not found: {missing}", where="k3env srt validate", fix="")
    m = materialize(load_lock(args.lock), app.state(), log, source=args.source)
    result = validate(m, recipes, log)
    errors = result.errors
    for note in result.not_checked:
        log.info(f"    not checked: {note}")
    app.emit(
        {"srt_slurm": m.as_json(), "recipes": [str(r) for r in recipes],
         "errors": [e.__dict__ for e in errors], "not_checked": result.not_checked},
        lambda: print(
            "\n".join(one_line(f"{e.file}: {e.key or '(recipe)'}: {e.message} [{e.stage}]")
                      for e in errors)
            or f"{len(recipes)} recipe(s) valid for srt-slurm {m.version} + {list(m.patches)}"
            + "".join(f"\n  not checked: {one_line(n)}" for n in result.not_checked)
        ),
    )  # fmt: skip
    if errors:
        raise CheckFailed(
            f"{len(errors)} error(s) in {len({e.file for e in errors})} recipe(s)",
            where=f"srt-slurm {m.version}",
            fix="fix each key above (srt-slurm's own message), or pin an srt-slurm that has it",
        )
    return 0
