"""External commands (debootstrap, pip, tar, nix-instantiate): the one place that runs them."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from k3env.errors import ToolError
from k3env.log import Log


def require_tool(name: str, package: str) -> str:
    """The path of ``name``; else the error names how to install it: ``package`` is a Debian
    package, or a whole command (``pip install uv``) where Debian has none."""
    path = shutil.which(name)
    if path is None:
        how = package if " " in package else f"apt-get install -y {package}"
        raise ToolError(
            f"`{name}` is not installed",
            where="PATH",
            fix=f"{how} (or `nix develop`, which pins it)",
        )
    return path


# What a program whose output must be a function of its inputs (``sealed``) sees of this
# host: where programs are, and the way out to a mirror. Nothing else: a developer shell's
# PYTHONDONTWRITEBYTECODE turned the .pyc files debootstrap's py3compile writes from
# timestamp to hash ones (another twin); `nix develop`'s SOURCE_DATE_EPOCH makes mksquashfs
# refuse the -mkfs-time an export gives it.
HOST_KEYS = ("PATH", "http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY",
             "NO_PROXY")  # fmt: skip


def _child_env(env: Mapping[str, str] | None, *, sealed: bool = False) -> dict[str, str] | None:
    """A child's environment: the host's with ``env`` over it (``None``: the host's as it
    is); ``sealed``, only the host's HOST_KEYS under ``env``."""
    if sealed:
        return {**{k: os.environ[k] for k in HOST_KEYS if k in os.environ}, **(env or {})}
    return {**os.environ, **env} if env else None


def run(
    argv: Sequence[str],
    log: Log,
    *,
    cwd: Path | None = None,
    capture: bool = False,
    what: str | None = None,
    env: Mapping[str, str] | None = None,
    sealed: bool = False,
) -> str:
    """Run ``argv``, echoed first; a non-zero exit raises with its output. ``sealed``: the
    program sees no more of the host's environment than its PATH and proxies."""
    log.command(list(argv))
    try:
        proc = subprocess.run(
            list(argv),
            cwd=cwd,
            check=False,
            text=True,
            errors="replace",  # other programs' bytes: never a UnicodeDecodeError
            stdout=subprocess.PIPE if capture else None,
            stderr=subprocess.PIPE if capture else None,
            env=_child_env(env, sealed=sealed),
        )
    except FileNotFoundError as e:
        raise ToolError(f"`{argv[0]}` not found", where=what or argv[0], fix="install it") from e
    if proc.returncode != 0:
        output = ((proc.stdout or "") + (proc.stderr or "")).strip()[-4000:]
        raise ToolError(
            f"`{' '.join(argv[:3])} ...` exited {proc.returncode}" + (":" if output else ""),
            where=what or argv[0],
            fix="read the command's output above",
            output=output or None,
        )
    return proc.stdout or ""


# The largest pipe an unprivileged process may ask for (Linux's /proc/sys/fs/pipe-max-size
# default): a stream of gigabytes wakes its reader once a MiB, not once each 64 KiB.
PIPE_SIZE = 1 << 20


def _widen(fd: int) -> None:
    """Ask for a PIPE_SIZE pipe (Linux); elsewhere, or refused, the pipe stays as it is."""
    import fcntl

    setsz = getattr(fcntl, "F_SETPIPE_SZ", None)  # Linux only
    if setsz is not None:
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, setsz, PIPE_SIZE)


def run_streaming(
    argv: Sequence[str],
    chunks: Iterable[bytes | bytearray | memoryview],
    log: Log,
    *,
    what: str | None = None,
    env: Mapping[str, str] | None = None,
    sealed: bool = False,
) -> str:
    """Run ``argv`` with ``chunks`` streamed to its stdin; a non-zero exit raises
    (``sealed`` as for run)."""
    log.command(list(argv))
    broken = False
    try:
        # The context manager closes every pipe and waits, also when ``chunks`` raises.
        with subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=_child_env(env, sealed=sealed),
        ) as proc:
            assert proc.stdin is not None and proc.stdout is not None
            _widen(proc.stdin.fileno())
            try:
                for chunk in chunks:
                    proc.stdin.write(chunk)
            except BrokenPipeError:
                broken = True  # the tool stopped reading: its exit code and output say why
            finally:
                with contextlib.suppress(BrokenPipeError):
                    proc.stdin.close()
                output = proc.stdout.read().decode(errors="replace")
    except FileNotFoundError as e:
        raise ToolError(f"`{argv[0]}` not found", where=what or argv[0], fix="install it") from e
    if proc.returncode != 0 or broken:
        raise ToolError(
            f"`{' '.join(argv[:3])} ...` exited {proc.returncode}" + (":" if output else ""),
            where=what or argv[0],
            fix="read the command's output above (disk full? wrong options?)",
            output=output[-4000:] or None,
        )
    return output


def output_or_none(argv: Sequence[str], log: Log) -> bytes | None:
    """``argv``'s stdout as bytes, or ``None`` when it exits non-zero (e.g. a missing file)."""
    log.command(list(argv))
    proc = subprocess.run(list(argv), capture_output=True, check=False)
    return proc.stdout if proc.returncode == 0 else None


def ask(argv: Sequence[str], stdin: bytes, *, timeout: float, limit: int) -> bytes | None:
    """``argv``'s stdout for ``stdin`` (a credential helper's question), or None when it is
    not installed, exits non-zero, runs past ``timeout`` or answers more than ``limit``
    bytes. Never echoed: its answer is a secret."""
    try:
        # Its own process group: at the deadline the helper and everything it started go
        # (a grandchild holding the pipe open would otherwise outlive it, and block the read).
        proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    except OSError:
        return None
    try:
        out, _ = proc.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.kill()
        proc.communicate()  # the group is gone: the pipes end, and are closed
        return None
    finally:
        with contextlib.suppress(OSError):  # what it left behind once it answered
            os.killpg(proc.pid, signal.SIGKILL)
    if proc.returncode != 0 or len(out) > limit:
        return None
    return out


def attempt(
    argv: Sequence[str],
    log: Log,
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> tuple[int, str]:
    """Run ``argv`` whose failure is an answer, not an error: (exit code, stdout + stderr)."""
    log.command(list(argv))
    proc = subprocess.run(
        list(argv),
        cwd=cwd,
        env=dict(env) if env is not None else None,
        check=False,
        text=True,
        errors="replace",  # other programs' bytes (a tag name, a log): never a decode error
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    return proc.returncode, proc.stdout


def poll(argv: Sequence[str], *, timeout: float) -> tuple[int, str]:
    """Run ``argv``, a question asked again every few seconds (``squeue``): (exit code, stdout
    + stderr), not echoed (its caller says once what it polls); 124 when it runs past
    ``timeout`` or cannot be started (its words then say why)."""
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, errors="replace",
                              timeout=timeout, check=False)  # fmt: skip
    except subprocess.TimeoutExpired:
        return 124, f"`{argv[0]}` did not answer within {timeout:.0f} s"
    except OSError as e:
        return 124, f"`{argv[0]}`: {e.strerror or e}"
    return proc.returncode, proc.stdout + proc.stderr
