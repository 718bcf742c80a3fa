"""The engine's own flags, parser names and env names, judged for every profile: by `vllm serve`'s
own parser as k3env has it (``Context.engine_cli``: verify's facts of this image, or the
recorded parser of the release the lock's twin pins, said in each finding), or listed as not
checked, naming each flag and name left unjudged and why. Never silence.

vLLM's behaviour read from its own code (0.31.0, ``entrypoints/launchers/launcher.py``
``validate_api_server_args``; ``platforms/interface.py`` ``validate_environ``): a tool-call
parser is checked at server setup when ``--enable-auto-tool-choice`` is on; a reasoning parser
is looked up when the engine builds its structured-outputs reasoner; a ``VLLM_`` name vLLM does
not read is warned about, and refused with ``--fail-on-environ-validation``.
"""

from __future__ import annotations

from collections.abc import Iterable

from k3env.checks.argv import ParsedCommand
from k3env.checks.engine_cli import ABBREVIATED, EngineCli, judge_serve
from k3env.checks.preflight import ERROR, WARNING, Context, Hit

PARSER_FLAGS = {"--tool-call-parser": "tool_call_parser", "--reasoning-parser": "reasoning_parser"}
PLUGINS = ("--tool-parser-plugin", "--reasoning-parser-plugin")


def _flags(cmd: ParsedCommand) -> list[str]:
    return [f"{k} {v}" if isinstance(v, str) else k for k, v in cmd.options.items()]


def engine_args(ctx: Context) -> Iterable[Hit]:
    for cmd in ctx.engine_commands():
        if cmd.role != "vllm-serve":
            ctx.unchecked(
                what=f"the {cmd.role} (`python -m dynamo.vllm`) flags and parser names: "
                + ", ".join(_flags(cmd)),
                why="k3env records no parser of the Dynamo worker; `k3env verify` runs it in "
                "an image k3env built (its args and parsers checks)",
            )
            continue
        cli = ctx.engine_cli
        if cli is None:
            ctx.unchecked(what="`vllm serve` flags and parser names: " + ", ".join(_flags(cmd)),
                          why=ctx.engine_cli_why)  # fmt: skip
            continue
        yield from _serve_args(ctx, cli, cmd)
        yield from _parser_names(ctx, cli, cmd)
        yield from _env_names(ctx, cli, cmd)
    _env_readers(ctx)


def _env_readers(ctx: Context) -> None:
    """A recipe's own env names: nothing baked them, so verify never searched the image for
    their readers; a misspelt name is ignored by the process. Said, name by name."""
    if ctx.job is None:  # a spec's env is baked: verify's env check searches its readers
        return
    judged = ctx.engine_cli is not None and any(c.role == "vllm-serve" for c in ctx.commands)
    names = sorted(n for n in ctx.spec.env if not (judged and n.startswith("VLLM_")))
    if names:
        ctx.unchecked(
            what="whether the image reads " + ", ".join(names),
            why="the recipe sets them at job start (not baked): `k3env verify` searches an "
            "image's files for the reader of each name it bakes (`k3env adopt` bakes them)",
        )


def _serve_args(ctx: Context, cli: EngineCli, cmd: ParsedCommand) -> Iterable[Hit]:
    judged = judge_serve(cli, cmd.argv)
    for v in judged.verdicts:
        if v.status == ABBREVIATED:
            yield Hit(
                key=ctx.key(cmd),
                severity=WARNING,
                message=f"{v.message}: it works by prefix only, and a release with another flag "
                f"of that prefix refuses it (judged by {cli.source})",
                fix="spell the flag in full",
            )
            continue
        yield Hit(
            key=ctx.key(cmd),
            message=f"{v.message} (judged by {cli.source}): vLLM exits 2 at job start",
            fix="spell the flag as `vllm serve --help` of the image lists it, or remove it",
        )
    values = [f for f in judged.unjudged if f not in PARSER_FLAGS]
    if values:
        ctx.unchecked(
            what="the values of " + ", ".join(values),
            why=f"vLLM converts them with its own types (JSON configs, ...); {cli.source} is "
            "replayed for flag names, counts, int/float values and choices only",
        )


def _parser_names(ctx: Context, cli: EngineCli, cmd: ParsedCommand) -> Iterable[Hit]:
    plugins = [p for p in PLUGINS if cmd.has(p)]
    for flag, kind in PARSER_FLAGS.items():
        name = cmd.opt(flag)
        if not isinstance(name, str) or not name:
            continue
        registry = cli.tool_parsers if kind == "tool_call_parser" else cli.reasoning_parsers
        if name in registry:
            continue
        if plugins:
            ctx.unchecked(what=f"{flag} {name}",
                          why=f"{', '.join(plugins)} may register it at server start")  # fmt: skip
            continue
        checked = kind != "tool_call_parser" or cmd.has("--enable-auto-tool-choice")
        yield Hit(
            key=ctx.key(cmd),
            severity=ERROR if checked else WARNING,
            message=f"{flag} {name}: {cli.said(kind, name)} (judged by {cli.source})"
            + (
                ": the server refuses to start"
                if checked
                else ": vLLM checks it only with --enable-auto-tool-choice, so it is never used"
            ),
            fix=f"use a name the image's vLLM registers (`{flag}` choices above)",
        )


def _env_names(ctx: Context, cli: EngineCli, cmd: ParsedCommand) -> Iterable[Hit]:
    """``VLLM_`` names the job sets that the release does not read: judged only by this
    image's own registry; a stand-in's is not this image's (its kernels may read more)."""
    unknown = sorted(n for n in ctx.env if n.startswith("VLLM_") and n not in cli.env_vars)
    if not unknown:
        return
    hard = cmd.has("--fail-on-environ-validation")
    if not cli.own:
        ctx.unchecked(
            what="the VLLM_ names the engine gets, against the image's vLLM: " + ", ".join(unknown),
            why=f"vLLM {cli.version}, the stand-in's, does not read them, but it is not this "
            "image's vLLM (the image may read them: `k3env verify` an image k3env built)"
            + (
                "; with --fail-on-environ-validation an unknown one stops the engine"
                if hard
                else ""
            ),
        )
        return
    for name in unknown:
        yield Hit(
            key=f"env.{name}",
            severity=ERROR if hard else WARNING,
            message=f"{cli.said('env', name)} (judged by {cli.source})"
            + (": --fail-on-environ-validation stops the engine" if hard else ": vLLM ignores it"),
            fix="remove it, or spell it as the image's vLLM reads it",
        )
