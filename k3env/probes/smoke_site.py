"""``sitecustomize`` of a smoke run (in-container, standard library only): the packages the CPU
twin leaves out by design (``[twin].omit``: GPU-only kernels, CUDA builds of torchvision and
the like) are stood in for when they are imported and not installed, so a process reaches
what lies behind them. Each stand-in is reported: a stand-in is never a pass for what it
replaces, and a call into one is an error with its name.

Names come from ``K3ENV_SMOKE_ABSENT`` (comma-separated top-level packages); the first import
of each writes one line to stderr. An installed package is never replaced.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from typing import Any


class _StandIn(type):
    """Attribute access, subscripts and unions give another stand-in (enough for module-level
    names and annotations); a call is an error naming what was called."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _StandIn(f"{cls.__name__}.{name}", (), {})

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{cls.__name__} was called: it stands in for a package the twin omits")

    def __getitem__(cls, key: Any) -> Any:
        return cls

    def __or__(cls, other: Any) -> Any:
        return cls

    __ror__ = __or__


class _Module(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _StandIn(f"{self.__name__}.{name}", (), {})


def _asked_if_installed() -> bool:
    """Whether this lookup is ``importlib.util.find_spec`` (a library asking whether the
    package is installed: the answer stays no, so its own fallbacks run) rather than an
    ``import`` statement."""
    frame: types.FrameType | None = sys._getframe(2)
    for _ in range(8):
        if frame is None:
            return False
        code = frame.f_code
        if code.co_name == "find_spec" and code.co_filename.endswith("importlib/util.py"):
            return True
        frame = frame.f_back
    return False


class Absent(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, names: set[str]) -> None:
        self.names = names
        self.said: set[str] = set()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        top = fullname.split(".")[0]
        if top not in self.names or _asked_if_installed():
            return None
        if top not in self.said:
            self.said.add(top)
            print(f"[k3env smoke] {top}: not installed (the twin omits it); a stand-in answers "
                  f"its import", file=sys.stderr)  # fmt: skip
        return importlib.util.spec_from_loader(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _Module(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def install() -> None:
    wanted = {n for n in os.environ.get("K3ENV_SMOKE_ABSENT", "").split(",") if n}
    absent = {n for n in wanted if importlib.util.find_spec(n) is None}
    if absent:
        sys.meta_path.append(Absent(absent))


install()
