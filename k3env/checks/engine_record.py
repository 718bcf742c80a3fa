"""Where preflight gets `vllm serve`'s parser for a recipe's image: verify's facts of that very
image (``vllm.cli``), else the recorded parser of the vLLM release the lock's CPU twin pins
(the twin stands in for the lock base, and every verdict says so), else nothing (said).

The twin's record (``schemas/engine-cli/vllm-VERSION.json``) is written by ``k3env preflight
--record-engine-cli PYTHON`` with an interpreter of an environment holding the twin's pinned
closure (``pip install --no-deps --require-hashes -r pins/cpu-twin.requirements.txt``): the
probe's ``cli.py`` asks vLLM's own parser, registries and messages. It carries the twin's
requirement line it was recorded for; a record whose release is not the pinned one is not used.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from k3env import jsontext
from k3env.checks.engine_cli import EngineCli, image_cli, load_cli
from k3env.config.pins import Lock
from k3env.config.twinreq import parse_pinned
from k3env.errors import ConfigError
from k3env.files import read_input, write_atomic
from k3env.log import Log
from k3env.runner import run

RECORDS = "schemas/engine-cli"
RECORD_LIMIT = 8 << 20  # a recorded parser is ~100 KB


@dataclass(frozen=True, kw_only=True)
class CliSource:
    """The parser judging a recipe's `vllm serve` line, or why there is none."""

    cli: EngineCli | None
    why: str  # when there is none: why, and what to do


def _pinned_vllm(lock: Lock, platform: str) -> tuple[str, list[str], str] | None:
    """(version, sha256s, requirements file) of the vLLM the twin for ``platform`` pins."""
    if lock.twin is None or platform not in lock.twin.all_platforms:
        return None
    twin = lock.twin.for_platform(platform)
    text = read_input(lock.resolve_path(twin.requirements), error=ConfigError).decode()
    found = parse_pinned(text).get("vllm")
    return None if found is None else (found[0], found[1], twin.requirements)


def record_path(lock: Lock, version: str) -> Path:
    return lock.resolve_path(f"{RECORDS}/vllm-{version}.json")


def twin_cli(lock: Lock, base: str, platform: str) -> CliSource:
    """The recorded parser of the vLLM release the lock's twin pins, standing in for ``base``."""
    pin = lock.bases.get(base)
    pinned = _pinned_vllm(lock, platform)
    if pin is None or (pin.twin is None and pin.kind != "twin") or pinned is None:
        return CliSource(
            cli=None,
            why=f"the lock names no CPU twin with a pinned vLLM for base {base} on {platform}",
        )
    version, hashes, requirements = pinned
    path = record_path(lock, version)
    if not path.is_file():
        return CliSource(
            cli=None,
            why=(
                f"no recorded parser of vLLM {version} (the twin's) at {path}: record it with "
                "`k3env preflight --record-engine-cli PYTHON` (an environment of the twin's "
                f"closure: pip install --no-deps --require-hashes -r {requirements})"
            ),
        )
    doc = jsontext.loads(
        read_input(path, error=ConfigError, limit=RECORD_LIMIT),
        where=str(path),
        limit=RECORD_LIMIT,
        error=ConfigError,
        fix=f"record it again: {path}",
    )
    recorded = doc.get("pinned") if isinstance(doc.get("pinned"), Mapping) else {}
    if recorded.get("version") != version:
        return CliSource(
            cli=None,
            why=f"{path} was recorded for vLLM {recorded.get('version')}, "
            f"not the twin's {version}: record it again",
        )
    same = set(recorded.get("sha256", [])) & set(hashes)
    wheel = "" if same else f" (recorded from the {recorded.get('platform')} wheel)"
    if pin.kind == "twin":  # the image is built over the twin: its vLLM is this one
        source = f"vLLM {version}'s own parser, recorded from the twin's closure ({path.name})"
        return CliSource(cli=load_cli(doc.get("cli"), source, own=True), why="")
    source = (
        f"vLLM {version}'s own parser, from the twin{wheel}, not by this image "
        f"({path.name}; the lock's stand-in for base {base})"
    )
    return CliSource(cli=load_cli(doc.get("cli"), source), why="")


def cli_for(
    lock: Lock,
    base: str,
    platform: str,
    facts: Mapping[str, Any] | None,
    facts_source: str | None,
    *,
    placed: bool = True,
    container: str = "the image",
) -> CliSource:
    """`vllm serve`'s parser for an image: its own (verify's facts), else its base's twin."""
    own = image_cli(facts, facts_source)
    if own is not None:
        return CliSource(cli=own, why="")
    if not placed:
        return CliSource(
            cli=None,
            why=(
                f"k3env cannot place {container}: which vLLM it runs is not known (`--base NAME` "
                "judges it as that lock base)"
            ),
        )
    return twin_cli(lock, base, platform)


def record_twin_cli(lock: Lock, python: str, platform: str, log: Log) -> tuple[Path, bool]:
    """Ask the release's own parser (``python`` of an environment of the twin's closure) and
    write its record; (path, changed). Refused when that environment's vLLM is not the twin's."""
    pinned = _pinned_vllm(lock, platform)
    if pinned is None:
        raise ConfigError(
            f"the lock's twin pins no vLLM for {platform}",
            where=str(lock.path),
            fix="pin the twin ([twin] requires) and `k3env twin --resolve`",
        )
    from k3env.checks.probe_run import PROBE_ENV  # the probe's environment (no GPU, offline)

    version, hashes, requirements = pinned
    probes = Path(str(resources.files("k3env.probes")))
    env = {**os.environ, **PROBE_ENV, "PYTHONPATH": str(probes)}
    out = run(
        [python, "-m", "probe.cli"],
        log,
        capture=True,
        env=env,
        cwd=probes,
        what=f"vLLM {version}'s parser",
    )
    cli = jsontext.loads(
        out,
        where=f"{python} -m probe.cli",
        limit=RECORD_LIMIT,
        error=ConfigError,
        fix="run it by hand and read its output",
    )
    if cli.get("version") != version:
        got = cli.get("version")
        raise ConfigError(
            f"{python} has vLLM {got}, not the twin's {version}",
            where=python,
            fix=f"pip install --no-deps --require-hashes -r {requirements}",
        )
    load_cli(cli, python)  # the shape preflight reads, checked before it is written
    doc = {
        "generated": "by `k3env preflight --record-engine-cli PYTHON` (k3env/probes/probe/cli.py "
        "run with an environment of the twin's closure): do not edit",
        "pinned": {
            "name": "vllm",
            "version": version,
            "sha256": sorted(hashes),
            "platform": platform,
            "requirements": requirements,
        },
        "cli": cli,
    }
    text = jsontext.dumps(doc, indent=1) + "\n"
    path = record_path(lock, version)
    same = path.is_file() and path.read_text() == text
    if not same:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text)
    return path, not same
