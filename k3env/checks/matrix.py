"""The version matrix: every image verified on the CPU twin with each variant of the pinned
components (``[variants.NAME]`` in the lock) beside the pinned ones.

A variant swaps a component's wheels; the twin base stays the lock's. Images that bake none
of a variant's components are the pinned images and are not built again (``same``). Each
cell is one real build (its components layer cached by content) and one probe run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from k3env.checks.verdicts import CheckResult, ImageReport
from k3env.config.pins import Lock
from k3env.config.shapes import DEFAULT_PLATFORM
from k3env.config.spec import ImageSpec

PINNED = "pinned"


@dataclass(frozen=True, kw_only=True)
class Cell:
    variant: str
    image: str
    status: str  # pass | fail | same (the image bakes none of the variant's components)
    versions: str  # the component wheels this cell baked
    failed: tuple[CheckResult, ...] = ()
    image_id: str | None = None
    platform: str = DEFAULT_PLATFORM

    @property
    def row(self) -> tuple[str, str]:
        return (self.image, self.platform)

    def as_json(self) -> dict[str, Any]:
        return {
            "variant": self.variant,
            "image": self.image,
            "platform": self.platform,
            "status": self.status,
            "versions": self.versions,
            "image_id": self.image_id,
            "failed": [f.as_json() for f in self.failed],
        }


def variant_locks(lock: Lock, names: Sequence[str]) -> list[tuple[str, Lock]]:
    return [(PINNED, lock)] + [(n, lock.with_variant(lock.variants[n])) for n in names]


def run_matrix(
    lock: Lock,
    specs: Sequence[ImageSpec],
    variants: Sequence[str],
    verify: Callable[[Lock, ImageSpec, str], ImageReport],
    platforms: Sequence[str] = (DEFAULT_PLATFORM,),
) -> list[Cell]:
    """``verify(lock, spec, platform)`` builds and verifies one image over that platform's
    twin: a row per image and platform, a column per variant."""
    cells = []
    for name, vlock in variant_locks(lock, variants):
        changed = set(lock.variants[name].components) if name != PINNED else None
        for platform in platforms:
            for spec in specs:
                versions = ", ".join(
                    f"{w.name} {w.version}"
                    for c in spec.components
                    for w in vlock.components[c].wheels
                )
                cell = Cell(variant=name, image=spec.name, status="same", versions=versions,
                            platform=platform)  # fmt: skip
                if changed is None or changed & set(spec.components):
                    report = verify(vlock, spec, platform)
                    status = "fail" if report.failed else "pass"
                    cell = replace(cell, status=status, failed=tuple(report.failed),
                                   image_id=report.image_id)  # fmt: skip
                cells.append(cell)
    return cells


_MARK = {"pass": "✅", "fail": "❌", "same": "= pinned"}


def markdown(lock: Lock, cells: Sequence[Cell]) -> str:
    """Images x variants; below, each variant's components and each failure's first line."""
    variants = list(dict.fromkeys(c.variant for c in cells))
    rows = list(dict.fromkeys(c.row for c in cells))
    at = {(c.variant, c.row): c for c in cells}
    lines = [
        "### k3env version matrix (CPU twin)",
        "",
        "| image | platform | " + " | ".join(f"`{v}`" for v in variants) + " |",
        "|---|---|" + "---|" * len(variants),
    ]
    for image, platform in rows:
        row = [_MARK[at[(v, (image, platform))].status] for v in variants]
        lines.append(f"| `{image}` | {platform} | " + " | ".join(row) + " |")
    lines.append("")
    for v in variants:
        why = lock.variants[v].why if v in lock.variants else "the lock's own pins"
        baked = sorted({c.versions for c in cells if c.variant == v and c.versions})
        lines.append(f"- `{v}`: {'; '.join(baked) or 'no components'}. {why}".rstrip())
    failures = [(c, f) for c in cells for f in c.failed]
    if failures:
        lines += ["", "<details><summary>Why each ❌</summary>", ""]
        for c, f in failures:
            first = next(iter(f.output.strip().splitlines()), "")
            where = c.image + (f"/{f.profile}" if f.profile else "") + f" ({c.platform})"
            lines.append(f"- `{c.variant}` **{where}** `{f.check}` {f.subject}: {first[:300]}")
        lines += ["", "</details>"]
    return "\n".join(lines) + "\n"
