"""A lock's ``tag_pattern``: a regular expression from a file, limited to a subset that
cannot backtrack without bound, and matched only against tags of bounded length.

Python's ``re`` backtracks: ``^(a+)+$`` against 30 ``a`` and a ``!`` tries 2^30 ways before
it fails, and the lock is read by every command. So a pattern is checked at load time, on the
tree ``re`` itself compiles (its parser, ``re._parser``: what is checked is what runs):

- no backreference, lookaround, conditional group or inline flag (a release tag needs none;
  a backreference makes matching NP-hard);
- a repeated group (``(...)*``, ``+``, ``{n,m}``) holds no alternation, and no quantifier unless
  each repetition starts with a separator nothing else in the group matches, and then one
  quantifier at most: ``(\\.[0-9]+)*`` is fine (each ``.`` starts the next repetition, so the
  text decides where they split), ``(a+)+`` and ``(a|ab)*`` are not;
- at most ``MAX_QUANTIFIERS`` quantifiers in all (each one more multiplies the worst case by
  the tag's length: five ``a*`` in a row take ~3 s on a 128-character tag), and
  ``MAX_PATTERN`` characters.

A tag longer than the distribution spec's 128 characters never matches (``matches_tag``).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterable
from typing import Any

from k3env.config.shapes import TAG_MAX

# The parser ``re.compile`` runs (private, typed Any; its tree is what the engine executes).
_parser: Any = importlib.import_module("re._parser")

MAX_PATTERN = 256
MAX_QUANTIFIERS = 5
_REPEATS = ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT")
_CATEGORIES = {
    "CATEGORY_DIGIT": r"\d",
    "CATEGORY_NOT_DIGIT": r"\D",
    "CATEGORY_WORD": r"\w",
    "CATEGORY_NOT_WORD": r"\W",
    "CATEGORY_SPACE": r"\s",
    "CATEGORY_NOT_SPACE": r"\S",
}
_REFUSED = {
    "GROUPREF": "a backreference (matching one is exponential in the worst case)",
    "GROUPREF_EXISTS": "a conditional group (?(...)...)",
    "ASSERT": "a lookahead or lookbehind (?=...) (?<=...)",
    "ASSERT_NOT": "a negative lookahead or lookbehind (?!...) (?<!...)",
}

TAG_PATTERN_FIX = (
    "use a plain pattern: literals, classes, anchors, quantifiers on single characters, and "
    r"repeated groups that start with a separator, e.g. ^v[0-9]+(\.[0-9]+)*$"
)


class UnsafePattern(ValueError):
    """A tag pattern that does not compile, or is outside the safe subset (the message says
    which construct, and why)."""


def compile_tag_pattern(pattern: str) -> re.Pattern[str]:
    """``pattern`` compiled, once it is known to be in the safe subset; else UnsafePattern."""
    if len(pattern) > MAX_PATTERN:
        raise UnsafePattern(
            f"it is {len(pattern)} characters long; a tag pattern has at most {MAX_PATTERN}"
        )
    try:
        compiled = re.compile(pattern)
    except re.error as e:
        raise UnsafePattern(f"not a regular expression: {e}") from e
    tree = _parser.parse(pattern)
    if tree.state.flags & ~re.UNICODE:
        raise UnsafePattern(
            "it sets inline flags ((?i), (?x), ...), which a tag pattern does not need"
        )
    problem = _walk(tree)
    if problem:
        raise UnsafePattern(problem)
    count = _quantifiers(tree)
    if count > MAX_QUANTIFIERS:
        raise UnsafePattern(
            f"it has {count} quantifiers; at most {MAX_QUANTIFIERS} (each one more multiplies "
            "the worst-case matching time by the tag's length)"
        )
    return compiled


def matches_tag(compiled: re.Pattern[str], tag: str) -> bool:
    """Whether ``tag`` matches, for a tag of at most 128 characters (a longer one is not a
    tag, and is never handed to the pattern)."""
    return len(tag) <= TAG_MAX and compiled.match(tag) is not None


def _walk(items: Iterable[Any]) -> str | None:
    for op, av in items:
        name = op.name
        if name in _REFUSED:
            return f"it uses {_REFUSED[name]}"
        if name == "SUBPATTERN":
            if av[1] or av[2]:
                return "it sets inline flags ((?i:...)), which a tag pattern does not need"
            found = _walk(av[3])
        elif name in _REPEATS:
            found = _walk(av[2])
            if found is None and av[1] > 1:
                found = _repeated_body(av[2])
        elif name == "BRANCH":
            found = next((p for p in map(_walk, av[1]) if p), None)
        elif name == "ATOMIC_GROUP":
            found = _walk(av)
        else:
            found = None
        if found:
            return found
    return None


def _repeated_body(body: Any) -> str | None:
    """Why a body repeated more than once may backtrack exponentially, or None."""
    items = _unwrap(body)
    if _has(items, ("BRANCH",)):
        return "a repeated group holds an alternation (a|b): nested choices backtrack exponentially"
    inner = _quantifiers(items)
    if inner == 0:
        return None
    first = items[0] if items else None
    if first is not None and first[0].name in ("LITERAL", "IN") and inner == 1:
        rest = items[1:]
        if not any(_may_match(rest, c) for c in _members(first)):
            return None
    return (
        "a repeated group holds a quantifier, as in (a+)+: nested quantifiers backtrack "
        "exponentially (allowed only as a separator then one quantifier, like (\\.[0-9]+)*)"
    )


def _unwrap(body: Any) -> list[Any]:
    items = list(body)
    while len(items) == 1 and items[0][0].name == "SUBPATTERN":
        items = list(items[0][1][3])
    return items


def _has(items: Iterable[Any], names: tuple[str, ...]) -> bool:
    for op, av in items:
        if op.name in names:
            return True
        for sub in _children(op.name, av):
            if _has(sub, names):
                return True
    return False


def _children(name: str, av: Any) -> list[Any]:
    if name == "SUBPATTERN":
        return [av[3]]
    if name in _REPEATS:
        return [av[2]]
    if name == "BRANCH":
        return list(av[1])
    if name == "ATOMIC_GROUP":
        return [av]
    return []


def _quantifiers(items: Iterable[Any]) -> int:
    """The quantifiers that leave a choice (``?``, ``*``, ``+``, ``{n,m}`` with n < m)."""
    count = 0
    for op, av in items:
        if op.name in _REPEATS and av[0] != av[1]:
            count += 1
        count += sum(_quantifiers(sub) for sub in _children(op.name, av))
    return count


def _members(item: Any) -> list[str] | list[None]:
    """The characters a separator (a literal, or a class of literals and ranges of at most
    64 characters) matches; ``[None]`` for a class too wide to list (never a separator)."""
    op, av = item
    if op.name == "LITERAL":
        return [chr(av)]
    out: list[str] = []
    for sub_op, sub_av in av:
        if sub_op.name == "LITERAL":
            out.append(chr(sub_av))
        elif sub_op.name == "RANGE" and sub_av[1] - sub_av[0] < 64:
            out += [chr(c) for c in range(sub_av[0], sub_av[1] + 1)]
        else:
            return [None]
    return out if len(out) <= 64 else [None]


def _may_match(items: Iterable[Any], c: str | None) -> bool:
    """Whether any single-character matcher in ``items`` may match ``c`` (None: any
    character). Conservative: what it does not know, it takes to match."""
    for op, av in items:
        name = op.name
        if name in ("LITERAL", "NOT_LITERAL"):
            if c is None or (chr(av) == c) == (name == "LITERAL"):
                return True
        elif name == "ANY":
            return True
        elif name == "IN":
            if c is None or _in_class(av, c):
                return True
        elif name == "AT":
            continue
        elif any(_may_match(sub, c) for sub in _children(name, av)):
            return True
        elif not _children(name, av):
            return True  # an operator this check does not know
    return False


def _in_class(members: Any, c: str) -> bool:
    negate = False
    hit = False
    for op, av in members:
        name = op.name
        if name == "NEGATE":
            negate = True
        elif name == "LITERAL":
            hit = hit or chr(av) == c
        elif name == "RANGE":
            hit = hit or av[0] <= ord(c) <= av[1]
        elif name == "CATEGORY" and av.name in _CATEGORIES:
            hit = hit or re.match(_CATEGORIES[av.name], c) is not None
        else:
            return True  # unknown: take it to match
    return hit != negate
