"""k3env.jsontext: the one strict encoder (no NaN or Infinity, the same bytes as json.dumps
for finite values) and the one bounded reader (size, depth, non-finite constants, top-level
type, typed fields) of JSON someone else wrote."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from k3env import jsontext
from k3env.errors import ConfigError, StateError

NAN, INF = float("nan"), float("inf")


# --- out ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "where"),
    [
        (NAN, "$ is nan"),
        ({"images": [{"size": 1}, {"size": -INF}]}, "$.images[1].size is -inf"),
        ({"a": ({"b": [0, INF]},)}, "$.a[0].b[1] is inf"),
        ({INF: 1}, "a key of $ is inf"),
    ],
)
def test_dumps_refuses_a_non_finite_number_naming_where_it_sits(value: Any, where: str) -> None:
    with pytest.raises(jsontext.NotFinite, match=r"not a finite number|JSON has no") as e:
        jsontext.dumps(value)
    assert isinstance(e.value, ValueError)
    assert str(e.value).startswith(where), str(e.value)


def test_dumps_names_a_non_finite_number_in_a_cycle_and_ends() -> None:
    """The path search walks each container once: a list that holds itself ends it."""
    cyclic: list[Any] = [NAN]
    cyclic.append(cyclic)
    with pytest.raises(jsontext.NotFinite, match=r"^\$\[0\] is nan"):
        jsontext.dumps(cyclic)
    finite: list[Any] = [1]
    finite.append(finite)
    with pytest.raises(ValueError, match="Circular reference") as e:
        jsontext.dumps(finite)
    assert not isinstance(e.value, jsontext.NotFinite)


def test_dumps_refuses_a_non_finite_number_that_default_makes() -> None:
    with pytest.raises(jsontext.NotFinite, match="not finite"):
        jsontext.dumps({"x": object()}, default=lambda o: NAN)


DOC = {"b": [1, 2.5, None, True], "a": {"é": "ü\u2028", "z": "x\x1b"}, "c": "snow ☃"}


@pytest.mark.parametrize(
    ("ours", "stdlib"),
    [
        ({}, {"sort_keys": True}),
        ({"sort_keys": False}, {}),
        ({"compact": True}, {"sort_keys": True, "separators": (",", ":")}),
        ({"compact": True, "sort_keys": False}, {"separators": (",", ":")}),
        ({"indent": 2}, {"indent": 2, "sort_keys": True}),
        ({"indent": 1, "sort_keys": False}, {"indent": 1}),
        (
            {"compact": True, "ensure_ascii": False, "default": str},
            {"sort_keys": True, "separators": (",", ":"), "ensure_ascii": False, "default": str},
        ),
    ],
)
def test_dumps_writes_the_bytes_json_dumps_writes_for_finite_values(
    ours: dict[str, Any], stdlib: dict[str, Any]
) -> None:
    """Image configs and manifests are hashed into digests: not a byte may move."""
    doc = {**DOC, "path": object()} if "default" in ours else DOC
    assert jsontext.dumps(doc, **ours) == json.dumps(doc, **stdlib)


# --- in ----------------------------------------------------------------------------------------
def test_loads_refuses_a_10000_deep_document_without_a_recursion_error() -> None:
    deep = "[" * 10_000 + "]" * 10_000
    with pytest.raises(StateError, match="nested deeper than 64 levels") as e:
        jsontext.loads(deep, where="entry.json", expect=list)
    assert e.value.where == "entry.json"
    wrapped = '{"statement": ' + '{"a": ' * 10_000 + "1" + "}" * 10_000 + "}"
    with pytest.raises(StateError, match="nested deeper than 64 levels"):
        jsontext.loads(wrapped.encode(), where="statement.json")


def test_loads_refuses_a_document_deeper_than_its_budget_that_python_can_parse() -> None:
    doc = "[" * 100 + "]" * 100
    with pytest.raises(StateError, match="nested 100 levels deep, over the limit of 64"):
        jsontext.loads(doc, where="x", expect=list)
    assert jsontext.loads(doc, where="x", expect=list, max_depth=100) is not None
    assert jsontext.depth({"a": [1, {"b": []}]}) == 4 and jsontext.depth(7) == 0


@pytest.mark.parametrize(
    "text",
    ['{"size": NaN}', '{"size": Infinity}', "[1, -Infinity]", '{"size": 1e999}', "-1e400"],
)
def test_loads_refuses_a_non_finite_number(text: str) -> None:
    with pytest.raises(StateError, match="not strict JSON") as e:
        jsontext.loads(text, where="entry.json", expect=object)
    assert "entry.json: not strict JSON" in e.value.render()


def test_loads_refuses_a_document_over_its_size_before_parsing_it() -> None:
    with pytest.raises(StateError, match="17 bytes of JSON, over the limit of 16 for it; not read"):
        jsontext.loads(b"not json at all!!", where="sbom.json", limit=16)
    assert jsontext.loads(b'{"a": "0123456"}', where="sbom.json", limit=16) == {"a": "0123456"}
    with pytest.raises(StateError, match="over the limit"):
        jsontext.loads(b" " * (jsontext.MAX_BYTES + 1), where="big.json")


@pytest.mark.parametrize(
    ("text", "expect", "said"),
    [
        ("[]", dict, "a JSON array where a JSON object belongs"),
        ('"x"', dict, "a JSON string where a JSON object belongs"),
        ("{}", list, "a JSON object where a JSON array belongs"),
        ("null", dict, "a JSON null where a JSON object belongs"),
    ],
)
def test_loads_refuses_the_wrong_top_level_type(text: str, expect: type, said: str) -> None:
    with pytest.raises(StateError, match=said):
        jsontext.loads(text, where="x", expect=expect)


def test_loads_raises_the_error_it_is_given_and_says_not_json() -> None:
    with pytest.raises(ConfigError, match="not JSON") as e:
        jsontext.loads(b"{", where="provenance.json", error=ConfigError, fix="write it again")
    assert e.value.fix == "write it again" and e.value.return_code == 2
    with pytest.raises(StateError, match="not JSON"):
        jsontext.loads(b"\xff\xfe{", where="x")  # not UTF-8
    assert jsontext.loads('{"a": [1, 2.5, null]}', where="x") == {"a": [1, 2.5, None]}


# --- fields ------------------------------------------------------------------------------------
def test_field_checks_a_keys_type_and_a_bool_is_not_an_int() -> None:
    doc = {"n": 3, "flag": True, "ratio": 2, "name": "x", "none": None}
    assert jsontext.field(doc, "n", int, where="e") == 3
    assert jsontext.field(doc, "flag", bool, where="e") is True
    ratio = jsontext.field(doc, "ratio", float, where="e")
    assert ratio == 2.0 and isinstance(ratio, float)
    assert jsontext.field(doc, "none", (str, type(None)), where="e") is None
    with pytest.raises(StateError, match="'flag' is a JSON boolean, not an integer") as e:
        jsontext.field(doc, "flag", int, where="entry.json")
    assert e.value.where == "entry.json"
    with pytest.raises(StateError, match="'flag' is a JSON boolean, not a number"):
        jsontext.field(doc, "flag", float, where="e")
    with pytest.raises(StateError, match="'name' is a JSON string, not an integer or null"):
        jsontext.field(doc, "name", (int, type(None)), where="e")
    with pytest.raises(StateError, match="'n' is a JSON integer, not a string"):
        jsontext.field(doc, "n", str, where="e")


def test_field_names_a_missing_key_unless_it_has_a_default() -> None:
    with pytest.raises(ConfigError, match="'size' is missing") as e:
        jsontext.field({}, "size", int, where="index.json", error=ConfigError)
    assert e.value.where == "index.json"
    assert jsontext.field({}, "size", int, where="x", default=0) == 0
    assert jsontext.field({}, "size", int, where="x", default=None) is None
    assert math.isclose(jsontext.field({"r": 0.5}, "r", float, where="x"), 0.5)


@pytest.mark.parametrize(
    "text", ["[" * 10_000 + "]" * 10_000, '{"a": NaN}', "[1e999]", "{", '"x"' + " " * 100]
)
def test_parse_answers_every_bad_document_with_a_value_error(text: str) -> None:
    """What a process others made prints (a probe's verdict, srt-slurm's validation) is read
    by callers that catch ValueError: a deep one is no RecursionError, a NaN no number."""
    if text.startswith('"x"'):
        assert jsontext.parse(text) == "x"
        with pytest.raises(ValueError, match="over the limit"):
            jsontext.parse(text, limit=10)
        return
    with pytest.raises(ValueError):
        jsontext.parse(text)
