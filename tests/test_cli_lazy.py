"""A command line that names a command builds only that command's parser (and imports only
its module), and parses exactly as the whole parser does."""

from __future__ import annotations

import subprocess
import sys

import pytest

from k3env.cli import parser
from k3env.commands import NAMES, command, named
from k3env.errors import UsageError

LINES = [
    ["build"],
    ["build", "--json", "-q", "--twin", "kimi-k3-dynamo"],
    ["build", "--bogus"],
    ["build", "--lock"],
    ["srt", "validate", "recipe.yaml"],
    ["srt", "validate"],
    ["srt", "recipe", "--json", "x", "y"],
    ["srt"],
    ["verify", "--key", "pub.pem", "--twin"],
    ["export", "--check", "f.sqsh", "--key", "k.pem"],
    ["preflight", "--json"],
    ["lock", "--help-me"],
    ["bogus"],
    ["--version"],
    ["-h"],
    ["srt", "recipe", "-h"],
    [],
]


def _parse(words: list[str], lazy: bool) -> tuple[str, object]:
    try:
        ns = (parser(words) if lazy else parser()).parse_args(words)
    except UsageError as e:
        return "error", e.render()
    except SystemExit as e:  # --version, --help
        return "exit", e.code
    found = vars(ns)
    run = found.pop("run", None)
    return "args", (sorted(found.items()), getattr(run, "__module__", None))


@pytest.mark.parametrize("words", LINES, ids=" ".join)
def test_the_lazy_parser_parses_as_the_whole_one(
    words: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    whole = _parse(words, lazy=False)
    printed = capsys.readouterr()
    assert _parse(words, lazy=True) == whole
    assert capsys.readouterr() == printed


def test_every_name_is_its_modules_command() -> None:
    assert len(set(NAMES)) == len(NAMES)
    for name in NAMES:
        assert name == command(name).NAME
    assert named(["srt", "schema", "--json"]) == "srt schema"
    assert named(["srt"]) is None and named(["--json", "build"]) is None


def test_a_run_imports_only_its_own_command() -> None:
    code = (
        "import sys\nfrom k3env.cli import parser\n"
        "parser(['preflight', '--json']).parse_args(['preflight', '--json'])\n"
        "print(sorted(m for m in sys.modules if m.startswith('k3env.commands.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    imported = set(out.stdout.strip().strip("[]").replace("'", "").split(", "))
    others = {f"k3env.commands.{n.replace(' ', '_')}" for n in NAMES if n != "preflight"}
    assert "k3env.commands.preflight" in imported and not imported & others, imported
