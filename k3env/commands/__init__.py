"""The commands of ``k3env``, one module each (``k3env.commands.app`` says what a command
module holds), in the order ``--help`` and README's command table list them."""

from __future__ import annotations

from types import ModuleType


def all_commands() -> list[ModuleType]:
    """Every command module; imported when the parser is built (each imports its heavy
    dependencies only when it runs)."""
    from k3env.commands import (
        adopt,
        build,
        bump,
        export,
        lock,
        matrix,
        outdated,
        preflight,
        push,
        schema,
        smoke,
        srt_materialize,
        srt_recipe,
        srt_schema,
        srt_validate,
        stage,
        twin,
        verify,
    )

    return [lock, schema, build, matrix, twin, push, export, srt_materialize, srt_validate,
            srt_recipe, srt_schema, adopt, verify, smoke, stage, bump, outdated,
            preflight]  # fmt: skip
