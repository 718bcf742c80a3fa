"""One probe process's state: the report of the plan under check, and what the process learned
that later plans of its group reuse (imports, file searches, environment lookups).

A forked copy of the process (``harness.in_fork``) holds a copy of it: what the copy learns
stays there unless its answer carries it back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Plan = dict[str, Any]
Json = dict[str, Any]


def _versions() -> dict[str, Any]:
    return {"versions": {}}


@dataclass
class Report:
    """One image's verdicts, the facts they learned, and its patch targets' text."""

    results: list[Json] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=_versions)
    targets: dict[str, Any] = field(default_factory=dict)

    def record(
        self,
        check: str,
        subject: str,
        status: str,
        component: str,
        output: object = "",
        profile: str | None = None,
    ) -> None:
        versions: dict[str, Any] = self.facts["versions"]
        self.results.append(
            {
                "check": check,
                "subject": subject,
                "status": status,  # pass | fail | skip
                "component": component,
                "version": versions.get(component.split(".")[0].split(" ")[0]),
                "output": output[-4000:] if isinstance(output, str) else str(output),
                "profile": profile,
            }
        )

    def section(self, component: str) -> dict[str, Any]:
        """The facts learned about ``component`` (created empty)."""
        out: dict[str, Any] = self.facts.setdefault(component, {})
        return out

    def as_json(self) -> Json:
        return {"results": self.results, "facts": self.facts, "patch_targets": self.targets}


@dataclass
class Run:
    """The probe process: its timeout, the report being written, and its caches."""

    timeout: float = 300.0  # seconds a forked copy may take (the host's --timeout)
    report: Report = field(default_factory=Report)
    # entrypoint module -> (status, output)
    imports: dict[str, tuple[str, str]] = field(default_factory=dict)
    # What imports looked up or set in os.environ, and opened of k3env's files in /etc/k3env.
    env_lookups: set[str] = field(default_factory=set)
    env_writes: set[str] = field(default_factory=set)
    opened_k3env: list[str] = field(default_factory=list)
    untracked: list[str] = field(default_factory=list)  # imports whose lookups were not seen
    # (name, tiers as JSON) -> (the file that reads it, where it was searched)
    searched: dict[tuple[str, str], tuple[str | None, list[str]]] = field(default_factory=dict)
    tokens: dict[str, str] = field(default_factory=dict)  # names searched files mention -> file
    serve_flags: set[str] = field(default_factory=set)  # `vllm serve`'s option strings
    interpreters: dict[str, str] = field(default_factory=dict)  # env (JSON) -> interpreter state
    c_strings: dict[str, str | None] = field(default_factory=dict)  # name -> a mapped library
