"""Verify each image from inside: one container start per image runs every probe.

Host side: build the plan (the spec's serve profiles, the lock's patches and versions, the
baked env), carry ``probes/probe.py`` and the plan into the image at run time (a read-only
mount, never baked), run it with no network, no GPU and a time bound, and read the verdicts
and facts it prints. Facts are cached by image ID for preflight.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from k3env.config.lock import BasePin, Lock, TwinPin, verify_patch_file
from k3env.config.patchfile import load_patch_file
from k3env.config.shapes import DEFAULT_PLATFORM
from k3env.config.spec import ImageSpec
from k3env.config.twinreq import pinned_versions
from k3env.engine.protocol import BaseImage, Engine
from k3env.errors import EngineError
from k3env.hashing import canonical_sha256, digest_hex, sha256_digest
from k3env.image.bases import select_base
from k3env.image.build import PROVENANCE_LABEL, PROVENANCE_PATH, BuildResult
from k3env.image.envpolicy import merged_env
from k3env.image.patches import SKIPPED, missing_edits
from k3env.log import Log
from k3env.state import State
from k3env.versions import Installed, canonical_name, unmet_requirements

MARK = "@@k3env-probe@@"
CHECKS = ("versions", "imports", "args", "parsers", "tokenizer", "patches", "env")
# Where to look for the reader of an env var, by its family prefix: a hint for the search in
# the image, never a pass by itself (a misspelt PYTORCH_ name is read by nothing). ":python"
# is the interpreter, ":ld.so" the dynamic loader. The serving stack is always searched too.
ENV_FAMILIES: dict[str, tuple[str, ...]] = {
    "VLLM_": ("vllm",),
    "DYN_": ("ai-dynamo", "ai-dynamo-runtime"),
    "AIPERF_": ("aiperf",),
    "NCCL_": ("torch", "nvidia-nccl-cu12", "nvidia-nccl-cu13"),
    "PYTORCH_": ("torch",),
    "TORCH_": ("torch",),
    "CUDA_": ("torch", "nvidia-cuda-runtime-cu12"),
    "CUBLAS_": ("torch", "nvidia-cublas-cu12"),
    "CUDNN_": ("torch", "nvidia-cudnn-cu12"),
    "NVIDIA_": ("torch",),
    "OMP_": ("torch",),
    "MKL_": ("torch",),
    "GLOO_": ("torch",),
    "HF_": ("huggingface-hub", "transformers"),
    "TRANSFORMERS_": ("transformers",),
    "TOKENIZERS_": ("tokenizers",),
    "UCX_": ("ai-dynamo-runtime", "nixl"),
    "NVSHMEM_": ("nvidia-nvshmem-cu12",),
    "TRITON_": ("triton",),
    "PYTHON": (":python",),
    "LD_": (":ld.so",),
}
ENV_DEFAULT_SOURCES = ("vllm", "ai-dynamo", "ai-dynamo-runtime")
# Component name in reports and facts -> the distribution that carries it (the one table).
COMPONENTS = {
    "vllm": "vllm",
    "dynamo": "ai-dynamo",
    "dynamo-runtime": "ai-dynamo-runtime",
    "torch": "torch",
    "aiperf": "aiperf",
}
# Tokenizer model_types probed in the Dynamo frontend for preflight's facts.
TOKENIZER_CANDIDATES = ("kimi", "kimi_k2", "kimi_k25", "kimi_k3", "deepseek_v3")
# What the probe process needs to build vLLM's parser without a GPU, and to stay offline.
PROBE_ENV = {
    "VLLM_TARGET_DEVICE": "cpu",
    "CUDA_VISIBLE_DEVICES": "",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "DYN_LOG": "error",
    "VLLM_LOGGING_LEVEL": "ERROR",
    "PYTHONDONTWRITEBYTECODE": "1",
}


@dataclass(frozen=True, kw_only=True)
class CheckResult:
    image: str
    profile: str | None
    check: str
    subject: str
    status: str  # pass | fail | skip
    component: str
    version: str | None
    output: str

    def as_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True, kw_only=True)
class ImageReport:
    image: str
    reference: str
    image_id: str
    results: tuple[CheckResult, ...]
    facts: Mapping[str, Any]
    seconds: float
    cached: bool = False
    platform: str = DEFAULT_PLATFORM  # the image's os/architecture: the checks ran on it

    @property
    def failed(self) -> list[CheckResult]:
        return [r for r in self.results if r.status == "fail"]

    def status(self, check: str) -> str:
        states = {r.status for r in self.results if r.check == check}
        if "fail" in states:
            return "fail"
        if "pass" in states:
            return "pass"
        return "skip"

    def as_json(self) -> dict[str, Any]:
        return {
            "image": self.image,
            "reference": self.reference,
            "image_id": self.image_id,
            "platform": self.platform,
            "seconds": round(self.seconds, 3),
            "cached": self.cached,
            "matrix": {c: self.status(c) for c in CHECKS},
            "results": [r.as_json() for r in self.results],
            "facts": dict(self.facts),
        }


def plan_for(
    lock: Lock, spec: ImageSpec, build: BuildResult, base_pin: BasePin, twin: bool
) -> dict[str, Any]:
    statuses = {p.name: p for p in build.patches}
    patches: list[dict[str, Any]] = []
    for name in spec.patches:
        pin = lock.container_patches[name]
        result = statuses.get(name)
        if result is not None and result.status == SKIPPED:
            patches.append({"name": name, "skip": result.detail})
            continue
        patches.append({"name": name, "module": pin.module, "path": pin.path})
    env = merged_env(lock, spec, base_pin)
    return {
        "image": spec.name,
        # Modules the CPU twin leaves out on purpose: an import that needs only those to
        # complete is not held against the twin (the output says so).
        "absent_by_design": list(t.omit) if (t := twin_of(lock, twin, build.platform)) else [],
        "profiles": [
            {
                "name": p.name,
                "tokenizer_model_type": p.tokenizer_model_type,
                "tool_call_parser": p.tool_call_parser,
                "reasoning_parser": p.reasoning_parser,
                "commands": [{"role": c.role, "argv": list(c.argv)} for c in p.commands],
            }
            for p in spec.profiles.values()
        ],
        "patches": patches,
        "env": {name: spec.env_readers.get(name) for name in env},
        "env_families": {k: list(v) for k, v in ENV_FAMILIES.items()},
        "env_default_sources": list(ENV_DEFAULT_SOURCES),
        "versions": expected_versions(lock, spec, twin, build.platform),
        "components": COMPONENTS,
        "tokenizer_candidates": list(TOKENIZER_CANDIDATES)
        if any(c.role == "dynamo-frontend" for p in spec.profiles.values() for c in p.commands)
        else [],
    }


def twin_of(lock: Lock, twin: bool, platform: str) -> TwinPin | None:
    """The twin pin an image over the twin on ``platform`` was built from."""
    return lock.twin.for_platform(platform) if twin and lock.twin is not None else None


def expected_versions(
    lock: Lock, spec: ImageSpec, twin: bool, platform: str = DEFAULT_PLATFORM
) -> dict[str, str | None]:
    """What the lock says the image holds: the wheels of the components the spec bakes, and
    over the twin its pinned requirements. A registry base's own packages are not pinned."""
    pinned: dict[str, str] = {}
    if (t := twin_of(lock, twin, platform)) is not None:
        pinned.update(pinned_versions(lock.resolve_path(t.requirements)))
    for name in spec.components:
        pinned.update({w.name: w.version for w in lock.components[name].wheels})
    return {component: pinned.get(dist) for component, dist in COMPONENTS.items()}


def requirement_rows(
    lock: Lock,
    spec: ImageSpec,
    facts: Mapping[str, Any],
    twin: bool,
    platform: str = DEFAULT_PLATFORM,
) -> list[CheckResult]:
    """Every installed distribution's ``Requires-Dist`` (and those of the extras the lock's
    components use), evaluated with the image's own marker environment against what the
    image has installed. Over the twin, requirements on what it leaves out or stands in for
    by design are reported as waived, never as met."""

    def row(status: str, subject: str, output: str) -> CheckResult:
        return image_row(spec, "versions", subject, status, output)

    raw = facts.get("distributions")
    if not isinstance(raw, list):
        return [row("fail", "requirements", "the probe listed no installed distributions")]
    rows = []
    seen: dict[str, dict[str, Any]] = {}
    for d in raw:
        key = canonical_name(str(d["name"]))
        if key in seen and seen[key].get("path") != d.get("path"):
            rows.append(
                row(
                    "fail",
                    f"installed {key}",
                    f"{key} is installed twice: {seen[key]['version']} ({seen[key].get('path')}) "
                    f"and {d['version']} ({d.get('path')}); Python imports one of them",
                )
            )
        seen.setdefault(key, d)
    installed = [
        Installed(name=str(d["name"]), version=str(d["version"]), requires=tuple(d["requires"]))
        for d in seen.values()
    ]
    # A component's extras belong to its first wheel (ai-dynamo[vllm]), as the lock writes it.
    extras = {
        lock.components[c].wheels[0].name: lock.components[c].extras
        for c in spec.components
        if lock.components[c].wheels  # a source build's wheels are named once built
    }
    waivers = t.waivers() if (t := twin_of(lock, twin, platform)) is not None else {}
    unmet = unmet_requirements(
        installed, dict(facts.get("marker_environment") or {}), extras=extras, waived=waivers
    )
    for u in unmet:
        if u.waived is None:
            rows.append(row("fail", f"requires {u.dist}", u.message))
    waived = [u for u in unmet if u.waived is not None]
    if waived:
        targets = sorted({u.target for u in waived})
        rows.append(
            row(
                "skip",
                "requirements waived in the twin",
                f"{len(waived)} requirement(s) on {len(targets)} distribution(s) the CPU twin "
                f"leaves out or stands in for, not checked here: {', '.join(targets)}",
            )
        )
    if not any(r.status == "fail" for r in rows):
        used = [f"{w}[{','.join(e)}]" for w, e in sorted(extras.items()) if e]
        rows.append(
            row(
                "pass",
                "requirements",
                f"every Requires-Dist of {len(installed)} installed distributions holds"
                + (f" (extras in use: {', '.join(used)})" if used else ""),
            )
        )
    return rows


@dataclass(frozen=True, kw_only=True)
class ProbeOutput:
    """What the probe printed: its verdicts, the facts it learned, the patch targets' text."""

    rows: list[dict[str, Any]]
    facts: dict[str, Any]
    patch_targets: dict[str, Any]


@functools.cache
def _probe_sha256() -> str:
    """The probe's own source: a changed probe answers afresh."""
    return digest_hex(sha256_digest((resources.files("k3env.probes") / "probe.py").read_bytes()))


def probe_env(config_env: Sequence[str]) -> dict[str, str]:
    """The environment the probe's container has: the image's config Env, then PROBE_ENV."""
    env = dict(item.split("=", 1) for item in config_env if "=" in item)
    return {**env, **PROBE_ENV}


def run_probe(
    engine: Engine,
    image: str,
    python: str,
    plans: Sequence[Mapping[str, Any]],
    envs: Sequence[Mapping[str, str]],
    *,
    timeout: float,
) -> list[ProbeOutput | str]:
    """The probe over one image or a group of images with the same files, in one container of
    ``image`` (the group's first): each plan's output, or why it could not share the import
    (the caller verifies that image on its own)."""
    workdir = Path(tempfile.mkdtemp(prefix="k3env-probe-"))
    try:
        with resources.as_file(resources.files("k3env.probes") / "probe.py") as probe:
            shutil.copy(probe, workdir / "probe.py")
        payload = {"plans": plans, "envs": envs, "timeout": timeout}
        (workdir / "plan.json").write_text(json.dumps(payload))
        workdir.chmod(0o755)
        result = engine.run(
            image,
            [python, "/k3env-probe/probe.py", "/k3env-probe/plan.json"],
            timeout=timeout,
            env=PROBE_ENV,
            mounts={str(workdir): "/k3env-probe"},
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    for line in reversed(result.stdout.splitlines()):
        if line.startswith(MARK):
            try:
                payload = json.loads(line[len(MARK) :])
                outputs: list[ProbeOutput | str] = []
                for one in payload["plans"]:
                    if "unshared" in one:
                        outputs.append(str(one["unshared"]))
                        continue
                    outputs.append(
                        ProbeOutput(
                            rows=list(one["results"]),
                            facts=dict(one["facts"]),
                            patch_targets=dict(one.get("patch_targets") or {}),
                        )
                    )
                if len(outputs) != len(plans):
                    raise ValueError(f"{len(outputs)} answers for {len(plans)} plans")
                return outputs
            except (ValueError, KeyError, TypeError) as e:
                raise EngineError(
                    f"the probe's verdict line is cut off or malformed ({e}; exit "
                    f"{result.exit_code}): {line[:200]!r}",
                    where=image,
                    fix="raise --timeout if the probe was killed; else report it as a k3env bug",
                ) from e
    how = (
        f"was killed by signal {result.exit_code - 128} (exit {result.exit_code})"
        if result.exit_code > 128
        else f"exited {result.exit_code}"
    )
    raise EngineError(
        f"the probe printed no verdict: it {how}:\n"
        f"{(result.stdout + result.stderr).strip()[-3000:]}",
        where=image,
        fix="the image's Python could not run the probe: check `python` in the base pin",
    )


def files_key(engine: Engine, image_id: str, image: BaseImage | None) -> tuple[Any, ...]:
    """What an image's files are, for grouping: its layers; for an image k3env built, the
    layers below its own and that layer's files as its provenance lists them (the record's
    sha256 is checked against the image's label). Images with the same key differ only in
    their config (Env) and their provenance record. ``image``: its inspection."""
    if image is None:
        return ("image", image_id)
    labels = image.config.get("Labels") or {}
    recorded = labels.get(PROVENANCE_LABEL)
    if not recorded:
        return ("layers", image.diff_ids)
    found = engine.read_files(image_id, [PROVENANCE_PATH]).get(PROVENANCE_PATH)
    if found is None or digest_hex(sha256_digest(found.content)) != recorded:
        return ("image", image_id)  # nothing to vouch for its layer: verified on its own
    files = json.loads(found.content).get("files")
    return ("k3env", image.diff_ids[:-1], canonical_sha256(files))


def image_row(spec: ImageSpec, check: str, subject: str, status: str, output: str) -> CheckResult:
    """A verdict the host judges about the image as a whole (no profile, no component)."""
    return CheckResult(
        image=spec.name,
        profile=None,
        check=check,
        subject=subject,
        status=status,
        component="image",
        version=None,
        output=output,
    )


def patch_rows(
    lock: Lock, spec: ImageSpec, build: BuildResult, targets: Mapping[str, Any]
) -> list[CheckResult]:
    """Whether each of the spec's patches is present in the image's copy of its target,
    judged by the builder's own definition (``image.patches.missing_edits``)."""
    statuses = {p.name: p for p in build.patches}
    rows = []
    for name in spec.patches:
        result = statuses.get(name)
        pin = lock.container_patches[name]

        def row(status: str, output: str, name: str = name) -> CheckResult:
            return image_row(spec, "patches", name, status, output)

        if result is not None and result.status == SKIPPED:
            rows.append(row("skip", result.detail))
            continue
        target = targets.get(name) or {}
        if target.get("text") is None:
            rows.append(row("fail", f"target {pin.target} not found in the image"))
            continue
        missing = missing_edits(load_patch_file(pin, verify_patch_file(lock, pin)), target["text"])
        path = target.get("path")
        rows.append(
            row("fail", f"{path}: " + "; ".join(missing))
            if missing
            else row("pass", f"{path}: every edit present")
        )
    return rows


def _with_variant_notes(
    results: tuple[CheckResult, ...], lock: Lock, state: State, log: Log
) -> list[CheckResult]:
    """A failed tokenizer verdict also names which of the lock's variants load the type."""
    from k3env.checks.variants import tokenizer_note

    out = []
    for r in results:
        if r.check == "tokenizer" and r.status == "fail" and lock.variants:
            note = tokenizer_note(lock, r.subject.removeprefix("model_type "), state, log)
            if note:
                r = dataclasses.replace(r, output=f"{note}\n{r.output}")
        out.append(r)
    return out


@dataclass(frozen=True, kw_only=True)
class _Job:
    spec: ImageSpec
    build: BuildResult
    python: str
    plan: dict[str, Any]
    key: str
    env: dict[str, str]
    image: BaseImage | None  # its inspection (config, layers)


def verify_images(
    engine: Engine,
    state: State,
    lock: Lock,
    pairs: Sequence[tuple[ImageSpec, BuildResult]],
    *,
    twin: bool,
    timeout: float = 300,
    log: Log | None = None,
    workers: int | None = None,
    share: bool = True,
) -> list[ImageReport]:
    """Verify images, each answered from its record when its image, plan and probe are
    unchanged; the rest probed, as many containers at once as there are cores. Images whose
    files are the same (``files_key``) share one container and one import of the entrypoints
    (each image's checks run under its own environment; the probe says when an image cannot
    share, and that image is probed on its own). ``share=False`` probes each on its own."""
    log = log or Log(quiet=True)
    start = time.monotonic()
    done = _Done(outputs={}, finished={})
    jobs = _plan_jobs(engine, state, lock, pairs, twin=twin, share=share, done=done)
    groups = _groups(engine, jobs, share=share)
    _schedule(engine, state, jobs, groups, done, timeout=timeout, log=log,
              cores=workers or max(1, os.cpu_count() or 1))  # fmt: skip
    return [
        _report(
            state,
            lock,
            spec,
            build,
            *done.outputs[i],
            twin=twin,
            log=log,
            seconds=done.finished[i] - start,
        )
        for i, (spec, build) in enumerate(pairs)
    ]


@dataclass(frozen=True, kw_only=True)
class _Done:
    """Each image's probe output (and whether it came from its record), and when it was in."""

    outputs: dict[int, tuple[ProbeOutput, bool]]
    finished: dict[int, float]


def _plan_jobs(
    engine: Engine,
    state: State,
    lock: Lock,
    pairs: Sequence[tuple[ImageSpec, BuildResult]],
    *,
    twin: bool,
    share: bool,
    done: _Done,
) -> dict[int, _Job]:
    """What each image must be asked; an image answered by its record goes into ``done``."""
    jobs: dict[int, _Job] = {}
    for i, (spec, build) in enumerate(pairs):
        base_pin = select_base(lock, spec, twin)  # the base the builder used
        plan = plan_for(lock, spec, build, base_pin, twin)
        # An image never changes: the same image, plan and probe give the same verdicts.
        key = canonical_sha256(
            {"image": build.image_id, "plan": plan, "probe": _probe_sha256(), "env": PROBE_ENV}
        )
        recorded = state.read_record("verify", key)
        # --isolated asks for an image's own import: a recorded shared verdict does not do.
        if isinstance(recorded, dict) and (share or "shared_import" not in recorded["facts"]):
            done.outputs[i] = (ProbeOutput(**recorded), True)
            done.finished[i] = time.monotonic()
            continue
        inspected = engine.inspect(build.image_id)
        env = probe_env((inspected.config.get("Env") or []) if inspected else [])
        jobs[i] = _Job(spec=spec, build=build, python=base_pin.python, plan=plan, key=key,
                       env=env, image=inspected)  # fmt: skip
    return jobs


def _groups(engine: Engine, jobs: Mapping[int, _Job], *, share: bool) -> list[list[int]]:
    """The images that can share one container, largest group first."""
    groups: dict[Any, list[int]] = {}
    for i, job in jobs.items():
        # The same files, interpreter and entrypoints to import (and the same modules the
        # twin leaves out): one import serves them all.
        imports = sorted({c["role"] for p in job.plan["profiles"] for c in p["commands"]})
        group = (
            (job.python, files_key(engine, job.build.image_id, job.image), tuple(imports),
             tuple(job.plan["absent_by_design"]))
            if share
            else i
        )  # fmt: skip
        groups.setdefault(group, []).append(i)
    return sorted(groups.values(), key=len, reverse=True)


def _schedule(
    engine: Engine,
    state: State,
    jobs: Mapping[int, _Job],
    groups: Sequence[list[int]],
    done: _Done,
    *,
    timeout: float,
    log: Log,
    cores: int,
) -> None:
    """Probe every group, ``cores`` containers at once; a group whose container failed as a
    whole goes again image by image. Each answer is recorded as it comes in."""
    from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

    def probe(members: list[int]) -> list[ProbeOutput | str]:
        first = jobs[members[0]]
        names = ", ".join(jobs[i].spec.name for i in members)
        what = f"verify {names} in one container" + (" (same files)" if len(members) > 1 else "")
        with log.step(f"{what} ({first.build.reference})"):
            return run_probe(
                engine,
                first.build.image_id,
                first.python,
                [jobs[i].plan for i in members],
                [jobs[i].env for i in members],
                # The shared import, then each member's checks, each within ``timeout``.
                timeout=timeout * (len(members) + (len(members) > 1)),
            )

    def probe_or_alone(members: list[int]) -> list[ProbeOutput | str]:
        """A group whose container failed as a whole: each member probed on its own."""
        try:
            return probe(members)
        except EngineError as e:
            if len(members) == 1:
                raise
            return [f"the group's container failed: {e.message[:300]}" for _ in members]

    with ThreadPoolExecutor(max_workers=cores) as pool:
        running: dict[Future[list[ProbeOutput | str]], list[int]] = {
            pool.submit(probe_or_alone, members): members for members in groups
        }
        while running:
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                members = running.pop(future)
                for i, out in zip(members, future.result(), strict=True):
                    if isinstance(out, str):
                        log.info(f"    {jobs[i].spec.name}: verified on its own: {out}")
                        running[pool.submit(probe, [i])] = [i]
                        continue
                    state.write_record(dataclasses.asdict(out), "verify", jobs[i].key)
                    done.outputs[i] = (out, False)
                    done.finished[i] = time.monotonic()


def _report(
    state: State,
    lock: Lock,
    spec: ImageSpec,
    build: BuildResult,
    out: ProbeOutput,
    cached: bool,
    *,
    twin: bool,
    log: Log,
    seconds: float,
) -> ImageReport:
    facts = out.facts
    results = tuple(
        CheckResult(
            image=spec.name,
            profile=r.get("profile"),
            check=str(r["check"]),
            subject=str(r["subject"]),
            status=str(r["status"]),
            component=str(r["component"]),
            version=r.get("version"),
            output=str(r.get("output", "")),
        )
        for r in out.rows
    ) + tuple(patch_rows(lock, spec, build, out.patch_targets))
    results += tuple(requirement_rows(lock, spec, facts, twin, build.platform))
    results = tuple(_with_variant_notes(results, lock, state, log))
    state.write_record(facts, "facts", build.image_id)
    return ImageReport(
        image=spec.name,
        reference=build.reference,
        image_id=build.image_id,
        results=results,
        facts=facts,
        seconds=seconds,
        cached=cached,
        platform=build.platform,
    )


def verify_image(
    engine: Engine,
    state: State,
    lock: Lock,
    spec: ImageSpec,
    build: BuildResult,
    *,
    twin: bool,
    timeout: float = 300,
    log: Log | None = None,
) -> ImageReport:
    """One image (``verify_images`` of one)."""
    return verify_images(engine, state, lock, [(spec, build)], twin=twin, timeout=timeout,
                         log=log)[0]  # fmt: skip
