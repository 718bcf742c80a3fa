"""Serve command lines as preflight rules and recipes read them: flags to values.

This does not replace the image's own parsers (``k3env verify`` runs those); it reads the
values the rules and the recipe writer need."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class ParsedCommand:
    """One command line of a serve profile, with its flags parsed."""

    role: str
    index: int
    argv: tuple[str, ...]
    options: Mapping[str, str | bool]

    def opt(self, name: str) -> str | bool | None:
        return self.options.get(name)

    def has(self, name: str) -> bool:
        value = self.options.get(name)
        return value is not None and value is not False


def parse_options(argv: Iterable[str]) -> dict[str, str | bool]:
    """``--flag value`` / ``--flag=value`` / bare ``--flag`` -> mapping. Positionals are ignored.

    A flag followed by another flag (or nothing) is a switch."""
    out: dict[str, str | bool] = {}
    tokens = list(argv)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token.startswith("--"):
            if "=" in token:
                name, value = token.split("=", 1)
                out[name] = value
            elif i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
                out[token] = tokens[i + 1]
                i += 1
            else:
                out[token] = True
        i += 1
    return out


def kv_transfer_config(command: ParsedCommand) -> dict[str, Any] | None:
    raw = command.opt("--kv-transfer-config")
    if not isinstance(raw, str):
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
