"""Rewrite the command table of README.md and the docs site's index (docs/index.md) from
k3env's argparse parser (`nox -s schemas`).

The table lives between `<!-- commands:begin -->` and `<!-- commands:end -->`;
tests/test_docs.py fails when it differs from what this writes.
"""

from __future__ import annotations

import sys
from pathlib import Path

from k3env.cli import command_table

BEGIN, END = "<!-- commands:begin -->\n", "<!-- commands:end -->\n"


def render(readme: str) -> str:
    head, _, rest = readme.partition(BEGIN)
    _, found, tail = rest.partition(END)
    if not rest or not found:
        raise SystemExit(f"the file lacks the markers {BEGIN.strip()} ... {END.strip()}")
    return head + BEGIN + command_table() + END + tail


if __name__ == "__main__":
    for path in map(Path, sys.argv[1:] or ["README.md"]):
        path.write_text(render(path.read_text()))
