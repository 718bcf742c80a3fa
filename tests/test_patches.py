from __future__ import annotations

from pathlib import Path

import pytest

from k3env.config.patchfile import Edit, PatchFile
from k3env.errors import PatchError
from k3env.image.patches import ALREADY_PRESENT, APPLIED, apply_patch

SRC = """def postprocess_state(self, idx_mapping):
    self.num_accepted_tokens_gpu.index_fill_(0, idx_mapping, 1)
"""


def _patch(*edits: tuple[str, str]) -> PatchFile:
    return PatchFile(
        name="p",
        path=Path("patches/container/p.toml"),
        description="",
        edits=tuple(Edit(anchor=a, replacement=r) for a, r in edits),
    )


FIX = ("index_fill_(0, idx_mapping,", "index_fill_(0, idx_mapping.long(),")


def test_applies_once() -> None:
    r = apply_patch(_patch(FIX), "/m.py", SRC, image="img")
    assert r.status == APPLIED
    assert r.new_text is not None and "idx_mapping.long()" in r.new_text


def test_already_present_is_not_applied_twice() -> None:
    r1 = apply_patch(_patch(FIX), "/m.py", SRC, image="img")
    assert r1.new_text is not None
    r2 = apply_patch(_patch(FIX), "/m.py", r1.new_text, image="img")
    assert r2.status == ALREADY_PRESENT and r2.new_text is None


def test_replacement_containing_the_anchor_is_still_idempotent() -> None:
    edit = ("x = 1\n", "x = 1\ny = 2\n")
    r1 = apply_patch(_patch(edit), "/m.py", "x = 1\n", image="img")
    assert r1.new_text == "x = 1\ny = 2\n"
    r2 = apply_patch(_patch(edit), "/m.py", r1.new_text, image="img")
    assert r2.status == ALREADY_PRESENT


def test_anchor_not_found_names_patch_file_and_expectation() -> None:
    with pytest.raises(PatchError) as e:
        apply_patch(_patch(FIX), "/m.py", "def other(): pass\n", image="img")
    msg = str(e.value)
    assert "anchor not found" in msg and "patches/container/p.toml" in msg and "/m.py" in msg
    assert "upstream layout changed" in msg


def test_anchor_found_twice_names_the_lines() -> None:
    with pytest.raises(PatchError, match=r"found 2 times \(lines \[2, 3\]\)"):
        apply_patch(_patch(FIX), "/m.py", SRC + SRC.splitlines()[1] + "\n", image="img")
