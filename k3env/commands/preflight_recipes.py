"""The `--recipe` / `--srtslurm` half of `k3env preflight`: srt-slurm recipes and a cluster's
`srtslurm.yaml` that people already have, checked with the rules of k3env's own specs (the
pipeline is ``srt.recipe_check``; this module reads the arguments and prints).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from k3env.commands.app import App
from k3env.config.lock import load_lock
from k3env.errors import CheckFailed
from k3env.quoting import one_line

if TYPE_CHECKING:
    from k3env.config.cluster import Cluster
    from k3env.config.pins import Lock
    from k3env.srt.recipe_check import RecipeResult
    from k3env.state import State


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--recipe",
        action="append",
        default=[],
        type=Path,
        metavar="FILE.yaml",
        help="an srt-slurm recipe to check instead of the specs (repeatable)",
    )
    p.add_argument(
        "--srtslurm",
        type=Path,
        metavar="FILE",
        help="a cluster's srtslurm.yaml: unknown keys are errors; its aliases are resolved",
    )
    p.add_argument("--base", help="the lock base a recipe's unknown container is taken as")
    p.add_argument("--model-type", help="the recipe model's tokenizer model_type")
    p.add_argument(
        "--record-engine-cli",
        metavar="PYTHON",
        help="record `vllm serve`'s parser of the twin's vLLM from PYTHON (an environment of the "
        "twin's pinned closure) into schemas/engine-cli/: recipes' flags are judged by it",
    )


def wanted(args: argparse.Namespace) -> bool:
    return bool(args.recipe or args.srtslurm or args.record_engine_cli)


def record(args: argparse.Namespace, app: App) -> int:
    """``--record-engine-cli PYTHON``: the twin's vLLM parser, asked with PYTHON, recorded."""
    from k3env.checks.engine_record import record_twin_cli
    from k3env.config.cluster import load_cluster

    lock = load_lock(args.lock)
    platform = load_cluster(args.cluster).platform
    path, changed = record_twin_cli(lock, args.record_engine_cli, platform, app.log)
    payload = {"path": str(path), "written": changed}
    app.emit(payload, lambda: print(f"{path}: {'written' if changed else 'unchanged'}"))
    return 0


def run(args: argparse.Namespace, app: App, rules: list[Any]) -> int:
    if args.record_engine_cli:
        return record(args, app)
    from k3env.config.cluster import load_cluster
    from k3env.config.srtrecipe import load_recipe
    from k3env.srt.recipe_check import (
        check_recipe,
        find_image,
        srt_loader,
    )

    start = time.perf_counter()
    lock = load_lock(args.lock)
    cluster = load_cluster(args.cluster)
    state = app.state()
    aliases: dict[str, str] = {}
    model_paths: dict[str, str] = {}
    payload: dict[str, Any] = {"cluster": str(args.cluster), "platform": cluster.platform}
    lines: list[str] = []
    if args.srtslurm:
        aliases, model_paths, payload["srtslurm"] = _cluster_config(args, lock, state, cluster,
                                                                     lines)  # fmt: skip
    recipes = [load_recipe(r, containers=aliases, model_paths=model_paths) for r in args.recipe]
    loaders = srt_loader(lock, state, app.log, [r.path for r in recipes]) if recipes else {}
    results = []
    for recipe in recipes:
        image = find_image(state, lock, args.images, recipe.container, args.base, cluster.platform)
        results.append(
            check_recipe(
                recipe,
                lock,
                cluster,
                image,
                rules,
                loaders[recipe.path],
                model_type=args.model_type,
            )
        )
    elapsed = time.perf_counter() - start
    payload["recipes"] = [r.as_json() for r in results]
    payload["errors"] = sum(r.errors for r in results)
    payload["warnings"] = sum(r.warnings for r in results)
    payload["seconds"] = round(elapsed, 4)

    app.emit(payload, lambda: _show(results, lines, len(rules), cluster.name))
    if payload["errors"]:
        failing = [str(r.recipe.path) for r in results if r.errors]
        raise CheckFailed(
            f"preflight found {payload['errors']} error(s) in {len(failing)} recipe(s)",
            where=", ".join(failing),
            fix="apply each finding's fix; `k3env preflight --explain RULE` says why",
        )
    return 0


def _cluster_config(
    args: argparse.Namespace, lock: Lock, state: State, cluster: Cluster, lines: list[str]
) -> tuple[dict[str, str], dict[str, str], dict[str, Any]]:
    """srt-slurm's cluster config (``--srtslurm``): its keys checked against the pinned
    srt-slurm, each container alias resolved to an image k3env built; (aliases, model paths,
    what the JSON says of it). Lines for a person go to ``lines``."""
    from k3env.config.srtrecipe import load_cluster_config, str_mapping
    from k3env.srt.recipe_check import check_cluster_config, containers_of

    doc = load_cluster_config(args.srtslurm)
    checked = check_cluster_config(doc, lock)
    aliases, model_paths = str_mapping(doc, "containers"), str_mapping(doc, "model_paths")
    entries = []
    for alias, value, image in containers_of(state, lock, args.images, aliases, cluster.platform):
        entries.append({"alias": alias, "container": value, "known": image.known, "how": image.how})
        lines.append(f"{args.srtslurm}: containers.{alias}: {value}: {image.how}")
    said = {"file": str(args.srtslurm), "containers": entries, "keys": checked}
    lines.append(f"{args.srtslurm}: {checked}")
    return aliases, model_paths, said


def _show(results: list[RecipeResult], lines: list[str], rules: int, cluster: str) -> None:
    """The recipes' verdicts, for a person: a line each (a recipe's names and values in it
    escaped: no line of their own)."""

    def say(line: str) -> None:
        print(one_line(line))

    for line in lines:
        say(line)
    for r in results:
        say(f"{r.recipe.path}: model.container {r.recipe.container}: {r.image.how}")
        for f in r.findings:
            print(f.text())  # two lines, each escaped
        for e in r.env:
            if e.changed:
                say(
                    f"{r.recipe.path}: {e.key}: {e.name}={e.value} changes the value the "
                    f"image bakes ({e.baked})"
                )
        for note in r.notes:
            say(f"{r.recipe.path}: note: {note}")
        for n in r.not_checked:
            say(f"{r.recipe.path}: {n.text()}")
        say(
            f"{r.recipe.path}: srt-slurm's loader and dry-run: {r.loader.verdict} "
            f"({r.loader.detail})"
        )
        say(
            f"{r.recipe.path}: {rules} rules, on {cluster}: {r.errors} "
            f"error(s), {r.warnings} warning(s)"
        )
