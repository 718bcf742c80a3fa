"""The YAML reader: a file others wrote (an srt-slurm recipe, a cluster's ``srtslurm.yaml``)
into plain values and the line of each key; the one place that imports ``yaml``.

PyYAML's safe loader (no Python tags), one document, a bounded regular file
(``files.read_input``). A key given twice is refused naming both lines: srt-slurm's loader
keeps the last one silently, and a hand-edit that adds a key a second time is exactly the
edit that is then not the one that runs.

Anchors and aliases are read as YAML defines them; each node's line is recorded once (an alias
is not walked again), so a file of aliases cannot make the walk grow beyond the file. What a
document stands for with every alias written out is bounded while it is composed, in values
(``MAX_EXPANDED``) and in bytes (``MAX_DOCUMENT``: each scalar counted at its length over every
path it is reached by), and one scalar in bytes (``MAX_SCALAR``): every reader after this one
(a flag joined into a command line, the TOML ``adopt`` writes, JSON printed) writes the value
out, so a "billion laughs" of counts or of bytes is refused at the alias that crosses the
budget, naming its line, before the document is built.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]

from k3env.errors import ConfigError
from k3env.files import read_input

MAX_YAML_BYTES = 1 << 20  # a recipe or a cluster config: a few KiB
# Values a document may stand for with its aliases written out: a recipe has hundreds.
MAX_EXPANDED = 100_000
# Bytes of scalars a document may stand for with its aliases written out. A recipe is a few
# KiB (the largest in tests/data, 1.4 KB as JSON) and anchors reuse a table a few times; the
# file itself is at most MAX_YAML_BYTES. 4 MiB is four files' worth and thousands of recipes',
# and what the writers after this one take is linear in it: at 16 MiB `adopt` (its TOML
# written a character at a time) took 10 s and 120 MB, at 4 MiB 4 s (3 of them PyYAML reading
# 95,000 aliases) and 70 MB. (95,000 aliases of one 600 KB string, 57 GB written out, kept
# `adopt` busy for hours.)
MAX_DOCUMENT = 4 << 20
# Bytes of one scalar: a name, a path, a flag's value, an inline script (the longest in
# tests/data is 191 characters). Aliases never make a scalar longer than the file, so this
# bound must sit under MAX_YAML_BYTES to mean anything: 256 KiB is a thousand times the longest.
MAX_SCALAR = 256 << 10


@dataclass(frozen=True, kw_only=True)
class YamlDoc:
    path: Path
    data: Any  # dicts, lists, str, int, float, bool, None (and datetime for timestamps)
    lines: Mapping[str, int] = field(default_factory=dict)  # dotted key path -> 1-based line

    def line(self, key: str) -> int | None:
        """The line of ``key``, or of the nearest enclosing key the file has."""
        while key:
            if key in self.lines:
                return self.lines[key]
            key = key.rsplit(".", 1)[0] if "." in key else ""
        return None

    def where(self, key: str) -> str:
        """``FILE:LINE: KEY`` (the line of the nearest key the file has)."""
        line = self.line(key)
        return f"{self.path}:{line}: {key}" if line else f"{self.path}: {key}"


def load_yaml(
    path: Path, *, error: type[ConfigError] = ConfigError, limit: int = MAX_YAML_BYTES
) -> YamlDoc:
    """Parse ``path``; a syntax error names the file, line and column."""
    raw = read_input(path, error=error, limit=limit)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"not UTF-8: {e}", where=str(path), fix="save the file as UTF-8") from e
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except _OverBudget as e:
        raise error(
            str(e), where=f"{path}:{e.mark.line + 1}:{e.mark.column + 1}", fix=e.fix
        ) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        raise error(
            f"not valid YAML: {' '.join(str(e).split())}",
            where=at,
            fix="fix the syntax at the line and column given",
        ) from e
    except (ValueError, TypeError, RecursionError) as e:  # a number or a nesting out of range
        raise error(f"not readable YAML: {e}", where=str(path), fix="simplify the file") from e
    finally:
        loader.dispose()
    lines: dict[str, int] = {}
    if node is not None:
        _walk(node, "", lines, set(), path, error)
    return YamlDoc(path=path, data=data, lines=lines)


class _OverBudget(Exception):
    """A document over one of the budgets, at ``mark`` (where the alias or scalar starts)."""

    def __init__(self, message: str, mark: Any, fix: str) -> None:
        super().__init__(message)
        self.mark, self.fix = mark, fix


class _Loader(yaml.SafeLoader):  # type: ignore[misc]
    """PyYAML's safe loader, counting while it composes what the document stands for with
    every alias written out: a node composed adds itself (a scalar its bytes), an alias adds
    the whole of the node it names (measured when that node was composed). The count is the
    expanded document so far, so the alias that crosses a budget is the one refused, after
    reading no more of the file than that."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.values = 0
        self.size = 0
        self.anchored: dict[int, tuple[int, int]] = {}  # id(node) -> (values, bytes) it stands for

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            node = super().compose_node(parent, index)  # an undefined alias: its error
            if id(node) not in self.anchored:
                raise _OverBudget(
                    f"alias *{event.anchor} refers to the value that contains it: written "
                    "out, it would not end",
                    event.start_mark,
                    "write the values out; an anchor can only be used after its value ends",
                )
            values, size = self.anchored[id(node)]
            self._spend(values, size, event.start_mark, event.anchor, node)
            return node
        event = self.peek_event()
        values, size = self.values, self.size
        node = super().compose_node(parent, index)
        if isinstance(node, yaml.ScalarNode):
            length = len(str(node.value).encode("utf-8", "surrogatepass"))
            if length > MAX_SCALAR:
                raise _OverBudget(
                    f"a value of {length:,} bytes, over the {MAX_SCALAR:,} bytes one value "
                    "may have (a recipe's are names, paths, flags, short scripts)",
                    node.start_mark,
                    "keep long text in a file the recipe names, not in the recipe",
                )
            self._spend(1, length, event.start_mark, None, node)
        else:
            self._spend(1, 0, event.start_mark, None, node)
        if event.anchor is not None:
            self.anchored[id(node)] = (self.values - values, self.size - size)
        return node

    def _spend(self, values: int, size: int, mark: Any, alias: str | None, node: Any) -> None:
        self.values += values
        self.size += size
        if self.values <= MAX_EXPANDED and self.size <= MAX_DOCUMENT:
            return
        if alias is None:  # no alias: the file alone is this large
            over = (
                f"more than {MAX_EXPANDED:,} values"
                if self.values > MAX_EXPANDED
                else f"more than {MAX_DOCUMENT:,} bytes of values"
            )
            raise _OverBudget(
                f"the document holds {over}: no recipe or cluster config is near that",
                mark,
                "split the file, or keep long data in a file the recipe names",
            )
        line = node.start_mark.line + 1
        stands = f"{values:,} value{'s' if values != 1 else ''}, {size:,} bytes"
        over = (
            f"more than {MAX_EXPANDED:,} values"
            if self.values > MAX_EXPANDED
            else f"more than {MAX_DOCUMENT:,} bytes"
        )
        raise _OverBudget(
            f"alias *{alias} (of the value anchored at line {line}, {stands} written out) "
            f"makes the document stand for {over} once its aliases are written out (an alias "
            "repeated, or of an alias of a list: a 'billion laughs'): nothing a recipe needs, "
            "and every reader after this one writes it out",
            mark,
            "write the values out, or use anchors for whole tables only",
        )


def _walk(
    node: Any,
    prefix: str,
    lines: dict[str, int],
    seen: set[int],
    path: Path,
    error: type[ConfigError],
) -> None:
    if id(node) in seen:  # an alias: its node was walked where the anchor is
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        first: dict[str, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *defaults`
                continue
            key = str(key_node.value)
            line = key_node.start_mark.line + 1
            if key in first:
                dotted = f"{prefix}.{key}" if prefix else key
                raise error(
                    f"key {dotted!r} is given twice (lines {first[key]} and {line}): srt-slurm "
                    "would keep the second silently",
                    where=f"{path}:{line}",
                    fix="keep one of them",
                )
            first[key] = line
            dotted = f"{prefix}.{key}" if prefix else key
            lines.setdefault(dotted, line)
            _walk(value_node, dotted, lines, seen, path, error)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            dotted = f"{prefix}[{i}]"
            lines.setdefault(dotted, item.start_mark.line + 1)
            _walk(item, dotted, lines, seen, path, error)
