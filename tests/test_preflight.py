"""Preflight rules: each trips on the failing form from the bring-up and passes the fix."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from k3env.checks.argv import parse_options
from k3env.checks.preflight import Report, contexts, run_rules
from k3env.checks.rules import RULES
from k3env.cli import main
from k3env.config.cluster import load_cluster
from k3env.config.lock import load_lock
from k3env.config.pins import Lock
from k3env.config.spec import ImageSpec, load_spec
from k3env.errors import ConfigError
from k3env.image.records import Build, Facts, build_key, write
from k3env.state import State

from .conftest import replace_in

F = Path("images/kimi-k3-direct-f.toml")
D = Path("images/kimi-k3-direct-d.toml")
DYN = Path("images/kimi-k3-dynamo.toml")
LOCK = Path("pins/k3.lock.toml")
CLUSTER = Path("clusters/b200-dgxc.toml")


def judged(
    spec: Path, cluster: Path = CLUSTER, state: State | None = None, lock: Lock | None = None
) -> Report:
    """Every rule over one spec (under ``lock``, else the project's) on one cluster profile."""
    lock = lock or load_lock(LOCK)
    return run_rules(contexts(lock, [load_spec(spec, lock)], load_cluster(cluster), state), RULES)


def findings(spec: Path, state: State | None = None) -> dict[str, str]:
    """rule id -> worst severity, for one spec."""
    out: dict[str, str] = {}
    for f in judged(spec, state=state).findings:
        if out.get(f.rule) != "error":
            out[f.rule] = f.severity
    return out


def test_final_variant_f_passes_with_no_findings(resolved: Path) -> None:
    assert findings(F) == {}
    assert main(["preflight", "kimi-k3-direct-f"]) == 0


def test_every_rule_has_metadata_and_explain(capsys: pytest.CaptureFixture[str]) -> None:
    ids = [r.id for r in RULES]
    assert len(ids) == len(set(ids)) >= 12
    for r in RULES:
        assert (
            r.symptom and r.fix and r.components and r.source and r.severity in ("error", "warning")
        )
        assert main(["preflight", "--explain", r.id]) == 0
        assert r.fix in capsys.readouterr().out
    assert main(["preflight", "--explain", "K3-NOPE"]) == 2


# (spec, old, new, rule, severity): the failing form of a variant, written as a profile.
TRIPS = [
    # Commit 2: the worker rejected the vLLM frontend parser flags.
    (DYN, '"--dyn-tool-call-parser", "kimi_k3",',
     '"--enable-auto-tool-choice", "--tool-call-parser", "kimi_k3",', "K3-PARSER-FLAGS", "error"),
    (D, '"--tool-call-parser", "kimi_k3",', '"--dyn-tool-call-parser", "kimi_k3",',
     "K3-PARSER-FLAGS", "error"),
    # Commit 6: aiperf's nvext.session_control rejected with 400.
    (DYN, 'AIPERF_USE_DYNAMO_CONV_AWARE_ROUTING = "0"',
     'AIPERF_USE_DYNAMO_CONV_AWARE_ROUTING = "1"', "K3-AIPERF-SESSION-CONTROL", "error"),
    # 0.95 OOM'd on the first forward.
    (F, '"--gpu-memory-utilization", "0.90"', '"--gpu-memory-utilization", "0.95"',
     "K3-GPU-MEM-HEADROOM", "error"),
    # Variant E's prefill OOM (no expandable_segments with the offload connector).
    (F, 'PYTORCH_CUDA_ALLOC_CONF = "expandable_segments:True"', "", "K3-ALLOC-FRAGMENTATION",
     "error"),
    # The GB recipes' retention interval.
    (F, 'VLLM_PREFIX_CACHE_RETENTION_INTERVAL = "0"',
     'VLLM_PREFIX_CACHE_RETENTION_INTERVAL = "32768"', "K3-RETENTION-BLOCK", "error"),
    # Variant E with cross-layer blocks on.
    (F, '"enable_cross_layers_blocks":false', '"enable_cross_layers_blocks":true',
     "K3-CROSS-LAYER-HYBRID", "error"),
    # Variant F, eighth sweep: expandable_segments without cumem.
    (F, '  "--enable-cumem-allocator",\n', "", "K3-SIMPLECPU-CUMEM", "error"),
    # Variant F, ninth sweep: cumem with custom all-reduce.
    (F, '  "--disable-custom-all-reduce",\n', "", "K3-CUMEM-CUSTOM-AR", "error"),
    (F, "299875000000", "399875000000", "K3-CPU-OFFLOAD-DRAM", "error"),
    (F, "299875000000", "349875000000", "K3-CPU-OFFLOAD-DRAM", "warning"),
    (F, 'PYTHONHASHSEED = "42"', "", "K3-PYTHONHASHSEED", "error"),
    (F, '"--nnodes", "2"', '"--nnodes", "3"', "K3-TOPOLOGY", "error"),
    (F, '"--pipeline-parallel-size", "2"', '"--pipeline-parallel-size", "4"', "K3-TOPOLOGY",
     "error"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "old", "new", "rule", "severity"),
    TRIPS,
    ids=[f"{t[3]}-{i}" for i, t in enumerate(TRIPS)],
)
def test_rule_trips_on_the_failing_form(
    repo_with_clusters: Path, spec: Path, old: str, new: str, rule: str, severity: str
) -> None:
    assert rule not in findings(spec), "the shipped (fixed) form must pass this rule"
    replace_in(spec, old, new)
    assert findings(spec).get(rule) == severity


def test_fragmentation_is_a_warning_without_a_connector(resolved: Path) -> None:
    # Variant D served 24 minutes without expandable_segments: a warning, not an error.
    assert findings(D) == {"K3-ALLOC-FRAGMENTATION": "warning"}


def test_retention_multiple_of_block_passes(repo_with_clusters: Path) -> None:
    replace_in(
        F,
        'VLLM_PREFIX_CACHE_RETENTION_INTERVAL = "0"',
        'VLLM_PREFIX_CACHE_RETENTION_INTERVAL = "3145728"',
    )
    assert "K3-RETENTION-BLOCK" not in findings(F)


def test_tokenizer_model_type_follows_the_pinned_dynamo(repo_with_clusters: Path) -> None:
    # Commit 3: dynamo 1.2.1's frontend did not know kimi_k3 (every request 404).
    assert "K3-TOKENIZER-MODEL-TYPE" not in findings(DYN)  # 1.6.1
    replace_in(LOCK, 'version = "1.6.1"\ngit = ', 'version = "1.2.1"\ngit = ')
    assert findings(DYN)["K3-TOKENIZER-MODEL-TYPE"] == "error"
    # ... and the session_control rule does not apply to that older Dynamo.
    replace_in(
        DYN,
        'AIPERF_USE_DYNAMO_CONV_AWARE_ROUTING = "0"',
        'AIPERF_USE_DYNAMO_CONV_AWARE_ROUTING = "1"',
    )
    assert "K3-AIPERF-SESSION-CONTROL" not in findings(DYN)


def twin_build(
    state: State,
    lock: Lock,
    spec: ImageSpec,
    image_id: str,
    reference: str = "k3env/kimi-k3-dynamo:t",
    platform: str = "linux/amd64",
) -> None:
    record = Build(image_id=f"sha256:{image_id}", reference=reference, twin=True)
    write(state, record, build_key(lock, spec, twin=True, platform=platform))  # fmt: skip


def test_verify_facts_about_the_image_override_the_lock(repo_with_clusters: Path) -> None:
    state = State()
    image_id = "ab" * 32
    lock = load_lock(LOCK)
    spec = load_spec(DYN, lock)
    twin_build(state, lock, spec, image_id)
    dynamo = {"tiktoken_model_types": ["kimi", "kimi_k2"]}
    write(state, Facts(facts={"versions": {"dynamo": "1.6.1"}, "dynamo": dynamo}), image_id)
    assert findings(DYN, state)["K3-TOKENIZER-MODEL-TYPE"] == "error"
    assert judged(DYN, state=state, lock=lock).facts_from == {
        "kimi-k3-dynamo/agg": "k3env/kimi-k3-dynamo:t (linux/amd64, built over the CPU twin)"
    }
    dynamo = {"tiktoken_model_types": ["kimi_k3"]}
    write(state, Facts(facts={"versions": {"dynamo": "1.6.1"}, "dynamo": dynamo}), image_id)
    assert "K3-TOKENIZER-MODEL-TYPE" not in findings(DYN, state)


def test_srt_slurm_frontend_needs_the_pr_or_the_release(repo_with_clusters: Path) -> None:
    # The committed lock pins both patch files: the pinned srt-slurm serves the profile.
    assert "K3-SRT-FRONTEND" not in findings(D)
    # A lock written where the patch files could not be made: unresolved pins provide nothing,
    # and the 2-node direct recipe needs both.
    committed = LOCK.read_text()
    start = committed.index("[[srt_slurm.patches]]")
    end = committed.index("# ----", start)
    patches = re.sub(r'(?m)^sha256 = "[0-9a-f]{64}"$', 'sha256 = "unresolved"',
                     committed[start:end])  # fmt: skip
    LOCK.write_text(committed[:start] + patches + committed[end:])
    srt = [f for f in judged(D).findings if f.rule == "K3-SRT-FRONTEND"]
    assert {f.key for f in srt} == {"srt_slurm.patches[0]", "srt_slurm.patches[1]"}
    assert all(f.severity == "error" and "unresolved (no sha256)" in f.message for f in srt)
    LOCK.write_text(committed)
    assert "K3-SRT-FRONTEND" not in findings(D)
    replace_in(LOCK, 'provides = ["frontend.vllm.multinode"]', "provides = []")
    assert findings(D)["K3-SRT-FRONTEND"] == "error"  # single-node only on 2 nodes
    replace_in(LOCK, 'version = "v1.0.36"', 'version = "v1.0.49"')
    assert "K3-SRT-FRONTEND" not in findings(D)  # upstream multi-node (PR #296)


def test_the_node_count_comes_from_the_profile(repo_with_clusters: Path) -> None:
    """A one-node profile (TP8, no PP) needs no multi-node support whatever the cluster has."""
    # PR #278 alone: the multi-node patch provides nothing.
    replace_in(LOCK, 'provides = ["frontend.vllm.multinode"]', "provides = []")
    assert findings(D).get("K3-SRT-FRONTEND") == "error"  # TP8 x PP2: 2 nodes
    text = D.read_text()
    one_node = text.replace('"--pipeline-parallel-size", "2",', '"--pipeline-parallel-size", "1",')
    D.write_text(one_node)
    assert findings(D).get("K3-SRT-FRONTEND") == "error"  # still --nnodes 2
    D.write_text(one_node.replace('  "--nnodes", "2",\n', ""))
    assert "K3-SRT-FRONTEND" not in findings(D)


def test_a_dropped_container_patch_is_an_error_naming_why(repo_with_clusters: Path) -> None:
    assert "K3-DROPPED-PATCH" not in findings(F)
    replace_in(F, 'patches = ["mamba-hybrid-index-int64"]', "patches = []")
    (hit,) = [f for f in judged(F).findings if f.rule == "K3-DROPPED-PATCH"]
    assert hit.severity == "error" and "mamba-hybrid-index-int64" in hit.message
    assert load_lock(LOCK).container_patches["mamba-hybrid-index-int64"].why in hit.message


def test_linter_output_and_json(resolved: Path, capsys: pytest.CaptureFixture[str]) -> None:
    replace_in(F, 'PYTHONHASHSEED = "42"', "")
    assert main(["preflight", "kimi-k3-direct-f"]) == 4
    out = capsys.readouterr().out
    assert "images/kimi-k3-direct-f.toml: env.PYTHONHASHSEED: K3-PYTHONHASHSEED error:" in out
    assert "fix: set PYTHONHASHSEED" in out
    assert main(["preflight", "kimi-k3-direct-f", "--json"]) == 4
    payload = json.loads(capsys.readouterr().out)
    assert payload["errors"] == 1 and payload["findings"][0]["rule"] == "K3-PYTHONHASHSEED"
    assert "kimi-k3-direct-f/agg" in payload["lacked_facts"]


def test_parse_options() -> None:
    opts = parse_options(["vllm", "serve", "/m", "--a", "1", "--flag", "--b=2", "--c", '{"x": 1}'])
    assert opts == {"--a": "1", "--flag": True, "--b": "2", "--c": '{"x": 1}'}


def test_facts_are_never_borrowed_from_another_lock(repo_with_clusters: Path) -> None:
    """A build recorded under one lock does not lend its facts to a spec under another."""
    state = State()
    image_id = "cd" * 32
    lock = load_lock(LOCK)
    spec = load_spec(DYN, lock)
    twin_build(state, lock, spec, image_id)
    write(state, Facts(facts={"versions": {"dynamo": "1.6.1"}}), image_id)
    assert judged(DYN, state=state, lock=lock).facts_from  # this lock: the facts are used
    replace_in(LOCK, "[env]\n", '[env]\nK3ENV_OTHER_LOCK = "1"\n')
    other = load_lock(LOCK)
    assert other.sha256 != lock.sha256
    assert judged(DYN, state=state, lock=other).facts_from == {}


GB200 = Path("clusters/gb200-nvl72.toml")


def rules_on(cluster: Path, spec: Path, state: State | None = None) -> dict[str, list[str]]:
    """rule id -> the messages of its findings, for one spec on one cluster profile."""
    out: dict[str, list[str]] = {}
    for f in judged(spec, cluster, state).findings:
        out.setdefault(f.rule, []).append(f"{f.severity}: {f.message}")
    return out


def test_the_b200_recipe_does_not_fit_a_gb200_rack(resolved: Path) -> None:
    """Variant F passes on its own B200 cluster; on GB200 trays (4 GPUs, 960 GB Grace DRAM
    each) its offload bytes and --nnodes are wrong, and its headroom is unmeasured."""
    assert rules_on(CLUSTER, F) == {}
    found = rules_on(GB200, F)
    assert found["K3-CPU-OFFLOAD-DRAM"] == [
        "error: cpu_bytes_to_use_per_rank 299,875,000,000 x 4 ranks/node = 1,200 GB of pinned "
        "DRAM; the node has 960 GB (budget 80% = 768 GB)"
    ]
    # What differs is named: the GPUs a node has, not the node count.
    assert found["K3-TOPOLOGY"] == [
        "error: --nnodes 2 puts TP x PP = 16 ranks 8 to a node, but a gb200-nvl72 node has 4 "
        "GB200 GPUs: the profile is sized for nodes of 8 GPUs (on gb200-nvl72: --nnodes 4, 4 "
        "ranks a node)"
    ]
    (headroom,) = found["K3-GPU-MEM-HEADROOM"]
    assert headroom.startswith("warning: no measured out-of-pool workspace for mxfp4 MoE on GB200")
    # TP8 over two 4-GPU trays stays inside the rack's 72-GPU NVLink domain.
    assert "K3-TP-NVLINK" not in found
    assert "K3-IMAGE-PLATFORM" not in found  # the lock pins the base's arm64 manifest


def test_an_arm64_cluster_needs_the_bases_arm64_manifest(resolved: Path) -> None:
    replace_in(LOCK, '"linux/arm64" = "sha256:' + "b" * 64 + '"\n', "")
    (missing,) = rules_on(GB200, F)["K3-IMAGE-PLATFORM"]
    assert missing.startswith("error: gb200-nvl72 runs linux/arm64 (aarch64), but base ")
    assert "pins only linux/amd64" in missing and "exec format error" in missing
    assert "K3-IMAGE-PLATFORM" not in rules_on(CLUSTER, F)  # B200 nodes are amd64


def test_an_unresolved_platform_manifest_and_a_missing_twin_are_said(
    repo_with_clusters: Path,
) -> None:
    found = rules_on(GB200, F)["K3-IMAGE-PLATFORM"]
    assert any(
        m.startswith("warning: base vllm-kimi-k3's linux/arm64 manifest is unresolved")
        for m in found
    )
    text = LOCK.read_text()
    start = text.index('[twin.platforms."linux/arm64"]')
    end = text.index("\n[", start + 1)
    LOCK.write_text(text[:start] + text[end + 1 :])
    found = rules_on(GB200, F)["K3-IMAGE-PLATFORM"]
    assert any("the lock pins no CPU twin for linux/arm64" in m for m in found)


def test_tensor_parallel_beyond_the_nvlink_domain_warns(resolved: Path) -> None:
    replace_in(F, '"--tensor-parallel-size", "8"', '"--tensor-parallel-size", "16"')
    replace_in(F, '"--pipeline-parallel-size", "2"', '"--pipeline-parallel-size", "1"')
    (tp,) = rules_on(CLUSTER, F)["K3-TP-NVLINK"]
    assert tp == (
        "warning: --tensor-parallel-size 16 spans more than one NVLink domain of b200-dgxc "
        "(8 GPUs): every layer's all-reduce crosses the network"
    )
    assert "K3-TP-NVLINK" not in rules_on(GB200, F)


def test_facts_come_from_the_clusters_platform_build(repo_with_clusters: Path) -> None:
    """An amd64 image's facts never answer for the arm64 image an aarch64 cluster runs."""
    state = State()
    lock = load_lock(LOCK)
    spec = load_spec(DYN, lock)
    for platform, image_id in (("linux/amd64", "ab" * 32), ("linux/arm64", "ef" * 32)):
        twin_build(state, lock, spec, image_id, f"k3env/dyn:{platform[-5:]}", platform)
    write(state, Facts(facts={"versions": {"dynamo": "1.6.1"}}), "ab" * 32)
    on = {c: judged(DYN, c, state, lock) for c in (CLUSTER, GB200)}
    assert on[CLUSTER].facts_from == {
        "kimi-k3-dynamo/agg": "k3env/dyn:amd64 (linux/amd64, built over the CPU twin)"
    }
    assert on[GB200].facts_from == {}  # the arm64 build has no verified facts yet
    write(state, Facts(facts={"versions": {"dynamo": "1.6.1"}}), "ef" * 32)
    assert judged(DYN, GB200, state, lock).facts_from == {
        "kimi-k3-dynamo/agg": "k3env/dyn:arm64 (linux/arm64, built over the CPU twin)"
    }


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('platform = "linux/s390x"\n', "'linux/s390x' is not a valid value here"),
        ("nvlink_domain_gpus = 0\n", "nvlink_domain_gpus must be greater than 0"),
    ],
)
def test_a_cluster_profile_with_a_bad_platform_or_domain_is_refused(
    tmp_path: Path, line: str, message: str
) -> None:
    from k3env.errors import ConfigError

    from .conftest import REPO

    text = (REPO / GB200).read_text()
    key = line.split(" = ")[0]
    text = "".join(x for x in text.splitlines(keepends=True) if not x.startswith(key + " ="))
    bad = tmp_path / "bad.toml"
    bad.write_text(line + text)
    with pytest.raises(ConfigError, match=message):
        load_cluster(bad)


def test_an_arm64_clusters_lacked_facts_name_the_platforms_verify(
    repo_with_clusters: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["preflight", "--cluster", str(GB200), "kimi-k3-dynamo"])
    out = capsys.readouterr().out
    assert "lacked facts ['dynamo.tiktoken_model_types'] (run `k3env verify --platform " in out
    assert "linux/arm64` to learn them)" in out
    main(["preflight", "--cluster", str(GB200), "--json", "-q", "kimi-k3-dynamo"])
    assert json.loads(capsys.readouterr().out)["platform"] == "linux/arm64"


def test_a_manifest_pinned_with_its_variant_serves_the_arm64_cluster(resolved: Path) -> None:
    replace_in(LOCK, '"linux/arm64" = "sha256:', '"linux/arm64/v8" = "sha256:')
    assert "K3-IMAGE-PLATFORM" not in rules_on(GB200, F)


def test_a_cluster_whose_enroot_cannot_import_by_digest_is_an_error(
    repo_with_clusters: Path,
) -> None:
    """k3env names images by digest; enroot 3.5 rejects `@sha256:` (srt-slurm#385)."""
    cluster = load_cluster(CLUSTER)
    assert cluster.runtime["enroot"].version == "4.1.2"
    assert cluster.runtime["pyxis"].commit == "107519944221822ea1dace4db8e7234b2eaa4cd5"
    assert "K3-ENROOT-DIGEST" not in findings(D)
    replace_in(CLUSTER, 'version = "4.1.2"', 'version = "3.5.0"')
    assert findings(D)["K3-ENROOT-DIGEST"] == "error"
    replace_in(CLUSTER, "[runtime.enroot]", "[runtime.docker]")
    with pytest.raises(ConfigError, match="'docker' is not a runtime part"):
        load_cluster(CLUSTER)
