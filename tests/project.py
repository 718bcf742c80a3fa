"""The one project builder of the tests: a lock pinning bases by digest, container patches,
and ``images/probe.toml``, written the same way for the fake engine's unit tests and for the
real engine's tests (whose bases are published to the local registry)."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from k3env.config.lock import load_lock
from k3env.config.pins import Lock
from k3env.config.spec import ImageSpec, load_spec
from k3env.hashing import file_sha256
from k3env.state import State


class Pinned(Protocol):
    """A base as a lock pins it (the fake registry's ``Published``, a real registry's)."""

    @property
    def repository(self) -> str: ...
    @property
    def tag(self) -> str: ...
    @property
    def digest(self) -> str: ...


BUGGY = textwrap.dedent(
    """\
    def postprocess_state(self, idx_mapping, num_sampled):
        self.num_accepted_tokens_gpu.index_fill_(0, idx_mapping, max(num_sampled, 1))
    """
)
FIXED = BUGGY.replace("idx_mapping, max", "idx_mapping.long(), max")
# The module moved on: neither the anchor nor the replacement is there.
REWRITTEN = BUGGY.replace("index_fill_(0, idx_mapping,", "fill_at(idx_mapping,")
PATCH = textwrap.dedent(
    """\
    description = "test: int64 index"
    [[edits]]
    anchor = "index_fill_(0, idx_mapping,"
    replacement = "index_fill_(0, idx_mapping.long(),"
    """
)
MODULE = "k3test.mod"
MODULE_FILE = "/usr/lib/python3/dist-packages/k3test/mod.py"
LOCK = "pins/test.lock.toml"
SPEC = "images/probe.toml"
REPOSITORY = "k3env-test/probe"


@dataclass(frozen=True, kw_only=True)
class PatchPin:
    """A container patch of the project: its file's text and the lock's pin fields."""

    text: str = PATCH
    bases: tuple[str, ...] = ("testbase",)
    module: str | None = MODULE
    path: str | None = None


@dataclass(frozen=True, kw_only=True)
class Project:
    root: Path
    bases: Mapping[str, Any] = field(default_factory=dict)  # Pinned, with what each engine adds

    @property
    def lock_path(self) -> Path:
        return self.root / LOCK

    @property
    def spec_path(self) -> Path:
        return self.root / SPEC

    @property
    def state(self) -> State:
        return State(self.root / "state")

    def lock(self) -> Lock:
        return load_lock(self.lock_path)

    def spec(self, lock: Lock | None = None) -> ImageSpec:
        return load_spec(self.spec_path, lock or self.lock())


def write_project(
    root: Path,
    bases: Mapping[str, Pinned],
    *,
    env: Mapping[str, str] | None = None,
    patches: Mapping[str, PatchPin] | None = None,
    spec_base: str = "testbase",
    spec_tail: str = "",
) -> Project:
    """A lock pinning ``bases`` by digest, container patches, and ``images/probe.toml``
    (over ``spec_base``, with every patch, ``[env]`` and then ``spec_tail``)."""
    patches = {"int64": PatchPin()} if patches is None else patches
    (root / "pins").mkdir(parents=True, exist_ok=True)
    (root / "images").mkdir(exist_ok=True)
    (root / "patches/container").mkdir(parents=True, exist_ok=True)
    lock = ["# test lock", "version = 1", "[env]", 'STACK_WIDE = "1"']
    for name, pub in bases.items():
        lock += [
            f"[bases.{name}]",
            f'repository = "{pub.repository}"',
            f'tag = "{pub.tag}"',
            f'digest = "{pub.digest}"',
        ]
    for name, pin in patches.items():
        file = root / f"patches/container/{name}.toml"
        file.write_text(pin.text)
        target = f'module = "{pin.module}"' if pin.module else f'path = "{pin.path}"'
        lock += [
            f"[container_patches.{name}]",
            f'file = "patches/container/{name}.toml"',
            f'sha256 = "{file_sha256(file)}"',
            target,
            "bases = [" + ", ".join(f'"{b}"' for b in pin.bases) + "]",
            'expects = "index_fill_ with the int32 idx_mapping"',
            'why = "test"',
        ]
    (root / LOCK).write_text("\n".join(lock) + "\n")
    spec = [
        'description = "test image"',
        f'base = "{spec_base}"',
        f'repository = "{REPOSITORY}"',
        "patches = [" + ", ".join(f'"{p}"' for p in patches) + "]",
        "[env]",
        *(f'{k} = "{v}"' for k, v in (env if env is not None else {"A": "1"}).items()),
    ]
    (root / SPEC).write_text("\n".join(spec) + "\n" + textwrap.dedent(spec_tail))
    return Project(root=root, bases=dict(bases))
