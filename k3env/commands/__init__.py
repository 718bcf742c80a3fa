"""The commands of ``k3env``, one module each (``k3env.commands.app`` says what a command
module holds), in the order ``--help`` and README's command table list them."""

from __future__ import annotations

from importlib import import_module
from types import ModuleType

# Each command's name, in --help order; its module is the name with ``_`` for the space
# (``srt materialize``: ``k3env.commands.srt_materialize``), so a run imports its own only.
NAMES = (
    "lock", "schema", "build", "matrix", "twin", "push", "export", "srt materialize",
    "srt validate", "srt recipe", "srt schema", "srt migrate", "adopt", "verify", "smoke",
    "stage", "bump", "outdated", "preflight",
)  # fmt: skip


def command(name: str) -> ModuleType:
    """The module of the command ``name`` (one of NAMES)."""
    return import_module(f"k3env.commands.{name.replace(' ', '_')}")


def named(words: list[str]) -> str | None:
    """The command ``words`` (a command line, program name excluded) name, if any."""
    for n in (2, 1):
        if " ".join(words[:n]) in NAMES:
            return " ".join(words[:n])
    return None


def all_commands() -> list[ModuleType]:
    """Every command module; imported when the whole parser is built (each imports its heavy
    dependencies only when it runs)."""
    return [command(n) for n in NAMES]
