"""Start each serve profile's processes in its image on this CPU and send them real requests:
`vllm serve`, or Dynamo's frontend and worker, as the job starts them, with the CPU build of
the pinned engine mounted over the image's own and random weights of a small model k3env
writes (its tokenizer declares the profile's model_type and carries its parsers' tokens);
then the model must be listed, a chat completion must return tokens, a `tool_choice:
"required"` request must come back as parsed tool_calls through the profile's tool-call
parser, the baked aiperf must run requests with 0 errors, and every process must stop on
SIGINT. What the host cannot run is reduced and said; what it cannot see is listed as not
checked
"""

from __future__ import annotations

import argparse

from k3env.commands.app import App, image_args
from k3env.errors import CheckFailed

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
        "--timeout", type=float, default=300,
        help="seconds for the model to be listed (each later stage has its own bound)",
    )  # fmt: skip
    p.set_defaults(platform=["linux/amd64"])


def run(args: argparse.Namespace, app: App) -> int:
    from k3env.smoke.run import smoke_images, table

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
