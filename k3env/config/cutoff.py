"""The package index's cut-off: the instant a resolution may see up to (uv's ``--exclude-newer``).

A file uploaded to an index carries its upload time, and an index only ever adds files: so a
resolution that considers only files uploaded before a past instant gives the same answer on
any later day. That holds only for an instant that has *settled*: one a day or more in the past,
so that an index, its mirrors and their caches have every file uploaded before it. A cut-off in
the future, or of the last hours, freezes nothing (files still arrive before it), and is
refused.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from k3env.errors import LockError

INSTANT_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")
INSTANT_FIX = 'write a UTC instant, e.g. "2026-11-30T00:00:00Z"'
# How far in the past an instant must be before a resolution may stop at it.
SETTLE = timedelta(days=1)


def parse_instant(value: str, *, where: str) -> datetime:
    if not INSTANT_RE.match(value):
        raise LockError(f"{value!r} is not a UTC instant", where=where, fix=INSTANT_FIX)
    try:
        return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError as e:
        raise LockError(f"{value!r} is not a date: {e}", where=where, fix=INSTANT_FIX) from e


def format_instant(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def settled_cutoff(now: datetime | None = None) -> str:
    """The newest cut-off a resolution may take now: midnight (UTC) of the day ``SETTLE``
    before ``now``."""
    when = (now or datetime.now(UTC)) - SETTLE
    return format_instant(when.replace(hour=0, minute=0, second=0, microsecond=0))


def require_settled(value: str, *, where: str, now: datetime | None = None) -> str:
    """``value``, refused unless it is at least ``SETTLE`` in the past."""
    when = parse_instant(value, where=where)
    now = now or datetime.now(UTC)
    if when > now - SETTLE:
        raise LockError(
            f"the index cut-off {value} is not settled (later than "
            f"{format_instant(now - SETTLE)}): "
            "files can still be uploaded before it, so the same lock would resolve to other "
            "wheels tomorrow",
            where=where,
            fix=f"use a cut-off a day or more in the past, e.g. {settled_cutoff(now)} "
            "(`k3env twin --resolve --refresh` records that one)",
        )
    return value
