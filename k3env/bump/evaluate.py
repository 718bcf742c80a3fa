"""One lock state, judged: build every image, verify it from inside, preflight it, and test
each container patch and srt-slurm PR patch on the pinned versions."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from k3env.checks.preflight import contexts, run_rules
from k3env.checks.rules import RULES
from k3env.checks.verdicts import CHECKS, ImageReport
from k3env.checks.verify import verify_images
from k3env.config.cluster import Cluster
from k3env.config.patchfile import PatchFile, load_patch_file
from k3env.config.pinned_files import verify_patch_file
from k3env.config.pins import BasePin, Lock
from k3env.config.shapes import DEFAULT_PLATFORM
from k3env.config.spec import ImageSpec
from k3env.engine.protocol import Engine
from k3env.errors import K3envError, PatchError
from k3env.image.bases import ResolvedBase, registry_base
from k3env.image.build import build_all, make_builder, read_base_files, resolve_modules
from k3env.image.patches import ALREADY_PRESENT, apply_patch
from k3env.image.twin import twin_base
from k3env.log import Log
from k3env.srt.fates import patch_fates
from k3env.state import State
from k3env.verdict import FAILED, NOT_CHECKED, PASSED, Gate, ok


@dataclass(frozen=True, kw_only=True)
class PatchFate:
    name: str
    base: str
    status: str  # applies | upstream | conflicts | skipped
    detail: str

    @property
    def gate(self) -> Gate:
        """Its fate as a verdict: in the code is a pass (upstream: drop it, said), a conflict
        fails, a base this host cannot have is not checked."""
        status = {"conflicts": FAILED, "skipped": NOT_CHECKED}.get(self.status, PASSED)
        return Gate(name=f"patch {self.name} on {self.base}", status=status,
                    detail=f"{self.status}: {self.detail}")  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """What one lock state gives: verify reports, preflight errors, patch fates."""

    reports: Sequence[ImageReport]
    preflight_errors: Mapping[str, int]  # image -> errors
    patches: Sequence[PatchFate]
    error: str | None = None  # a build that failed outright
    twin: bool = False  # built and verified over the CPU twins (the offline default)

    def matrix(self) -> dict[str, dict[str, str]]:
        return {r.image: {c: r.status(c) for c in CHECKS} for r in self.reports}

    @property
    def gates(self) -> tuple[Gate, ...]:
        """The state in the one verdict model: the build, each image's checks, its preflight
        errors, each patch's fate (verify not run is no gate: the body says so)."""
        built = (Gate(name="build", status=FAILED, detail=self.error),) if self.error else ()
        checks = (g for r in self.reports for g in r.gates)
        pre = (Gate(name=f"preflight {image}", status=FAILED if n else PASSED,
                    detail=f"{n} error(s)")
               for image, n in self.preflight_errors.items())  # fmt: skip
        return (*built, *checks, *pre, *(p.gate for p in self.patches))

    @property
    def failed(self) -> bool:
        return not ok(self.gates)


def describe_error(e: K3envError) -> str:
    return e.render().replace("\n", " ")


def evaluate(
    lock: Lock,
    specs: Sequence[ImageSpec],
    *,
    engine: Engine,
    state: State,
    log: Log,
    cluster: Cluster,
    run_verify: bool,
    srt_source: str | None = None,
    twin: bool = False,
) -> Outcome:
    """Build every image on ``lock``, verify and preflight it, and test each container patch.
    ``twin``: images built and verified over each base's CPU twin (the offline default)."""
    registry = registry_base(engine, log, state)

    def resolve(pin: BasePin, platform: str = DEFAULT_PLATFORM) -> ResolvedBase:
        if pin.kind == "twin":
            return twin_base(lock, engine, state, log, pin, platform)
        return registry(pin, platform)

    try:
        patch_files = {
            name: load_patch_file(pin, verify_patch_file(lock, pin))
            for name, pin in lock.container_patches.items()
        }
    except K3envError as e:
        # The lock before `bump container_patches.NAME`: its patch file was edited since (the
        # bytes it pinned are gone). A state that cannot be built, said so; never a crash.
        return Outcome(reports=(), preflight_errors={}, patches=(), error=describe_error(e),
                       twin=twin)  # fmt: skip
    fates = _container_patch_fates(lock, patch_files, resolve, engine, state, log)
    fates += _srt_patch_fates(lock, log, srt_source)
    try:
        builder = make_builder(lock, engine, state, log, twin)
        builds = list(zip(specs, build_all(builder, specs), strict=True))
    except K3envError as e:
        return Outcome(reports=(), preflight_errors={}, patches=fates, error=describe_error(e),
                       twin=twin)  # fmt: skip
    reports = verify_images(engine, state, lock, builds, twin=twin) if run_verify else []
    pre = run_rules(contexts(lock, specs, cluster, state), RULES)
    errors = {spec.name: 0 for spec in specs}
    for f in pre.findings:
        if f.severity == "error":
            errors[f.image] = errors.get(f.image, 0) + 1
    return Outcome(reports=reports, preflight_errors=errors, patches=fates, twin=twin)


def _container_patch_fates(
    lock: Lock,
    patch_files: Mapping[str, PatchFile],
    resolve: Callable[[BasePin], ResolvedBase],
    engine: Engine,
    state: State,
    log: Log,
) -> list[PatchFate]:
    """Each container patch on each base it was written for: applies, upstream (drop it),
    conflicts, or skipped (its base cannot be had here)."""
    fates: list[PatchFate] = []
    for name, pin in lock.container_patches.items():
        patch = patch_files[name]
        for base_name in pin.bases:
            base_pin = lock.bases[base_name]
            # A patch is tested on the bases it was written for, never on a twin in their
            # place (the twin's vLLM is another release: a conflict there says nothing). A
            # twin the patch names itself is built here.
            here = base_pin.kind == "twin" or (
                base_pin.kind == "registry" and base_pin.digest is not None
            )
            if not here:
                fates.append(PatchFate(name=name, base=base_name, status="skipped",
                                       detail="base not resolvable here"))  # fmt: skip
                continue
            try:
                base = resolve(base_pin)
                target = (
                    pin.path
                    or resolve_modules(engine, state, base, [pin.module or ""], log)[
                        pin.module or ""
                    ]
                )
                file = read_base_files(engine, state, base, [target])[target] if target else None
                if file is None:
                    raise PatchError(f"target {pin.target} not in the image", where=name, fix="")
                result = apply_patch(
                    patch, str(target), file.content.decode(), image=base.reference
                )
                status = "upstream" if result.status == ALREADY_PRESENT else "applies"
                fates.append(
                    PatchFate(name=name, base=base_name, status=status, detail=result.detail)
                )
            except PatchError as e:
                fates.append(PatchFate(name=name, base=base_name, status="conflicts",
                                       detail=e.message))  # fmt: skip
    return fates


def _srt_patch_fates(lock: Lock, log: Log, srt_source: str | None) -> list[PatchFate]:
    """Each srt-slurm PR patch on the pinned version (or why they could not be tried)."""
    if lock.srt_slurm is None or not lock.srt_slurm.patches:
        return []
    try:
        return [
            PatchFate(
                name=fate.label,
                base=f"srt-slurm {lock.srt_slurm.version}",
                status=fate.status,
                detail=fate.detail,
            )
            for fate in patch_fates(lock, log, source=srt_source)
        ]
    except K3envError as e:
        return [PatchFate(name="srt-slurm patches", base=lock.srt_slurm.version,
                          status="skipped", detail=describe_error(e))]  # fmt: skip
