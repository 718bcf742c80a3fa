"""The YAML reader: a file others wrote (an srt-slurm recipe, a cluster's ``srtslurm.yaml``)
into plain values and the line of each key; the one place that imports ``yaml``.

PyYAML's safe loader (no Python tags), one document, a bounded regular file
(``files.read_input``). A key given twice is refused naming both lines: srt-slurm's loader
keeps the last one silently, and a hand-edit that adds a key a second time is exactly the
edit that is then not the one that runs. Anchors and aliases are read as YAML defines them;
each node's line is recorded once (an alias is not walked again), so a file of aliases cannot
make the walk grow beyond the file; and a document whose aliases expand past ``MAX_EXPANDED``
values (a "billion laughs") is refused before it is built, since every reader after this one
(flags joined into a command line, JSON written) would write it out.
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
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is not None and _expanded(node, {}) > MAX_EXPANDED:
            raise error(
                f"its aliases expand to more than {MAX_EXPANDED:,} values (an alias of an "
                "alias of a list, a 'billion laughs'): nothing a recipe needs, and a reader "
                "that walks it would not end",
                where=str(path),
                fix="write the values out, or use anchors for whole tables only",
            )
        data = loader.construct_document(node) if node is not None else None
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


def _expanded(node: Any, memo: dict[int, int]) -> int:
    """How many values ``node`` stands for once every alias in it is written out (a node
    reached again through an alias counts again; a node that contains itself is endless)."""
    key = id(node)
    if key in memo:
        if memo[key] < 0:  # inside itself: a recursive alias
            return MAX_EXPANDED + 1
        return memo[key]
    memo[key] = -1
    total = 1
    if isinstance(node, yaml.MappingNode):
        children = [n for pair in node.value for n in pair]
    elif isinstance(node, yaml.SequenceNode):
        children = list(node.value)
    else:
        children = []
    for child in children:
        total += _expanded(child, memo)
        if total > MAX_EXPANDED:
            break
    memo[key] = min(total, MAX_EXPANDED + 1)
    return memo[key]


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
