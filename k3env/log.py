"""Progress on stderr: steps, echoed commands, one summary line per item.

stdout is kept for results (tables, or JSON with ``--json``), so a machine can read it while
a person watches the steps scroll by on stderr.

What reaches a person's terminal carries names others wrote (a tag, a registry's answer, a
recipe's keys): a progress message is one line, every control character in it (an escape
sequence, a carriage return, a line break) escaped; a result printed for a person
(``human_stdout``) keeps its line breaks and escapes every other control character.
"""

from __future__ import annotations

import contextlib
import io
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO, cast

from k3env.quoting import one_line, visible


class Log:
    # Off a terminal, a live status (a transfer's progress) is printed at most this often.
    LIVE_INTERVAL = 3.0

    def __init__(self, *, quiet: bool = False, tty: bool | None = None) -> None:
        self.quiet = quiet
        self.tty = sys.stderr.isatty() if tty is None else tty
        self._live_shown = True  # whether the last live status has been printed
        self._live_text = ""
        self._live_at = 0.0
        self._live_open = False  # a status line is on the terminal without its newline

    def _end_live(self) -> None:
        if self._live_open:
            sys.stderr.write("\n")
            self._live_open = False

    def info(self, message: str) -> None:
        if not self.quiet:
            self._end_live()
            print(one_line(message), file=sys.stderr, flush=True)

    def detail(self, message: str) -> None:
        if not self.quiet and message:
            self._end_live()
            print(f"    {one_line(message)}", file=sys.stderr, flush=True)

    def live(self, message: str) -> None:
        """A status that replaces the previous one (a transfer's bar): redrawn in place on a
        terminal, else one line every few seconds. An empty message ends it (the last
        status is then always shown)."""
        if self.quiet:
            return
        if not message:
            if self.tty:
                self._end_live()
            elif not self._live_shown:
                print(f"    {self._live_text}", file=sys.stderr, flush=True)
            self._live_shown = True
            return
        self._live_text, self._live_shown = one_line(message), False
        if self.tty:
            sys.stderr.write(f"\r\x1b[K    {self._live_text}")
            sys.stderr.flush()
            self._live_open = True
            self._live_shown = True
        elif (now := time.monotonic()) - self._live_at >= self.LIVE_INTERVAL:
            self._live_at = now
            print(f"    {self._live_text}", file=sys.stderr, flush=True)
            self._live_shown = True

    def command(self, argv: list[str]) -> None:
        self.info("+ " + " ".join(argv))

    @contextmanager
    def step(self, title: str) -> Iterator[None]:
        self.info(f"==> {title}")
        start = time.monotonic()
        try:
            yield
        finally:
            self.info(f"<== {title} ({time.monotonic() - start:.2f} s)")


class _Visible(io.TextIOBase):
    """A text stream that escapes every control character but the line break on its way to
    ``out``."""

    def __init__(self, out: TextIO) -> None:
        self._out = out

    def write(self, text: str) -> int:
        self._out.write(visible(text))
        return len(text)

    def flush(self) -> None:
        self._out.flush()


@contextmanager
def human_stdout() -> Iterator[None]:
    """Within it, what is printed on stdout for a person has its control characters escaped
    (its line breaks kept): a name someone else wrote cannot move the cursor or clear the
    screen."""
    with contextlib.redirect_stdout(cast(TextIO, _Visible(sys.stdout))):
        yield
