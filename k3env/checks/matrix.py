"""The version matrix: every image verified on the CPU twin with each variant of the pinned
components (``[variants.NAME]`` in the lock) beside the pinned ones.

A variant swaps a component's wheels, or lays another vLLM release over the twin (then it is
under every image). Images that bake none of a variant's components, with no release laid
under them, are the pinned images and are not built again (``same``: the pinned cell's
verdict). Each cell is one real build (its layers cached by content) and one probe run, its
status the one verdict model's summary of its checks; each column names the vLLM, Dynamo and
aiperf its images run, each failed cell its first failing line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from k3env import jsontext
from k3env.checks.report import MARKS
from k3env.checks.verdicts import CheckResult, ImageReport
from k3env.config.pins import OVERLAYS, Lock
from k3env.config.shapes import DEFAULT_PLATFORM
from k3env.config.spec import ImageSpec
from k3env.verdict import FAILED, NOT_CHECKED, NOT_RUN, PASSED, Gate, summary

PINNED = "pinned"


@dataclass(frozen=True, kw_only=True)
class Cell:
    variant: str
    image: str
    status: str  # one of verdict.STATUSES
    versions: str  # the component wheels this cell baked
    same: bool = False  # the pinned image (it bakes none of the variant's components)
    failed: tuple[CheckResult, ...] = ()
    image_id: str | None = None
    platform: str = DEFAULT_PLATFORM
    stack: Mapping[str, str | None] = field(default_factory=dict)  # vllm / dynamo / aiperf
    unchecked: tuple[str, ...] = ()  # env vars this host could not check (said, never passed)
    smoke: str | None = None  # with --smoke: "passed", "failed: ...", "not checked: ..."

    @property
    def first_failure(self) -> str:
        """The first failing check, as one line: ``check subject: first output line``."""
        if not self.failed:
            return ""
        f = self.failed[0]
        first = next(iter(f.output.strip().splitlines()), "")
        # Most outputs open with their subject: said once.
        first = first.removeprefix(f.subject).removeprefix(":").strip() or first
        return f"{f.check} {f.subject}: {first}"

    @property
    def row(self) -> tuple[str, str]:
        return (self.image, self.platform)

    def as_json(self) -> dict[str, Any]:
        return {**jsontext.plain(self, leave=("unchecked",)), "not_checked": list(self.unchecked),
                "first_failure": self.first_failure or None}  # fmt: skip


def baked_versions(vlock: Lock, spec: ImageSpec) -> str:
    """The wheels a cell bakes: the spec's components, and a variant's release over the twin."""
    pins = [vlock.components[c] for c in spec.components]
    if vlock.overlay is not None:
        pins.append(vlock.overlay)
    return ", ".join(f"{w.name} {w.version}" for c in pins for w in c.wheels)


def run_matrix(
    lock: Lock,
    specs: Sequence[ImageSpec],
    variants: Sequence[str],
    verify: Callable[[Lock, ImageSpec, str], ImageReport],
    platforms: Sequence[str] = (DEFAULT_PLATFORM,),
    smoke: Callable[[Lock, ImageSpec, str], str] | None = None,
) -> list[Cell]:
    """``verify(lock, spec, platform)`` builds and verifies one image over that platform's
    twin: a row per image and platform, a column per variant; ``smoke(lock, spec,
    platform)``, after it, that image's smoke verdict in one line."""
    cells: list[Cell] = []
    pinned: dict[tuple[str, str], str] = {}  # (image, platform) -> the pinned cell's status
    locks = [(PINNED, lock)] + [(n, lock.with_variant(lock.variants[n])) for n in variants]
    for name, vlock in locks:
        changed = set(lock.variants[name].components) if name != PINNED else None
        for platform in platforms:
            for spec in specs:
                cell = Cell(variant=name, image=spec.name, versions=baked_versions(vlock, spec),
                            platform=platform, stack=vlock.stack(platform), same=True,
                            status=pinned.get((spec.name, platform), NOT_RUN))  # fmt: skip
                # A release laid over the twin is under every image.
                if changed is None or changed & {*spec.components, *OVERLAYS}:
                    report = verify(vlock, spec, platform)
                    unchecked = tuple(r.subject for r in report.results
                                      if r.check == "env" and r.status == NOT_CHECKED)  # fmt: skip
                    smoked = smoke(vlock, spec, platform) if smoke else None
                    cell = replace(cell, status=summary(report.gates), same=False,
                                   failed=tuple(report.failed), image_id=report.image_id,
                                   unchecked=unchecked, smoke=smoked)  # fmt: skip
                    pinned.setdefault((spec.name, platform), cell.status)
                cells.append(cell)
    return cells


_STACK = (("vllm", "vLLM"), ("dynamo", "Dynamo"), ("aiperf", "aiperf"))
CELL_LINE = 100  # characters of a cell's first failing line (the details keep 300)


def column_header(variant: str, cells: Sequence[Cell]) -> str:
    """`variant`<br>vLLM x · Dynamo y · aiperf z: what the column's images run."""
    stack = next((c.stack for c in cells if c.variant == variant and c.stack), {})
    parts = [f"{label} {stack[key]}" for key, label in _STACK if stack.get(key)]
    return f"`{variant}`" + (f"<br>{' · '.join(parts)}" if parts else "")


class GateReport(Protocol):
    """A smoke report as a matrix cell reads it (``smoke.run.Report``)."""

    @property
    def profile(self) -> str: ...
    @property
    def stand_in(self) -> str: ...
    @property
    def gates(self) -> Sequence[Gate]: ...


def smoke_cell(reports: Sequence[GateReport]) -> str:
    """A cell's smoke verdict in one line, from each profile's gates: ``failed`` (the first
    failed gate), ``not run`` (a planned gate that never ran), ``partly checked`` (every gate
    passed but some could not be checked here, named), else ``passed``. Only ``passed`` is a
    pass: a gate not checked or not run is never shown as one."""
    gates = [(r, g) for r in reports for g in r.gates]
    if not gates:
        return "not run: no profile was served"
    for status in (FAILED, NOT_RUN):
        hit = [(r, g) for r, g in gates if g.status == status]
        if hit:
            r, g = hit[0]
            return f"{status}: {r.profile} {g.name}" + (f": {g.detail}" if g.detail else "")
    unchecked = [f"{r.profile} {g.name}" for r, g in gates if g.status == NOT_CHECKED]
    if unchecked:
        return "partly checked: not checked: " + ", ".join(unchecked)
    return "passed: " + ", ".join(f"{r.profile} ({r.stand_in})" for r in reports)


SMOKE_MARKS = {**MARKS, "partly checked": "✅ partly (not checked: see below)"}


def cell_text(cell: Cell) -> str:
    text = _verify_text(cell)
    if cell.smoke is None:
        return text
    verdict = cell.smoke.split(":", 1)[0]
    return f"{text}<br>smoke {SMOKE_MARKS.get(verdict, verdict)}"


def _verify_text(cell: Cell) -> str:
    if cell.same:
        return "= pinned"
    if cell.status == PASSED and cell.unchecked:
        return f"✅ ({len(cell.unchecked)} env not checked)"
    if not cell.failed:
        return MARKS[cell.status]
    line = cell.first_failure.replace("|", "\\|").replace("`", "'")
    short = line if len(line) <= CELL_LINE else line[: CELL_LINE - 1] + "…"
    more = f" (+{len(cell.failed) - 1})" if len(cell.failed) > 1 else ""
    return f"{MARKS[cell.status]} {short}{more}"


def markdown(lock: Lock, cells: Sequence[Cell]) -> str:
    """Images x variants (each column naming its vLLM, Dynamo and aiperf; each ❌ cell its
    first failing line); below, each variant's wheels and each failure's first line."""
    variants = list(dict.fromkeys(c.variant for c in cells))
    rows = list(dict.fromkeys(c.row for c in cells))
    at = {(c.variant, c.row): c for c in cells}
    lines = [
        "### k3env version matrix (CPU twin)",
        "",
        "| image | platform | " + " | ".join(column_header(v, cells) for v in variants) + " |",
        "|---|---|" + "---|" * len(variants),
    ]
    for image, platform in rows:
        row = [cell_text(at[(v, (image, platform))]) for v in variants]
        lines.append(f"| `{image}` | {platform} | " + " | ".join(row) + " |")
    lines.append("")
    for v in variants:
        why = lock.variants[v].why if v in lock.variants else "the lock's own pins"
        baked = sorted({w for c in cells if c.variant == v for w in c.versions.split(", ") if w})
        lines.append(f"- `{v}`: {', '.join(baked) or 'no components'}. {why}".rstrip())
    unchecked = sorted({(c.variant, n) for c in cells for n in c.unchecked})
    if unchecked:
        lines += ["", "Not checked on this host (said, never passed): "
                  + "; ".join(f"`{v}` {n}" for v, n in unchecked)]  # fmt: skip
    smoked = [(c, c.smoke) for c in cells if c.smoke and not c.smoke.startswith("passed")]
    if smoked:
        lines += ["", "Smoke (the CPU build of each column's vLLM serving the image):"]
        lines += [f"- `{c.variant}` **{c.image}**: {s[:300]}" for c, s in smoked]
    failures = [(c, f) for c in cells for f in c.failed]
    if failures:
        lines += ["", "<details><summary>Why each ❌</summary>", ""]
        for c, f in failures:
            first = next(iter(f.output.strip().splitlines()), "")
            where = c.image + (f"/{f.profile}" if f.profile else "") + f" ({c.platform})"
            lines.append(f"- `{c.variant}` **{where}** `{f.check}` {f.subject}: {first[:300]}")
        lines += ["", "</details>"]
    return "\n".join(lines) + "\n"
