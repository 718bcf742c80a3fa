"""Start each serve profile's processes in its image on this CPU and send them real requests:
`vllm serve`, or Dynamo's frontend and worker, as the job starts them, with the CPU build of
the pinned engine mounted over the image's own and random weights of a small model k3env
writes (its tokenizer declares the profile's model_type and carries its parsers' tokens);
then each engine process must hold every baked env var at its baked value
(`/proc/PID/environ`), the model must be listed, a chat completion must return tokens, a
`tool_choice: "required"` request must come back as parsed tool_calls through the profile's
tool-call parser, the baked aiperf must run requests with 0 errors, and every process must stop on
SIGINT. What the host cannot run is reduced and said; what it cannot see is listed as not
checked. With `--cluster PROFILE.toml IMAGE`: the same battery as one short Slurm job on the
GPUs, the real image by digest with random weights (`--load-format dummy`; `--layers N` cuts
the model and the nodes it needs): an srt-slurm recipe (benchmark type `custom`, validated by
the pinned srt-slurm where it is materialized) and a plain sbatch script (pyxis) in `--out`;
`--submit` runs it and follows it; `--collect DIR` turns a finished job's logs into verdicts,
each engine failure with its stage (init, KV-cache init, CUDA graph capture, first decode,
serving) and log line, recorded by image digest and cluster profile. `--cpu-partition`: the
CPU smoke's battery as the job instead (one node, no GPU): the image through the cluster's
pyxis and enroot, the CPU build of the engine mounted over its own, the baked env read from
the engine's process; recorded apart from the GPU job's verdict
"""

from __future__ import annotations

import argparse
from pathlib import Path

from k3env.commands.app import App, image_args
from k3env.errors import CheckFailed, ConfigError

NAME = "smoke"
HELP = "serve each profile on this CPU and send it chat, tool-call and benchmark requests"


def arguments(p: argparse.ArgumentParser) -> None:
    image_args(p, twin="smoke the images built over the twin")
    p.add_argument("--profile", action="append", default=[], help="only this profile (repeatable)")
    p.add_argument(
        "--variant", metavar="NAME",
        help="smoke the images built with the lock's [variants.NAME] components (with --twin)",
    )  # fmt: skip
    p.add_argument(
        "--timeout", type=float,
        help="seconds for the model to be listed (each later stage has its own bound; "
        "default 300, on a cluster 1200)",
    )  # fmt: skip
    c = p.add_argument_group("on a Slurm cluster")
    c.add_argument(
        "--cluster",
        type=Path,
        metavar="PROFILE.toml",
        help="write the smoke job of IMAGE for this cluster profile",
    )
    c.add_argument(
        "--layers",
        type=int,
        metavar="N",
        help="cut the model to N layers: its TP group on one pipeline stage",
    )
    c.add_argument(
        "--out",
        type=Path,
        default=Path("out/cluster-smoke"),
        metavar="DIR",
        help="where the job's files go: a directory the nodes see (%(default)s)",
    )
    c.add_argument("--container", help="image reference or .sqsh (default: pushed digest)")
    c.add_argument("--model-path", help="model path on the cluster (default: cluster profile)")
    c.add_argument(
        "--runtime",
        choices=("pyxis", "none"),
        default="pyxis",
        help="the job's container runtime (none: on the nodes themselves)",
    )
    c.add_argument(
        "--cpu-partition",
        action="store_true",
        help="run the CPU smoke's battery as the job, on a CPU partition: the image through "
        "the cluster's runtime, the CPU build of the engine mounted over its own (one node)",
    )
    c.add_argument(
        "--cpus", type=int, default=8, metavar="N",
        help="CPUs the CPU partition job asks for (%(default)s)",
    )  # fmt: skip
    c.add_argument("--partition", metavar="NAME", help="the Slurm partition of the job")
    c.add_argument(
        "--job-timeout",
        type=float,
        default=1800,
        metavar="SECONDS",
        help="the job's time limit; k3env cancels it past that (%(default)s)",
    )
    c.add_argument(
        "--submit",
        action="store_true",
        help="sbatch the script, follow the job, collect its verdicts",
    )
    c.add_argument(
        "--collect",
        type=Path,
        metavar="DIR",
        help="verdicts from a finished job's output directory",
    )
    p.set_defaults(platform=["linux/amd64"])


def run(args: argparse.Namespace, app: App) -> int:
    if args.collect is not None or args.cluster is not None:
        from k3env.commands.smoke_cluster import run_cluster

        return run_cluster(args, app)
    if args.submit or args.layers is not None:
        raise ConfigError(
            "--submit and --layers smoke on a cluster", where="k3env smoke",
            fix="add --cluster PROFILE.toml",
        )  # fmt: skip
    from k3env.smoke.run import smoke_images, table

    args.timeout = 300.0 if args.timeout is None else args.timeout

    lock, specs, engine, state, builds = app.builds(args)
    reports = smoke_images(
        engine, state, lock, list(zip(specs, builds, strict=True)), app.log,
        timeout=args.timeout, profiles=tuple(args.profile),
    )  # fmt: skip
    failed = [r for r in reports if not r.ok]
    payload = {
        "twin": args.twin,
        "variant": args.variant,
        "profiles": [r.as_json() for r in reports],
        "failures": len(failed),
    }
    app.emit(payload, lambda: print(table(reports)))
    if failed:
        raise CheckFailed(
            f"{len(failed)} profile(s) did not serve: "
            + ", ".join(f"{r.image}/{r.profile}" for r in failed),
            where="k3env smoke",
            fix="each failed gate above names the role, its command line and its own words",
        )
    return 0
