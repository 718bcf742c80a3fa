"""Record the pinned srt-slurm's recipe and cluster-config schema from its own loader (the
marshmallow schemas it loads with: every key, its type, whether it is required, its choices,
and marshmallow's messages) into the file the lock pins (`[srt_slurm] schema`), atomically;
`preflight --recipe` and `--srtslurm` check keys and types against it where srt-slurm is not
materialized. `--check`: the committed file is what the materialized srt-slurm says (exit 4
if not)
"""

from __future__ import annotations

import argparse

from k3env import jsontext
from k3env.commands.app import SOURCE_HELP, App
from k3env.errors import CheckFailed, ConfigError

NAME = "srt schema"
HELP = "record the pinned srt-slurm's recipe schema from its own loader"


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--source", help=SOURCE_HELP)
    p.add_argument(
        "--check", action="store_true", help="compare with the committed file, write nothing"
    )


def run(args: argparse.Namespace, app: App) -> int:
    from k3env.config.lock import load_lock
    from k3env.config.srtschema import identity
    from k3env.files import write_atomic
    from k3env.srt.materialize import materialize
    from k3env.srt.validate import record_schema

    lock = load_lock(args.lock)
    srt = lock.srt_slurm
    if srt is None or srt.schema is None:
        raise ConfigError(
            "the lock names no file for srt-slurm's schema",
            where=f"{lock.path} [srt_slurm]",
            fix='add schema = "schemas/srt-slurm.schema.json" to [srt_slurm]',
        )
    m = materialize(lock, app.state(), app.log, source=args.source)
    doc = {"srt_slurm": identity(srt), **record_schema(m, app.log)}
    text = jsontext.dumps(doc, indent=1) + "\n"
    path = lock.resolve_path(srt.schema, key="srt_slurm.schema")
    same = path.is_file() and path.read_text() == text
    payload = {"path": str(path), "version": srt.version, "unchanged": same, "written": False}
    if args.check:
        app.emit(payload, lambda: print(f"{path}: {'as recorded' if same else 'differs'}"))
        if not same:
            raise CheckFailed(
                f"{path} is not the schema srt-slurm {srt.version} loads with",
                where=str(path),
                fix="`k3env srt schema`, then `k3env lock --update-hashes`",
            )
        return 0
    if not same:
        write_atomic(path, text)
    payload["written"] = not same
    app.emit(
        payload,
        lambda: print(
            f"srt-slurm {srt.version}'s schema: {path} ({'unchanged' if same else 'written'}; "
            "then `k3env lock --update-hashes`)"
        ),
    )
    return 0
