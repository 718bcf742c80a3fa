"""The probe's harness: output captured per check, lookups that try where a name moved between
releases, a file's bytes, and a function run in a forked copy of the process."""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import mmap
import os
import selectors
import signal
import struct
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

MARK = "@@k3env-probe@@"
# sys.path as the interpreter starts: what the image's Python finds. Imports may add to it
# (setuptools adds its _vendor directory), and the version checks must not see those.
START_PATH = list(sys.path)
# The probe's directory, run as ``python PACKAGE_DIR`` to start the probe again.
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


@contextlib.contextmanager
def captured() -> Iterator[io.StringIO]:
    """Capture stdout/stderr (argparse errors, warnings) into one buffer."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        yield buf


def run_captured(fn: Callable[[], object]) -> tuple[bool, str]:
    """(ok, output): SystemExit(0) is success, any other exit or exception a failure."""
    with captured() as buf:
        try:
            fn()
            ok = True
        except SystemExit as e:
            ok = e.code in (0, None)
            print(f"[exit {e.code}]")
        except BaseException:
            traceback.print_exc(limit=-6)
            ok = False
    return ok, buf.getvalue()


def first_attribute(attribute: str, *modules: str) -> Any:
    """``attribute`` from the first of ``modules`` that has it (functions move between
    releases); says where it looked when none does."""
    looked = []
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ImportError as e:
            looked.append(f"{name} ({e})")
            continue
        if hasattr(module, attribute):
            return getattr(module, attribute)
        looked.append(f"{name} (no {attribute})")
    raise ImportError(f"{attribute} is in none of: " + "; ".join(looked))


def first_import(*names: str) -> ModuleType:
    errors = []
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError as e:
            errors.append(f"{name}: {e}")
    raise ImportError("none of " + ", ".join(names) + " imports: " + "; ".join(errors))


def read_bytes(path: str) -> bytes | mmap.mmap | None:
    """A file's bytes (a large library memory-mapped, not copied), or None."""
    try:
        with open(path, "rb") as fh:
            if os.fstat(fh.fileno()).st_size > (8 << 20):
                return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            return fh.read()
    except (OSError, ValueError):
        return None


def in_fork(fn: Callable[[], Any], timeout: float) -> tuple[Any, str | None]:
    """``fn()`` in a forked copy of this process (what it imports or patches stays there):
    ``(result, None)``, or ``(None, why)`` when the copy failed, died or ran out of
    ``timeout``. The answer is length-prefixed (a process the copy left behind cannot hold
    the reply open) and the copy runs in its own process group (killed whole on timeout)."""
    sys.stdout.flush()
    sys.stderr.flush()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the copy: answer on the pipe, never return into the caller's stack
        try:
            os.close(r)
            os.setpgid(0, 0)
            try:
                data = json.dumps({"ok": fn()}).encode()
            except BaseException:
                data = json.dumps({"error": traceback.format_exc(limit=-6)}).encode()
            view = memoryview(struct.pack(">Q", len(data)) + data)
            while view:
                view = view[os.write(w, view) :]
        finally:
            os._exit(0)
    os.close(w)
    try:
        answer, why = _read_answer(r, timeout)
    finally:
        os.close(r)
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    if answer is None:
        return None, why
    if "error" in answer:
        return None, str(answer["error"])
    return answer["ok"], None


def _read_answer(r: int, timeout: float) -> tuple[dict[str, Any] | None, str | None]:
    """The forked copy's length-prefixed answer on ``r``, or (None, why)."""
    buf, need = bytearray(), None
    deadline = time.monotonic() + timeout
    sel = selectors.DefaultSelector()
    sel.register(r, selectors.EVENT_READ)
    try:
        while need is None or len(buf) < need + 8:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                return None, f"no answer within {timeout:.0f} s"
            chunk = os.read(r, 1 << 20)
            if not chunk:
                return None, "it exited without an answer"
            buf += chunk
            if need is None and len(buf) >= 8:
                need = struct.unpack(">Q", bytes(buf[:8]))[0]
    finally:
        sel.close()
    answer: dict[str, Any] = json.loads(bytes(buf[8 : 8 + need]))
    return answer, None
