"""Container patch files (``patches/container/NAME.toml``): ordered anchored edits::

    [[edits]]
    anchor = "exact text that must occur exactly once in the target"
    replacement = "what it becomes"

Parsing only; ``image.patches`` applies them and says whether they are present.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from k3env.config.pins import ContainerPatchPin
from k3env.config.reader import Table, load_toml
from k3env.errors import SpecError


@dataclass(frozen=True, kw_only=True)
class Edit:
    anchor: str
    replacement: str


@dataclass(frozen=True, kw_only=True)
class PatchFile:
    name: str
    path: Path
    description: str
    edits: tuple[Edit, ...]


def load_patch_file(pin: ContainerPatchPin, path: Path) -> PatchFile:
    t = Table(load_toml(path, SpecError), file=path, path="", error=SpecError)
    edits = []
    for e in t.tables("edits"):
        anchor = e.text("anchor")
        replacement = e.text("replacement")
        if not anchor:
            raise e.fail("anchor", "empty anchor", "write the exact text the edit replaces")
        if anchor == replacement:
            raise e.fail("replacement", "replacement equals the anchor", "this edit does nothing")
        edits.append(Edit(anchor=anchor, replacement=replacement))
        e.done()
    if not edits:
        raise t.fail("edits", "a patch needs at least one [[edits]] entry", "add [[edits]]")
    pf = PatchFile(
        name=pin.name,
        path=path,
        description=t.string("description", required=False, default=""),
        edits=tuple(edits),
    )
    t.done()
    return pf
