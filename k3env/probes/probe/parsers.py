"""The tool-call and reasoning parser names a profile gives, checked against the registry of
the process that reads them: vLLM's parser managers, or Dynamo's Rust frontend."""

from __future__ import annotations

import importlib
import traceback
from collections.abc import Sequence
from typing import Any

from .harness import captured, first_import
from .session import Plan, Run

Registry = tuple[list[str], list[str]]  # (tool-call parsers, reasoning parsers)

# Which flag names a parser for which process, and whose registry answers for it.
PARSER_FLAGS = {
    "vllm-serve": {"--tool-call-parser": ("vllm", 0), "--reasoning-parser": ("vllm", 1)},
    "dynamo-worker": {
        "--dyn-tool-call-parser": ("dynamo", 0),
        "--dyn-reasoning-parser": ("dynamo", 1),
    },
}
# vLLM frontend flags the Dynamo worker's parser does not take (the Dynamo frontend parses chat
# output). Not --reasoning-parser: the worker takes it and reads it
# (structured_outputs_config.reasoning_parser decides whether the frontend's tool grammar
# excludes reasoning), which `k3env smoke` shows by starting it.
WORKER_FRONTEND_FLAGS = {
    "--tool-call-parser": "--dyn-tool-call-parser",
}


def vllm_registries() -> Registry:
    tools = first_import("vllm.tool_parsers", "vllm.entrypoints.openai.tool_parsers")
    reasoning = first_import("vllm.reasoning")
    return (
        sorted(tools.ToolParserManager.list_registered()),
        sorted(reasoning.ReasoningParserManager.list_registered()),
    )


def dynamo_registries() -> Registry:
    core = importlib.import_module("dynamo._core")
    return sorted(core.get_tool_parser_names()), sorted(core.get_reasoning_parser_names())


def flag_values(argv: Sequence[str]) -> list[tuple[str, str]]:
    out = []
    for i, token in enumerate(argv):
        if token.startswith("--"):
            flag, eq, value = token.partition("=")
            if eq:
                out.append((flag, value))
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                out.append((flag, argv[i + 1]))
    return out


class _Judge:
    """Parser names judged against each component's registry, read once per plan."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.cache: dict[str, Registry | str] = {}

    def registry(self, component: str) -> Registry | str:
        if component not in self.cache:
            try:
                with captured():
                    found = (vllm_registries if component == "vllm" else dynamo_registries)()
                self.cache[component] = found
                self.run.report.section(component).update(
                    {"tool_parsers": found[0], "reasoning_parsers": found[1]}
                )
            except BaseException:
                self.cache[component] = traceback.format_exc(limit=-6)
        return self.cache[component]

    def __call__(
        self, subject: str, component: str, idx: int, name: str, where: str, profile: str
    ) -> None:
        found = self.registry(component)
        record = self.run.report.record
        if isinstance(found, str):
            record("parsers", subject, "fail", component, found, profile)
        elif name in found[idx]:
            record("parsers", subject, "pass", component, f"registered ({where})", profile)
        else:
            registered = ", ".join(found[idx])
            message = f"{name!r} ({where}) is not registered; registered: {registered}"
            record("parsers", subject, "fail", component, message, profile)


def check_parsers(run: Run, plan: Plan) -> None:
    judge = _Judge(run)
    for profile in plan["profiles"]:
        roles = {c["role"] for c in profile["commands"]}
        # Who parses chat output: vLLM's OpenAI server, or the Dynamo frontend.
        component = "dynamo" if "dynamo-frontend" in roles else "vllm"
        for kind, idx in (("tool_call_parser", 0), ("reasoning_parser", 1)):
            name = profile.get(kind)
            if name:
                judge(f"{kind} {name}", component, idx, name, "profile", profile["name"])
        # The names on the command lines themselves, checked by the process that reads them.
        for i, command in enumerate(profile["commands"]):
            _check_command(run, judge, profile["name"], i, command)


def _check_command(run: Run, judge: _Judge, profile: str, i: int, command: Any) -> None:
    flags = PARSER_FLAGS.get(command["role"], {})
    for flag, value in flag_values(command["argv"]):
        subject = f"commands[{i}] {flag} {value}"
        if flag in flags:
            owner, idx = flags[flag]
            judge(subject, owner, idx, value, f"commands[{i}]", profile)
        elif command["role"] == "dynamo-worker" and flag in WORKER_FRONTEND_FLAGS:
            run.report.record(
                "parsers",
                subject,
                "fail",
                "dynamo.vllm",
                f"the Dynamo worker does not take {flag} (a vLLM frontend flag): the "
                f"Dynamo frontend parses chat output; use "
                f"{WORKER_FRONTEND_FLAGS[flag]} {value}",
                profile,
            )
