"""Check serve profiles, specs, the lock and a cluster profile against the rules drawn from the
bring-up's failures (`--list-rules`), with no engine (~10 ms). With `--recipe FILE.yaml`: an
srt-slurm recipe people already have, mapped as srt-slurm will start it (its defaults applied,
its image found by `model.container` in k3env's push and export records or as a lock base,
else said as an image k3env cannot place), with the same rules; findings on the recipe's keys
and lines, each baked env value the recipe changes, and srt-slurm's own loader and dry-run
where the pinned srt-slurm is materialized (else its recorded schema's keys and types, and the
rest said: not checked). `--srtslurm FILE`: what srt-slurm's cluster config does not take is an
error (srt-slurm only warns, then drops the file)
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from k3env.commands.app import App, image_args
from k3env.commands.preflight_recipes import arguments as recipe_arguments
from k3env.commands.preflight_recipes import run as run_recipes
from k3env.commands.preflight_recipes import wanted as recipes_wanted
from k3env.config.cluster import DEFAULT_CLUSTER
from k3env.config.lock import load_lock
from k3env.config.shapes import platform_option
from k3env.config.spec import load_specs
from k3env.errors import CheckFailed, ConfigError
from k3env.quoting import one_line

NAME = "preflight"
HELP = "check serve profiles against the bring-up's failure rules (no engine, ~10 ms)"


def arguments(p: argparse.ArgumentParser) -> None:
    image_args(p, twin=None)
    p.add_argument(
        "--cluster", type=Path, default=DEFAULT_CLUSTER, help=f"cluster profile ({DEFAULT_CLUSTER})"
    )
    p.add_argument("--rule", action="append", default=[], help="run only this rule (repeatable)")
    p.add_argument("--explain", metavar="RULE", help="print what RULE prevents and its fix")
    p.add_argument("--list-rules", action="store_true", help="list the rules")
    recipe_arguments(p)


def run(args: argparse.Namespace, app: App) -> int:
    from k3env.checks.preflight import contexts, run_rules
    from k3env.checks.rules import RULES, RULES_BY_ID
    from k3env.config.cluster import load_cluster

    if args.explain:
        rule = RULES_BY_ID.get(args.explain)
        if rule is None:
            raise ConfigError(
                f"unknown rule {args.explain!r}",
                where="--explain",
                fix=f"choose from {sorted(RULES_BY_ID)}",
            )
        app.emit(
            {k: v for k, v in rule.__dict__.items() if k != "check"},
            lambda: print(rule.explain()),
        )
        return 0
    if args.list_rules:
        app.emit(
            [{"id": r.id, "severity": r.severity, "title": r.title} for r in RULES],
            lambda: print("\n".join(f"{r.id:26} {r.severity:8} {r.title}" for r in RULES)),
        )
        return 0
    start = time.perf_counter()
    unknown = sorted(set(args.rule) - set(RULES_BY_ID))
    if unknown:
        raise ConfigError(
            f"unknown rule(s) {unknown}", where="--rule", fix=f"choose from {sorted(RULES_BY_ID)}"
        )
    rules = [r for r in RULES if not args.rule or r.id in args.rule]
    if recipes_wanted(args):
        return run_recipes(args, app, rules)
    lock = load_lock(args.lock)
    specs = load_specs(args.images, lock, tuple(args.image))
    cluster = load_cluster(args.cluster)
    report = run_rules(contexts(lock, specs, cluster, app.state()), rules)
    elapsed = time.perf_counter() - start
    payload = {**report.as_json(), "cluster": str(args.cluster), "platform": cluster.platform,
               "seconds": round(elapsed, 4)}  # fmt: skip

    def human() -> None:
        for f in report.findings:
            print(f.text())
        for name, source in report.facts_from.items():
            print(f"{name}: facts from {source}")
        on = platform_option(cluster.platform)
        for name, entries in report.not_checked.items():
            for n in entries:
                print(one_line(f"{name}: {n.text()}"))
        for name, facts in report.lacked.items():
            print(f"{name}: lacked facts {list(facts)} (run `k3env verify{on}` to learn them)")
        print(
            f"{len(report.checked)} profile(s), {report.rules} rules, on {cluster.name}: "
            f"{report.errors} error(s), {report.warnings} warning(s) ({elapsed * 1000:.0f} ms)"
        )

    app.emit(payload, human)
    if report.errors:
        raise CheckFailed(
            f"preflight found {report.errors} error(s)",
            where=", ".join(sorted({f.image for f in report.findings if f.severity == "error"})),
            fix="apply each finding's fix; `k3env preflight --explain RULE` says why",
        )
    return 0
