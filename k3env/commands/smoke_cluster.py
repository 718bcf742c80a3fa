"""`k3env smoke --cluster` / `--collect`: the cluster smoke's part of the smoke command (its
options are the command's, in ``commands.smoke``)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from k3env.commands.app import App
from k3env.errors import ConfigError
from k3env.quoting import one_line
from k3env.verdict import exit_code

if TYPE_CHECKING:
    from k3env.cluster.collect import ClusterVerdict
    from k3env.cluster.job import Written
    from k3env.config.cluster import Cluster
    from k3env.config.spec import ImageSpec


def run_cluster(args: argparse.Namespace, app: App) -> int:
    from k3env.cluster.collect import collect, record, table
    from k3env.cluster.job import submit_and_collect, write_job

    state = app.state()
    if args.collect is not None:
        if args.cluster is not None or args.submit:
            raise ConfigError(
                "--collect reads a finished job; it takes no --cluster or --submit",
                where="k3env smoke --collect",
                fix="pass only --collect DIR",
            )
        verdict = record(state, collect(args.collect))
        app.emit({"collected": verdict.as_json()}, lambda: print(table(verdict)))
        return _exit_code(verdict, str(args.collect))
    from k3env.config.cluster import load_cluster
    from k3env.config.lock import load_lock
    from k3env.config.spec import load_specs

    if len(args.image) != 1:
        raise ConfigError(
            "--cluster smokes one image",
            where="k3env smoke --cluster",
            fix="name one image spec (e.g. kimi-k3-direct-f)",
        )
    cluster = load_cluster(args.cluster)
    if args.cpu_partition:
        written = _cpu_job(args, app, cluster)
    else:
        lock = load_lock(args.lock)
        (spec,) = load_specs(args.images, lock, tuple(args.image))
        written = write_job(
            lock,
            spec,
            spec.profiles[_profile(args, spec)],
            cluster,
            state,
            app.log,
            out=args.out,
            layers=args.layers,
            container=args.container,
            model_path=args.model_path,
            runtime=args.runtime,
            job_timeout=args.job_timeout,
            ready_timeout=1200.0 if args.timeout is None else args.timeout,
            partition=args.partition,
        )
    payload = {"written": written.as_json()}
    if not args.submit:
        app.emit(payload, lambda: print("\n".join(_written(written))))
        return 0
    for line in _written(written):
        app.log.info(line)
    verdict = submit_and_collect(written, state, app.log, job_timeout=args.job_timeout)
    app.emit({**payload, "collected": verdict.as_json()}, lambda: print(table(verdict)))
    return _exit_code(verdict, str(written.out))


def _profile(args: argparse.Namespace, spec: ImageSpec) -> str:
    name: str = args.profile[0] if args.profile else next(iter(spec.profiles), "")
    if name not in spec.profiles:
        raise ConfigError(
            f"no serve profile {name!r} in {spec.path}",
            where="--profile",
            fix=f"choose from {sorted(spec.profiles)}",
        )
    return name


def _cpu_job(args: argparse.Namespace, app: App, cluster: Cluster) -> Written:
    """The CPU partition mode: the image built (or found) as `k3env smoke` builds it, its
    job written (``cluster.cpu_partition``)."""
    from k3env.cluster.job import write_cpu_job

    if args.runtime != "pyxis" or args.layers is not None:
        raise ConfigError(
            "--cpu-partition runs the image through pyxis, whole (--runtime pyxis, no --layers)",
            where="k3env smoke --cluster --cpu-partition",
            fix="drop --runtime none and --layers",
        )
    args.platform = [cluster.platform]
    lock, specs, engine, state, builds = app.builds(args)
    (spec,), (build,) = specs, builds
    return write_cpu_job(
        lock, spec, spec.profiles[_profile(args, spec)], cluster, state, app.log,
        engine=engine, build=build, out=args.out, container=args.container, cpus=args.cpus,
        partition=args.partition, job_timeout=args.job_timeout,
        ready_timeout=300.0 if args.timeout is None else args.timeout,
    )  # fmt: skip


def _written(w: object) -> list[str]:
    """What was written and how to run it, for a person: lines, each one line (a name in it
    escaped)."""
    from k3env.cluster.job import RECIPE, SCRIPT, Written

    assert isinstance(w, Written)
    s = w.smoke
    no_recipe = w.validation is None
    recipe = (
        "not written (CPU partition mode: srt-slurm starts its engine on GPU nodes)"
        if w.validation is None
        else f"{w.out / RECIPE} ({w.validation.status}: {w.validation.detail})"
    )
    run = f"sbatch {w.out / SCRIPT}"
    where = (
        f"{s.cluster}'s CPU partition: one node, no GPU"
        if no_recipe
        else s.topology.said() + (f" ({s.layers} layers)" if s.layers else "")
    )
    lines = [
        f"{s.image} / {s.profile} on {where}",
        f"  image: {w.image.container} ({w.image.how})",
        f"  srt-slurm recipe: {recipe}",
        f"  sbatch script:    {w.out / SCRIPT}",
        "  changed from a full attempt:",
        *[f"    - {c}" for c in s.changes],
        "  not checked by this job:",
        *[f"    - {n}" for n in s.not_checked],
        f"  run: {run}" if no_recipe else f"  run: srtctl apply -f {w.out / RECIPE}   or   {run}",
        "  then: k3env smoke --collect JOB_DIR (the script prints it)",
    ]
    return [one_line(line) for line in lines]


def _exit_code(verdict: ClusterVerdict, where: str) -> int:
    return exit_code(
        verdict.all_gates,
        what="the cluster smoke job did not serve",
        where=where,
        fix="each failure above names its stage, its log line and the bring-up's fix",
    )
