"""Container patches: anchored edits applied to one file of the base image at build time.

A patch file (``patches/container/NAME.toml``) holds ordered edits::

    [[edits]]
    anchor = "exact text that must occur exactly once in the target"
    replacement = "what it becomes"

Per edit: the replacement already present (and the anchor gone) means the fix is there
already (upstream, or an earlier build): nothing is applied twice. An anchor found once is
replaced. An anchor found zero or several times means the upstream layout changed: the build
refuses, naming the patch, the file and what differs. Pure text in, text out: reading and
writing the image is the builder's job.
"""

from __future__ import annotations

from dataclasses import dataclass

from k3env.config.patchfile import Edit, PatchFile
from k3env.errors import PatchError

APPLIED = "applied"
ALREADY_PRESENT = "already-present"
SKIPPED = "skipped"

# Where one edit stands in a file (edit_state).
PRESENT = "present"
FRESH = "fresh"
ABSENT = "absent"
AMBIGUOUS = "ambiguous"


@dataclass(frozen=True, kw_only=True)
class PatchResult:
    name: str
    target: str  # path in the image
    status: str  # applied | already-present | skipped
    detail: str
    new_text: str | None  # None unless applied


def _lines_of(text: str, needle: str) -> list[int]:
    lines = []
    start = 0
    while (i := text.find(needle, start)) != -1:
        lines.append(text.count("\n", 0, i) + 1)
        start = i + 1
    return lines


def edit_state(edit: Edit, text: str) -> tuple[str, list[int]]:
    """Where one edit stands in ``text``: ``present`` (the replacement is there and no fresh
    anchor is left), ``fresh`` (the anchor occurs once: it can be applied), ``absent`` (neither
    anchor nor replacement), or ``ambiguous`` (the anchor occurs several times); with the
    lines of the anchor. The one definition of "this patch is present", for the builder,
    ``k3env verify`` and ``k3env export --check`` alike."""
    anchor_at = _lines_of(text, edit.anchor)
    done_at = _lines_of(text, edit.replacement)
    # An anchor inside the replacement is not a fresh match.
    fresh = len(anchor_at) - len(done_at) * edit.replacement.count(edit.anchor)
    if done_at and fresh <= 0:
        return PRESENT, anchor_at
    if fresh == 1 and len(anchor_at) == 1:
        return FRESH, anchor_at
    if not anchor_at:
        return ABSENT, anchor_at
    return AMBIGUOUS, anchor_at


def missing_edits(patch: PatchFile, text: str) -> list[str]:
    """Why ``patch`` is not fully present in ``text`` (empty: every edit is there)."""
    out = []
    for n, edit in enumerate(patch.edits, start=1):
        state, at = edit_state(edit, text)
        if state == FRESH:
            out.append(f"edit {n}: not applied (its anchor is still at line {at[0]})")
        elif state == ABSENT:
            out.append(f"edit {n}: neither the replacement nor the anchor is there")
        elif state == AMBIGUOUS:
            out.append(f"edit {n}: anchor found {len(at)} times (lines {at}), replacement absent")
    return out


def apply_patch(patch: PatchFile, target: str, text: str, *, image: str) -> PatchResult:
    """Apply every edit of ``patch`` to ``text`` (the content of ``target`` in ``image``)."""
    where = f"container patch {patch.name} ({patch.path}) on {target} in {image}"
    applied = 0
    present = 0
    for n, edit in enumerate(patch.edits, start=1):
        state, anchor_at = edit_state(edit, text)
        if state == PRESENT:
            present += 1
            continue
        if state == FRESH:
            text = text.replace(edit.anchor, edit.replacement, 1)
            applied += 1
            continue
        first_line = edit.anchor.strip().splitlines()[0] if edit.anchor.strip() else edit.anchor
        if state == ABSENT:
            raise PatchError(
                f"edit {n}: anchor not found, and the replacement is not there either: "
                f"the file does not look as the patch expects (expected a line like "
                f"{first_line!r})",
                where=where,
                fix=(
                    "the upstream layout changed: compare the file in the image with the patch, "
                    "then update the anchor (and `k3env lock --update-hashes`) or drop the patch"
                ),
            )
        raise PatchError(
            f"edit {n}: anchor found {len(anchor_at)} times (lines {anchor_at}); it must match "
            "exactly once",
            where=where,
            fix="make the anchor longer so that it matches one place only",
        )
    if applied == 0:
        return PatchResult(
            name=patch.name,
            target=target,
            status=ALREADY_PRESENT,
            detail=f"all {present} edit(s) already present: not applied twice",
            new_text=None,
        )
    detail = f"{applied} edit(s) applied" + (f", {present} already present" if present else "")
    return PatchResult(name=patch.name, target=target, status=APPLIED, detail=detail, new_text=text)
