"""The TOML reader: files into checked values; the one place that calls ``tomllib``.

Domain modules (lock, spec, patches) walk the parsed tables through a :class:`Table`, which
records the key path for error messages and rejects keys nobody asked for.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from k3env.errors import ConfigError

T = TypeVar("T")

UNRESOLVED = "unresolved"

SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def load_toml(path: Path, error: type[ConfigError] = ConfigError) -> dict[str, Any]:
    """Parse ``path``; a syntax error names the file, line and column."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError as e:
        raise error(
            "file not found", where=str(path), fix="check the path, or create the file"
        ) from e
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise error(
            f"not valid TOML: {e}",
            where=str(path),
            fix="fix the syntax at the line and column given (see https://toml.io)",
        ) from e


class Table:
    """A parsed TOML table with its location, handing out checked values."""

    def __init__(
        self, data: dict[str, Any], *, file: Path, path: str, error: type[ConfigError]
    ) -> None:
        self.data = data
        self.file = file
        self.path = path
        self.error = error
        self._seen: set[str] = set()

    def where(self, key: str | None = None) -> str:
        dotted = ".".join(p for p in (self.path, key) if p)
        return f"{self.file}: {dotted}" if dotted else str(self.file)

    def fail(self, key: str | None, message: str, fix: str) -> ConfigError:
        return self.error(message, where=self.where(key), fix=fix)

    def keys(self) -> list[str]:
        return list(self.data)

    def has(self, key: str) -> bool:
        return key in self.data

    def _get(self, key: str, kind: type[T] | tuple[type, ...], required: bool, default: Any) -> Any:
        self._seen.add(key)
        if key not in self.data:
            if required:
                raise self.fail(key, "required key is missing", f"add `{key} = ...` here")
            return default
        value = self.data[key]
        # bool is an int in Python; a TOML `true` is never a valid int here.
        if isinstance(value, bool) and kind is not bool and kind != (bool,):
            raise self.fail(key, f"expected {_kind_name(kind)}, got a boolean", "fix the value")
        if not isinstance(value, kind):
            raise self.fail(
                key,
                f"expected {_kind_name(kind)}, got {type(value).__name__} {value!r}",
                "fix the value's type",
            )
        return value

    def string(self, key: str, *, required: bool = True, default: str | None = None) -> Any:
        return self._get(key, str, required, default)

    def integer(self, key: str, *, required: bool = True, default: int | None = None) -> Any:
        return self._get(key, int, required, default)

    def number(self, key: str, *, required: bool = True, default: float | None = None) -> float:
        value = self._get(key, (int, float), required, default)
        if value is None or value < 0:
            raise self.fail(key, f"expected a non-negative number, got {value!r}", "fix the value")
        return float(value)

    def str_list(self, key: str, *, required: bool = False) -> tuple[str, ...]:
        value = self._get(key, list, required, [])
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise self.fail(f"{key}[{i}]", f"expected a string, got {item!r}", "quote it")
        return tuple(value)

    def table(self, key: str, *, required: bool = True) -> Table:
        value = self._get(key, dict, required, {})
        return Table(value, file=self.file, path=_join(self.path, key), error=self.error)

    def tables(self, key: str) -> list[Table]:
        """An array of tables (``[[key]]``)."""
        value = self._get(key, list, False, [])
        out = []
        for i, item in enumerate(value):
            if not isinstance(item, dict):
                raise self.fail(f"{key}[{i}]", "expected a table", f"write it as [[{key}]]")
            out.append(
                Table(item, file=self.file, path=f"{_join(self.path, key)}[{i}]", error=self.error)
            )
        return out

    def matching(
        self,
        key: str,
        pattern: re.Pattern[str],
        fix: str,
        *,
        required: bool = True,
        allow_unresolved: bool = False,
    ) -> str | None:
        """A string matching ``pattern``; ``None`` for "unresolved" where allowed."""
        value = self.string(key, required=required)
        if value is None:
            return None
        if allow_unresolved and value == UNRESOLVED:
            return None
        if not pattern.match(value):
            raise self.fail(key, f"{value!r} is not a valid value here", fix)
        return str(value)

    def done(self, extra_allowed: Iterable[str] = ()) -> None:
        """Reject every key that no accessor asked for."""
        import difflib

        allowed = self._seen | set(extra_allowed)
        for key in self.data:
            if key not in allowed:
                close = difflib.get_close_matches(key, sorted(allowed), n=1)
                hint = f"did you mean `{close[0]}`?" if close else f"allowed: {sorted(allowed)}"
                raise self.fail(key, "unknown key", f"remove it or correct the spelling ({hint})")


def env_table(t: Table) -> dict[str, str]:
    """An ``[env]`` table: valid variable names, string values."""
    out = {}
    for key in t.keys():
        if not ENV_NAME_RE.match(key):
            raise t.fail(key, f"{key!r} is not a valid environment variable name", "rename it")
        out[key] = t.string(key)
    t.done()
    return out


def each_entry(table: Table, make: Callable[[str, Table], T]) -> dict[str, T]:
    """A table of named sub-tables (``[section.NAME]``), each built by ``make``."""
    out: dict[str, T] = {}
    for name in table.keys():
        if not NAME_RE.match(name):
            raise table.fail(
                name, f"name {name!r} is not valid", "use lowercase letters, digits, '.', '_', '-'"
            )
        out[name] = make(name, table.table(name))
    table.done()
    return out


def _join(a: str, b: str) -> str:
    return f"{a}.{b}" if a else b


def _kind_name(kind: type | tuple[type, ...]) -> str:
    names = {
        str: "a string",
        int: "an integer",
        bool: "a boolean",
        list: "an array",
        dict: "a table",
    }
    if isinstance(kind, tuple):
        return " or ".join(names.get(k, k.__name__) for k in kind)
    return names.get(kind, kind.__name__)
