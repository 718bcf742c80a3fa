"""What the image has installed: the components' versions against the lock, every
distribution with its requirements, and the interpreter's PEP 508 marker variables (the host
evaluates the requirements)."""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import sys
from typing import Any

from .harness import START_PATH
from .session import Plan, Run


def distribution(dist: str) -> md.Distribution | None:
    """The distribution ``dist`` as the image's Python finds it on start, or None."""
    return next(iter(md.distributions(name=dist, path=START_PATH)), None)


def version_of(dist: str) -> str | None:
    found = distribution(dist)
    return found.version if found is not None else None


def marker_environment() -> dict[str, str]:
    """The PEP 508 marker variables of this interpreter."""
    impl = sys.implementation.version
    impl_version = f"{impl.major}.{impl.minor}.{impl.micro}"
    if impl.releaselevel != "final":
        impl_version += impl.releaselevel[0] + str(impl.serial)
    return {
        "implementation_name": sys.implementation.name,
        "implementation_version": impl_version,
        "os_name": os.name,
        "platform_machine": platform.machine(),
        "platform_release": platform.release(),
        "platform_system": platform.system(),
        "platform_version": platform.version(),
        "python_full_version": platform.python_version(),
        "platform_python_implementation": platform.python_implementation(),
        "python_version": ".".join(platform.python_version_tuple()[:2]),
        "sys_platform": sys.platform,
    }


def installed_distributions() -> list[dict[str, Any]]:
    """Every distribution on sys.path, with its Requires-Dist and where its metadata is."""
    out = []
    for d in md.distributions(path=START_PATH):
        name = d.metadata["Name"]
        if not name:
            continue
        where = getattr(d, "_path", None)
        out.append(
            {
                "name": name,
                "version": d.version,
                "requires": list(d.requires or []),
                "path": str(where) if where else None,
            }
        )
    return sorted(out, key=lambda d: (str(d["name"]).lower(), d["path"] or ""))


def check_versions(run: Run, plan: Plan) -> None:
    report = run.report
    versions: dict[str, Any] = report.facts["versions"]
    for component, dist in sorted(plan["components"].items()):
        versions[component] = version_of(dist)
    report.facts["distributions"] = installed_distributions()
    report.facts["marker_environment"] = marker_environment()
    for component, expected in sorted(plan.get("versions", {}).items()):
        actual = versions.get(component)
        if expected is None:
            report.record(
                "versions", component, "skip", component, f"installed {actual}; lock pins none"
            )
        elif actual == expected:
            report.record("versions", component, "pass", component, f"{actual}")
        else:
            report.record(
                "versions", component, "fail", component, f"installed {actual}, lock {expected}"
            )
