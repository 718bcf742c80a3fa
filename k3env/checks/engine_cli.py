"""`vllm serve` command lines judged where the engine is not: by the option table, registries
and messages recorded from the release's own parser (``probes/probe/cli.py``), replayed through
the standard library's argparse, the engine vLLM's parser is built on.

What the replay decides as vLLM's parser would: an unknown flag (vLLM's own "unrecognized
arguments" line), an abbreviation the parser takes (``allow_abbrev``), an ambiguous one, a
missing value, a value of a flag typed ``int`` / ``float`` or with choices (argparse's own
words, under vLLM's prog). What it does not: values of flags vLLM converts with its own types
(JSON configs, ...), dotted ``--a.b`` arguments and ``--config`` files; those are returned as
not judged, never as accepted.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from k3env.errors import ConfigError

ABBREVIATED = "abbreviated"
REFUSED = "refused"
_REPLAYED_TYPES: Mapping[str, type] = {"int": int, "float": float, "str": str}
# FlexibleArgumentParser.parse_args (vllm/utils/argparse_utils.py): `_` -> `-` in a flag's name,
# up to its first `.` (a dotted name is a JSON field of a config argument).
_NAME = re.compile(r"(?<=--)[^.=]*")


@dataclass(frozen=True, kw_only=True)
class Option:
    strings: tuple[str, ...]
    nargs: Any  # None, an int, "?", "*", "+", "...", "A..."
    kind: str  # store | switch | boolean_optional | append
    type: str  # int | float | str | vllm (vLLM's own converter: value not replayed)
    choices: tuple[str, ...] | None


@dataclass(frozen=True, kw_only=True)
class EngineCli:
    """One release's `vllm serve`, as recorded from its own parser and registries."""

    version: str
    python: str  # the interpreter it was recorded with (argparse's behaviour is its)
    prog: str
    allow_abbrev: bool
    options: tuple[Option, ...]
    positionals: tuple[Option, ...]
    messages: Mapping[str, str]
    sentinels: Mapping[str, str]
    tool_parsers: frozenset[str]
    reasoning_parsers: frozenset[str]
    env_vars: frozenset[str]
    source: str  # how k3env has it, as findings say it
    own: bool = False  # recorded from this very image (else a stand-in's)

    def said(self, kind: str, value: str) -> str:
        """vLLM's own message ``kind`` with ``value`` where it named the sentinel."""
        sentinel = self.sentinels[
            "flag" if kind == "unrecognized" else "env" if kind == "env" else "name"
        ]
        return self.messages[kind].replace(sentinel, value)


@dataclass(frozen=True, kw_only=True)
class ArgVerdict:
    status: str  # refused | abbreviated
    message: str
    flags: tuple[str, ...]  # the flags as written


@dataclass(frozen=True, kw_only=True)
class Judged:
    verdicts: tuple[ArgVerdict, ...]
    unjudged: tuple[str, ...]  # flags whose value (or whole) the replay does not decide


def _strs(value: Any, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(
            f"{what} is not a list of strings",
            where=what,
            fix="record it again from the release's own parser",
        )
    return tuple(value)


def _option(entry: Any, where: str) -> Option:
    if not isinstance(entry, Mapping):
        raise ConfigError("an option is not a mapping", where=where, fix="record it again")
    choices = entry.get("choices")
    return Option(
        strings=_strs(entry.get("strings", []), f"{where}.strings"),
        nargs=entry.get("nargs"),
        kind=str(entry.get("kind", "store")),
        type=str(entry.get("type", "vllm")),
        choices=None if choices is None else _strs(choices, f"{where}.choices"),
    )


def load_cli(data: Any, source: str, *, own: bool = False) -> EngineCli:
    """A recorded `vllm serve` (``probes/probe/cli.py``'s document) as checked values."""
    if not isinstance(data, Mapping) or not isinstance(data.get("serve"), Mapping):
        raise ConfigError(
            "not a recorded vLLM parser (no `serve`)",
            where=source,
            fix="record it again from the release's own parser",
        )
    serve = data["serve"]
    messages, sentinels = data.get("messages"), data.get("sentinels")
    if not isinstance(messages, Mapping) or not isinstance(sentinels, Mapping):
        raise ConfigError(
            "a recorded vLLM parser without its messages",
            where=source,
            fix="record it again from the release's own parser",
        )
    return EngineCli(
        version=str(data.get("version")),
        python=str(data.get("python")),
        prog=str(serve.get("prog", "vllm serve")),
        allow_abbrev=bool(serve.get("allow_abbrev", True)),
        options=tuple(
            _option(o, f"serve.options[{i}]") for i, o in enumerate(serve.get("options", []))
        ),
        positionals=tuple(
            _option({**p, "strings": []}, f"serve.positionals[{i}]")
            for i, p in enumerate(serve.get("positionals", []))
        ),
        messages={str(k): str(v) for k, v in messages.items()},
        sentinels={str(k): str(v) for k, v in sentinels.items()},
        tool_parsers=frozenset(_strs(data.get("tool_parsers", []), "tool_parsers")),
        reasoning_parsers=frozenset(_strs(data.get("reasoning_parsers", []), "reasoning_parsers")),
        env_vars=frozenset(_strs(data.get("env_vars", []), "env_vars")),
        source=source,
        own=own,
    )


def image_cli(facts: Mapping[str, Any] | None, facts_source: str | None) -> EngineCli | None:
    """`vllm serve` as verify recorded it from this very image (its facts' ``vllm.cli``)."""
    vllm = (facts or {}).get("vllm")
    cli = vllm.get("cli") if isinstance(vllm, Mapping) else None
    if not isinstance(cli, Mapping):
        return None
    source = (
        f"vLLM {cli.get('version')}'s own parser, in this image (verify's facts of {facts_source})"
    )
    return load_cli(cli, source, own=True)


class _Refused(Exception):
    pass


class _Replay(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _Refused(f"{self.prog}: error: {message}")


def _add(parser: argparse.ArgumentParser, i: int, o: Option) -> None:
    kw: dict[str, Any] = {"dest": f"o{i}"} if o.strings else {}
    if o.kind == "switch":
        kw.update(action="store_const", const=True)
    elif o.kind == "boolean_optional":
        strings = [s for s in o.strings if not s.startswith("--no-")]
        parser.add_argument(*strings, action=argparse.BooleanOptionalAction, **kw)
        return
    else:
        kw["action"] = "append" if o.kind == "append" else "store"
        if o.nargs is not None:
            kw["nargs"] = o.nargs
        if o.type in _REPLAYED_TYPES:
            kw["type"] = _REPLAYED_TYPES[o.type]
            if o.choices is not None:
                kw["choices"] = [kw["type"](c) for c in o.choices]
    if o.strings:
        parser.add_argument(*o.strings, **kw)
    else:
        parser.add_argument(f"p{i}", **kw)


def replay_parser(cli: EngineCli) -> argparse.ArgumentParser:
    parser = _Replay(prog=cli.prog, allow_abbrev=cli.allow_abbrev, add_help=False)
    for i, o in enumerate((*cli.options, *cli.positionals)):
        _add(parser, i, o)
    return parser


def _normalized(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """vLLM's own renaming of flags (``_`` -> ``-``), with dotted and ``--config`` arguments
    (and their values) set aside as not judged."""
    out: list[str] = []
    unjudged: list[str] = []
    skip = False
    for i, token in enumerate(argv):
        if skip:
            skip = False
            continue
        name = token.split("=", 1)[0]
        if token.startswith("--") and ("." in name or name == "--config"):
            unjudged.append(name)
            skip = "=" not in token and i + 1 < len(argv) and not argv[i + 1].startswith("-")
            continue
        out.append(
            _NAME.sub(lambda m: m.group(0).replace("_", "-"), token, count=1)
            if token.startswith("--")
            else token
        )
    return out, unjudged


def judge_serve(cli: EngineCli, argv: Sequence[str]) -> Judged:
    """``vllm serve ARGS`` (``argv`` from ``vllm``) through the recorded parser."""
    args, unjudged = _normalized(list(argv[2:]))
    strings = {s for o in cli.options for s in o.strings}
    verdicts: list[ArgVerdict] = []
    try:
        _, extras = replay_parser(cli).parse_known_args(args)
    except _Refused as e:
        flags = tuple(
            t.split("=", 1)[0] for t in args if t.startswith("-") and t.split("=", 1)[0] in str(e)
        )
        return Judged(
            verdicts=(ArgVerdict(status=REFUSED, message=str(e), flags=flags),),
            unjudged=tuple(unjudged),
        )
    if extras:
        flags = tuple(t.split("=", 1)[0] for t in extras if t.startswith("-"))
        verdicts.append(
            ArgVerdict(
                status=REFUSED,
                message=cli.said("unrecognized", " ".join(extras)),
                flags=flags or tuple(extras),
            )
        )
    for token in args:
        name = token.split("=", 1)[0]
        if not name.startswith("--") or name in strings or name in extras:
            continue
        taken = sorted(s for s in strings if s.startswith(name))
        if len(taken) == 1:
            verdicts.append(
                ArgVerdict(
                    status=ABBREVIATED,
                    flags=(name,),
                    message=(
                        f"{cli.prog} takes {name} as {taken[0]}: its parser accepts a unique "
                        "prefix of a flag (argparse allow_abbrev)"
                    ),
                )
            )
    typed = {s for o in cli.options if o.type == "vllm" for s in o.strings}
    unjudged += [t.split("=", 1)[0] for t in args if t.split("=", 1)[0] in typed]
    return Judged(verdicts=tuple(verdicts), unjudged=tuple(dict.fromkeys(unjudged)))
