"""k3env.versions without packaging at import: the fast requirement path is a subset of what
packaging accepts and names the same distribution; PEP 503 names as packaging makes them;
the lent names are packaging's own classes."""

from __future__ import annotations

import subprocess
import sys

import packaging.requirements
import packaging.utils
import packaging.version
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from k3env import versions
from k3env.config.lock import load_lock
from tests.conftest import REPO

NAME = st.from_regex(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,12}[A-Za-z0-9])?", fullmatch=True)
RELEASE = st.from_regex(r"[0-9]{1,3}(\.[0-9]{1,3}){0,3}((a|b|rc)[0-9])?(\.post[0-9])?(\.dev[0-9])?",
                        fullmatch=True)  # fmt: skip
LOCAL = st.from_regex(r"\+[a-z0-9]{1,4}(\.[a-z0-9]{1,3})?", fullmatch=True)
OPS = st.sampled_from(["==", "!=", ">=", "<=", ">", "<", "~=", "===", "=", " == "])


@st.composite
def requirement_lines(draw: st.DrawFn) -> str:
    """Lines near the fast path's edge: names, extras, clauses, locals after any operator,
    and now and then a character packaging may refuse."""
    line = draw(NAME)
    if draw(st.booleans()):
        line += "[" + ",".join(draw(st.lists(NAME, min_size=1, max_size=3))) + "]"
    for i in range(draw(st.integers(0, 3))):
        clause = draw(OPS) + draw(RELEASE)
        if draw(st.booleans()):
            clause += draw(LOCAL)
        line += ("," if i else "") + clause
    if draw(st.integers(0, 9)) == 0:
        at = draw(st.integers(0, len(line)))
        line = line[:at] + draw(st.sampled_from([" ", ";", "*", "@", "[", "]", ","])) + line[at:]
    return line


def packaging_name(line: str) -> str | None:
    try:
        return packaging.utils.canonicalize_name(packaging.requirements.Requirement(line).name)
    except packaging.requirements.InvalidRequirement:
        return None


@settings(max_examples=1500, deadline=None)
@given(requirement_lines())
def test_fast_path_is_a_subset_of_packaging(line: str) -> None:
    if versions._SIMPLE.fullmatch(line):
        assert packaging_name(line) is not None, f"fast path accepted {line!r}; packaging did not"
    assert versions.requirement_name(line) == packaging_name(line)


@pytest.mark.parametrize(
    "line",
    [
        "torch==2.13.0+cpu",
        "ai-dynamo[vllm]==1.6.1",
        "Ai_Dynamo.Runtime>=1.0,<2",
        "vllm>=0.8.5rc1.post2.dev3",
        "vllm>=1.0+cpu",  # a local label after >=: PEP 440 refuses it
        "vllm~=1",  # ~= needs two release parts
        "vllm==1.0.*",
        "vllm ; python_version > '3'",
        "-vllm==1",
        "vllm==",
        "vllm @ https://example.invalid/v.whl",
        "",
    ],
)
def test_named_lines_agree_with_packaging(line: str) -> None:
    assert versions.requirement_name(line) == packaging_name(line)


def test_every_requirement_line_of_the_lock_agrees() -> None:
    lock = load_lock(REPO / "pins/k3.lock.toml")
    assert lock.twin is not None
    lines = [*lock.twin.requires, *lock.twin.stand_ins]
    lines += [r for v in lock.variants.values() for c in v.components.values() for r in c.requires]
    assert lines, "the lock names requirement lines"
    assert all(versions.requirement_name(x) == packaging_name(x) for x in lines)


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet="aZ09-_.~ ", max_size=20))
def test_canonical_name_is_pep503(name: str) -> None:
    assert versions.canonical_name(name) == packaging.utils.canonicalize_name(name)


def test_lent_names_are_packagings_own() -> None:
    assert versions.Version is packaging.version.Version
    assert versions.InvalidVersion is packaging.version.InvalidVersion
    assert versions.InvalidRequirement is packaging.requirements.InvalidRequirement
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        _ = versions.Nothing


def test_reading_the_lock_does_not_import_the_requirement_parser() -> None:
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from k3env.config.lock import load_lock\n"
        f"load_lock(Path({str(REPO / 'pins/k3.lock.toml')!r}))\n"
        "print(sorted(m for m in sys.modules if m.startswith('packaging.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "packaging.requirements" not in out.stdout
    assert "packaging.markers" not in out.stdout
