"""The pull request a bump proposes: title, markdown body, and the JSON result (pure)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

from k3env.bump.evaluate import Outcome
from k3env.checks.verdicts import CHECKS
from k3env.config.lock_edit import Change
from k3env.config.pins import Lock
from k3env.config.reader import COMMIT_RE, DIGEST_RE
from k3env.handoff.sbomdiff import PackageDiff, diff
from k3env.quoting import one_line
from k3env.versions import canonical_name

SBOM_DIFF = "SBOM diff (installed Python distributions and Debian packages, before → after)"
SHOWN = 60  # changes listed per image and kind: a base bump moves hundreds of Debian packages


def _link(lock: Lock, change: Change) -> str:
    m = re.match(r"https://github\.com/([^/]+/[^/.]+)", _git_url(lock, change.key) or "")
    if m and change.old and COMMIT_RE.match(change.new) and COMMIT_RE.match(change.old):
        return f" ([diff](https://github.com/{m[1]}/compare/{change.old[:12]}...{change.new[:12]}))"
    if m and COMMIT_RE.match(change.new):
        return f" ([commit](https://github.com/{m[1]}/commit/{change.new}))"
    return ""


def _git_url(lock: Lock, key: str) -> str | None:
    if key.startswith("dynamo.") and lock.dynamo:
        return lock.dynamo.git
    if key.startswith("srt_slurm.") and lock.srt_slurm:
        return lock.srt_slurm.git
    return None


def _short(value: str | None) -> str:
    if value is None:
        return "—"
    return value if len(value) < 20 else f"`{value[:19]}…`"


def title(pin: str, changes: Sequence[Change]) -> str:
    main = changes[-1] if changes else None
    new = main.new if main else "?"
    return f"Bump {pin} to {new[:12] if COMMIT_RE.match(new) or DIGEST_RE.match(new) else new}"


def body(
    lock: Lock,
    pin: str,
    changes: Sequence[Change],
    before: Outcome,
    after: Outcome,
    extra: Sequence[str] = (),
) -> str:
    """The markdown body (``extra``: sections a pin adds after the patches)."""
    lines = [
        f"## {title(pin, changes)}",
        "",
        "### Pins",
        "",
        "| pin | old | new |",
        "|---|---|---|",
    ]
    for c in changes:
        lines.append(f"| `{c.key}` | {_short(c.old)} | {_short(c.new)}{_link(lock, c)} |")
    lines += ["", "### Patches on the new pins", ""]
    if after.patches:
        lines += ["| patch | base | status | detail |", "|---|---|---|---|"]
        for p in after.patches:
            mark = {"applies": "✅ applies", "upstream": "⬆️ upstream: drop it",
                    "conflicts": "❌ conflicts", "skipped": "n/a"}[p.status]  # fmt: skip
            lines.append(f"| `{p.name}` | {p.base} | {mark} | {p.detail} |")
    else:
        lines.append("No container patch applies to the bumped pins.")
    lines += extra
    lines += ["", "### Compat matrix (before → after)", ""]
    if after.twin:
        lines += [
            "Built and verified over each base's CPU twin (`--twin`): the real base is not "
            "resolvable here. The twin carries the lock's `[twin]` release of vLLM from PyPI "
            "with CPU torch, not the real base's build; container patches written for the real "
            "base are not judged on it.",
            "",
        ]
    old, new = before.matrix(), after.matrix()
    lines += [
        "| image | " + " | ".join(CHECKS) + " | preflight |",
        "|---|" + "---|" * (len(CHECKS) + 1),
    ]
    for image in sorted(set(old) | set(new)):
        cells = []
        for check in CHECKS:
            a, b = old.get(image, {}).get(check, "—"), new.get(image, {}).get(check, "—")
            cells.append(f"**{a} → {b}**" if a != b else b)
        pa, pb = before.preflight_errors.get(image, 0), after.preflight_errors.get(image, 0)
        cells.append(f"**{pa} → {pb} errors**" if pa != pb else f"{pb} errors")
        lines.append(f"| `{image}` | " + " | ".join(cells) + " |")
    if before.error:
        lines += ["", f"**The lock before the bump did not build:** {before.error}"]
    if after.error:
        lines += ["", f"**The bumped lock did not build:** {after.error}"]
    lines += _package_diff(before, after)
    failures = [f for r in after.reports for f in r.failed]
    if failures:
        lines += ["", "<details open><summary>Failing checks after the bump</summary>", ""]
        for f in failures:
            lines += [
                f"**{f.image}{'/' + f.profile if f.profile else ''}** `{f.check}` {f.subject} "
                f"({f.component} {f.version or '?'})",
                "",
                "```",
                *f.output.strip().splitlines()[-12:],
                "```",
                "",
            ]
        lines.append("</details>")
    lines += [
        "",
        "### Changelog",
        "",
        "- pins: "
        + "; ".join(f"{c.key} {_short(c.old)} → {_short(c.new)}" for c in changes)
        + " (`k3env bump "
        + pin
        + "`)",
        "",
        "Generated by `k3env bump`. " + _verdict(before, after),
    ]
    return "\n".join(lines) + "\n"


def as_json(
    pin: str, changes: Sequence[Change], before: Outcome, after: Outcome, written: bool, text: str
) -> dict[str, Any]:
    return {
        "pin": pin,
        "title": title(pin, changes),
        "changes": [c.__dict__ for c in changes],
        "before": {"matrix": before.matrix(), "preflight_errors": dict(before.preflight_errors)},
        "after": {
            "matrix": after.matrix(),
            "preflight_errors": dict(after.preflight_errors),
            "patches": [p.__dict__ for p in after.patches],
            "error": after.error,
        },
        "twin": after.twin,
        "failed": after.failed,
        "lock_written": written,
        "body": text,
    }


def _installed(report: Any) -> dict[str, str]:
    """``pypi:name`` -> version of every distribution verify found in the image."""
    got = report.facts.get("distributions") if isinstance(report.facts, dict) else None
    return {
        f"pypi:{canonical_name(str(d.get('name')))}": str(d.get("version"))
        for d in (got if isinstance(got, list) else [])
        if isinstance(d, dict)
    }


def _debian(report: Any) -> dict[str, str] | str:
    """``deb:name`` (``deb:name:arch`` for a name installed for several architectures) ->
    version of every Debian package verify found installed; or why there is no list (facts
    recorded before verify read dpkg's status, or a status it did not read)."""
    facts = report.facts if isinstance(report.facts, dict) else {}
    got = facts.get("debian_packages")
    if not isinstance(got, list):
        unread = facts.get("debian_packages_unread")
        return (
            f"dpkg's status was not read ({one_line(str(unread))[:200]})"
            if unread
            else "its facts were recorded before verify read dpkg's status (run verify again)"
        )
    rows = [(str(d.get("name")), str(d.get("version")), str(d.get("arch") or ""))
            for d in got if isinstance(d, dict)]  # fmt: skip
    names = Counter(name for name, _, _ in rows)
    return {f"deb:{n}" + (f":{a}" if names[n] > 1 and a else ""): v for n, v, a in rows}


def _changes(d: PackageDiff) -> str:
    """``+ name version; - name version; name old → new`` (at most ``SHOWN`` of them)."""
    said = [*(f"+ {n.split(':', 1)[1]} {v}" for n, v in d.added),
            *(f"- {n.split(':', 1)[1]} {v}" for n, v in d.removed),
            *(f"{n.split(':', 1)[1]} {a} → {b}" for n, a, b in d.changed)]  # fmt: skip
    more = f"; and {len(said) - SHOWN} more (k3env verify --json: facts)" * (len(said) > SHOWN)
    return "; ".join(said[:SHOWN]) + more


def _package_diff(before: Outcome, after: Outcome) -> list[str]:
    """The SBOM diff a reviewer reads: per image, the Python distributions and the Debian
    packages added, removed and changed, from what verify found installed before and after
    the bump; where either side's facts have no Debian packages, said, never "no change"."""
    old = {r.image: r for r in before.reports}
    lines = ["", f"### {SBOM_DIFF}", ""]
    changed, uncompared = False, False
    for r in after.reports:
        if r.image not in old:
            continue
        d = diff(_installed(old[r.image]), _installed(r))
        if not d.empty:
            changed = True
            lines.append(f"**`{r.image}`**: " + _changes(d))
        was, now = _debian(old[r.image]), _debian(r)
        if isinstance(was, str) or isinstance(now, str):
            uncompared = True
            why = f"before the bump {was}" if isinstance(was, str) else f"after the bump {now}"
            lines.append(f"**`{r.image}`** Debian packages: not compared: {why}.")
        elif not (d := diff(was, now)).empty:
            changed = True
            lines.append(f"**`{r.image}`** Debian packages: " + _changes(d))
    if not old or not after.reports:
        lines.append("Not compared: verify did not run on both locks.")
    elif not changed:
        lines.append(
            "No installed Python distribution changed."
            if uncompared
            else "No installed Python distribution or Debian package changed."
        )
    return lines


def _verdict(before: Outcome, after: Outcome) -> str:
    """The last line: never "All checks pass" over checks that did not run."""
    if after.failed:
        same = (
            before.failed
            and before.matrix() == after.matrix()
            and (before.error is None) == (after.error is None)
        )
        return "**Not mergeable: checks fail after the bump.**" + (
            " The lock before the bump failed the same way." if same else ""
        )
    if not after.reports:
        return (
            "Built and preflighted; verify did not run (--skip-verify): the compat matrix is "
            "empty, so this bump is not checked from inside the images."
        )
    return "All checks pass."
