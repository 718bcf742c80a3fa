"""One preflight Context as the rules see it, built from the repository's committed lock,
specs and cluster profiles with the parts a test changes: the commands, the env, the facts
verify learned, the cluster's figures, the lock's pins. The rules' verdicts are then asserted
hit by hit (key, severity, message, fix, file), as the user reads them."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from k3env.checks.argv import ParsedCommand, parse_options
from k3env.checks.preflight import Context, Hit
from k3env.config.cluster import Cluster, load_cluster
from k3env.config.lock import load_lock
from k3env.config.pins import Lock
from k3env.config.spec import ImageSpec, load_spec

from .conftest import REPO


@functools.cache
def committed_lock() -> Lock:
    return load_lock(REPO / "pins/k3.lock.toml")


@functools.cache
def committed_spec(name: str) -> ImageSpec:
    return load_spec(REPO / f"images/{name}.toml", committed_lock())


@functools.cache
def committed_cluster(name: str) -> Cluster:
    return load_cluster(REPO / f"clusters/{name}.toml")


def key(index: int) -> str:
    """Where a finding on the profile's command ``index`` points."""
    return f"profiles.agg.commands[{index}].argv"


def kv(connector: str | None = None, **extra: Any) -> str:
    """A --kv-transfer-config value: ``connector`` and its extra config."""
    config: dict[str, Any] = {"kv_role": "kv_both", "kv_connector_extra_config": extra}
    if connector is not None:
        config["kv_connector"] = connector
    return json.dumps(config)


def context(
    *commands: tuple[str, Sequence[str]],
    spec: str = "kimi-k3-direct-f",
    cluster: str = "b200-dgxc",
    env: Mapping[str, str] | None = None,
    facts: Mapping[str, Any] | None = None,
    lock: Lock | None = None,
    profile: Mapping[str, Any] | None = None,
    cluster_fields: Mapping[str, Any] | None = None,
    spec_fields: Mapping[str, Any] | None = None,
    **fields: Any,
) -> Context:
    """``commands`` as (role, argv) pairs (none: the spec's profile's own), over the committed
    spec's ``agg`` profile (``profile`` replaces its fields) on a committed cluster
    (``cluster_fields`` replace its figures; ``spec_fields`` the spec's); ``env`` is the
    engine's whole environment."""
    image = replace(committed_spec(spec), **(spec_fields or {}))
    prof = replace(image.profiles["agg"], **(profile or {}))
    pairs = commands or tuple((c.role, c.argv) for c in prof.commands)
    return Context(
        spec=image,
        profile=prof,
        lock=lock or committed_lock(),
        cluster=replace(committed_cluster(cluster), **(cluster_fields or {})),
        env=dict(env or {}),
        facts=facts,
        commands=tuple(
            ParsedCommand(role=role, index=i, argv=tuple(argv), options=parse_options(argv))
            for i, (role, argv) in enumerate(pairs)
        ),
        **fields,
    )


def serve(*flags: str) -> tuple[str, tuple[str, ...]]:
    """A `vllm serve` command with ``flags``."""
    return ("vllm-serve", ("vllm", "serve", "/model", *flags))


def worker(*flags: str) -> tuple[str, tuple[str, ...]]:
    """A `python -m dynamo.vllm` worker with ``flags``."""
    return ("dynamo-worker", ("python3", "-m", "dynamo.vllm", *flags))


FRONTEND = ("dynamo-frontend", ("python3", "-m", "dynamo.frontend"))


@dataclass(frozen=True)
class FakeRule:
    """A rule that says what it is told to (the runner's contract, not a real rule's), and
    reads the facts it ``lacks``."""

    id: str
    hits: tuple[Hit, ...] = ()
    severity: str = "warning"
    fix: str = "the rule's own fix"
    only: str | None = None  # applies to this spec only
    boom: Exception | None = None
    lacks: tuple[str, ...] = ()
    seen: list[str] = field(default_factory=list)

    def _check(self, ctx: Context) -> Iterable[Hit]:
        self.seen.append(ctx.spec.name)
        for lack in self.lacks:  # a fact no image has
            assert ctx.fact("no", "such", lack, lacking=lack) is None
        if self.boom is not None:
            raise self.boom
        return self.hits

    @property
    def check(self) -> Callable[[Context], Iterable[Hit]]:
        return self._check

    def applies(self, ctx: Context) -> bool:
        return self.only is None or ctx.spec.name == self.only


__all__ = ["FRONTEND", "Hit", "committed_lock", "context", "key", "kv", "serve", "worker"]
