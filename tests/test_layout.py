"""The layout check (scripts/check_layout.py): k3env passes it, and it fails on what it forbids."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from .conftest import REPO


def _checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_layout", REPO / "scripts/check_layout.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_layout"] = module
    spec.loader.exec_module(module)
    return module


def _package(root: Path, files: dict[str, str]) -> Path:
    pkg = root / "k3env"
    for rel, text in files.items():
        path = pkg / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return pkg


def test_k3env_has_no_cycle_and_its_layers_hold() -> None:
    assert _checker().check(REPO / "k3env") == []


def test_a_cycle_is_found_even_through_a_lazy_import(tmp_path: Path) -> None:
    pkg = _package(
        tmp_path,
        {
            "__init__.py": '"""x"""\n',
            "image/__init__.py": '"""x"""\n',
            "image/build.py": '"""x"""\nfrom k3env.image.twin import twin_base\n',
            "image/twin.py": '"""x"""\ndef f():\n    from k3env.image import build\n',
        },
    )
    problems = _checker().check(pkg)
    assert problems == ["import cycle: k3env.image.build -> k3env.image.twin -> k3env.image.build"]


def test_an_upward_import_a_second_owner_and_a_missing_docstring_are_named(
    tmp_path: Path,
) -> None:
    pkg = _package(
        tmp_path,
        {
            "__init__.py": '"""x"""\n',
            "config/__init__.py": '"""x"""\n',
            "config/lock.py": '"""x"""\nimport tomlkit\nfrom k3env.checks import verify\n',
            "checks/__init__.py": '"""x"""\n',
            "checks/verify.py": "import json\n",
        },
    )
    problems = _checker().check(pkg)
    assert any("config module imports k3env.checks.verify (checks)" in p for p in problems)
    assert any(p.startswith("tomlkit imported by ['k3env.config.lock']") for p in problems)
    assert any(
        p.endswith("verify.py: no module docstring (say the module's one job)") for p in problems
    )


def test_json_emitted_outside_jsontext_is_named_but_probes_may(tmp_path: Path) -> None:
    """Every JSON document goes through the one strict encoder: json.dumps / json.dump under
    any name is refused outside jsontext.py; json.loads and the probes (stdlib only) are not."""
    pkg = _package(
        tmp_path,
        {
            "__init__.py": '"""x"""\n',
            "jsontext.py": '"""x"""\nimport json\nOUT = json.dumps(1)\n',
            "state.py": '"""x"""\nimport json\nA = json.loads("1")\nB = json.dumps(A)\n',
            "signing.py": '"""x"""\nimport json as j\n\ndef f(x, fp):\n    j.dump(x, fp)\n',
            "hashing.py": '"""x"""\nfrom json import dumps as d\nC = d(2)\n',
            "probes/__init__.py": '"""x"""\n',
            "probes/facts.py": '"""x"""\nimport json\nD = json.dumps({})\n',
        },
    )
    problems = _checker().check(pkg)
    named = sorted(p.split(": json.dumps")[0].removeprefix(f"{pkg}/") for p in problems)
    assert named == ["hashing.py:3", "signing.py:5", "state.py:4"], problems
    assert all("emit JSON through k3env.jsontext.dumps" in p for p in problems)


def test_no_function_is_over_80_lines() -> None:
    """#23's rule, held by a test: the long ones crept back in twice."""
    import ast

    long = []
    for root in ("k3env", "benchmarks", "scripts", "tests"):
        for path in sorted((REPO / root).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = (node.end_lineno or node.lineno) - node.lineno + 1
                    if lines > 80:
                        long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} {lines}")
    assert not long, long
