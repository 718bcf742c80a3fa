"""Rendering verify reports: a terminal table and a markdown compat matrix. Pure text."""

from __future__ import annotations

from collections.abc import Sequence

from k3env.checks.verify import CHECKS, ImageReport

_MARK = {"pass": "✅", "fail": "❌", "skip": "n/a"}


def table(reports: Sequence[ImageReport]) -> str:
    width = max([len(r.image) for r in reports] + [5])
    head = f"{'image':{width}}  " + "  ".join(f"{c:9}" for c in CHECKS) + "  seconds"
    lines = [head, "-" * len(head)]
    for r in reports:
        cells = "  ".join(f"{r.status(c):9}" for c in CHECKS)
        lines.append(f"{r.image:{width}}  {cells}  {r.seconds:7.2f}")
    failures = [f for r in reports for f in r.failed]
    for f in failures:
        lines.append("")
        where = f"{f.image}" + (f"/{f.profile}" if f.profile else "")
        lines.append(f"FAIL {where} {f.check}: {f.subject} [{f.component} {f.version or '?'}]")
        lines.extend(f"    {line}" for line in f.output.strip().splitlines()[-15:])
    return "\n".join(lines)


def markdown(reports: Sequence[ImageReport], title: str = "k3env compat matrix") -> str:
    """Images x checks, for a PR body; failures listed below with the probe's own output."""
    lines = [
        f"### {title}",
        "",
        "| image | " + " | ".join(CHECKS) + " |",
        "|---|" + "---|" * len(CHECKS),
    ]
    for r in reports:
        lines.append(f"| `{r.image}` | " + " | ".join(_MARK[r.status(c)] for c in CHECKS) + " |")
    versions = {
        f"{k} {v}" for r in reports for k, v in (r.facts.get("versions") or {}).items() if v
    }
    if versions:
        lines += ["", "Inside the images: " + ", ".join(sorted(versions)) + "."]
    failures = [f for r in reports for f in r.failed]
    if failures:
        lines += ["", "<details><summary>Failures</summary>", ""]
        for f in failures:
            where = f.image + (f"/{f.profile}" if f.profile else "")
            lines += [
                f"**{where}**: `{f.check}` {f.subject} ({f.component} {f.version or '?'})",
                "",
                "```",
                *f.output.strip().splitlines()[-15:],
                "```",
                "",
            ]
        lines.append("</details>")
    return "\n".join(lines) + "\n"
