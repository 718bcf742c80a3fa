"""The probe's env search over the twin: what only a CPU stand-in or an absent GPU library
could read is not checked, never failed; what a reader the search can see never mentions is.

Runs the probe's own code on this host's Python: ``pytest`` is installed here, the NCCL
wheels are not.
"""

from __future__ import annotations

from typing import Any

from k3env.probes.probe.envsearch import _stood_in

FAMILIES = {"NCCL_": ["torch", "nvidia-nccl-cu12", "nvidia-nccl-cu13"], "PYTHON": [":python"]}


def plan(**over: Any) -> dict[str, Any]:
    return {"env": {"NCCL_CUMEM_ENABLE": None}, "env_families": FAMILIES,
            "stand_ins": ["torch"], **over}  # fmt: skip


def test_a_native_familys_name_over_the_twin_is_not_checked_naming_why() -> None:
    why = _stood_in(plan(), "NCCL_CUMEM_ENABLE")
    assert why == (
        "not checked: NCCL_CUMEM_ENABLE is read natively by the GPU build's libraries; here its "
        "readers are torch (a CPU stand-in) and nvidia-nccl-cu12, nvidia-nccl-cu13 are not "
        "installed, and none of them mentions it"
    )


def test_a_name_whose_reader_the_search_can_see_stays_a_finding() -> None:
    # A family reader that is installed here and no stand-in: an unread name is a finding.
    seen = {"NCCL_": ["torch", "pytest"]}
    assert _stood_in(plan(env_families=seen), "NCCL_CUMEM_ENABLE") is None
    # Not over the twin (no stand-ins), a declared reader, or no family: a finding too.
    assert _stood_in(plan(stand_ins=[]), "NCCL_CUMEM_ENABLE") is None
    declared = plan(env={"NCCL_CUMEM_ENABLE": "torch reads it"})
    assert _stood_in(declared, "NCCL_CUMEM_ENABLE") is None
    assert _stood_in(plan(env={"VLLM_X": None}), "VLLM_X") is None
