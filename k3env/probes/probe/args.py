"""Each profile's command lines through the process's own argument parser: vLLM's CLI and its
server-setup validation, the Dynamo worker's and the Dynamo frontend's own parsers."""

from __future__ import annotations

import importlib
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

from .harness import captured, first_attribute, first_import, run_captured
from .session import Plan, Run


def _serve_parser(run: Run | None) -> tuple[Any, Any, dict[str, Any]]:
    """(vllm's top parser, its subparsers, the commands by name), as `vllm` builds them."""
    serve = importlib.import_module("vllm.entrypoints.cli.serve")
    flexible = first_import("vllm.utils.argparse_utils", "vllm.utils").FlexibleArgumentParser
    top = flexible(prog="vllm")
    sub = top.add_subparsers(required=False, dest="subparser")
    commands = {}
    for cmd in serve.cmd_init():
        cmd.subparser_init(sub).set_defaults(dispatch_function=cmd.cmd)
        commands[cmd.name] = cmd
    if run is not None and "serve" in sub.choices:  # the env check's flag lookup reuses it
        run.serve_flags.update(sub.choices["serve"]._option_string_actions)
    return top, sub, commands


def server_validator() -> Any:
    """vLLM's ``validate_api_server_args``. It moved: 0.31 launchers.launcher (re-exported by
    openai.api_server), 0.33 common.cli_args."""
    return first_attribute(
        "validate_api_server_args",
        "vllm.entrypoints.common.cli_args",
        "vllm.entrypoints.launchers.cli_args",
        "vllm.entrypoints.launchers.launcher",
        "vllm.entrypoints.openai.api_server",
        "vllm.entrypoints.openai.cli_args",
    )


def parse_vllm_serve(run: Run, argv: Sequence[str]) -> None:
    """``vllm serve ...`` through vLLM's own CLI parser, then the server-setup validation."""
    top, _, commands = _serve_parser(run)
    args = top.parse_args(list(argv[1:]))
    if getattr(args, "model_tag", None):
        args.model = args.model_tag
    commands[args.subparser].validate(args)
    # Parser names pass argparse and fail at server setup (validate_api_server_args): run it.
    validate = server_validator()
    engine_args = importlib.import_module("vllm.engine.arg_utils").AsyncEngineArgs
    # What the server does before validating (the reasoning parser moves into the structured
    # outputs config), run as vLLM's own method on the parsed args: constructing the engine
    # args would look for the model, which is not on this host.
    if hasattr(engine_args, "create_structured_outputs_config"):
        args.structured_outputs_config = engine_args.create_structured_outputs_config(args)
    module = sys.modules[validate.__module__]
    if hasattr(module, "init_parser_plugin"):
        module.init_parser_plugin(args)
    validate(args)
    print("accepted")


def parse_dynamo_worker(run: Run, argv: Sequence[str]) -> None:
    args_mod = importlib.import_module("dynamo.vllm.args")
    rest = (
        list(argv[3:])
        if list(argv[:3]) == ["python3", "-m", "dynamo.vllm"]
        or list(argv[1:3]) == ["-m", "dynamo.vllm"]
        else list(argv[1:])
    )
    # _parse_cli_args is the worker's own argparse step (Dynamo flags, then vLLM's engine
    # args); parse_args (all that Dynamo <= 1.4 has) goes on to build the engine args, whose
    # __post_init__ resolves the model path and, for a path not on disk, asks the Hub. The
    # model is never here: an empty local directory stands in for it, so parsing neither
    # touches the model nor the network.
    if hasattr(args_mod, "_parse_cli_args"):
        args_mod._parse_cli_args(rest)
    else:
        args_mod.parse_args(_stand_in_model(rest))
    print("accepted")


def _stand_in_model(argv: list[str]) -> list[str]:
    out = list(argv)
    for i, token in enumerate(out):
        if token == "--model" and i + 1 < len(out) and not os.path.exists(out[i + 1]):
            out[i + 1] = tempfile.mkdtemp(prefix="k3env-model-")
        elif token.startswith("--model=") and not os.path.exists(token.split("=", 1)[1]):
            out[i] = "--model=" + tempfile.mkdtemp(prefix="k3env-model-")
    return out


def parse_dynamo_frontend(run: Run, argv: Sequence[str]) -> None:
    main = importlib.import_module("dynamo.frontend.main")
    rest = list(argv[3:]) if list(argv[1:3]) == ["-m", "dynamo.frontend"] else list(argv[1:])
    saved = sys.argv
    sys.argv = ["dynamo.frontend", *rest]
    try:
        main.parse_args()
    finally:
        sys.argv = saved
    print("accepted")


PARSERS: dict[str, tuple[str, Callable[[Run, Sequence[str]], None]]] = {
    "vllm-serve": ("vllm", parse_vllm_serve),
    "dynamo-worker": ("dynamo.vllm", parse_dynamo_worker),
    "dynamo-frontend": ("dynamo.frontend", parse_dynamo_frontend),
}


def check_args(run: Run, plan: Plan) -> None:
    for profile in plan["profiles"]:
        for i, command in enumerate(profile["commands"]):
            component, fn = PARSERS[command["role"]]
            argv = command["argv"]
            ok, out = run_captured(lambda fn=fn, argv=argv: fn(run, argv))  # type: ignore[misc]
            subject = f"commands[{i}] {command['role']}"
            status = "pass" if ok else "fail"
            run.report.record("args", subject, status, component, out, profile["name"])


def serve_flags(run: Run) -> set[str]:
    """The option strings of `vllm serve` (from the parser check_args built, else built)."""
    if run.serve_flags:
        return run.serve_flags
    try:
        with captured():
            _, sub, _ = _serve_parser(None)
        run.serve_flags.update(sub.choices["serve"]._option_string_actions)
        return run.serve_flags
    except BaseException:
        return set()
