"""External commands (debootstrap, pip, tar, nix-instantiate): the one place that runs them."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from .errors import ToolError
from .log import Log


def require_tool(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise ToolError(
            f"`{name}` is not installed",
            where="PATH",
            fix=f"apt-get install -y {package} (or `nix develop`, which pins it)",
        )
    return path


def run(
    argv: Sequence[str],
    log: Log,
    *,
    cwd: Path | None = None,
    capture: bool = False,
    what: str | None = None,
) -> str:
    """Run ``argv``, echoed first; a non-zero exit raises with its output."""
    log.command(list(argv))
    try:
        proc = subprocess.run(
            list(argv),
            cwd=cwd,
            check=False,
            text=True,
            stdout=subprocess.PIPE if capture else None,
            stderr=subprocess.PIPE if capture else None,
        )
    except FileNotFoundError as e:
        raise ToolError(f"`{argv[0]}` not found", where=what or argv[0], fix="install it") from e
    if proc.returncode != 0:
        output = ((proc.stdout or "") + (proc.stderr or "")).strip()[-4000:]
        raise ToolError(
            f"`{' '.join(argv[:3])} ...` exited {proc.returncode}"
            + (f":\n{output}" if output else ""),
            where=what or argv[0],
            fix="read the command's output above",
        )
    return proc.stdout or ""
