"""The smoke run inside the image: start the profile's processes, send the battery, stop them.

Runs with the image's own ``python3`` (standard library only; this file is mounted into the
container, never imported by k3env on the host). It reads the plan k3env wrote
(``/k3env-smoke/bin/plan.json``), prints one progress line per stage, and writes every gate's
verdict to ``/k3env-smoke/out/result.json``, also when a stage fails or the plan's time runs
out: the processes are stopped in any case (and the container is removed by k3env after).

A verdict carries the process's own words: for a role that stopped, its command line, its
last error line and the tail of its log; for a request, the status and the body's start.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

PLAN = Path(os.environ.get("K3ENV_SMOKE_PLAN", "/k3env-smoke/bin/plan.json"))
# A cluster job's own output directory, known only when it starts: the plan's ``out`` moves
# there (every path of the plan under it too).
OUT = os.environ.get("K3ENV_SMOKE_OUT")
TAIL = 25  # log lines kept with a failure, per process
ANSI = re.compile(r"\x1b\[[0-9;]*m")
BODY = 600  # characters of a reply kept as evidence


class StageFailed(Exception):
    def __init__(self, detail: str, output: str = "") -> None:
        super().__init__(detail)
        self.detail = detail
        self.output = output


class NotCheckable(Exception):
    """What the gate needs, the server does not do: said as not checked, with its evidence."""


def say(text: str) -> None:
    print(f"[smoke] {text}", flush=True)


def tail(path: Path, n: int = TAIL) -> str:
    """The last ``n`` lines of a log, each cut at 300 characters, colour codes dropped."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(ANSI.sub("", x)[:300] for x in lines[-n:])


def error_line(text: str) -> str:
    """The process's own last word on what went wrong: the last line naming an error."""
    marks = ("Error", "error:", "Exception", "ERROR", "Traceback", "refused", "invalid")
    for line in reversed(text.splitlines()):
        if any(m in line for m in marks) and "Traceback" not in line:
            return line.strip()[:400]
    lines = [x for x in text.splitlines() if x.strip()]
    return lines[-1].strip()[:400] if lines else "(no output)"


class Role:
    def __init__(self, spec: dict[str, Any], logs: Path) -> None:
        self.name: str = spec["role"]
        self.argv: list[str] = spec["argv"]
        self.env = {**os.environ, **spec.get("env", {})}
        for key, value in spec.get("prepend", {}).items():
            old = os.environ.get(key)
            self.env[key] = f"{value}:{old}" if old else value
        self.unset = set(spec.get("unset", []))
        for key in self.unset:
            self.env.pop(key, None)
        self.log = logs / f"{self.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "wb") as out:
            # A session of its own: a stop signal reaches the role and its children.
            self.proc = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                start_new_session=True, cwd="/tmp",
            )  # fmt: skip

    def exited(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def words(self) -> str:
        """The log's warnings and errors (the last 12), then its tail."""
        try:
            text = ANSI.sub("", self.log.read_text(errors="replace"))
        except OSError:
            return ""
        marks = (" WARN ", " ERROR ", "WARNING", "Error", "error:")
        flagged = [x[:800] for x in text.splitlines() if any(m in x for m in marks)][-12:]
        head = ["[warnings and errors]", *flagged, "[tail]"] if flagged else []
        return "\n".join([*head, tail(self.log, 15)])

    def refused(self, served: str) -> str | None:
        """The first error line that names ``served``: the process refused the model (Dynamo's
        frontend: "Error adding model from discovery model_name=...")."""
        try:
            text = ANSI.sub("", self.log.read_text(errors="replace"))
        except OSError:
            return None
        for line in text.splitlines():
            if (" ERROR " in line or "Error" in line) and served in line:
                # Its reason first (a Rust log line: `... error="..."`), the prefix after.
                at = line.find("error=")
                return (line[at:] if at >= 0 else line).strip()[:800]
        return None

    def failure(self, what: str) -> StageFailed:
        text = self.words()
        return StageFailed(
            f"{self.name}: {what}: {error_line(text)}",
            f"$ {' '.join(self.argv)}\n{text}",
        )

    def stop(self, timeout: float) -> tuple[bool, str]:
        """SIGINT (a server's clean shutdown), then SIGKILL after ``timeout``."""
        if self.proc is None:
            return True, "not started"
        if self.proc.poll() is not None:
            return False, f"had exited with status {self.proc.returncode}"
        os.killpg(self.proc.pid, signal.SIGINT)
        try:
            code = self.proc.wait(timeout)
            return True, f"stopped on SIGINT (status {code})"
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            return False, f"still running {timeout:.0f} s after SIGINT: killed"


def http(url: str, body: dict[str, Any] | None, timeout: float) -> tuple[int, str]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return reply.status, reply.read(1 << 22).decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read(1 << 16).decode(errors="replace")


# Seconds the model may stay unlisted after a process logged an error naming it: a process
# that refused the model does not list it later (a registration in flight takes far less).
REFUSED_GRACE = 15.0


def wait_listed(url: str, served: str, roles: list[Role], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    refused: tuple[float, Role, str] | None = None
    while time.monotonic() < deadline:
        for role in roles:
            code = role.exited()
            if code is not None:
                raise role.failure(f"exited with status {code} before the model was listed")
            if refused is None and (line := role.refused(served)) is not None:
                refused = (time.monotonic(), role, line)
        if refused is not None and time.monotonic() - refused[0] > REFUSED_GRACE:
            _, role, line = refused
            roles_words = "\n".join(f"--- {r.name}\n{r.words()}" for r in roles)
            raise StageFailed(f"{served!r} is not listed: {role.name} refused it: {line}",
                              roles_words)  # fmt: skip
        try:
            status, body = http(f"{url}/v1/models", None, 2)
            ids = [m.get("id") for m in json.loads(body).get("data", [])] if status == 200 else []
            if served in ids:
                return f"/v1/models lists {served!r}"
            last = f"/v1/models answered {status}: {body[:200]}"
        except (OSError, ValueError) as e:
            last = f"/v1/models: {e}"
        time.sleep(0.5)
    roles_words = "\n".join(f"--- {r.name}\n{r.words()}" for r in roles)
    raise StageFailed(f"{served!r} not listed within {timeout:.0f} s ({last})", roles_words)


def post_json(url: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    try:
        status, text = http(url, body, timeout)
    except OSError as e:
        raise StageFailed(f"POST {url}: {e}") from e
    if status != 200:
        raise StageFailed(f"POST {url} answered {status}: {text[:BODY]}")
    try:
        reply: dict[str, Any] = json.loads(text)
    except ValueError as e:
        raise StageFailed(f"POST {url}: not JSON: {text[:BODY]}") from e
    return reply


def chat(plan: dict[str, Any], timeout: float) -> tuple[str, dict[str, Any]]:
    reply = post_json(f"{plan['url']}/v1/chat/completions", plan["chat"], timeout)
    tokens = (reply.get("usage") or {}).get("completion_tokens") or 0
    if tokens <= 0:
        raise StageFailed(f"200 with {tokens} completion tokens", json.dumps(reply)[:BODY])
    return f"200, {tokens} completion tokens", reply


def reasoning(reply: dict[str, Any]) -> str:
    message = ((reply.get("choices") or [{}])[0]).get("message") or {}
    text = message.get("reasoning") or message.get("reasoning_content") or ""
    if text:
        return f"accepted at start; the reply's reasoning field holds {len(text)} characters"
    # The parser was accepted at start (the `listed` gate), but nothing was parsed: that is
    # no evidence it works (random weights may never open a reasoning block).
    raise NotCheckable(
        "the server started with the parser, but the reply carried no reasoning field (the "
        "model never opened a reasoning block): the parser's output was not seen"
    )


def steerable(plan: dict[str, Any], timeout: float) -> None:
    """Whether the server applies ``logit_bias`` (the tool request's steering needs it)."""
    probe = plan.get("bias_probe")
    if not probe:
        return
    reply = post_json(f"{plan['url']}/v1/chat/completions", probe["request"], timeout)
    message = ((reply.get("choices") or [{}])[0]).get("message") or {}
    got = (message.get("content") or "") + (
        message.get("reasoning") or message.get("reasoning_content") or ""
    )
    if probe["expect"] not in got:
        raise NotCheckable(
            f"the server does not apply logit_bias (a bias toward {probe['expect'][0]!r} gave "
            f"{got[:24]!r}): random weights cannot be steered into a tool call through it"
        )


def tools(plan: dict[str, Any], timeout: float) -> str:
    steerable(plan, timeout)
    reply = post_json(f"{plan['url']}/v1/chat/completions", plan["tools"], timeout)
    choice = (reply.get("choices") or [{}])[0]
    calls = (choice.get("message") or {}).get("tool_calls") or []
    want = plan["tools"]["tools"][0]["function"]["name"]
    names = [((c.get("function") or {}).get("name")) for c in calls]
    if want not in names:
        raise StageFailed(
            f"no parsed tool_calls naming {want!r} (finish_reason {choice.get('finish_reason')!r})",
            json.dumps(choice)[:BODY],
        )
    return f"200, parsed tool_calls {names} (finish_reason {choice.get('finish_reason')!r})"


def metric(data: dict[str, Any], key: str) -> float | None:
    """One aiperf export metric's value (``{"unit": ..., "avg": N}``), or None."""
    value = data.get(key)
    if isinstance(value, dict) and isinstance(value.get("avg"), (int, float)):
        return float(value["avg"])
    return None


def bench(plan: dict[str, Any], timeout: float, logs: Path) -> str:
    spec = plan["bench"]
    log = logs / "aiperf.log"
    env = {k: v for k, v in os.environ.items() if k not in spec.get("unset", [])}
    with open(log, "wb") as out:
        try:
            code = subprocess.run(
                spec["argv"], stdout=out, stderr=subprocess.STDOUT, env=env, timeout=timeout,
                cwd="/tmp",
            ).returncode  # fmt: skip
        except subprocess.TimeoutExpired as e:
            raise StageFailed(f"aiperf still running after {timeout:.0f} s", tail(log)) from e
    words = f"$ {' '.join(spec['argv'])}\n{tail(log)}"
    if code != 0:
        raise StageFailed(f"aiperf exited with status {code}: {error_line(tail(log))}", words)
    export = Path(spec["artifacts"]) / "profile_export_aiperf.json"
    try:
        data = json.loads(export.read_text())
    except (OSError, ValueError) as e:
        raise StageFailed(f"aiperf's export {export}: {e}", words) from e
    requests = metric(data, "completed_request_count") or metric(data, "request_count") or 0
    errors = data.get("error_summary") or []
    tokens = metric(data, "total_usage_completion_tokens") or metric(data, "total_osl") or 0
    summary = f"aiperf: {requests:g} requests, {len(errors)} error kinds, {tokens:g} output tokens"
    if requests <= 0 or errors or tokens <= 0:
        raise StageFailed(summary, json.dumps(errors)[:BODY] + "\n" + words)
    return summary


def environ(pid: int) -> dict[str, str]:
    """A process's environment as the kernel holds it (``/proc/PID/environ``)."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()[: 4 << 20]
    pairs = (x.split("=", 1) for x in raw.decode(errors="replace").split("\0") if "=" in x)
    return {k: v for k, v in pairs}


def _live_environ(role: Role, wait: float = 10.0) -> tuple[int, dict[str, str]]:
    """The environment of ``role``'s running process. Empty is no evidence: a process still
    inside exec (Popen returns once the new image is mapped, before its environment is laid
    out) and a zombie both show none; read again until it shows one, or say why not."""
    deadline = time.monotonic() + wait
    while True:
        if role.proc is None or role.exited() is not None:
            raise OSError("the process has exited")
        env = environ(role.proc.pid)
        if env and role.exited() is None:
            return role.proc.pid, env
        if time.monotonic() > deadline:
            raise OSError(f"its environ stayed empty for {wait:.0f} s")
        time.sleep(0.1)


def env_gate(want: dict[str, str], roles: list[Role]) -> str:
    """Every baked env var at its baked value in each role's process, as the kernel shows
    that process's environment (the runtime's precedence applied: docker's, pyxis's)."""
    if not roles:
        raise NotCheckable("the job started the engine: the driver holds no process to read")
    wrong, seen = [], []
    for role in roles:
        try:
            pid, env = _live_environ(role)
        except OSError as e:
            # Gone before it could be read: the next gate reports its own words.
            raise NotCheckable(f"{role.name}: its environment could not be read ({e})") from e
        seen.append(f"{role.name} (pid {pid})")
        for name, value in sorted(want.items()):
            if name not in role.unset and env.get(name) != value:
                got = "unset" if name not in env else repr(env[name][:200])
                wrong.append(f"{role.name} sees {name} {got}, the image bakes {value[:200]!r}")
    if wrong:
        raise StageFailed(
            f"{len(wrong)} baked env value(s) not what the engine's process sees: {wrong[0]}",
            "\n".join(wrong),
        )
    return (
        f"{len(want)} baked env var(s) at their baked values in {', '.join(seen)}: "
        + (", ".join(sorted(want)))[:BODY]
    )


def relocated(value: Any, old: str, new: str) -> Any:
    """``value`` with every string at or under the directory ``old`` moved under ``new``."""
    if isinstance(value, str) and (value == old or value.startswith(old + "/")):
        return new + value[len(old) :]
    if isinstance(value, list):
        return [relocated(v, old, new) for v in value]
    if isinstance(value, dict):
        return {k: relocated(v, old, new) for k, v in value.items()}
    return value


def main() -> int:
    plan = json.loads(PLAN.read_text())
    if OUT:
        plan = relocated(plan, plan["out"], OUT.rstrip("/") or "/")
    out = Path(plan["out"])
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    limits = plan["timeouts"]
    roles = [Role(r, logs) for r in plan["roles"]]
    gates: list[dict[str, Any]] = []

    def gate(name: str, fn: Any, *args: Any) -> Any:
        say(f"{name} ...")
        t0 = time.monotonic()
        try:
            result = fn(*args)
        except NotCheckable as e:
            took = time.monotonic() - t0
            gates.append({"gate": name, "status": "not checked", "seconds": round(took, 2),
                          "detail": str(e)})  # fmt: skip
            say(f"{name}: not checked ({took:.1f} s): {e}")
            return None
        except StageFailed as e:
            took = time.monotonic() - t0
            if name != "listed":  # a refused request: the servers' own words on it
                time.sleep(0.5)  # let their logs catch up
                e.output += "".join(f"\n--- {r.name}\n{r.words()}" for r in roles)
            gates.append({"gate": name, "status": "failed", "seconds": round(took, 2),
                          "detail": e.detail, "output": e.output[-16000:]})  # fmt: skip
            say(f"{name}: FAILED ({took:.1f} s): {e.detail}")
            raise
        took = time.monotonic() - t0
        evidence, value = result if isinstance(result, tuple) else (result, None)
        gates.append({"gate": name, "status": "passed", "seconds": round(took, 2),
                      "detail": evidence})  # fmt: skip
        say(f"{name}: ok ({took:.1f} s): {evidence}")
        return value

    # Planned before anything runs (as k3env plans it, smoke.plan.battery_gates): a gate
    # that does not report is "not run", and the driver's exit status says so.
    planned = [*(["env"] if plan.get("env") else []), "listed", "chat"]
    planned += ["reasoning"] if plan.get("reasoning_parser") else []
    planned += ["tool-calls"] if plan.get("tools") else []
    planned += ["benchmark"] if plan.get("bench") else []
    planned += ["stop"]
    try:
        for role in roles:
            say(f"start {role.name}: {' '.join(role.argv)}")
            role.start()
        if plan.get("env"):  # fixed at each process's start: known before the engine loads
            gate("env", env_gate, plan["env"], roles)
        gate("listed", wait_listed, plan["url"], plan["served"], roles, limits["ready"])
        reply = gate("chat", chat, plan, limits["request"])
        if plan.get("reasoning_parser"):
            gate("reasoning", lambda: reasoning(reply))
        if plan.get("tools"):
            gate("tool-calls", tools, plan, limits["request"])
        if plan.get("bench"):
            gate("benchmark", bench, plan, limits["bench"], logs)
    except StageFailed:
        pass
    finally:
        gates.append(stop_gate(roles, limits["stop"]))
        reported = {g["gate"] for g in gates}
        for name in planned:
            if name not in reported:
                gates.append({"gate": name, "status": "not run", "seconds": 0.0,
                              "detail": "an earlier gate failed"})  # fmt: skip
        (out / "result.json").write_text(json.dumps({"planned": planned, "gates": gates}, indent=1))
    bad = [g["gate"] for g in gates if g["status"] in ("failed", "not run")]
    if bad:
        say(f"battery: failed or not run: {', '.join(bad)}")
        return 1
    return 0


def stop_gate(roles: list[Role], limit: float) -> dict[str, Any]:
    """Each process of the driver's own stopped (SIGINT, then harder): passed when all
    stopped in time; with none of its own (the job started them), not checked."""
    say("stop ...")
    t0 = time.monotonic()
    clean, words = True, []
    for role in reversed(roles):
        ok, what = role.stop(limit)
        clean = clean and ok
        words.append(f"{role.name} {what}")
    status = "passed" if clean else "failed"
    if not roles:  # nothing of its own to stop: no evidence either way
        status = "not checked"
        words = ["the job started the servers and stops them: the driver has no process to stop"]
    stop: dict[str, Any] = {
        "gate": "stop",
        "status": status,
        "seconds": round(time.monotonic() - t0, 2),
        "detail": "; ".join(words),
    }
    if not clean:
        stop["output"] = "\n".join(f"--- {r.name}\n{r.words()}" for r in roles)
    say(f"stop: {'; '.join(words)}")
    return stop


if __name__ == "__main__":
    sys.exit(main())
