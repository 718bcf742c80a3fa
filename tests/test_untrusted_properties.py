"""Properties of the code that turns what others made into data (hypothesis, derandomized:
CI sees the same corpus every run). Each property is one promise of the untrusted-input
surfaces: a value k3env writes into YAML reads back as that value and adds no key; a comment
stays one line; a tag pattern k3env accepts cannot backtrack for long; a pinned path that
passes the check stays under the repository; a tree path never climbs out; an auth file of
any shape is skipped, never a traceback; tags outside the OCI grammar are never offered."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from k3env import untrusted
from k3env.config.shapes import is_normal_relative_path
from k3env.config.tagpattern import UnsafePattern, compile_tag_pattern
from k3env.engine import credentials
from k3env.engine.registry import TAG
from k3env.errors import UntrustedFileError
from k3env.quoting import one_line, yaml_scalar, yaml_string

PROPERTY = settings(
    max_examples=300, derandomize=True, deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)  # fmt: skip
# Any text: YAML forbids some characters raw (C0/C1 controls, line separators), which the
# serializer escapes.
TEXT = st.text(max_size=60)


@PROPERTY
@given(key=TEXT, value=TEXT)
def test_a_written_key_and_value_read_back_as_themselves_and_add_no_key(
    key: str, value: str
) -> None:
    document = f"name: {yaml_scalar('k3env')}\n{yaml_string(key)}: {yaml_scalar(value)}\n"
    loaded = yaml.safe_load(document)
    assert loaded == {"name": "k3env", key: value} if key != "name" else loaded == {"name": value}


@PROPERTY
@given(
    value=st.recursive(
        st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | TEXT
        | st.floats(allow_nan=False),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
        max_leaves=12,
    )
)  # fmt: skip
def test_any_value_round_trips_through_the_flow_serializer(value: Any) -> None:
    assert yaml.safe_load(f"v: {yaml_scalar(value)}\n") == {"v": value}


@PROPERTY
@given(text=st.text(max_size=80))
def test_a_comment_stays_one_line(text: str) -> None:
    line = one_line(text)
    assert len(line.splitlines()) <= 1
    assert yaml.safe_load(f"# {line}\nkey: 1\n") == {"key": 1}


# Patterns drawn from the pieces tag patterns are made of, nested quantifiers included.
ATOMS = st.sampled_from(["a", "[0-9]", r"\.", "v", "[a-z]+", r"\d", ".", "(a|aa)", "(a+)"])
QUANT = st.sampled_from(["", "*", "+", "?", "{1,3}"])


@st.composite
def patterns(draw: st.DrawFn, depth: int = 0) -> str:
    parts = []
    for _ in range(draw(st.integers(1, 4))):
        if depth < 2 and draw(st.booleans()):
            atom = "(" + draw(patterns(depth + 1)) + ")"
        else:
            atom = draw(ATOMS)
        parts.append(atom + draw(QUANT))
    return "".join(parts)


ADVERSARIAL = ["a" * 128, "a" * 127 + "!", "1" * 64 + "." * 63 + "x", "v" + "a." * 63 + "!"]


@settings(max_examples=300, derandomize=True, deadline=None)
@given(body=patterns())
def test_an_accepted_tag_pattern_never_backtracks_for_long(body: str) -> None:
    pattern = f"^{body}$"
    try:
        compiled = compile_tag_pattern(pattern)
    except UnsafePattern:
        return
    for tag in ADVERSARIAL:
        start = time.monotonic()
        compiled.fullmatch(tag)
        assert time.monotonic() - start < 2, (pattern, tag)  # exponential would be hours


@PROPERTY
@given(path=st.lists(st.sampled_from(["a", "b", "..", ".", "", "c.txt", "~", "/"]), max_size=6))
def test_a_pinned_path_that_passes_stays_under_the_repository(path: list[str]) -> None:
    text = "/".join(path)
    if not is_normal_relative_path(text):
        return
    root = Path("/repo")
    assert os.path.normpath(root / text).startswith("/repo/")
    assert ".." not in Path(text).parts and not text.startswith("/")


@PROPERTY
@given(path=st.lists(st.sampled_from(["a", "..", ".", "", "b", "\x00"]), min_size=1, max_size=5))
def test_a_tree_path_never_leaves_the_tree(tmp_path: Path, path: list[str]) -> None:
    tree = tmp_path / "tree"
    (tree / "a").mkdir(parents=True, exist_ok=True)
    (tree / "a/b").write_text("inside")
    (tmp_path / "b").write_text("OUTSIDE")
    try:
        data = untrusted.read_bytes(tree, "/".join(path))
    except UntrustedFileError:
        return
    assert data in (None, b"inside")


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner,
                                                               max_size=3),
    max_leaves=10,
)  # fmt: skip


@PROPERTY
@given(
    document=st.one_of(
        JSON,
        st.fixed_dictionaries({"auths": st.dictionaries(st.just("reg.example:5000"), JSON)}),
        st.fixed_dictionaries({"auths": st.just({"reg.example:5000": {"auth": st.text()}})}),
    )
)
def test_an_auth_file_of_any_shape_is_read_or_skipped_never_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, document: Any
) -> None:
    for name in ("REGISTRY_AUTH_FILE", "XDG_RUNTIME_DIR", "DOCKER_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("PATH", "/nonexistent")  # no credential helper runs
    (tmp_path / ".docker").mkdir(exist_ok=True)
    (tmp_path / ".docker/config.json").write_text(json.dumps(document, default=str))
    found = credentials.lookup("reg.example:5000")
    assert found is None or (found.username and found.secret and "secret" not in repr(found))


@PROPERTY
@given(tag=st.text(max_size=140))
def test_a_tag_in_the_grammar_has_no_space_and_fits(tag: str) -> None:
    if TAG.fullmatch(tag):
        assert len(tag) <= 128 and not any(c.isspace() for c in tag)
        assert tag[0] not in ".-" and tag.isascii()
