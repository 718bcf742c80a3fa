"""`vllm serve` as its own parser defines it, for judging command lines where the engine is not
(preflight of a recipe): every option's strings, nargs, choices and value type, the parser's
``allow_abbrev``, the parser and registry names, the env registry, and vLLM's own messages for
an unknown flag, parser name or env var, each captured by running vLLM's own code on a sentinel.

Runs where the release is installed: inside an image (verify's facts, ``vllm.cli``), or with
the interpreter of an environment holding the twin's pinned closure
(``python -m probe.cli`` with this package's parent on ``sys.path``; prints one JSON document).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
from typing import Any

from .args import _serve_parser, server_validator
from .harness import captured, first_import

SENTINEL = "k3env_sentinel_zz"
FLAG = "--" + SENTINEL.replace("_", "-")
ENV = "VLLM_" + SENTINEL.upper()
_NARGS_ZERO = (
    argparse._StoreConstAction,
    argparse._StoreTrueAction,
    argparse._StoreFalseAction,
    argparse._CountAction,
    argparse._HelpAction,
    argparse._VersionAction,
    argparse._AppendConstAction,
)


def _kind(action: argparse.Action) -> str:
    if isinstance(action, argparse.BooleanOptionalAction):
        return "boolean_optional"
    if isinstance(action, _NARGS_ZERO) or action.nargs == 0:
        return "switch"
    if isinstance(action, argparse._AppendAction):
        return "append"
    return "store"


def _type(action: argparse.Action) -> str:
    t = action.type
    if t is None:
        return "str"
    if t in (int, float, str):
        return t.__name__
    return "vllm"  # vLLM's own converter (JSON configs, optional types, ...): not replayed


def describe_parser(parser: argparse.ArgumentParser) -> dict[str, Any]:
    """Each option and positional of ``parser``, as JSON."""
    options, positionals = [], []
    for action in parser._actions:
        entry = {
            "dest": action.dest,
            "nargs": action.nargs,
            "kind": _kind(action),
            "type": _type(action),
            # In the parser's order: argparse lists them so in its "invalid choice" message.
            "choices": [str(c) for c in action.choices] if action.choices is not None else None,
        }
        if action.option_strings:
            options.append({"strings": list(action.option_strings), **entry})
        else:
            positionals.append(entry)
    return {
        "prog": parser.prog,
        "allow_abbrev": parser.allow_abbrev,
        "prefix_chars": parser.prefix_chars,
        "options": options,
        "positionals": positionals,
    }


def _serve() -> tuple[Any, Any, dict[str, Any]]:
    """(vllm's top parser, its `serve` parser, the commands by name): verify's own parser."""
    top, sub, commands = _serve_parser(None)
    return top, sub.choices["serve"], commands


def _said(fn: Any) -> str:
    """What ``fn`` says when it refuses the sentinel: its exception, else the last line of
    what it printed (argparse's `prog: error: ...`)."""
    with captured() as buf:
        try:
            fn()
        except SystemExit:
            pass
        except Exception as e:
            return str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
    lines = [line for line in buf.getvalue().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _messages(top: Any) -> dict[str, str]:
    validate = server_validator()
    reasoning = first_import("vllm.reasoning").ReasoningParserManager

    def tool() -> None:
        args = top.parse_args(["serve", "/model", "--enable-auto-tool-choice",
                               "--tool-call-parser", SENTINEL])  # fmt: skip
        args.structured_outputs_config.reasoning_parser = None
        validate(args)

    def env() -> None:
        current = first_import("vllm.platforms").current_platform
        os.environ[ENV] = "1"
        try:
            current.validate_environ(True)
        finally:
            del os.environ[ENV]

    return {
        "unrecognized": _said(lambda: top.parse_args(["serve", "/model", FLAG])),
        "tool_call_parser": _said(tool),
        # The engine's lookup when it builds the structured-outputs reasoner.
        "reasoning_parser": _said(lambda: reasoning.get_reasoning_parser(SENTINEL)),
        "env": _said(env),
    }


def describe_vllm() -> dict[str, Any]:
    """`vllm serve`'s parser, registries, env registry and messages, from vLLM's own code."""
    logging.disable(logging.WARNING)
    try:
        return _describe_vllm()
    finally:
        logging.disable(logging.NOTSET)


def record_cli(run: Any, plan: Any) -> None:
    """verify's fact ``vllm.cli`` (preflight judges a recipe's `vllm serve` line by it); why
    not, as ``vllm.cli_unread``, where the image's vLLM cannot say."""
    import traceback

    try:
        with captured():
            run.report.section("vllm")["cli"] = describe_vllm()
    except BaseException:
        run.report.section("vllm")["cli_unread"] = traceback.format_exc(limit=-3)[-2000:]


def _describe_vllm() -> dict[str, Any]:
    vllm = first_import("vllm")
    top, serve, _ = _serve()
    tools = first_import("vllm.tool_parsers", "vllm.entrypoints.openai.tool_parsers")
    reasoning = first_import("vllm.reasoning").ReasoningParserManager
    envs = first_import("vllm.envs")
    return {
        "component": "vllm",
        "version": str(vllm.__version__),
        "python": platform.python_version(),
        "serve": describe_parser(serve),
        # Each message below names its sentinel where vLLM names the flag, parser or variable.
        "sentinels": {"flag": FLAG, "name": SENTINEL, "env": ENV},
        "messages": _messages(top),
        "tool_parsers": sorted(tools.ToolParserManager.list_registered()),
        "reasoning_parsers": sorted(reasoning.list_registered()),
        "env_vars": sorted(envs.environment_variables),
    }


if __name__ == "__main__":
    document = describe_vllm()
    sys.stdout.write(json.dumps(document, indent=1, sort_keys=True) + "\n")
