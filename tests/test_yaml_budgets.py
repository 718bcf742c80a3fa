"""The YAML reader's budgets in bytes: what a document stands for with every alias written out,
and one scalar. 95,000 aliases of one 600 KB string (under the 100,000-value limit) kept `adopt`
busy for hours and made `preflight --recipe --json` die with a MemoryError traceback."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml  # type: ignore[import-untyped]

from k3env.config import yamlread
from k3env.config.yamlread import MAX_DOCUMENT, MAX_SCALAR, load_yaml
from k3env.errors import ConfigError

from .conftest import REPO

_MEASURED = """
import resource, runpy, sys
sys.argv = ["k3env", *sys.argv[1:]]
try:
    runpy.run_module("k3env", run_name="__main__", alter_sys=True)
finally:
    print(f"maxrss_kib={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}", file=sys.stderr)
"""


def _bomb(path: Path, scalar: int, aliases: int = 95_000) -> Path:
    """``big`` a scalar of ``scalar`` bytes, ``all`` a list of ``aliases`` aliases of it: a
    file under MAX_YAML_BYTES (a flow list: 3 bytes an alias)."""
    path.write_text(f"big: &a {'x' * scalar}\nall: [{','.join(['*a'] * aliases)}]\n")
    assert path.stat().st_size < yamlread.MAX_YAML_BYTES
    return path


def measured(
    *args: str, cwd: Path = REPO, timeout: int = 120
) -> tuple[subprocess.CompletedProcess[str], int, float]:
    """``python -m k3env ARGS`` in a process of its own: (the run, its peak RSS in KiB, s)."""
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", _MEASURED, *args], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd)  # fmt: skip
    seconds = time.monotonic() - start
    done.stderr, _, rss = done.stderr.rpartition("maxrss_kib=")
    return done, int(rss), seconds


@pytest.mark.parametrize(
    ("scalar", "says"),
    [
        (600_000, f"a value of 600,000 bytes, over the {MAX_SCALAR:,} bytes one value may have"),
        (200_000, f"more than {MAX_DOCUMENT:,} bytes once its aliases are written out"),
    ],
)
def test_a_long_value_aliased_95000_times_is_refused_at_once(
    tmp_path: Path, scalar: int, says: str
) -> None:
    """The issue's file (600 KB, over the scalar budget) and one whose value passes that
    budget (200 KB: only the expanded document is over): refused in words, naming the line."""
    bomb = _bomb(tmp_path / "bomb.yaml", scalar)
    start = time.monotonic()
    with pytest.raises(ConfigError) as e:
        load_yaml(bomb)
    assert time.monotonic() - start < 10
    assert says in e.value.message
    assert str(e.value.where).startswith(f"{bomb}:")
    if scalar == 200_000:  # the alias that crossed: the n-th, 200 KB (+ 6, the keys) + n x 200 KB
        n = (MAX_DOCUMENT - 200_006) // 200_000 + 1
        assert e.value.where == f"{bomb}:2:{7 + 3 * (n - 1)}"
        assert "alias *a (of the value anchored at line 1, 1 value, 200,000 bytes" in str(e.value)


@pytest.mark.parametrize("command", [["preflight", "--json", "--recipe"], ["adopt", "--json"]])
def test_the_alias_bomb_through_the_cli_is_one_json_error_within_memory(
    tmp_path: Path, command: list[str]
) -> None:
    """`preflight --recipe --json` and `adopt --json`: exit 2, strict JSON with an "error" on
    stdout, no traceback, peak RSS under 512 MB, in seconds; adopt writes nothing."""
    out = tmp_path / "adopted.toml"
    for scalar in (600_000, 200_000):
        bomb = _bomb(tmp_path / f"bomb-{scalar}.yaml", scalar)
        args = [*command, str(bomb)] + (["--out", str(out)] if command[0] == "adopt" else [])
        done, rss, seconds = measured(*args)
        assert done.returncode == 2, (done.stdout, done.stderr)
        doc = json.loads(done.stdout, parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))
        assert doc["error"]["error"] == "ConfigError", doc
        assert doc["error"]["where"].startswith(str(bomb)), doc
        assert "Traceback" not in done.stderr, done.stderr
        assert rss < 512 << 10, rss
        assert seconds < 30, seconds
        assert not out.exists()


def test_budgets_count_every_path_a_value_is_reached_by(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An alias of a table counts the table's scalars again; an alias of an alias of a list
    multiplies (with a small budget, so the arithmetic is visible)."""
    monkeypatch.setattr(yamlread, "MAX_DOCUMENT", 100)
    doc = tmp_path / "doc.yaml"
    doc.write_text("t: &t {k: '0123456789'}\none: *t\ntwo: *t\n")  # 3 x 11 bytes + 3 keys
    assert load_yaml(doc).data["two"] == {"k": "0123456789"}
    doc.write_text("t: &t {k: '0123456789'}\n" + "".join(f"a{i}: *t\n" for i in range(8)))
    with pytest.raises(ConfigError, match="more than 100 bytes") as e:
        load_yaml(doc)
    assert e.value.where == f"{doc}:8:5"  # the 7th alias: 4 + 7 x 13 bytes > 100
    # a: 10 bytes; b: 3 x a = 30 bytes (10 values); c: 2 x b. With the keys: 1 + 10 + 1 + 30
    # + 1 + 30 = 73, and the second *b makes it 103.
    doc.write_text("a: &a [xxxxx, xxxxx]\nb: &b [*a, *a, *a]\nc: [*b, *b]\n")
    with pytest.raises(ConfigError, match=r"alias \*b .* at line 2, 10 values, 30 bytes") as e:
        load_yaml(doc)
    assert e.value.where == f"{doc}:3:9"


def test_an_alias_inside_its_own_value_is_refused_naming_it(tmp_path: Path) -> None:
    doc = tmp_path / "doc.yaml"
    doc.write_text("a: &a\n  - x\n  - *a\n")
    with pytest.raises(ConfigError, match=r"alias \*a refers to the value that contains it") as e:
        load_yaml(doc)
    assert e.value.where == f"{doc}:3:5"
    doc.write_text("a: *nowhere\n")  # an undefined alias stays PyYAML's error
    with pytest.raises(ConfigError, match="not valid YAML: found undefined alias"):
        load_yaml(doc)


def test_a_file_of_many_small_values_is_refused_without_aliases(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(yamlread, "MAX_EXPANDED", 1_000)  # 100,000 values: 3 s of PyYAML
    doc = tmp_path / "doc.yaml"
    doc.write_text("v: [" + ",".join(["1"] * 1_500) + "]\n")
    with pytest.raises(ConfigError, match="the document holds more than 1,000 values") as e:
        load_yaml(doc)
    assert e.value.where == f"{doc}:1:{5 + 2 * 999}"  # the 1,001st value: "v" is the first


def test_every_recipe_and_config_in_the_repository_still_loads() -> None:
    """Far under the budgets: each YAML file of tests/data and clusters/ reads as PyYAML
    reads it."""
    paths = sorted([*(REPO / "tests/data").rglob("*.yaml"), *(REPO / "clusters").rglob("*.yaml")])
    assert len(paths) >= 10
    for path in paths:
        try:
            expected = yaml.safe_load(path.read_text())
        except yaml.YAMLError:
            continue  # a file kept broken on purpose
        assert load_yaml(path).data == expected, path


def test_a_recipe_just_under_the_budget_is_adopted_in_seconds_within_memory(
    tmp_path: Path,
) -> None:
    """The most a document may stand for (a flag's list of 2,000 aliases of a 2 KB string:
    4 MB written out) goes through `adopt` and its TOML writer: no hang, under 512 MB."""
    recipe = (REPO / "tests/data/recipes/d.yaml").read_text()
    flag = "      served-model-name: Kimi-K3"
    assert flag in recipe
    aliases = ",".join(["*a"] * 2_000)
    near = tmp_path / "near.yaml"
    near.write_text(
        f"big: &a {'x' * 2_090}\n" + recipe.replace(flag, f"      bomb: [{aliases}]\n{flag}")
    )
    out = tmp_path / "near.toml"
    done, rss, seconds = measured("adopt", "--json", str(near), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert out.stat().st_size > 4_000_000
    assert rss < 512 << 10, rss
    assert seconds < 30, seconds
