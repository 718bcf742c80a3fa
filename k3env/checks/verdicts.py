"""Verify's verdicts: one row per check, an image's report, and the rows the host judges
itself from the lock and what the probe read (versions and requirements, patches present).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from k3env.config.patchfile import load_patch_file
from k3env.config.pinned_files import verify_patch_file
from k3env.config.pins import Lock, TwinPin
from k3env.config.shapes import DEFAULT_PLATFORM
from k3env.config.spec import ImageSpec
from k3env.config.twinreq import pinned_versions
from k3env.image.build import BuildResult
from k3env.image.patches import SKIPPED, missing_edits
from k3env.versions import Installed, canonical_name, unmet_requirements

CHECKS = ("versions", "imports", "args", "parsers", "tokenizer", "patches", "env")
# Component name in reports and facts -> the distribution that carries it (the one table).
COMPONENTS = {
    "vllm": "vllm",
    "dynamo": "ai-dynamo",
    "dynamo-runtime": "ai-dynamo-runtime",
    "torch": "torch",
    "aiperf": "aiperf",
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
        if (overlay := lock.overlay) is not None:  # a variant's vLLM over the twin
            if overlay.closure is not None:
                pinned.update(pinned_versions(lock.resolve_path(overlay.closure)))
            pinned.update({w.name: w.version for w in overlay.wheels})
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
