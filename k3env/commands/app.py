"""What every command is handed, and the arguments several commands share.

A command is a module of ``k3env.commands``: its docstring is its description (``--help``
and README's command table), ``NAME`` and ``HELP`` name it, ``arguments(p)`` adds its
arguments and ``run(args, app)`` runs it. ``App`` carries the log, the engine and state (each
made on first use, never at import time) and the one result a command emits; ``k3env.cli``
parses, dispatches, and is the one place errors become exit codes.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from k3env.config.lock import load_lock
from k3env.config.pins import Lock
from k3env.config.shapes import DEFAULT_PLATFORM, MACHINES
from k3env.config.spec import DEFAULT_IMAGES, ImageSpec, load_specs
from k3env.errors import ConfigError
from k3env.log import Log, human_stdout
from k3env.state import State

if TYPE_CHECKING:
    from k3env.engine.protocol import Engine
    from k3env.image.build import BuildResult


def docker_engine() -> Engine:
    """The engine a command talks to unless it is handed another: the local dockerd."""
    from k3env.engine.dockerd import DockerEngine

    return DockerEngine()


@dataclass(kw_only=True)
class App:
    log: Log
    as_json: bool = False
    make_engine: Callable[[], Engine] = docker_engine
    result: Any = None  # what ``emit`` kept: the one JSON document of ``--json``
    _engine: Engine | None = field(default=None, repr=False)
    _state: State | None = field(default=None, repr=False)

    def engine(self) -> Engine:
        if self._engine is None:
            self._engine = self.make_engine()
        return self._engine

    def state(self) -> State:
        if self._state is None:
            self._state = State()
        return self._state

    def emit(self, payload: Any, human: Callable[[], None]) -> None:
        """The command's result: kept for the CLI to print as the one JSON document
        (``--json``; a failure after this adds its error to the same document), or printed
        for a person."""
        if self.as_json:
            self.result = payload
        else:
            with human_stdout():  # a name someone else wrote cannot drive the terminal
                human()

    def builds(
        self, args: argparse.Namespace, *, registry_form: bool = False
    ) -> tuple[Lock, list[ImageSpec], Engine, State, list[BuildResult]]:
        """The one build loop of every command that needs images: load, build (cached),
        record, for each ``--platform``. ``registry_form``: a publish follows, so each
        image's layers and config must be kept too."""
        from k3env.image.build import build_all, make_builder

        lock = with_variant(load_lock(args.lock), getattr(args, "variant", None), args)
        specs = load_specs(args.images, lock, tuple(args.image))
        engine = self.engine()
        if not self.log.quiet:  # one more engine call (GET /info): only when someone reads it
            self.log.info(f"engine: {engine.describe()}")
        state = self.state()
        builds, each = [], []
        for platform in args.platform:
            builder = make_builder(
                lock, engine, state, self.log, args.twin, platform, registry_form=registry_form
            )
            builds += build_all(builder, specs)
            each += specs
        return lock, each, engine, state, builds


def with_variant(lock: Lock, name: str | None, args: argparse.Namespace) -> Lock:
    """``lock``, or ``lock`` with its ``[variants.NAME]`` in place of the pinned components
    (over the CPU twin only: a variant is a release the twin can carry)."""
    if name is None:
        return lock
    if name not in lock.variants:
        raise ConfigError(
            f"unknown variant {name!r}",
            where=f"{args.lock} [variants]",
            fix=f"use one of {sorted(lock.variants)}, or add [variants.NAME] to the lock",
        )
    if not getattr(args, "twin", False):
        raise ConfigError(
            f"--variant {name} is built over the CPU twin", where="--variant", fix="add --twin"
        )
    return lock.with_variant(lock.variants[name])


SOURCE_HELP = "git URL or local mirror path of srt-slurm (default: the lock's git URL)"


def image_args(p: argparse.ArgumentParser, *, twin: str | None) -> None:
    """IMAGE... and --images, plus --twin where the command can work over the CPU twin."""
    p.add_argument("image", nargs="*", help="image spec names (default: all in --images)")
    p.add_argument(
        "--images", type=Path, default=DEFAULT_IMAGES, help="image spec directory (default: images)"
    )
    if twin:
        p.add_argument("--twin", action="store_true", help=twin)


def platforms(text: str) -> list[str]:
    """``--platform linux/amd64,linux/arm64`` (argparse type)."""
    from k3env.config.shapes import PLATFORM_FIX, PLATFORM_RE

    out = [p.strip() for p in text.split(",") if p.strip()]
    for p in out:
        if not PLATFORM_RE.match(p):
            raise argparse.ArgumentTypeError(f"{p!r} is not a platform: {PLATFORM_FIX}")
    return out


def platform_arg(p: argparse.ArgumentParser, *, many: bool) -> None:
    if many:
        p.add_argument(
            "--platform", type=platforms, default=[DEFAULT_PLATFORM], metavar="OS/ARCH[,...]",
            help="the platforms to build for, comma-separated (default: linux/amd64); another "
            "architecture's containers run under qemu-user emulation",
        )  # fmt: skip
    else:
        p.add_argument(
            "--platform", default=DEFAULT_PLATFORM, choices=sorted(MACHINES),
            help="the twin's platform (default: %(default)s)",
        )  # fmt: skip
