"""The ``k3env`` command: parse, dispatch to a command module (``k3env.commands``), and turn
errors into exit codes: the only place they are caught."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from k3env import __version__, jsontext
from k3env.commands import all_commands, command, named
from k3env.commands.app import App, docker_engine
from k3env.config.lock import DEFAULT_LOCK
from k3env.errors import K3envError, StateError, UsageError
from k3env.log import Log

if TYPE_CHECKING:
    from k3env.engine.protocol import Engine


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are k3env errors (exit 2): with ``--json`` they are the one
    JSON document on stdout too."""

    def error(self, message: str) -> Any:
        usage = " ".join(self.format_usage().split())
        raise UsageError(message, where=self.prog, fix=f"{usage} (see `{self.prog} --help`)")


def parser(words: list[str] | None = None) -> argparse.ArgumentParser:
    """k3env's parser. Given a command line that names a command, only that command's
    subparser (and module) is made: the rest are for ``--help`` and a name nobody knows."""
    wanted = named(words) if words is not None else None
    common = _Parser(add_help=False)
    common.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    common.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    common.add_argument(
        "--lock", type=Path, default=DEFAULT_LOCK, help=f"the lockfile (default: {DEFAULT_LOCK})"
    )
    p = _Parser(
        prog="k3env",
        description=(
            "Build pinned, patched, verified serving images (vLLM, Dynamo) for Slurm clusters, "
            "from one lockfile (pins/) and image specs (images/)."
        ),
    )
    p.add_argument("--version", action="version", version=f"k3env {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    groups: dict[str, argparse._SubParsersAction[_Parser]] = {}
    for module in [command(wanted)] if wanted else all_commands():
        where, name = sub, module.NAME
        if " " in name:  # `srt materialize`: a command of the `srt` group
            group, name = name.split(" ", 1)
            if group not in groups:
                g = sub.add_parser(group, help=GROUPS[group])
                groups[group] = g.add_subparsers(
                    dest=f"{group}_command", required=True, metavar=f"{group.upper()}_COMMAND"
                )
            where = groups[group]
        cp = where.add_parser(name, parents=[common], help=module.HELP,
                              description=module.__doc__)  # fmt: skip
        module.arguments(cp)
        cp.set_defaults(run=module.run)
    return p


GROUPS = {"srt": "srt-slurm: materialize the pinned version, recipes, validate"}


COMMON_OPTIONS = ("[-h]", "[--json]", "[-q]", "[--lock LOCK]")


def command_table(p: argparse.ArgumentParser | None = None) -> str:
    """README's command table, rendered from the parser itself (a test fails on drift)."""
    rows = ["| command | what it does |", "|---|---|"]

    def walk(parser: argparse.ArgumentParser) -> None:
        for action in parser._actions:
            if not isinstance(action, argparse._SubParsersAction):
                continue
            for sub in action.choices.values():
                if any(isinstance(a, argparse._SubParsersAction) for a in sub._actions):
                    walk(sub)
                    continue
                usage = " ".join(sub.format_usage().split())
                usage = usage.removeprefix("usage: ").replace("|", "\\|")
                for common in COMMON_OPTIONS:
                    usage = usage.replace(f" {common}", "")
                text = " ".join((sub.description or "").split()).replace("|", "\\|")
                rows.append(f"| `{usage}` | {text} |")

    walk(p or parser())
    return "\n".join(rows) + "\n"


def main(argv: Sequence[str] | None = None, *, engine: Engine | None = None) -> int:
    """Run one command; ``engine``: the engine it talks to (default: the local dockerd)."""
    words = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser(words).parse_args(words)
    except UsageError as e:
        usage = App(log=Log(quiet=False), as_json="--json" in words, make_engine=docker_engine)
        return _fail(usage, e)
    make: Callable[[], Engine] = docker_engine if engine is None else (lambda: engine)
    app = App(log=Log(quiet=args.quiet), as_json=args.json, make_engine=make)
    try:
        with _terminable():
            code = int(args.run(args, app))
    except K3envError as e:
        return _fail(app, e)
    except jsontext.NotFinite as e:  # a NaN or an infinity on its way into a JSON document
        return _fail(app, _not_json(e, args.command, "a JSON document"))
    except KeyboardInterrupt:
        print("k3env: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print("k3env: terminated (SIGTERM)", file=sys.stderr)
        return 143
    except OSError as e:
        # A file k3env was told to use (an --out path, a recipe, a directory) that the
        # system refused: the user's to fix, not a bug to show as a traceback.
        return _fail(
            app,
            StateError(
                f"{e.strerror or e}",
                where=str(e.filename) if e.filename else args.command,
                fix="check the path, its permissions and the free disk space",
            ),
        )
    if app.as_json:
        try:
            text = jsontext.dumps(app.result, indent=2)
        except jsontext.NotFinite as e:  # the whole document is refused, not printed in part
            return _fail(app, _not_json(e, args.command, "the JSON result"), keep_result=False)
        if not _print_json(text):
            return StateError.return_code
    return code


class Terminated(BaseException):
    """SIGTERM (a CI job cancelled, Slurm's time limit, `kill`), raised where the command is,
    so every ``finally`` runs on the way out as for Ctrl-C (a bump restores what it wrote)."""


@contextmanager
def _terminable() -> Iterator[None]:
    """SIGTERM raised as ``Terminated`` while a command runs (the main thread only: a handler
    cannot be set elsewhere), the previous handler back after it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminated(signum: int, frame: object) -> None:
        raise Terminated

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _not_json(e: jsontext.NotFinite, command: str, what: str) -> StateError:
    return StateError(
        f"{what} cannot be written: {e}",
        where=command,
        fix="a number that is not finite reached k3env's output: report it as a k3env bug "
        "(its source should refuse it or say it in words)",
    )


def _fail(app: App, error: K3envError, *, keep_result: bool = True) -> int:
    """Report ``error``: on stderr, and with ``--json`` in the one document on stdout (the
    command's result so far, plus ``error``; the error alone when the result cannot be
    written as JSON)."""
    if app.as_json:
        result = app.result if keep_result and isinstance(app.result, dict) else {}
        try:
            text = jsontext.dumps({**result, "error": error.as_json()}, indent=2)
        except jsontext.NotFinite:
            text = jsontext.dumps({"error": error.as_json()}, indent=2)
        _print_json(text)
    print(f"k3env: error: {error.render()}", file=sys.stderr)
    return error.return_code


def _print_json(text: str) -> bool:
    """The one JSON document (``text``, encoded whole before a byte is written) on stdout;
    False (said on stderr) when stdout cannot take it (a full disk, a closed pipe): never a
    traceback, never half a document claimed as whole."""
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except OSError as e:
        print(f"k3env: error: cannot write the JSON result to stdout: {e.strerror or e}",
              file=sys.stderr)  # fmt: skip
        _close_stdout()
        return False
    return True


def _close_stdout() -> None:
    """Point stdout at nothing, so the interpreter's flush at exit cannot fail again."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
