"""The smoke driver's verdicts (k3env/probes/smoke_driver.py, run as the job runs it): every
planned gate reports, a gate that never ran is ``not run``, a gate with no evidence is ``not
checked`` (never passed), and the exit status says whether the battery passed.

The server here is a boundary stand-in (an OpenAI-shaped HTTP answer on 127.0.0.1); the real
engines behind the same driver are tests/engine/test_smoke_engine.py and test_slurm_engine.py.
"""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from k3env.smoke.plan import battery_gates

DRIVER = Path(__file__).parents[1] / "k3env/probes/smoke_driver.py"


@pytest.fixture
def server() -> Iterator[tuple[str, dict[str, Any]]]:
    """127.0.0.1: ``/v1/models`` lists what ``said["models"]`` holds, a chat completion
    answers ``said["reply"]``."""
    said: dict[str, Any] = {"models": ["M"], "reply": {}}

    class Api(http.server.BaseHTTPRequestHandler):
        def _send(self, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._send({"data": [{"id": m} for m in said["models"]]})

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self._send(said["reply"])

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Api)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", said
    finally:
        httpd.shutdown()
        httpd.server_close()


def _run(
    tmp_path: Path, url: str, job_env: dict[str, str] | None = None, **plan: Any
) -> tuple[int, dict[str, Any], list[str]]:
    full = {"roles": [], "url": url, "served": "M", "out": str(tmp_path / "out"),
            "chat": {"model": "M", "messages": [{"role": "user", "content": "hi"}]},
            "tools": None, "bias_probe": None, "reasoning_parser": None, "bench": None,
            "timeouts": {"ready": 2, "request": 5, "bench": 5, "stop": 2}, **plan}  # fmt: skip
    (tmp_path / "plan.json").write_text(json.dumps(full))
    env = {"K3ENV_SMOKE_PLAN": str(tmp_path / "plan.json"), "PATH": "/usr/bin:/bin",
           **(job_env or {})}  # fmt: skip
    done = subprocess.run([sys.executable, str(DRIVER)], env=env, capture_output=True, timeout=60)
    result = json.loads((tmp_path / "out/result.json").read_text())
    return done.returncode, result, list(battery_gates(full))


def test_a_reply_without_reasoning_and_no_process_to_stop_are_not_checked(
    tmp_path: Path, server: tuple[str, dict[str, Any]]
) -> None:
    url, said = server
    said["reply"] = {"choices": [{"message": {"content": "hello"}}],
                     "usage": {"completion_tokens": 3}}  # fmt: skip
    code, result, planned = _run(tmp_path, url, reasoning_parser="kimi_k3")
    got = {g["gate"]: g for g in result["gates"]}
    assert result["planned"] == planned == ["listed", "chat", "reasoning", "stop"]
    assert [got[n]["status"] for n in planned] == ["passed", "passed", "not checked",
                                                    "not checked"]  # fmt: skip
    assert "carried no reasoning" in got["reasoning"]["detail"]
    assert "no process to stop" in got["stop"]["detail"]
    assert code == 0
    # With reasoning in the reply, the gate has its evidence.
    said["reply"]["choices"][0]["message"]["reasoning_content"] = "thinking"
    code, result, _ = _run(tmp_path, url, reasoning_parser="kimi_k3")
    assert {g["gate"]: g["status"] for g in result["gates"]}["reasoning"] == "passed"


def test_gates_after_a_failure_are_not_run_and_the_driver_exits_non_zero(
    tmp_path: Path, server: tuple[str, dict[str, Any]]
) -> None:
    url, said = server
    said["models"] = ["other"]  # the served model is never listed
    code, result, planned = _run(tmp_path, url, reasoning_parser="kimi_k3")
    got = {g["gate"]: g["status"] for g in result["gates"]}
    assert got == {"listed": "failed", "chat": "not run", "reasoning": "not run",
                   "stop": "not checked"}  # fmt: skip
    assert set(got) == set(planned)
    assert code == 1


SLEEPER = {"role": "vllm-serve", "argv": [sys.executable, "-c", "import time; time.sleep(60)"]}


def test_the_env_gate_reads_each_role_process_environment(
    tmp_path: Path, server: tuple[str, dict[str, Any]]
) -> None:
    url, said = server
    said["reply"] = {"choices": [{"message": {"content": "hello"}}],
                     "usage": {"completion_tokens": 3}}  # fmt: skip
    baked = {"K3_BAKED": "from-the-image", "K3_OTHER": "x"}
    # The runtime gave the driver the baked values: the role's process has them.
    code, result, planned = _run(tmp_path, url, job_env=baked, roles=[SLEEPER], env=baked)
    got = {g["gate"]: g for g in result["gates"]}
    assert planned == result["planned"] == ["env", "listed", "chat", "stop"]
    assert got["env"]["status"] == "passed", got["env"]
    assert "2 baked env var(s) at their baked values in vllm-serve (pid " in got["env"]["detail"]
    # A value the runtime replaced (pyxis: a job's --container-env) is what the process sees.
    job = {**baked, "K3_BAKED": "from-the-job"}
    code, result, _ = _run(tmp_path, url, job_env=job, roles=[SLEEPER], env=baked)
    got = {g["gate"]: g for g in result["gates"]}
    assert got["env"]["status"] == "failed" and code == 1
    assert (
        "vllm-serve sees K3_BAKED 'from-the-job', the image bakes 'from-the-image'"
        in (got["env"]["detail"])
    )
    assert got["listed"]["status"] == got["chat"]["status"] == "not run"
    # A name the process lacks is said as unset.
    code, result, _ = _run(tmp_path, url, job_env={"K3_OTHER": "x"}, roles=[SLEEPER], env=baked)
    env_gate = {g["gate"]: g for g in result["gates"]}["env"]
    assert "vllm-serve sees K3_BAKED unset" in env_gate["detail"]


def test_the_env_gate_without_a_process_of_its_own_is_not_checked(
    tmp_path: Path, server: tuple[str, dict[str, Any]]
) -> None:
    url, said = server
    said["reply"] = {"choices": [{"message": {"content": "hello"}}],
                     "usage": {"completion_tokens": 3}}  # fmt: skip
    code, result, _ = _run(tmp_path, url, env={"K3_BAKED": "v"})
    env_gate = {g["gate"]: g for g in result["gates"]}["env"]
    assert env_gate["status"] == "not checked" and "no process to read" in env_gate["detail"]
    assert code == 0
