"""Preflight: check serve profiles against rules before any GPU is allocated.

Pipeline: load lock + specs + cluster -> build one Context per (image, profile) -> run every
rule -> findings, sorted, one line each. No engine; well under a second for all of images/.
Facts that ``k3env verify`` learned about an image (cached by image ID) sharpen rules whose
truth depends on what is inside the image; preflight says which facts it lacked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from k3env.checks.argv import ParsedCommand, parse_options
from k3env.checks.engine_cli import EngineCli
from k3env.config.cluster import Cluster
from k3env.config.pins import Lock
from k3env.config.shapes import DEFAULT_PLATFORM
from k3env.config.spec import ImageSpec, ServeProfile
from k3env.config.srtrecipe import JobShape
from k3env.image.envpolicy import merged_env
from k3env.image.records import Facts, last_build, read
from k3env.quoting import one_line
from k3env.state import State

ERROR = "error"
WARNING = "warning"
ENGINE_ROLES = ("vllm-serve", "dynamo-worker")


@dataclass(frozen=True, kw_only=True)
class NotChecked:
    """What a rule would have checked and could not here, and why: listed, never passed."""

    rule: str
    what: str
    why: str

    def text(self) -> str:
        return f"{self.rule}: not checked: {self.what}: {self.why}"

    def as_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(kw_only=True)
class Context:
    spec: ImageSpec
    profile: ServeProfile
    lock: Lock
    cluster: Cluster
    env: Mapping[str, str]
    facts: Mapping[str, Any] | None
    commands: tuple[ParsedCommand, ...]
    facts_source: str | None = None
    lacked: set[str] = field(default_factory=set)
    # Where a command's findings point, when the profile was read from a file other than a
    # spec (an srt-slurm recipe: its engine flags' key); default: the spec's argv key.
    command_key: Callable[[ParsedCommand], str] | None = None
    # The environment the benchmark client runs with, where it is not the engine's (an
    # srt-slurm recipe: the image's env and the top-level `environment` only), and the key
    # that sets a variable of it; default: the engine's env, a spec's `env.NAME`.
    client_env: Mapping[str, str] | None = None
    client_env_key: Callable[[str], str] | None = None
    # A script the job runs at every start that k3env cannot see into (an srt-slurm
    # recipe's setup_script): what it may change is said, never assumed either way.
    setup_script: str | None = None
    # False: the image's base is not known (an image k3env cannot place): no rule judges
    # what the base carries.
    base_known: bool = True
    # What an srt-slurm recipe asks of Slurm (nodes, GPUs, each role's parallel sizes) and its
    # frontend type; None for a spec's profile (the cluster profile is all there is).
    job: JobShape | None = None
    frontend_type: str | None = None
    # `vllm serve`'s own parser as k3env has it for this image (verify's facts, or the
    # recorded parser of the release the lock's twin pins), else why there is none.
    engine_cli: EngineCli | None = None
    engine_cli_why: str = "no recorded parser of this image's vLLM"
    # The rule being run (set by ``run_rules``), and what each rule could not check.
    rule: str = ""
    not_checked: list[NotChecked] = field(default_factory=list)
    lacked_by: dict[str, set[str]] = field(default_factory=dict)

    def unchecked(self, what: str, why: str) -> None:
        """Say that the running rule could not check ``what``, and why."""
        self.not_checked.append(NotChecked(rule=self.rule or "(rule)", what=what, why=why))

    @property
    def bench_env(self) -> Mapping[str, str]:
        return self.env if self.client_env is None else self.client_env

    def bench_key(self, name: str) -> str:
        return f"env.{name}" if self.client_env_key is None else self.client_env_key(name)

    def engine_commands(self) -> list[ParsedCommand]:
        return [c for c in self.commands if c.role in ENGINE_ROLES]

    def roles(self) -> set[str]:
        return {c.role for c in self.commands}

    def key(self, command: ParsedCommand) -> str:
        if self.command_key is not None:
            return self.command_key(command)
        return f"profiles.{self.profile.name}.commands[{command.index}].argv"

    def fact(self, *path: str, lacking: str) -> Any:
        """A fact verify learned about the image, or ``None`` (and the lack is recorded)."""
        node: Any = self.facts
        for p in path:
            if not isinstance(node, Mapping) or p not in node:
                self.lacked.add(lacking)
                self.lacked_by.setdefault(self.rule or "(rule)", set()).add(lacking)
                return None
            node = node[p]
        return node


@dataclass(frozen=True, kw_only=True)
class Hit:
    key: str
    message: str
    severity: str | None = None
    fix: str | None = None
    file: str | None = None


class Rule(Protocol):
    """What the runner needs of a rule (``rules.RULES`` holds them, passed in by the CLI)."""

    @property
    def id(self) -> str: ...
    @property
    def severity(self) -> str: ...
    @property
    def fix(self) -> str: ...
    @property
    def check(self) -> Callable[[Context], Iterable[Hit]]: ...
    def applies(self, ctx: Context) -> bool: ...


@dataclass(frozen=True, kw_only=True)
class Finding:
    """One rule's finding, on a spec's key or a recipe's (``line``: where the file says it,
    when k3env read the file itself). The one finding type of preflight and of recipes."""

    rule: str
    severity: str
    image: str
    profile: str
    file: str
    key: str
    message: str
    fix: str
    line: int | None = None

    def text(self) -> str:
        """Two lines for a person; a recipe's key or value in them is escaped (no line or
        escape sequence of its own)."""
        at = f"{self.file}:{self.line}" if self.line else self.file
        said = f"{at}: {self.key}: {self.rule} {self.severity}: {self.message}"
        return f"{one_line(said)}\n    fix: {one_line(self.fix)}"

    def as_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True, kw_only=True)
class Report:
    findings: tuple[Finding, ...]
    checked: tuple[str, ...]  # image/profile pairs
    lacked: Mapping[str, tuple[str, ...]]  # image/profile -> facts the rules did not have
    rules: int
    facts_from: Mapping[str, str] = field(default_factory=dict)  # image/profile -> image
    # image/profile -> what each rule could not check there, and why
    not_checked: Mapping[str, tuple[NotChecked, ...]] = field(default_factory=dict)

    @property
    def errors(self) -> int:
        return sum(f.severity == ERROR for f in self.findings)

    @property
    def warnings(self) -> int:
        return sum(f.severity == WARNING for f in self.findings)

    def as_json(self) -> dict[str, Any]:
        return {
            "findings": [f.as_json() for f in self.findings],
            "checked": list(self.checked),
            "lacked_facts": {k: list(v) for k, v in self.lacked.items()},
            "facts_from": dict(self.facts_from),
            "not_checked": {k: [n.as_json() for n in v] for k, v in self.not_checked.items()},
            "rules": self.rules,
            "errors": self.errors,
            "warnings": self.warnings,
        }


def load_facts(
    state: State, lock: Lock, spec: ImageSpec, platform: str = DEFAULT_PLATFORM
) -> tuple[Mapping[str, Any] | None, str | None]:
    """Facts verify cached for the image built from ``spec`` under this very ``lock`` for
    ``platform`` (by image ID), and which image that was (a CPU-twin build answers for the
    twin's versions, not the GPU image's). Never facts of an image another lock built, nor
    of another platform's image."""
    build = last_build(state, lock, spec, platform)
    if not build:
        return None, None
    facts = read(state, Facts, build.image_id)
    if facts is None:
        return None, None
    twin = ", built over the CPU twin" if build.twin else ""
    return facts.facts, f"{build.reference} ({platform}{twin})"


def contexts(
    lock: Lock, specs: Iterable[ImageSpec], cluster: Cluster, state: State | None
) -> list[Context]:
    from k3env.checks.engine_record import cli_for

    out = []
    for spec in specs:
        facts, source = load_facts(state, lock, spec, cluster.platform) if state else (None, None)
        env = merged_env(lock, spec)
        cli = cli_for(lock, spec.base, cluster.platform, facts, source)
        for profile in spec.profiles.values():
            commands = tuple(
                ParsedCommand(role=c.role, index=i, argv=c.argv, options=parse_options(c.argv))
                for i, c in enumerate(profile.commands)
            )
            out.append(
                Context(
                    spec=spec,
                    profile=profile,
                    lock=lock,
                    cluster=cluster,
                    env=env,
                    facts=facts,
                    commands=commands,
                    facts_source=source,
                    engine_cli=cli.cli,
                    engine_cli_why=cli.why,
                )
            )
    return out


def run_rules(ctxs: Iterable[Context], rules: Sequence[Rule]) -> Report:
    """Every rule over every context: findings sorted errors first, then by file and key."""
    findings: list[Finding] = []
    checked = []
    lacked: dict[str, tuple[str, ...]] = {}
    not_checked: dict[str, tuple[NotChecked, ...]] = {}
    facts_from: dict[str, str] = {}
    for ctx in ctxs:
        name = f"{ctx.spec.name}/{ctx.profile.name}"
        checked.append(name)
        for rule in rules:
            if not rule.applies(ctx):
                continue
            ctx.rule = rule.id
            try:
                hits = list(rule.check(ctx))
            except Exception as e:  # a rule that cannot read this input says so, visibly
                hits = [
                    Hit(
                        key=f"profiles.{ctx.profile.name}",
                        severity=ERROR,
                        message=f"rule {rule.id} could not judge this profile: "
                        f"{type(e).__name__}: {e}",
                        fix="check the values this rule reads; report it if they are right",
                    )
                ]
            for hit in hits:
                findings.append(
                    Finding(
                        rule=rule.id,
                        severity=hit.severity or rule.severity,
                        image=ctx.spec.name,
                        profile=ctx.profile.name,
                        file=hit.file or str(ctx.spec.path),
                        key=hit.key,
                        message=hit.message,
                        fix=hit.fix or rule.fix,
                    )
                )
        if ctx.lacked:
            lacked[name] = tuple(sorted(ctx.lacked))
        if ctx.not_checked or ctx.lacked_by:
            not_checked[name] = (*ctx.not_checked, *lacked_facts(ctx))
        if ctx.facts_source:
            facts_from[name] = ctx.facts_source
    findings.sort(key=lambda f: (f.severity != ERROR, f.file, f.key, f.rule))
    return Report(
        findings=tuple(findings),
        checked=tuple(checked),
        lacked=lacked,
        rules=len(rules),
        facts_from=facts_from,
        not_checked=not_checked,
    )


def lacked_facts(ctx: Context) -> list[NotChecked]:
    """Each rule that went without a fact verify learns of the image: what it would have read."""
    return [
        NotChecked(
            rule=rule,
            what=f"with verify's fact(s) {', '.join(sorted(facts))} of this image",
            why="no verify record of this image has them; the rule went on with the lock's "
            "versions and k3env's recorded tables (a warning where those say nothing)",
        )
        for rule, facts in sorted(ctx.lacked_by.items())
    ]
