"""Rendering verify reports: a terminal table and a markdown compat matrix. Pure text."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from k3env.checks.verdicts import CHECKS, CheckResult, ImageReport
from k3env.verdict import FAILED, NOT_CHECKED, NOT_RUN, PASSED

# A status in markdown: only passed is a check mark.
MARKS = {PASSED: "✅", FAILED: "❌", NOT_RUN: "⛔ not run", NOT_CHECKED: "not checked"}


def table(reports: Sequence[ImageReport]) -> str:
    width = max([len(r.image) for r in reports] + [5])
    head = f"{'image':{width}}  {'platform':11}  " + "  ".join(f"{c:11}" for c in CHECKS)
    head += "  seconds"
    lines = [head, "-" * len(head)]
    for r in reports:
        cells = "  ".join(f"{r.status(c):11}" for c in CHECKS)
        lines.append(f"{r.image:{width}}  {r.platform:11}  {cells}  {r.seconds:7.2f}")
    for r, f in _failures(reports):
        lines.append("")
        lines.append(
            f"{f.status} {_where(r, f)} {f.check}: {f.subject} [{f.component} {f.version or '?'}]"
        )
        lines.extend(f"    {line}" for line in f.output.strip().splitlines()[-15:])
    return "\n".join(lines)


def _failures(reports: Sequence[ImageReport]) -> list[tuple[ImageReport, CheckResult]]:
    return [(r, f) for r in reports for f in r.failed]


def _where(r: ImageReport, f: CheckResult) -> str:
    return f.image + (f"/{f.profile}" if f.profile else "") + f" ({r.platform})"


def markdown(
    reports: Sequence[ImageReport],
    title: str = "k3env compat matrix",
    serves: Mapping[str, bool | None] | None = None,
) -> str:
    """Images x checks, a row per image and platform, for a PR body; failures listed below
    with the probe's own output. ``serves``: image ID -> whether every profile served in its
    last `k3env smoke` (None: never smoked), as a last column."""
    extra = ["serves"] if serves is not None else []
    lines = [
        f"### {title}",
        "",
        "| image | platform | " + " | ".join([*CHECKS, *extra]) + " |",
        "|---|---|" + "---|" * (len(CHECKS) + len(extra)),
    ]
    for r in reports:
        marks = " | ".join(MARKS[r.status(c)] for c in CHECKS)
        if serves is not None:
            served = serves.get(r.image_id)
            marks += " | " + (
                "not smoked" if served is None else MARKS[PASSED if served else FAILED]
            )
        lines.append(f"| `{r.image}` | {r.platform} | {marks} |")
    versions = {
        f"{k} {v}" for r in reports for k, v in (r.facts.get("versions") or {}).items() if v
    }
    if versions:
        lines += ["", "Inside the images: " + ", ".join(sorted(versions)) + "."]
    failures = _failures(reports)
    if failures:
        lines += ["", "<details><summary>Failures</summary>", ""]
        for r, f in failures:
            lines += [
                f"**{_where(r, f)}**: `{f.check}` {f.subject} ({f.component} {f.version or '?'})",
                "",
                "```",
                *f.output.strip().splitlines()[-15:],
                "```",
                "",
            ]
        lines.append("</details>")
    return "\n".join(lines) + "\n"
