"""Verify each image from inside: one container start per image runs every probe.

Host side: build the plan (the spec's serve profiles, the lock's patches and versions, the
baked env), carry the probe package (``probes/probe/``) and the plan into the image at run
time (a read-only mount, never baked), run it with no network, no GPU and a time bound, and
read the verdicts and facts it prints, and dpkg's installed packages from the image's files (no
container start). Facts are cached by image ID for preflight and a bump's package diff.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from k3env.checks.probe_plan import plan_for, planned_checks
from k3env.checks.probe_run import (
    PROBE_ENV,
    files_key,
    probe_env,
    probe_sha256,
    run_probe,
)
from k3env.checks.verdicts import (
    CheckResult,
    ImageReport,
    patch_rows,
    requirement_rows,
    with_unreported,
)
from k3env.config.pins import Lock
from k3env.config.spec import ImageSpec
from k3env.engine.protocol import BaseImage, Engine
from k3env.errors import EngineError
from k3env.hashing import canonical_sha256
from k3env.image import records
from k3env.image.bases import select_base
from k3env.image.build import BuildResult
from k3env.image.records import Facts, ProbeOutput
from k3env.installed import DPKG_STATUS, STATUS_LIMIT, debian_installed
from k3env.log import Log
from k3env.state import State
from k3env.verdict import FAILED


def _with_variant_notes(
    results: tuple[CheckResult, ...], lock: Lock, state: State, log: Log
) -> list[CheckResult]:
    """A failed tokenizer verdict also names which of the lock's variants load the type."""
    from k3env.checks.variants import tokenizer_note

    out = []
    for r in results:
        if r.check == "tokenizer" and r.status == FAILED and lock.variants:
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
    done = _Done(outputs={}, finished={}, plans={})
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
            done.plans[i],
            twin=twin,
            log=log,
            seconds=done.finished[i] - start,
        )
        for i, (spec, build) in enumerate(pairs)
    ]


@dataclass(frozen=True, kw_only=True)
class _Done:
    """Each image's probe output (and whether it came from its record), when it was in, and
    the plan it answered."""

    outputs: dict[int, tuple[ProbeOutput, bool]]
    finished: dict[int, float]
    plans: dict[int, dict[str, Any]]


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
        plan = done.plans[i] = plan_for(lock, spec, build, base_pin, twin)
        # An image never changes: the same image, plan and probe give the same verdicts.
        key = canonical_sha256(
            {"image": build.image_id, "plan": plan, "probe": probe_sha256(), "env": PROBE_ENV}
        )
        out = records.read(state, ProbeOutput, key)
        # --isolated asks for an image's own import: a recorded shared verdict does not do.
        if out is not None and (share or "shared_import" not in out.facts):
            if not {"debian_packages", "debian_packages_unread"} & out.facts.keys():
                # Recorded before verify read dpkg's status: read now (no container start).
                out = dataclasses.replace(
                    out, facts={**out.facts, **debian_facts(engine, build.engine_id)}
                )
                records.write(state, out, key)
            done.outputs[i] = (out, True)
            done.finished[i] = time.monotonic()
            continue
        inspected = engine.inspect(build.engine_id)
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
        group = (
            (job.python, files_key(engine, job.build.engine_id, job.image),
             tuple(job.plan["imports"]),
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
            outs = run_probe(
                engine,
                first.build.engine_id,
                first.python,
                [jobs[i].plan for i in members],
                [jobs[i].env for i in members],
                # The shared import, then each member's checks, each within ``timeout``.
                timeout=timeout * (len(members) + (len(members) > 1)),
            )
            debs = debian_facts(engine, first.build.engine_id)  # the same files: one read
        return [dataclasses.replace(o, facts={**o.facts, **debs})
                if isinstance(o, ProbeOutput) else o for o in outs]  # fmt: skip

    def probe_or_alone(members: list[int]) -> list[ProbeOutput | str]:
        """A group whose container failed as a whole: each member probed on its own."""
        try:
            return probe(members)
        except EngineError as e:
            if len(members) == 1:
                raise
            return [f"the group's container failed: {e.said}" for _ in members]

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
                    records.write(state, out, jobs[i].key)
                    done.outputs[i] = (out, False)
                    done.finished[i] = time.monotonic()


def debian_facts(engine: Engine, engine_id: str) -> dict[str, Any]:
    """The facts of dpkg's installed packages in the image (``debian_packages``: name,
    version, architecture), its status read through the engine without a container start and
    parsed as the SBOM parses it; ``debian_packages_unread`` says why not (over the size
    limit). An image without dpkg's status has none."""
    path = "/" + DPKG_STATUS
    found = engine.read_files(engine_id, [path]).get(path)
    if found is not None and len(found.content) > STATUS_LIMIT:
        return {"debian_packages_unread": f"{path} is {len(found.content)} bytes, over the "
                f"{STATUS_LIMIT} k3env reads"}  # fmt: skip
    debs = debian_installed(found.content.decode(errors="replace") if found else "")
    return {"debian_packages": [{"name": d.name, "version": d.version, "arch": d.arch}
                                for d in debs]}  # fmt: skip


def _report(
    state: State,
    lock: Lock,
    spec: ImageSpec,
    build: BuildResult,
    out: ProbeOutput,
    cached: bool,
    plan: dict[str, Any],
    *,
    twin: bool,
    log: Log,
    seconds: float,
) -> ImageReport:
    facts = out.facts
    rows = [CheckResult.read(r, spec.name) for r in out.rows]
    results = with_unreported(spec.name, planned_checks(plan), rows)
    results += tuple(patch_rows(lock, spec, build, out.patch_targets))
    results += tuple(requirement_rows(lock, spec, facts, twin, build.platform))
    results = tuple(_with_variant_notes(results, lock, state, log))
    records.write(state, Facts(facts=facts), build.image_id)
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
