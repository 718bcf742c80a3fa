"""Where a build is recorded: by the hash of (lock, spec, base kind), so preflight and
``srt recipe`` find the image this very lock and spec built (and the facts verify learned
about it) without importing the builder."""

from __future__ import annotations

from typing import Any

from k3env.config.pins import Lock
from k3env.config.shapes import DEFAULT_PLATFORM
from k3env.config.spec import ImageSpec
from k3env.hashing import canonical_sha256
from k3env.state import State


def build_key(lock: Lock, spec: ImageSpec, twin: bool, platform: str = DEFAULT_PLATFORM) -> str:
    """What a build record is keyed by: the lock's and the spec's content, the base kind and
    (other than the default) the platform. Another checkout with another lock never finds
    this image's record."""
    on = {} if platform == DEFAULT_PLATFORM else {"platform": platform}
    return canonical_sha256({"lock": lock.sha256, "spec": spec.sha256, "twin": twin, **on})


def last_build(
    state: State, lock: Lock, spec: ImageSpec, platform: str = DEFAULT_PLATFORM
) -> dict[str, Any] | None:
    """The recorded build of ``spec`` under ``lock``: over the real base if there is one,
    else over the CPU twin; ``None`` when neither was built from this lock and spec."""
    for twin in (False, True):
        record = state.read_record("builds", build_key(lock, spec, twin, platform))
        if isinstance(record, dict) and record.get("image_id"):
            return record
    return None
