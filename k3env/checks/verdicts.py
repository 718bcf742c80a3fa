"""Verify's verdicts: one row per check, an image's report, and the rows the host judges
itself from the lock and what the probe read (versions and requirements, patches present).

A row's status is one of ``verdict.STATUSES``: the probe's own words (pass / fail / skip, also
in records earlier k3env wrote) are read at the edge (``CheckResult.read``), and a check the
plan asked for that the probe never reported is ``not run`` (``with_unreported``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from k3env import jsontext
from k3env.config.patchfile import load_patch_file
from k3env.config.pinned_files import verify_patch_file
from k3env.config.pins import Lock, TwinPin
from k3env.config.shapes import DEFAULT_PLATFORM
from k3env.config.spec import ImageSpec
from k3env.config.twinreq import pinned_versions
from k3env.image.build import BuildResult
from k3env.image.patches import SKIPPED, missing_edits
from k3env.quoting import one_line
from k3env.verdict import (
    FAILED,
    NOT_CHECKED,
    NOT_RUN,
    PASSED,
    STATUSES,
    Gate,
    read_status,
    summary,
)
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
# The in-image probe's words, as verdicts: a skip's output says why it was not checked.
PROBE_WORDS = {"pass": PASSED, "fail": FAILED, "skip": NOT_CHECKED}
NOT_REPORTED = "planned, and the probe reported no verdict for it"


@dataclass(frozen=True, kw_only=True)
class CheckResult:
    image: str
    profile: str | None
    check: str
    subject: str
    status: str  # one of verdict.STATUSES
    component: str
    version: str | None
    output: str  # the evidence, the failure's own words, or why it was not checked

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"check {self.subject!r}: status {self.status!r} is not a verdict")

    @classmethod
    def read(cls, row: object, image: str) -> CheckResult:
        """A row as the probe printed it, or as a record of an earlier k3env kept it (the
        probe's pass / fail / skip, or the four words); any other status is ``failed``, named."""
        got = row if isinstance(row, Mapping) else {"output": f"not a row: {row!r:.200}"}
        word, profile, version = got.get("status"), got.get("profile"), got.get("version")
        status, output = read_status(
            PROBE_WORDS.get(word, word) if isinstance(word, str) else word,
            str(got.get("output") or ""),
        )
        return cls(image=image, profile=None if profile is None else str(profile),
                   check=str(got.get("check", "?")), subject=str(got.get("subject", "?")),
                   status=status, component=str(got.get("component", "?")),
                   version=None if version is None else str(version), output=output)  # fmt: skip

    @property
    def gate(self) -> Gate:
        """This row in the one verdict model: named by image, profile, check and subject."""
        where = self.image + (f"/{self.profile}" if self.profile else "")
        first = next(iter(self.output.strip().splitlines()), "")
        return Gate(name=f"{where} {self.check} {self.subject}", status=self.status,
                    detail=one_line(first)[:300])  # fmt: skip

    def as_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def with_unreported(
    image: str, planned: Iterable[tuple[str, str | None, str]], rows: Sequence[CheckResult]
) -> tuple[CheckResult, ...]:
    """``rows``, then each planned (check, profile, subject) none of them reported, as ``not
    run``: a check nobody reported is never read as passed, nor as not checked."""
    seen = {(r.check, r.profile, r.subject) for r in rows}
    return (*rows, *(CheckResult(image=image, profile=profile, check=check, subject=subject,
                                 status=NOT_RUN, component="k3env-probe", version=None,
                                 output=NOT_REPORTED)
                     for check, profile, subject in dict.fromkeys(planned)
                     if (check, profile, subject) not in seen))  # fmt: skip


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
        """The checks that failed or never ran: neither is a pass."""
        return [r for r in self.results if r.status in (FAILED, NOT_RUN)]

    @property
    def gates(self) -> tuple[Gate, ...]:
        return tuple(r.gate for r in self.results)

    def status(self, check: str) -> str:
        """One status for a check (``verdict.summary``); ``not checked``: nothing to check."""
        gates = [r.gate for r in self.results if r.check == check]
        return summary(gates) if gates else NOT_CHECKED

    def as_json(self) -> dict[str, Any]:
        return {**jsontext.plain(self), "seconds": round(self.seconds, 3),
                "matrix": {c: self.status(c) for c in CHECKS}}  # fmt: skip


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
        return [row(FAILED, "requirements", "the probe listed no installed distributions")]
    rows = []
    seen: dict[str, dict[str, Any]] = {}
    for d in raw:
        key = canonical_name(str(d["name"]))
        if key in seen and seen[key].get("path") != d.get("path"):
            rows.append(
                row(
                    FAILED,
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
            rows.append(row(FAILED, f"requires {u.dist}", u.message))
    waived = [u for u in unmet if u.waived is not None]
    if waived:
        targets = sorted({u.target for u in waived})
        rows.append(
            row(
                NOT_CHECKED,
                "requirements waived in the twin",
                f"{len(waived)} requirement(s) on {len(targets)} distribution(s) the CPU twin "
                f"leaves out or stands in for, not checked here: {', '.join(targets)}",
            )
        )
    if not any(r.status == FAILED for r in rows):
        used = [f"{w}[{','.join(e)}]" for w, e in sorted(extras.items()) if e]
        rows.append(
            row(
                PASSED,
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
            rows.append(row(NOT_CHECKED, result.detail))
            continue
        target = targets.get(name) or {}
        if target.get("text") is None:
            rows.append(row(FAILED, f"target {pin.target} not found in the image"))
            continue
        missing = missing_edits(load_patch_file(pin, verify_patch_file(lock, pin)), target["text"])
        path = target.get("path")
        rows.append(
            row(FAILED, f"{path}: " + "; ".join(missing))
            if missing
            else row(PASSED, f"{path}: every edit present")
        )
    return rows
