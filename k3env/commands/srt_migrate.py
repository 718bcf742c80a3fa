"""Rewrite srt-slurm recipes to schema 2 with the pinned srt-slurm 2.x's own `srtctl migrate`
(comments, key order and quoting kept; its notes printed), then judge each rewritten recipe as
`preflight --recipe` does. Refused, saying why, where the pinned srt-slurm is 1.x or 2.x is not
materialized on this host (k3env carries no copy of the rewrite)
"""

from __future__ import annotations

import argparse
from pathlib import Path

from k3env.commands.app import App
from k3env.config.cluster import DEFAULT_CLUSTER
from k3env.config.lock import load_lock
from k3env.config.spec import DEFAULT_IMAGES
from k3env.errors import ConfigError
from k3env.quoting import one_line

NAME = "srt migrate"
HELP = "rewrite recipes to schema 2 with the pinned srt-slurm 2.x's own migrate, then judge them"


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("recipe", nargs="+", type=Path, help="recipe YAML files or directories")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--in-place", action="store_true", help="rewrite each file in place")
    where.add_argument("--out", type=Path, metavar="DIR", help="write each to DIR/NAME.yaml")
    p.add_argument(
        "--cluster", type=Path, default=DEFAULT_CLUSTER, help=f"cluster profile ({DEFAULT_CLUSTER})"
    )
    p.add_argument("--images", type=Path, default=DEFAULT_IMAGES, help="image spec directory")


def run(args: argparse.Namespace, app: App) -> int:
    from k3env.checks.rules import RULES
    from k3env.commands.preflight_recipes import run as judge
    from k3env.srt.migrate import migrate, migrator

    recipes: list[Path] = []
    for r in args.recipe:
        recipes += sorted(r.glob("*.yaml")) if r.is_dir() else [r]
    missing = [str(r) for r in recipes if not r.is_file()]
    if not recipes or missing:
        raise ConfigError(f"recipe(s) not found: {missing or args.recipe}",
                          where="k3env srt migrate", fix="pass RECIPE.yaml files")  # fmt: skip
    m = migrator(load_lock(args.lock), app.state(), app.log)
    done = migrate(m, recipes, None if args.in_place else args.out, app.log)
    if not app.as_json:
        for d in done:
            state = "rewritten" if d.changed else "unchanged"
            print(one_line(f"{d.source}: srtctl migrate (srt-slurm {m.version}): {state} -> "
                           f"{d.written}"))  # fmt: skip
            for note in d.notes:
                print(one_line(f"  {note}"))
    judged = argparse.Namespace(**{**vars(args), "recipe": [d.written for d in done],
                                   "srtslurm": None, "base": None, "model_type": None,
                                   "record_engine_cli": None})  # fmt: skip
    try:
        return judge(judged, app, list(RULES))
    finally:  # --json: the judgement's document says what srt-slurm's migrate did too
        if isinstance(app.result, dict):
            app.result["migrated"] = [d.as_json() for d in done]
            app.result["srt_slurm"] = m.as_json()
