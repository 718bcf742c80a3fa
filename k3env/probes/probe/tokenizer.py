"""Dynamo's Rust frontend loading a tokenizer of the profile's ``model_type``: its HTTP
frontend started over the Mocker engine and a tiny tiktoken model, asked for ``/v1/models``."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import importlib
import importlib.util
import json
import mmap
import os
import re
import socket
import tempfile
import time
import traceback
import urllib.request
from types import ModuleType

from .harness import captured, read_bytes
from .session import Plan, Run
from .versions import version_of


def _model_dir(model_type: str) -> str:
    d = tempfile.mkdtemp(prefix="k3env-tok-")
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(
            {
                "model_type": model_type,
                "architectures": ["ProbeForCausalLM"],
                "max_position_embeddings": 4096,
                "vocab_size": 258,
                "bos_token_id": 256,
                "eos_token_id": 257,
            },
            f,
        )
    with open(os.path.join(d, "tiktoken.model"), "w") as f:
        for i in range(256):
            f.write(f"{base64.b64encode(bytes([i])).decode()} {i}\n")
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(
            {
                "bos_token": "[BOS]",
                "eos_token": "[EOS]",
                # Every field of Hugging Face's AddedToken: older Dynamo parsers require them all.
                "added_tokens_decoder": {
                    str(i): {
                        "content": text,
                        "lstrip": False,
                        "rstrip": False,
                        "normalized": False,
                        "single_word": False,
                        "special": True,
                    }
                    for i, text in ((256, "[BOS]"), (257, "[EOS]"))
                },
                "chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}",
            },
            f,
        )
    return d


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port: int = s.getsockname()[1]
    s.close()
    return port


def _get_models(port: int) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=1) as r:
        body: bytes = r.read()
        return body


async def _serve_models(core: ModuleType, model_type: str, timeout: float) -> tuple[bool, str]:
    """Start Dynamo's HTTP frontend with the Mocker engine over a tiny tiktoken model."""
    loop = asyncio.get_running_loop()
    runtime = core.DistributedRuntime(loop, "mem", "tcp")
    port = _free_port()
    args = core.EntrypointArgs(
        core.EngineType.Mocker,
        model_path=_model_dir(model_type),
        model_name="k3env-probe",
        http_host="127.0.0.1",
        http_port=port,
    )
    engine = await core.make_engine(runtime, args)
    task = asyncio.ensure_future(core.run_input(runtime, "http", engine))
    deadline = time.monotonic() + timeout
    last = "no answer"
    try:
        while time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            if task.done():
                return False, "the frontend stopped: " + _chain(task.exception())
            try:
                body = await loop.run_in_executor(None, _get_models, port)
                models = [m.get("id") for m in json.loads(body).get("data", [])]
                if "k3env-probe" in models:
                    took = time.monotonic() - deadline + timeout
                    return True, f"/v1/models lists the model ({took:.2f} s)"
                last = f"/v1/models: {models}"
            except OSError as e:
                last = str(e)
        return False, f"no model registered within {timeout} s ({last})"
    finally:
        task.cancel()
        with contextlib.suppress(BaseException):
            runtime.shutdown()


def _chain(exc: BaseException | None) -> str:
    chain = []
    while exc is not None:
        chain.append(f"{type(exc).__name__}: {exc}")
        exc = exc.__cause__ or exc.__context__
    return " <- ".join(chain)


def tokenizer_loads(model_type: str, timeout: float = 8.0) -> tuple[bool, str]:
    core = importlib.import_module("dynamo._core")
    os.environ.setdefault("DYN_LOG", "error")
    with captured() as buf:
        try:
            ok, detail = asyncio.run(_serve_models(core, model_type, timeout))
        except BaseException:
            ok, detail = False, traceback.format_exc(limit=-4)
    return ok, detail + ("\n" + buf.getvalue() if buf.getvalue().strip() and not ok else "")


def check_tokenizer(run: Run, plan: Plan) -> None:
    report = run.report
    accepted: list[str] = []
    rejected: list[str] = []
    tested: dict[str, tuple[bool, str]] = {}
    for model_type in plan.get("tokenizer_candidates", []):
        ok, detail = tokenizer_loads(model_type)
        tested[model_type] = (ok, detail)
        (accepted if ok else rejected).append(model_type)
    if tested:
        report.section("dynamo").update(
            {"tiktoken_model_types": accepted, "tiktoken_rejected": rejected}
        )
    for profile in plan["profiles"]:
        roles = {c["role"] for c in profile["commands"]}
        model_type = profile.get("tokenizer_model_type")
        if "dynamo-frontend" not in roles or not model_type:
            continue
        ok, detail = tested.get(model_type) or tokenizer_loads(model_type)
        if not ok:
            supported = tiktoken_supported()
            if supported is not None:
                report.section("dynamo")["tiktoken_supported"] = supported
                detail = (
                    f"dynamo-runtime {version_of('ai-dynamo-runtime')} does not load model_type "
                    f"{model_type!r}: its frontend supports {', '.join(supported)} (the list "
                    f"compiled into dynamo._core)\n{detail}"
                )
        status = "pass" if ok else "fail"
        subject = f"model_type {model_type}"
        report.record("tokenizer", subject, status, "dynamo-runtime", detail, profile["name"])


def tiktoken_supported() -> list[str] | None:
    """The tiktoken model types the runtime's Rust frontend knows, from its own error text
    ("... Currently supported: a, b, c."), or None where the library does not say."""
    try:
        spec = importlib.util.find_spec("dynamo._core")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    data = read_bytes(spec.origin)
    return None if data is None else supported_in(data)


def supported_in(data: bytes | mmap.mmap) -> list[str] | None:
    """The tiktoken model types named in a Dynamo runtime library's bytes, or None."""
    m = re.search(rb"Currently supported: ([a-z0-9_]+(?:, [a-z0-9_]+)*)", data)
    return m.group(1).decode().split(", ") if m else None
