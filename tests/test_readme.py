"""README.md tells the truth about the CLI: its command table is the parser's own."""

from __future__ import annotations

import importlib.util

from k3env.cli import command_table, parser

from .conftest import REPO


def test_readme_command_table_is_rendered_from_the_parser() -> None:
    """Fails when a command, option or description changes without `nox -s schemas`."""
    readme = (REPO / "README.md").read_text()
    begin, end = "<!-- commands:begin -->\n", "<!-- commands:end -->\n"
    assert begin in readme and end in readme
    assert readme.split(begin, 1)[1].split(end, 1)[0] == command_table()


def test_every_command_is_in_the_table_with_a_description() -> None:
    table = command_table()
    rows = [r for r in table.splitlines()[2:]]
    names = [r.split("`")[1].split(" [")[0].split(" {")[0] for r in rows]
    assert "k3env srt recipe" in " ".join(names)
    group = parser()._subparsers
    assert group is not None
    subs = group._group_actions[0].choices
    assert isinstance(subs, dict)
    for name in subs:
        assert any(n.startswith(f"k3env {name}") for n in names), name
    assert all(not r.endswith("|  |") for r in rows), [r for r in rows if r.endswith("|  |")]


def test_the_readme_renderer_rewrites_only_between_the_markers() -> None:
    spec = importlib.util.spec_from_file_location("rc", REPO / "scripts/readme_commands.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = "intro\n<!-- commands:begin -->\nstale\n<!-- commands:end -->\noutro\n"
    out = module.render(text)
    assert out.startswith("intro\n<!-- commands:begin -->\n| command |")
    assert out.endswith("<!-- commands:end -->\noutro\n") and "stale" not in out
