"""Progress on stderr: steps, echoed commands, one summary line per item.

stdout is kept for results (tables, or JSON with ``--json``), so a machine can read it while
a person watches the steps scroll by on stderr.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager


class Log:
    def __init__(self, *, quiet: bool = False) -> None:
        self.quiet = quiet

    def info(self, message: str) -> None:
        if not self.quiet:
            print(message, file=sys.stderr, flush=True)

    def detail(self, message: str) -> None:
        if not self.quiet and message:
            print(f"    {message}", file=sys.stderr, flush=True)

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
