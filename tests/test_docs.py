"""The docs site and README tell the truth about the CLI, as README's command table does: every
page is in mkdocs.yml's nav and every nav entry is a page, the site's command table is the
parser's own, and every command a page or README shows is one k3env and nox take.

A command in a shell block must parse as written (k3env's own parser; a nox session that exists,
and what it passes to k3env after `--` parsed as that k3env command); a command quoted in prose
(`k3env smoke --cluster`) must name a command that exists and options it has. `nox -s docs`
builds the site with `mkdocs build --strict`, which also fails on a broken link or anchor."""

from __future__ import annotations

import argparse
import ast
import importlib.util
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from k3env.cli import command_table, parser
from k3env.errors import UsageError

from .conftest import REPO

DOCS = REPO / "docs"
PAGES = sorted(DOCS.glob("*.md"))
README_LINES = 200


def _nav_files(nav: object) -> Iterator[str]:
    """The page files a mkdocs nav names, at any depth."""
    if isinstance(nav, str):
        yield nav
    elif isinstance(nav, list):
        for item in nav:
            yield from _nav_files(item)
    elif isinstance(nav, dict):
        for value in nav.values():
            yield from _nav_files(value)


def test_every_nav_entry_is_a_page_and_every_page_is_in_the_nav() -> None:
    yaml = pytest.importorskip("yaml")  # PyYAML: a k3env dependency; its stubs are not installed
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    assert config["docs_dir"] == "docs" and config["theme"]["name"] == "material"
    nav = list(_nav_files(config["nav"]))
    assert len(nav) == len(set(nav)), nav
    missing = [f for f in nav if not (DOCS / f).is_file()]
    assert not missing, f"mkdocs.yml's nav names pages docs/ lacks: {missing}"
    orphans = sorted(p.name for p in PAGES if p.name not in nav)
    assert not orphans, f"pages missing from mkdocs.yml's nav: {orphans}"
    # One page per job (issue #54), beside the index and the layout.
    for page in ("index.md", "layout.md", "build.md", "verify.md", "smoke.md", "recipes.md",
                 "cluster.md", "staging.md", "sbom.md", "bump.md", "performance.md",
                 "threat-model.md"):  # fmt: skip
        assert page in nav, page


@pytest.mark.parametrize("page", [REPO / "README.md", DOCS / "index.md"], ids=lambda p: p.name)
def test_the_command_table_is_rendered_from_the_parser(page: Path) -> None:
    """Fails when a command, option or description changes without `nox -s schemas`."""
    text = page.read_text()
    begin, end = "<!-- commands:begin -->\n", "<!-- commands:end -->\n"
    assert begin in text and end in text
    assert text.split(begin, 1)[1].split(end, 1)[0] == command_table()


def test_every_command_is_in_the_table_with_a_description() -> None:
    rows = command_table().splitlines()[2:]
    names = [r.split("`")[1].split(" [")[0].split(" {")[0] for r in rows]
    assert "k3env srt recipe" in " ".join(names)
    for name in _subcommands(parser()):
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


def test_readme_is_the_front_door() -> None:
    """README: what k3env is, the two commands, the command table, links; the rest is the site."""
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= README_LINES, len(readme.splitlines())
    # Its relative links reach files of the repository (the pages among them).
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    local = [link for link in links if not re.match(r"[a-z]+:", link)]
    assert any(link.startswith("docs/") for link in local), local
    assert [link for link in local if not (REPO / link).exists()] == []
    # Every page is linked from README.
    for page in PAGES:
        assert f"docs/{page.name}" in readme, page.name


# --- the commands pages show --------------------------------------------------------------------

SHELLS = ("sh", "bash", "shell", "console")


def shell_lines(text: str) -> Iterator[str]:
    """The command lines of a page's shell blocks, continuations joined, heredoc bodies left out."""
    fence: str | None = None
    heredoc: str | None = None
    line = ""
    for raw in text.splitlines():
        opening = re.match(r"\s*```(\w*)", raw)
        if fence is None:
            if opening:
                fence = opening.group(1)
            continue
        if raw.strip() == "```":
            fence = None
            continue
        if fence not in SHELLS:
            continue
        if heredoc is not None:
            heredoc = None if raw.strip() == heredoc else heredoc
            continue
        marker = re.search(r"<<-?'?(\w+)'?", raw)
        if marker:
            heredoc = marker.group(1)
        line += raw
        if line.endswith("\\"):
            line = line[:-1]
            continue
        yield line
        line = ""


def prose_commands(text: str) -> Iterator[str]:
    """`k3env ...` and `nox -s ...` quoted in prose and tables (outside code blocks)."""
    fenced = False
    for raw in text.splitlines():
        if raw.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            for code in re.findall(r"`([^`]+)`", raw):
                if re.match(r"(k3env|nox -s) ", code):
                    yield code


def commands(line: str) -> Iterator[list[str]]:
    """Each simple command of a shell line, its words (`&&`, `;` and pipes split it)."""
    words: list[str] = []
    for word in shlex.split(line, comments=True):
        if word in ("&&", "||", ";", "|"):
            yield words
            words = []
        else:
            words.append(word)
    yield words


def nox_sessions() -> dict[str, list[list[str]]]:
    """noxfile.py's sessions, each with the k3env command lines its args go to (`k3env build
    *session.posargs`: ["build"]), read from the file itself."""
    sessions: dict[str, list[list[str]]] = {}
    for fn in ast.parse((REPO / "noxfile.py").read_text()).body:
        if not isinstance(fn, ast.FunctionDef):
            continue
        for deco in fn.decorator_list:
            if isinstance(deco, ast.Call) and ast.unparse(deco.func) == "nox.session":
                names = [k.value for k in deco.keywords if k.arg == "name"]
                name = names[0].value if names and isinstance(names[0], ast.Constant) else fn.name
                sessions[str(name)] = list(_k3env_runs(fn))
    return sessions


def _k3env_runs(fn: ast.FunctionDef) -> Iterator[list[str]]:
    for node in ast.walk(fn):
        if not (isinstance(node, ast.Call) and ast.unparse(node.func) == "session.run"):
            continue
        args = node.args
        if not args or not (isinstance(args[0], ast.Constant) and args[0].value == "k3env"):
            continue
        starred = [i for i, a in enumerate(args) if isinstance(a, ast.Starred)]
        if starred and ast.unparse(args[starred[0]]) == "*session.posargs":
            head = args[1 : starred[0]]
            if all(isinstance(a, ast.Constant) for a in head):
                yield [str(a.value) for a in head if isinstance(a, ast.Constant)]


def parse_k3env(words: list[str]) -> str | None:
    """None when k3env's parser takes ``words`` (a command line after `k3env`), else its error."""
    try:
        parser(words).parse_args(words)
    except UsageError as e:
        return str(e)
    except SystemExit as e:  # --help, --version
        return None if e.code == 0 else f"exit {e.code}"
    return None


def check_nox(words: list[str], sessions: dict[str, list[list[str]]]) -> str | None:
    """`nox -s NAME [-- ARGS]`: the session exists; ARGS parse as each k3env command it runs."""
    at = words.index("-s")
    name = words[at + 1]
    if name not in sessions:
        return f"no nox session {name!r} in noxfile.py"
    args = words[words.index("--") + 1 :] if "--" in words else []
    for head in sessions[name]:
        error = parse_k3env([*head, *args])
        if error:
            return f"nox -s {name} passes {args} to `k3env {' '.join(head)}`: {error}"
    return None


def check_line(line: str, sessions: dict[str, list[list[str]]]) -> list[str]:
    """What is wrong with the k3env and nox commands of one shell line."""
    errors = []
    for words in commands(line):
        while words and (words[0] in ("env", "exec") or re.match(r"\w+=", words[0])):
            words = words[1:]
        if words[:1] == ["k3env"]:
            error = parse_k3env(words[1:])
        elif "nox" in words and words[words.index("nox") + 1 : words.index("nox") + 2] == ["-s"]:
            error = check_nox(words[words.index("nox") :], sessions)
        else:
            continue
        if error:
            errors.append(f"{' '.join(words)}: {error}")
    return errors


def _subcommands(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def check_prose(code: str, sessions: dict[str, list[list[str]]]) -> str | None:
    """A command quoted in prose: the command exists and has every `--option` the quote names."""
    words = code.split()
    if words[0] == "nox":
        name = words[2]
        return None if name in sessions else f"no nox session {name!r} in noxfile.py"
    p = parser()
    path: list[str] = []
    for word in words[1:]:
        subs = _subcommands(p)
        if not subs:
            break
        if word not in subs:
            return f"k3env has no command {' '.join([*path, word])!r}"
        p = subs[word]
        path.append(word)
    if _subcommands(p):
        return None  # `k3env srt`: the group itself
    named = re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", code)
    unknown = [o for o in named if o not in p._option_string_actions]
    return f"`k3env {' '.join(path)}` has no option {unknown}" if unknown else None


SOURCES = [REPO / "README.md", *PAGES]


@pytest.mark.parametrize("page", SOURCES, ids=lambda p: p.name)
def test_every_command_a_page_shows_is_one_k3env_and_nox_take(page: Path) -> None:
    sessions = nox_sessions()
    text = page.read_text()
    errors = [e for line in shell_lines(text) for e in check_line(line, sessions)]
    errors += [f"`{c}`: {e}" for c in prose_commands(text) if (e := check_prose(c, sessions))]
    assert not errors, "\n".join(errors)


def test_the_command_checks_fail_on_what_is_wrong() -> None:
    """Wrong commands are found: an unknown option, a missing argument, an unknown session, args
    a session's k3env command refuses, a command or option quoted in prose that does not exist."""
    sessions = nox_sessions()
    assert sessions["build-image"] == [["build"]] and sessions["enroot"][0] == ["push"]
    page = (
        "```sh\n"
        "k3env build --twin \\\n  --no-such-flag\n"
        "k3env srt recipe --out x.yaml     # the image is missing\n"
        "bash scripts/host-setup.sh && nox -s build-images -- --twin\n"
        "nox -s verify -- --twni\n"
        "cat > f <<'SH'\nk3env not-a-command\nSH\n"
        "k3env verify --twin && nox -s smoke -- --twin   # these two are right\n"
        "```\n"
        "Prose: `k3env smoke --cluster`, `k3env smoke --clusters`, `k3env srt frobnicate`, "
        "`nox -s nope`.\n"
    )
    errors = [e for line in shell_lines(page) for e in check_line(line, sessions)]
    assert len(errors) == 4, errors
    assert "--no-such-flag" in errors[0] and "required: image" in errors[1]
    assert "'build-images'" in errors[2] and "--twni" in errors[3]
    prose = [check_prose(c, sessions) for c in prose_commands(page)]
    assert prose[0] is None and "--clusters" in str(prose[1])
    assert "srt frobnicate" in str(prose[2]) and "'nope'" in str(prose[3])
