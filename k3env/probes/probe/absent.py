"""Importing past a module that is not installed: when an import fails on a top-level package
the image does not have, that package is stood in for and the import goes on, to report the
first real incompatibility behind it."""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import traceback
from collections.abc import Iterable, Iterator, Sequence
from types import ModuleType
from typing import Any

from .harness import captured


class _StandInMeta(type):
    """A stand-in for anything an absent module would have held: attribute access, calls,
    subscripts and unions give another stand-in, so an import can go on past it."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _stand_in(f"{cls.__name__}.{name}")

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return cls

    def __getitem__(cls, key: Any) -> Any:
        return cls

    def __or__(cls, other: Any) -> Any:
        return cls

    __ror__ = __or__

    def __iter__(cls) -> Iterator[Any]:
        return iter(())


def _stand_in(name: str) -> _StandInMeta:
    return _StandInMeta(name, (), {})


class _StandInModule(ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _stand_in(f"{self.__name__}.{name}")


class AbsentModules:
    """A meta-path finder of last resort for top-level packages that are not installed:
    each becomes an empty stand-in package, so an import reaches what lies behind it."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] not in self.names:
            return None
        return importlib.util.spec_from_loader(fullname, self, is_package=True)  # type: ignore[arg-type]

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = _StandInModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: ModuleType) -> None:
        pass


def absent_top(error: BaseException) -> str | None:
    """The top-level package an import failed on, when it is not installed at all."""
    if not isinstance(error, ModuleNotFoundError):
        return None
    top = (error.name or "").split(".")[0]
    return top if top and importlib.util.find_spec(top) is None else None


def import_past_absent(module: str, absent_by_design: Iterable[str] = ()) -> tuple[str, str]:
    """Import ``module``; when it fails on a top-level package that is not installed, say so,
    stand that package in and go on, to report the first real incompatibility behind it.
    Returns (status, output)."""
    finder = AbsentModules()
    notes: list[str] = []
    sys.meta_path.append(finder)
    try:
        error, output = _import_standing_in(module, finder, notes)
    finally:
        sys.meta_path.remove(finder)
    absent = sorted(finder.names)
    if error is None and not absent:
        return "pass", ""
    out = []
    if absent:
        out.append(
            f"not installed in the image: {', '.join(absent)} (first symptom below); "
            "with a stand-in for it the import went on"
        )
        out.append(notes[0])
    if error is not None:
        out.append(("behind it, the first real incompatibility:\n" if absent else "") + output)
        return "fail", "\n".join(out)
    if set(absent) <= set(absent_by_design):
        out.append(
            "nothing else is missing: the import completes with stand-ins for modules the CPU "
            "twin leaves out by design ([twin].omit); the GPU image must carry them"
        )
        return "pass", "\n".join(out)
    out.append("nothing else is missing behind them")
    return "fail", "\n".join(out)


def _import_standing_in(
    module: str, finder: AbsentModules, notes: list[str]
) -> tuple[BaseException | None, str]:
    """Import ``module`` again after each absent top-level package it fails on is stood in
    (at most 20): the last error, if any, and its output."""
    error: BaseException | None = None
    output = ""
    for _ in range(20):
        with captured() as buf:
            try:
                importlib.import_module(module)
                error = None
            except SystemExit as e:
                error = e
                print(f"[exit {e.code}]")
            except BaseException as e:
                error = e
                traceback.print_exc(limit=-6)
        output = buf.getvalue()
        if error is None:
            break
        top = absent_top(error)
        # Never the module under check itself: its absence is the answer.
        if top and top not in finder.names and top != module.split(".")[0]:
            finder.names.add(top)
            notes.append(output.rstrip())
            continue
        break
    return error, output
