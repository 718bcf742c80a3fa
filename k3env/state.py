"""What k3env remembers on this host, keyed by content so it is never stale.

``$K3ENV_STATE_DIR`` (default ``~/.cache/k3env``) holds records, each under a kind and a
content key: facts about images keyed by image ID (which file a module resolves to, file
contents read for patching, what verify learned), pushes and exports keyed by image ID, builds
keyed by the hash of (lock, spec, twin), the CPU twin's records keyed by its input hash, and
the wheelhouse. A record keyed by an image ID describes an immutable image, so it is reused
as it is; nothing is keyed by a name that another lock could reuse. Each kind is typed, read
and written in ``image.records``; a document is read as untrusted (bounded, strict JSON).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from k3env import jsontext
from k3env.errors import StateError
from k3env.files import write_atomic
from k3env.untrusted import read_bytes

FIX = "remove the file (k3env writes it again), or point K3ENV_STATE_DIR elsewhere"


class State:
    def __init__(self, root: Path | None = None) -> None:
        env = os.environ.get("K3ENV_STATE_DIR")
        self.root = root or (Path(env) if env else Path.home() / ".cache" / "k3env")

    def path(self, *parts: str) -> Path:
        return self.root.joinpath(*parts)

    def read_json(self, *parts: str, expect: type = object) -> Any:
        """The JSON document at ``parts`` (None: there is none), read as untrusted: a regular
        file, bounded, strict JSON of type ``expect``; else an error naming it."""
        try:
            data = read_bytes(self.root, "/".join(parts), limit=jsontext.MAX_BYTES,
                              shown_as=f"{self.root}/")  # fmt: skip
        except FileNotFoundError:  # no state directory yet
            return None
        where = str(self.path(*parts))
        return None if data is None else jsontext.loads(data, where=where, expect=expect, fix=FIX)

    def write_json(self, value: Any, *parts: str) -> None:
        self.write_bytes(jsontext.dumps(value, indent=2).encode(), *parts)

    def read_bytes(self, *parts: str) -> bytes | None:
        try:
            return self.path(*parts).read_bytes()
        except FileNotFoundError:
            return None

    def write_bytes(self, data: bytes, *parts: str) -> None:
        """Atomic: a reader sees the old content or the new, never half of it."""
        try:
            write_atomic(self.path(*parts), data)
        except OSError as e:
            raise StateError(
                f"cannot write k3env's state: {e.strerror}",
                where=str(self.path(*parts)),
                fix="free disk space or point K3ENV_STATE_DIR at a writable directory",
            ) from e
