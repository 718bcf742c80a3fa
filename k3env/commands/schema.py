"""The JSON Schema of the lock or of image specs, recorded from k3env's own reader walking the
real files; `schemas/` holds the committed ones (a test fails when they drift). Editors that
read `#:schema` comments (taplo, Even Better TOML) check the files against them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from k3env import jsontext
from k3env.commands.app import App
from k3env.config.lock import load_lock
from k3env.config.spec import DEFAULT_IMAGES
from k3env.errors import ConfigError
from k3env.files import write_atomic

NAME = "schema"
HELP = "write the JSON Schema of the lock or of image specs (for editors)"


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("kind", choices=("lock", "spec"), help="which file kind")
    p.add_argument(
        "--images", type=Path, default=DEFAULT_IMAGES, help="image spec directory (for spec)"
    )
    p.add_argument("--out", type=Path, help="write the schema here (atomically)")


def run(args: argparse.Namespace, app: App) -> int:
    log = app.log
    """The JSON Schema of the lock or of image specs, recorded from k3env's own reader run
    over the real files (so a key the reader would reject is not in it)."""
    from k3env.config.reader import record_schema
    from k3env.config.spec import load_spec

    if args.kind == "lock":
        schema = record_schema(lambda: load_lock(args.lock), "k3env lockfile (pins/*.lock.toml)")
    else:
        lock = load_lock(args.lock)
        paths = sorted(args.images.glob("*.toml"))
        if not paths:
            raise ConfigError("no image specs", where=str(args.images), fix="pass --images DIR")
        schema = record_schema(
            lambda: [load_spec(path, lock) for path in paths], "k3env image spec (images/*.toml)"
        )
    text = jsontext.dumps(schema, indent=2) + "\n"
    if args.out:
        write_atomic(args.out, text)
        log.info(f"schema written to {args.out}")
    app.emit(schema, lambda: None if args.out else print(text, end=""))
    return 0
