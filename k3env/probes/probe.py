"""k3env probe: runs INSIDE a derived image, with the image's own Python and packages.

Carried into the container at run time (mounted read-only, never baked), started once per
image with no network. Stdlib only, plus whatever the image has. Reads a plan (JSON) and
writes one JSON document after MARK on stdout: each plan's checks and the facts it learned.

Every check asks the image's own code: vLLM's and Dynamo's own argument parsers and
registries, Dynamo's Rust frontend loading a tokenizer, the files on the image's sys.path.
Module paths move between releases: each lookup tries the known places in order and says so
when none fits.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import difflib
import importlib
import importlib.metadata as md
import importlib.util
import io
import json
import mmap
import os
import re
import socket
import sys
import tempfile
import time
import traceback
import urllib.request

MARK = "@@k3env-probe@@"
# sys.path as the interpreter starts: what the image's Python finds. Imports may add to it
# (setuptools adds its _vendor directory), and the version checks must not see those.
START_PATH = list(sys.path)
RESULTS: list[dict[str, object]] = []
FACTS: dict[str, object] = {"versions": {}}


def record(check, subject, status, component, output="", profile=None):
    RESULTS.append(
        {
            "check": check,
            "subject": subject,
            "status": status,  # pass | fail | skip
            "component": component,
            "version": FACTS["versions"].get(component.split(".")[0].split(" ")[0]),
            "output": output[-4000:] if isinstance(output, str) else str(output),
            "profile": profile,
        }
    )


def distribution(dist):
    """The distribution ``dist`` as the image's Python finds it on start, or None."""
    return next(iter(md.distributions(name=dist, path=START_PATH)), None)


def version_of(dist):
    found = distribution(dist)
    return found.version if found is not None else None


@contextlib.contextmanager
def captured():
    """Capture stdout/stderr (argparse errors, warnings) into one buffer."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        yield buf


def run_captured(fn):
    """(ok, output): SystemExit(0) is success, any other exit or exception a failure."""
    with captured() as buf:
        try:
            fn()
            ok = True
        except SystemExit as e:
            ok = e.code in (0, None)
            print(f"[exit {e.code}]")
        except BaseException:
            traceback.print_exc(limit=-6)
            ok = False
    return ok, buf.getvalue()


def first_attribute(attribute, *modules):
    """``attribute`` from the first of ``modules`` that has it (functions move between
    releases); says where it looked when none does."""
    looked = []
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ImportError as e:
            looked.append(f"{name} ({e})")
            continue
        if hasattr(module, attribute):
            return getattr(module, attribute)
        looked.append(f"{name} (no {attribute})")
    raise ImportError(f"{attribute} is in none of: " + "; ".join(looked))


def first_import(*names):
    errors = []
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError as e:
            errors.append(f"{name}: {e}")
    raise ImportError("none of " + ", ".join(names) + " imports: " + "; ".join(errors))


# --- versions -------------------------------------------------------------------------------
def marker_environment():
    """The PEP 508 marker variables of this interpreter (the host evaluates requirements)."""
    import platform

    impl = sys.implementation.version
    impl_version = f"{impl.major}.{impl.minor}.{impl.micro}"
    if impl.releaselevel != "final":
        impl_version += impl.releaselevel[0] + str(impl.serial)
    return {
        "implementation_name": sys.implementation.name,
        "implementation_version": impl_version,
        "os_name": os.name,
        "platform_machine": platform.machine(),
        "platform_release": platform.release(),
        "platform_system": platform.system(),
        "platform_version": platform.version(),
        "python_full_version": platform.python_version(),
        "platform_python_implementation": platform.python_implementation(),
        "python_version": ".".join(platform.python_version_tuple()[:2]),
        "sys_platform": sys.platform,
    }


def installed_distributions():
    """Every distribution on sys.path, with its Requires-Dist and where its metadata is."""
    out = []
    for d in md.distributions(path=START_PATH):
        name = d.metadata["Name"]
        if not name:
            continue
        where = getattr(d, "_path", None)
        out.append(
            {
                "name": name,
                "version": d.version,
                "requires": list(d.requires or []),
                "path": str(where) if where else None,
            }
        )
    return sorted(out, key=lambda d: (d["name"].lower(), d["path"] or ""))


def check_versions(plan):
    for component, dist in sorted(plan["components"].items()):
        FACTS["versions"][component] = version_of(dist)
    FACTS["distributions"] = installed_distributions()
    FACTS["marker_environment"] = marker_environment()
    for component, expected in sorted(plan.get("versions", {}).items()):
        actual = FACTS["versions"].get(component)
        if expected is None:
            record("versions", component, "skip", component, f"installed {actual}; lock pins none")
        elif actual == expected:
            record("versions", component, "pass", component, f"{actual}")
        else:
            record("versions", component, "fail", component, f"installed {actual}, lock {expected}")


# --- entrypoint imports ----------------------------------------------------------------------
ENTRYPOINT_MODULES = {
    "vllm-serve": ("vllm.entrypoints.cli.serve",),
    "dynamo-worker": ("dynamo.vllm.main",),
    "dynamo-frontend": ("dynamo.frontend.main",),
}


class _StandInMeta(type):
    """A stand-in for anything an absent module would have held: attribute access, calls,
    subscripts and unions give another stand-in, so an import can go on past it."""

    def __getattr__(cls, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _stand_in(f"{cls.__name__}.{name}")

    def __call__(cls, *args, **kwargs):
        return cls

    def __getitem__(cls, key):
        return cls

    def __or__(cls, other):
        return cls

    __ror__ = __or__

    def __iter__(cls):
        return iter(())


def _stand_in(name):
    return _StandInMeta(name, (), {})


class _StandInModule(type(sys)):
    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _stand_in(f"{self.__name__}.{name}")


class AbsentModules:
    """A meta-path finder of last resort for top-level packages that are not installed:
    each becomes an empty stand-in package, so an import reaches what lies behind it."""

    def __init__(self):
        self.names = set()

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] not in self.names:
            return None
        return importlib.util.spec_from_loader(fullname, self, is_package=True)

    def create_module(self, spec):
        module = _StandInModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def import_past_absent(module, absent_by_design=()):
    """Import ``module``; when it fails on a top-level package that is not installed, say so,
    stand that package in and go on, to report the first real incompatibility behind it.
    Returns (status, output)."""
    finder = AbsentModules()
    notes = []
    sys.meta_path.append(finder)
    try:
        for _ in range(20):
            with captured() as buf:
                try:
                    importlib.import_module(module)
                    error = None
                except SystemExit as e:
                    error = e
                    print(f"[exit {e.code}]")
                except BaseException as e:
                    error = e
                    traceback.print_exc(limit=-6)
            if error is None:
                break
            top = _absent_top(error)
            # Never the module under check itself: its absence is the answer.
            if top and top not in finder.names and top != module.split(".")[0]:
                finder.names.add(top)
                notes.append(buf.getvalue().rstrip())
                continue
            break
    finally:
        sys.meta_path.remove(finder)
    absent = sorted(finder.names)
    if error is None and not absent:
        return "pass", ""
    out = []
    if absent:
        out.append(
            f"not installed in the image: {', '.join(absent)} (first symptom below); "
            "with a stand-in for it the import went on"
        )
        out.append(notes[0])
    if error is not None:
        out.append(
            ("behind it, the first real incompatibility:\n" if absent else "") + buf.getvalue()
        )
        return "fail", "\n".join(out)
    design = set(absent_by_design)
    if set(absent) <= design:
        out.append(
            "nothing else is missing: the import completes with stand-ins for modules the CPU "
            "twin leaves out by design ([twin].omit); the GPU image must carry them"
        )
        return "pass", "\n".join(out)
    out.append("nothing else is missing behind them")
    return "fail", "\n".join(out)


def _absent_top(error):
    """The top-level package an import failed on, when it is not installed at all."""
    if not isinstance(error, ModuleNotFoundError):
        return None
    top = (error.name or "").split(".")[0]
    return top if top and importlib.util.find_spec(top) is None else None


IMPORTS: dict[str, tuple[str, str]] = {}  # entrypoint module -> (status, output)


def import_entrypoint(module, design):
    """(status, output) of importing ``module``; when it fails on an absent top-level
    package, the import goes on past it in a forked copy of this process (stand-ins must
    never serve a later check, and torch cannot be imported twice in one process), else in a
    new interpreter."""
    if module in IMPORTS:
        return IMPORTS[module]
    error = None
    with captured() as buf:
        try:
            importlib.import_module(module)
        except BaseException as e:
            error = e
            traceback.print_exc(limit=-6)
    if error is None:
        result = ("pass", "")
    elif _absent_top(error) is None:
        result = ("fail", buf.getvalue())
    else:
        forked, _ = in_fork(lambda: past_absent_tracked(module, design), timeout=TIMEOUT[0])
        if forked is not None:
            result = tuple(forked["result"])
            ENV_LOOKUPS.update(forked["lookups"])
            OPENED_K3ENV.extend(forked["opened"])
        else:
            result = import_in_subprocess(module, design)
            UNTRACKED.append(f"{module} went on past an absent module in a new interpreter")
    IMPORTS[module] = result
    return result


def past_absent_tracked(module, design):
    """``import_past_absent`` in a forked copy, with what it looked up in the environment."""
    result = import_past_absent(module, design)
    return {"result": result, "lookups": sorted(ENV_LOOKUPS), "opened": OPENED_K3ENV}


def entrypoints(plan):
    return sorted(
        {m for p in plan["profiles"] for c in p["commands"] for m in ENTRYPOINT_MODULES[c["role"]]}
    )


def check_imports(plan):
    design = [n.replace("-", "_") for n in plan.get("absent_by_design", [])]
    for module in entrypoints(plan):
        component = "vllm" if module.startswith("vllm.") else "dynamo"
        status, out = import_entrypoint(module, design)
        record("imports", module, status, component, out)


def in_fork(fn, timeout):
    """``fn()`` in a forked copy of this process (what it imports or patches stays there):
    ``(result, None)``, or ``(None, why)`` when the copy failed, died or ran out of
    ``timeout``. The answer is length-prefixed (a process the copy left behind cannot hold
    the reply open) and the copy runs in its own process group (killed whole on timeout)."""
    import selectors
    import signal
    import struct

    sys.stdout.flush()
    sys.stderr.flush()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the copy: answer on the pipe, never return into the caller's stack
        try:
            os.close(r)
            os.setpgid(0, 0)
            try:
                data = json.dumps({"ok": fn()}).encode()
            except BaseException:
                data = json.dumps({"error": traceback.format_exc(limit=-6)}).encode()
            view = memoryview(struct.pack(">Q", len(data)) + data)
            while view:
                view = view[os.write(w, view) :]
        finally:
            os._exit(0)
    os.close(w)
    buf, need = bytearray(), None
    deadline = time.monotonic() + timeout
    sel = selectors.DefaultSelector()
    sel.register(r, selectors.EVENT_READ)
    why = None
    try:
        while need is None or len(buf) < need + 8:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                why = f"no answer within {timeout:.0f} s"
                break
            chunk = os.read(r, 1 << 20)
            if not chunk:
                why = "it exited without an answer"
                break
            buf += chunk
            if need is None and len(buf) >= 8:
                need = struct.unpack(">Q", bytes(buf[:8]))[0]
    finally:
        sel.close()
        os.close(r)
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    if why is not None:
        return None, why
    answer = json.loads(bytes(buf[8 : 8 + need]))
    if "error" in answer:
        return None, answer["error"]
    return answer["ok"], None


def import_in_subprocess(module, design):
    import subprocess

    try:
        proc = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--import-past-absent", module,
             json.dumps(design)],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return "fail", f"importing {module} past its absent modules took over 300 s"
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(MARK):
            status, out = json.loads(line[len(MARK) :])
            return status, out
    return "fail", f"importing {module} past its absent modules: exit {proc.returncode}\n" + (
        proc.stdout + proc.stderr
    )[-3000:]


# --- argument parsing ---------------------------------------------------------------------------
def parse_vllm_serve(argv):
    """``vllm serve ...`` through vLLM's own CLI parser, then the server-setup validation."""
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    serve = importlib.import_module("vllm.entrypoints.cli.serve")
    top = FlexibleArgumentParser(prog="vllm")
    sub = top.add_subparsers(required=False, dest="subparser")
    commands = {}
    for cmd in serve.cmd_init():
        cmd.subparser_init(sub).set_defaults(dispatch_function=cmd.cmd)
        commands[cmd.name] = cmd
    if "serve" in sub.choices:  # the env check's flag lookup reuses what this parser knows
        SERVE_FLAGS.update(sub.choices["serve"]._option_string_actions)
    args = top.parse_args(list(argv[1:]))
    if getattr(args, "model_tag", None):
        args.model = args.model_tag
    commands[args.subparser].validate(args)
    # Parser names pass argparse and fail at server setup (validate_api_server_args): run it.
    # It moved: 0.31 launchers.launcher (re-exported by openai.api_server), 0.33 common.cli_args.
    validate = first_attribute(
        "validate_api_server_args",
        "vllm.entrypoints.common.cli_args",
        "vllm.entrypoints.launchers.cli_args",
        "vllm.entrypoints.launchers.launcher",
        "vllm.entrypoints.openai.api_server",
        "vllm.entrypoints.openai.cli_args",
    )
    from vllm.engine.arg_utils import AsyncEngineArgs

    # What the server does before validating (the reasoning parser moves into the structured
    # outputs config), run as vLLM's own method on the parsed args: constructing the engine
    # args would look for the model, which is not on this host.
    if hasattr(AsyncEngineArgs, "create_structured_outputs_config"):
        args.structured_outputs_config = AsyncEngineArgs.create_structured_outputs_config(args)
    module = sys.modules[validate.__module__]
    if hasattr(module, "init_parser_plugin"):
        module.init_parser_plugin(args)
    validate(args)
    print("accepted")


def parse_dynamo_worker(argv):
    args_mod = importlib.import_module("dynamo.vllm.args")
    rest = (
        list(argv[3:])
        if argv[:3] == ["python3", "-m", "dynamo.vllm"] or argv[1:3] == ["-m", "dynamo.vllm"]
        else list(argv[1:])
    )
    # _parse_cli_args is the worker's own argparse step (Dynamo flags, then vLLM's engine
    # args); parse_args (all that Dynamo <= 1.4 has) goes on to build the engine args, whose
    # __post_init__ resolves the model path and, for a path not on disk, asks the Hub. The
    # model is never here: an empty local directory stands in for it, so parsing neither
    # touches the model nor the network.
    if hasattr(args_mod, "_parse_cli_args"):
        args_mod._parse_cli_args(rest)
    else:
        args_mod.parse_args(_stand_in_model(rest))
    print("accepted")


def _stand_in_model(argv):
    out = list(argv)
    for i, token in enumerate(out):
        if token == "--model" and i + 1 < len(out) and not os.path.exists(out[i + 1]):
            out[i + 1] = tempfile.mkdtemp(prefix="k3env-model-")
        elif token.startswith("--model=") and not os.path.exists(token.split("=", 1)[1]):
            out[i] = "--model=" + tempfile.mkdtemp(prefix="k3env-model-")
    return out


def parse_dynamo_frontend(argv):
    main = importlib.import_module("dynamo.frontend.main")
    rest = list(argv[3:]) if argv[1:3] == ["-m", "dynamo.frontend"] else list(argv[1:])
    saved = sys.argv
    sys.argv = ["dynamo.frontend", *rest]
    try:
        main.parse_args()
    finally:
        sys.argv = saved
    print("accepted")


PARSERS = {
    "vllm-serve": ("vllm", parse_vllm_serve),
    "dynamo-worker": ("dynamo.vllm", parse_dynamo_worker),
    "dynamo-frontend": ("dynamo.frontend", parse_dynamo_frontend),
}


def check_args(plan):
    for profile in plan["profiles"]:
        for i, command in enumerate(profile["commands"]):
            component, fn = PARSERS[command["role"]]
            ok, out = run_captured(lambda fn=fn, argv=command["argv"]: fn(argv))
            subject = f"commands[{i}] {command['role']}"
            record("args", subject, "pass" if ok else "fail", component, out, profile["name"])


# --- parser registries ---------------------------------------------------------------------------
def vllm_registries():
    tools = first_import("vllm.tool_parsers", "vllm.entrypoints.openai.tool_parsers")
    reasoning = first_import("vllm.reasoning")
    return (
        sorted(tools.ToolParserManager.list_registered()),
        sorted(reasoning.ReasoningParserManager.list_registered()),
    )


def dynamo_registries():
    core = importlib.import_module("dynamo._core")
    return sorted(core.get_tool_parser_names()), sorted(core.get_reasoning_parser_names())


# Which flag names a parser for which process, and whose registry answers for it.
PARSER_FLAGS = {
    "vllm-serve": {"--tool-call-parser": ("vllm", 0), "--reasoning-parser": ("vllm", 1)},
    "dynamo-worker": {
        "--dyn-tool-call-parser": ("dynamo", 0),
        "--dyn-reasoning-parser": ("dynamo", 1),
    },
}
# vLLM frontend flags a Dynamo worker does not take (the Dynamo frontend parses chat output).
# vLLM frontend flags the Dynamo worker's parser does not take. Not --reasoning-parser: the
# worker takes it and reads it (structured_outputs_config.reasoning_parser decides whether the
# frontend's tool grammar excludes reasoning), which `k3env smoke` shows by starting it.
WORKER_FRONTEND_FLAGS = {
    "--tool-call-parser": "--dyn-tool-call-parser",
}


def _flag_values(argv):
    out = []
    for i, token in enumerate(argv):
        if token.startswith("--"):
            flag, eq, value = token.partition("=")
            if eq:
                out.append((flag, value))
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                out.append((flag, argv[i + 1]))
    return out


def check_parsers(plan):
    cache = {}

    def registry(component):
        if component not in cache:
            try:
                with captured():
                    cache[component] = (
                        vllm_registries if component == "vllm" else dynamo_registries
                    )()
                FACTS.setdefault(component, {}).update(
                    {"tool_parsers": cache[component][0], "reasoning_parsers": cache[component][1]}
                )
            except BaseException:
                cache[component] = traceback.format_exc(limit=-6)
        return cache[component]

    def judge(subject, component, idx, name, where, profile):
        found = registry(component)
        if isinstance(found, str):
            record("parsers", subject, "fail", component, found, profile)
        elif name in found[idx]:
            record("parsers", subject, "pass", component, f"registered ({where})", profile)
        else:
            record(
                "parsers",
                subject,
                "fail",
                component,
                f"{name!r} ({where}) is not registered; registered: {', '.join(found[idx])}",
                profile,
            )

    for profile in plan["profiles"]:
        roles = {c["role"] for c in profile["commands"]}
        # Who parses chat output: vLLM's OpenAI server, or the Dynamo frontend.
        component = "dynamo" if "dynamo-frontend" in roles else "vllm"
        for kind, idx in (("tool_call_parser", 0), ("reasoning_parser", 1)):
            name = profile.get(kind)
            if name:
                judge(f"{kind} {name}", component, idx, name, "profile", profile["name"])
        # The names on the command lines themselves, checked by the process that reads them.
        for i, command in enumerate(profile["commands"]):
            flags = PARSER_FLAGS.get(command["role"], {})
            for flag, value in _flag_values(command["argv"]):
                subject = f"commands[{i}] {flag} {value}"
                if flag in flags:
                    owner, idx = flags[flag]
                    judge(subject, owner, idx, value, f"commands[{i}]", profile["name"])
                elif command["role"] == "dynamo-worker" and flag in WORKER_FRONTEND_FLAGS:
                    record(
                        "parsers",
                        subject,
                        "fail",
                        "dynamo.vllm",
                        f"the Dynamo worker does not take {flag} (a vLLM frontend flag): the "
                        f"Dynamo frontend parses chat output; use "
                        f"{WORKER_FRONTEND_FLAGS[flag]} {value}",
                        profile["name"],
                    )


# --- tokenizer (Dynamo Rust frontend, functional) -------------------------------------------
def _model_dir(model_type):
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


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _get_models(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=1) as r:
        return r.read()


async def _serve_models(core, model_type, timeout):
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
                exc = task.exception()
                chain = []
                while exc is not None:
                    chain.append(f"{type(exc).__name__}: {exc}")
                    exc = exc.__cause__ or exc.__context__
                return False, "the frontend stopped: " + " <- ".join(chain)
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


def tokenizer_loads(model_type, timeout=8.0):
    core = importlib.import_module("dynamo._core")
    os.environ.setdefault("DYN_LOG", "error")
    with captured() as buf:
        try:
            ok, detail = asyncio.run(_serve_models(core, model_type, timeout))
        except BaseException:
            ok, detail = False, traceback.format_exc(limit=-4)
    return ok, detail + ("\n" + buf.getvalue() if buf.getvalue().strip() and not ok else "")


def check_tokenizer(plan):
    accepted, rejected = [], []
    tested = {}
    for model_type in plan.get("tokenizer_candidates", []):
        ok, detail = tokenizer_loads(model_type)
        tested[model_type] = (ok, detail)
        (accepted if ok else rejected).append(model_type)
    if tested:
        FACTS.setdefault("dynamo", {}).update(
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
                FACTS.setdefault("dynamo", {})["tiktoken_supported"] = supported
                detail = (
                    f"dynamo-runtime {version_of('ai-dynamo-runtime')} does not load model_type "
                    f"{model_type!r}: its frontend supports {', '.join(supported)} (the list "
                    f"compiled into dynamo._core)\n{detail}"
                )
        record(
            "tokenizer",
            f"model_type {model_type}",
            "pass" if ok else "fail",
            "dynamo-runtime",
            detail,
            profile["name"],
        )


def tiktoken_supported():
    """The tiktoken model types the runtime's Rust frontend knows, from its own error text
    ("... Currently supported: a, b, c."), or None where the library does not say."""
    try:
        spec = importlib.util.find_spec("dynamo._core")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    data = _read(spec.origin)
    return None if data is None else supported_in(data)


def supported_in(data: bytes) -> list[str] | None:
    """The tiktoken model types named in a Dynamo runtime library's bytes, or None."""
    m = re.search(rb"Currently supported: ([a-z0-9_]+(?:, [a-z0-9_]+)*)", data)
    return m.group(1).decode().split(", ") if m else None


# --- patches ---------------------------------------------------------------------------------
def find_module_file(module):
    """The file of ``module`` on sys.path, without importing it (or its parents)."""
    parts = module.split(".")
    for d in sys.path:
        if not d or not os.path.isdir(d):
            continue
        stem = os.path.join(d, *parts)
        for cand in (stem + ".py", os.path.join(stem, "__init__.py")):
            if os.path.isfile(cand):
                return os.path.realpath(cand)
    return None


TARGETS: dict[str, object] = {}


def read_patch_targets(plan):
    """The text of each patch's target as the image has it; the host judges whether the
    patch is present (one definition, shared with the builder and ``export --check``)."""
    for patch in plan.get("patches", []):
        if patch.get("skip"):
            continue
        path = patch.get("path") or find_module_file(patch["module"])
        if path is None or not os.path.isfile(path):
            TARGETS[patch["name"]] = {"path": path, "text": None}
            continue
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            TARGETS[patch["name"]] = {"path": path, "text": f.read()}


# --- env -------------------------------------------------------------------------------------
def _dist_files(dist):
    """The installed files of distribution ``dist`` worth searching (Python sources, shared
    libraries), or None when it is not installed."""
    found = distribution(dist)
    if found is None:
        return None
    files = found.files or []
    return [f for f in files if f.suffix == ".py" or ".so" in f.name]


def _special_files(source):
    """Files of the runtimes that have no distribution: the interpreter, the dynamic loader."""
    if source == ":python":
        exe = os.path.realpath(sys.executable)
        libdir = os.path.dirname(os.path.dirname(exe)) + "/lib"
        libs = (
            [
                os.path.join(libdir, n)
                for n in sorted(os.listdir(libdir))
                if n.startswith("libpython")
            ]
            if os.path.isdir(libdir)
            else []
        )
        return [exe, *libs]
    if source == ":ld.so":
        return sorted(
            {
                os.path.realpath(p)
                for p in ("/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-aarch64.so.1")
                if os.path.exists(p)
            }
        )
    return []


def _search(names, tiers):
    """For each name, the first file that reads it: a Python source that has the name as a
    string literal, a shared library or binary that has it as a C string (the dynamic
    loader's LD_ names appear without their prefix). ``tiers`` gives, per name, lists of
    sources in order of preference (the family hint before the serving stack); a tier is
    searched only for names the tiers before it did not find. Each file is read once a tier."""
    found = {}
    searched = {n: [] for n in names}
    tokens = {}
    for level in range(max((len(t) for t in tiers.values()), default=0)):
        by_file = {}
        for name in names:
            if name in found or level >= len(tiers[name]):
                continue
            for source in tiers[name][level]:
                if source.startswith(":"):
                    paths = _special_files(source)
                    searched[name].append(source[1:])
                else:
                    files = _dist_files(source)
                    if files is None:
                        continue
                    searched[name].append(f"{source} {version_of(source)}")
                    paths = [str(f.locate()) for f in files]
                for path in paths:
                    by_file.setdefault(path, set()).add(name)
        for path, wanted in by_file.items():
            wanted = {n for n in wanted if n not in found}
            if not wanted:
                continue
            data = _read(path)
            if data is None:
                continue
            is_py = path.endswith(".py")
            for name in wanted:
                raw = name.encode()
                # find(), not `in`: on a memory-mapped library `in` walks byte by byte.
                if is_py:
                    hit = data.find(b'"' + raw + b'"') >= 0 or data.find(b"'" + raw + b"'") >= 0
                    if not hit and b"env_prefix" in data:
                        field = _settings_field(data, name)
                        if field:
                            found[name] = f"{path} ({field})"
                            continue
                else:
                    hit = data.find(raw + b"\0") >= 0 or (
                        name.startswith("LD_") and ".so" in path and data.find(raw[3:] + b"\0") >= 0
                    )
                if hit:
                    found[name] = path
            if is_py:  # names a Python source reads, for did-you-mean
                for token in re.findall(rb"[A-Z][A-Z0-9]+_[A-Z0-9_]{2,}", data):
                    tokens.setdefault(token.decode(errors="replace"), path)
                if b"env_prefix" in data:
                    for prefix, fields in _settings_classes(data):
                        for f in fields:
                            tokens.setdefault(prefix + f.upper(), path)
            else:  # in a large library only the names of the families asked about
                for name in wanted:
                    family = re.escape(name.split("_", 1)[0].encode() + b"_")
                    for token in re.findall(family + rb"[A-Z0-9_]{2,}(?=\0)", data):
                        tokens.setdefault(token.decode(errors="replace"), path)
    return found, searched, tokens


def _settings_classes(data):
    """(env_prefix, [field names]) of each top-level class in a Python source that sets a
    pydantic-settings ``env_prefix``: the class reads PREFIX + FIELD from the environment."""
    out = []
    text = data.decode("utf-8", "replace")
    for block in re.split(r"(?m)^(?=class \w)", text):
        m = re.search(r"env_prefix\s*=\s*[\"']([A-Za-z0-9_]+)[\"']", block)
        if m and block.startswith("class "):
            fields = re.findall(r"(?m)^    ([A-Za-z_][A-Za-z0-9_]*)\s*:", block)
            out.append((m.group(1), [f for f in fields if f != "model_config"]))
    return out


def _settings_field(data, name):
    """How a pydantic-settings class in this source reads ``name`` (its prefix and field,
    matched case-insensitively as pydantic-settings does by default), or None."""
    for prefix, fields in _settings_classes(data):
        if name.upper().startswith(prefix.upper()):
            rest = name[len(prefix) :].upper()
            for f in fields:
                if f.upper() == rest:
                    return f"pydantic-settings: env_prefix {prefix!r} + field {f}"
    return None


def _read(path):
    """A file's bytes (a large library memory-mapped, not copied), or None."""
    try:
        with open(path, "rb") as fh:
            if os.fstat(fh.fileno()).st_size > (8 << 20):
                return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            return fh.read()
    except (OSError, ValueError):
        return None


SERVE_FLAGS = set()  # `vllm serve`'s option strings, once a parser was built


def _serve_flags():
    """The option strings of `vllm serve` (from the parser check_args built, else built)."""
    if SERVE_FLAGS:
        return SERVE_FLAGS
    try:
        with captured():
            serve = importlib.import_module("vllm.entrypoints.cli.serve")
            FlexibleArgumentParser = first_import(
                "vllm.utils.argparse_utils", "vllm.utils"
            ).FlexibleArgumentParser
            top = FlexibleArgumentParser(prog="vllm")
            sub = top.add_subparsers(dest="subparser")
            for cmd in serve.cmd_init():
                cmd.subparser_init(sub)
        return set(sub.choices["serve"]._option_string_actions)
    except BaseException:
        return set()


def _vllm_env_registry():
    """vLLM's own table of the variables it reads (vllm.envs), or {} without vLLM."""
    try:
        with captured():
            envs = importlib.import_module("vllm.envs")
        return dict.fromkeys(getattr(envs, "environment_variables", {}))
    except BaseException:
        return {}


def env_search_plan(plan, registry):
    """(names to search, per name the tiers of sources to search in order)."""
    env = plan.get("env", {})
    families = plan.get("env_families", {})
    default = plan.get("env_default_sources", [])
    tiers = {}
    for name, declared in env.items():
        if declared:  # a declared reader is a place to look, never a pass by itself
            tiers[name] = [[declared.split()[0]]]
        else:
            hint = [s for prefix, srcs in families.items() if name.startswith(prefix) for s in srcs]
            rest = [s for s in default if s not in hint]
            tiers[name] = [hint, rest] if hint else [rest]
    pending = sorted(n for n in env if n not in registry or env[n])
    return pending, tiers


SEARCHED: dict[tuple[str, str], tuple[object, list[str]]] = {}  # (name, tiers) -> (file, where)
TOKENS: dict[str, str] = {}  # upper-case names the searched files mention -> a file


def search_cached(names, tiers):
    """``_search`` once per (name, tiers) in this process: a group's images share the files."""
    key = {n: json.dumps(tiers[n]) for n in names}
    misses = sorted({n for n in names if (n, key[n]) not in SEARCHED})
    by_tiers = {}
    for n in misses:
        by_tiers.setdefault(key[n], []).append(n)
    for group in by_tiers.values():
        found, searched, tokens = _search(group, {n: tiers[n] for n in group})
        for n in group:
            SEARCHED[(n, key[n])] = (found.get(n), searched[n])
        for token, path in tokens.items():
            TOKENS.setdefault(token, path)
    found = {n: SEARCHED[(n, key[n])][0] for n in names if SEARCHED[(n, key[n])][0]}
    return found, {n: SEARCHED[(n, key[n])][1] for n in names}, TOKENS


def check_env(plan):
    registry = _vllm_env_registry()
    if registry:
        FACTS.setdefault("vllm", {})["env_vars"] = sorted(registry)
    env = plan.get("env", {})
    pending, tiers = env_search_plan(plan, registry)
    found, searched, tokens = search_cached(pending, tiers)
    flags = None
    for name in sorted(env):
        declared = env[name]
        if name in registry and not declared:
            record("env", name, "pass", "vllm", "in vllm.envs.environment_variables")
            continue
        if name in found:
            owner = "spec-declared " + declared.split()[0] if declared else "image"
            record("env", name, "pass", owner, f"read by {found[name]}")
            continue
        where = ", ".join(searched[name]) or "nothing installed to search"
        if declared and not searched[name]:
            message = (
                f"{name}: the declared reader {declared.split()[0]!r} is not installed in "
                "the image, so nothing reads it"
            )
        elif declared:
            message = f"{name}: the declared reader ({where}) never mentions it"
        else:
            message = f"{name} is baked but nothing in the image reads it (searched {where})"
        close = difflib.get_close_matches(name, sorted(set(registry) | set(tokens)), n=1)
        if close:
            message += f"; did you mean {close[0]} ({tokens.get(close[0], 'vllm.envs')})?"
        if name.startswith("VLLM_"):
            if flags is None:
                flags = _serve_flags()
            flag = "--" + name.removeprefix("VLLM_").lower().replace("_", "-")
            if flag in flags:
                message += f"; vLLM {FACTS['versions'].get('vllm')} takes {flag} instead"
        record("env", name, "fail", declared.split()[0] if declared else "image", message)


CHECK_FUNCTIONS = (
    ("versions", check_versions),
    ("imports", check_imports),
    ("args", check_args),
    ("parsers", check_parsers),
    ("tokenizer", check_tokenizer),
    ("patches", read_patch_targets),
    ("env", check_env),
)


def run_plan(plan):
    """Every check of one image's plan."""
    RESULTS.clear()
    FACTS.clear()
    FACTS["versions"] = {}
    TARGETS.clear()
    start = time.monotonic()
    timings = {}
    for name, fn in CHECK_FUNCTIONS:
        t = time.monotonic()
        try:
            fn(plan)
        except BaseException:
            record(name, "(probe)", "fail", "k3env-probe", traceback.format_exc(limit=-6))
        timings[name] = round(time.monotonic() - t, 3)
    FACTS["probe_seconds"] = round(time.monotonic() - start, 3)
    FACTS["probe_timings"] = timings
    return {"results": RESULTS, "facts": FACTS, "patch_targets": TARGETS}


# --- one import for a group of images ---------------------------------------------------------
# The host groups images whose files are the same (layers, and k3env's own layer's files but
# its provenance record); they differ in their environment. The entrypoints are imported once
# under the environment they all share, then each image's checks run in a forked copy with its
# own values of the names that differ. An image's verdicts stand on the shared import only with
# the evidence that it is the import the image would have made: no name it sets differently
# was looked up (or set) during the import, none is read from C when a process starts, the
# interpreter starts the same under its environment, and k3env's files were not read.
TIMEOUT = [300.0]  # seconds a forked copy may take (the host's --timeout)
ENV_LOOKUPS: set[str] = set()
ENV_WRITES: set[str] = set()
OPENED_K3ENV: list[str] = []
UNTRACKED: list[str] = []  # imports whose lookups could not be seen (a new interpreter)
# Read from C when a process starts (the interpreter, the dynamic loader, the C library, the
# OpenMP / MKL runtimes as they load), never through os.environ: not shareable.
START_FAMILIES = ("LD_", "PYTHON", "LC_", "LANG", "MALLOC_", "GLIBC_TUNABLES", "OMP_", "KMP_",
                  "MKL_", "GOMP_")  # fmt: skip
# What the engine gives a container whose image does not set it.
ENGINE_DEFAULTS = ("HOME", "PATH", "HOSTNAME")
# Unset (or "random"), the interpreter draws a random hash seed: a fixed seed is one draw.
HASH_SEED = "PYTHONHASHSEED"
INTERPRETER = (
    "import json, sys; print(json.dumps([repr(sys.flags), sys.path, sys.prefix, "
    "sys.getfilesystemencoding(), sys.warnoptions, sorted(sys._xoptions)]))"
)


def _name(key):
    return key.decode(errors="replace") if isinstance(key, bytes) else str(key)


def track_environment():
    """Record every name looked up in os.environ one at a time (``os.environ[name]``,
    ``.get``, ``in``, ``os.getenv``), every name set or removed, and every open of k3env's
    files in /etc/k3env."""
    cls = type(os.environ)
    getitem, setitem, delitem = cls.__getitem__, cls.__setitem__, cls.__delitem__

    def __getitem__(self, key):
        ENV_LOOKUPS.add(_name(key))
        return getitem(self, key)

    def __setitem__(self, key, value):
        ENV_WRITES.add(_name(key))
        return setitem(self, key, value)

    def __delitem__(self, key):
        ENV_WRITES.add(_name(key))
        return delitem(self, key)

    cls.__getitem__, cls.__setitem__, cls.__delitem__ = __getitem__, __setitem__, __delitem__

    def hook(event, args):
        path = args[0] if event == "open" and args else None
        if isinstance(path, str) and path.startswith("/etc/k3env"):
            OPENED_K3ENV.append(path)

    sys.addaudithook(hook)


INTERPRETERS: dict[str, str] = {}  # an environment (as JSON) -> how the interpreter starts


def interpreter_state(env):
    """How the interpreter starts under ``env`` (flags, path, prefix, encoding, options)."""
    import subprocess

    key = json.dumps(env, sort_keys=True)
    if key in INTERPRETERS:
        return INTERPRETERS[key]
    try:
        proc = subprocess.run([sys.executable, "-c", INTERPRETER], env=env,
                              capture_output=True, text=True, timeout=60)  # fmt: skip
    except subprocess.TimeoutExpired:
        return "no answer within 60 s"
    state = proc.stdout.strip() if proc.returncode == 0 else f"exit {proc.returncode}"
    INTERPRETERS[key] = state
    return state


def group_envs(payload):
    """(each image's environment as its container would have it, the one they share). The
    engine's own names (HOSTNAME, and HOME and PATH where the image sets none) come from this
    container; the shared environment takes the one fixed hash seed any image sets."""
    started = dict(os.environ)
    raw = payload["envs"]
    extras = {k: v for k, v in started.items() if k not in raw[0]}
    envs = [{**extras, **env} for env in raw]
    common = {k: v for k, v in envs[0].items() if all(e.get(k) == v for e in envs[1:])}
    seeds = {e.get(HASH_SEED) for e in envs} - {None, "random"}
    if len(seeds) == 1:
        common[HASH_SEED] = seeds.pop()
    return envs, common


def differing_names(env, common):
    out = []
    for n in sorted(set(env) | set(common)):
        if env.get(n) == common.get(n):
            continue
        if n == HASH_SEED and env.get(n) in (None, "random"):
            continue  # the shared interpreter's fixed seed is one draw of this image's random
        out.append(n)
    return out


def shared_reason(raw, raw_first, env, common):
    """(the names this image sets differently from the shared environment, and why it cannot
    share the import, or None)."""
    differing = differing_names(env, common)
    unknown = [n for n in ENGINE_DEFAULTS if n not in raw and n in raw_first]
    start = [n for n in differing if n.startswith(START_FAMILIES)]
    looked = [n for n in differing if n in ENV_LOOKUPS or n in ENV_WRITES]
    if unknown:
        why = f"the engine would give it its own {', '.join(unknown)}, not known in this container"
    elif start:
        why = f"it sets {', '.join(start)} differently, read from C when a process starts"
    elif looked:
        why = (
            f"the shared import looked up {', '.join(looked)}, which this image sets "
            "differently from its group"
        )
    elif differing and UNTRACKED:
        why = f"the shared import's lookups are not all known: {UNTRACKED[0]}"
    elif OPENED_K3ENV:
        why = f"the shared import opened {OPENED_K3ENV[0]} (it differs per image)"
    elif differing and interpreter_state(env) != interpreter_state(common):
        why = "the interpreter starts differently under this image's environment"
    else:
        why = None
    return differing, why


def mapped_c_strings(names):
    """Which of ``names`` a shared library mapped into this process has as a C string: code
    that may read them from C, which the lookups above cannot see (evidence, said in facts)."""
    todo = [n for n in names if n not in C_STRINGS]
    if todo:
        try:
            with open("/proc/self/maps") as f:
                libs = sorted({line.split()[-1] for line in f if ".so" in line and "/" in line})
        except OSError:
            libs = []
        for lib in libs:
            data = _read(lib)
            for n in todo:
                if data is not None and n not in C_STRINGS and data.find(n.encode() + b"\0") >= 0:
                    C_STRINGS[n] = lib
        for n in todo:
            C_STRINGS.setdefault(n, None)
    return {n: C_STRINGS[n] for n in names if C_STRINGS[n]}


C_STRINGS: dict[str, str | None] = {}  # name -> a mapped library that has it (once a group)


def run_in_env(plan, env, common):
    """``run_plan`` with this image's values of the names that differ from the shared
    environment; everything else stays as the shared import left it."""
    for n in differing_names(env, common):
        if n in env:
            os.environ[n] = env[n]
        else:
            os.environ.pop(n, None)
    return run_plan(plan)


def run_group(payload, state_path):
    plans = payload["plans"]
    with open(state_path) as f:
        envs, common = json.load(f)
    raw = payload["envs"]
    track_environment()
    t = time.monotonic()
    design = [n.replace("-", "_") for n in plans[0].get("absent_by_design", [])]
    for module in sorted({m for plan in plans for m in entrypoints(plan)}):
        import_entrypoint(module, design)
    registry = _vllm_env_registry()
    for plan in plans:  # the files are the same: search them once for every image's names
        search_cached(*env_search_plan(plan, registry))
    shared_seconds = round(time.monotonic() - t, 3)
    out = []
    for i, (plan, env) in enumerate(zip(plans, envs, strict=True)):
        try:
            differing, reason = shared_reason(raw[i], raw[0], env, common)
            if reason is None:
                answer, why = in_fork(lambda p=plan, e=env: run_in_env(p, e, common), TIMEOUT[0])
                if answer is None:
                    reason = f"its forked check process failed: {why[-1500:]}"
        except BaseException:
            reason = "the group probe failed for it: " + traceback.format_exc(limit=-4)
        if reason is not None:
            out.append({"unshared": reason})
            continue
        answer["facts"]["shared_import"] = {
            "images": [p["image"] for p in plans],
            "seconds": shared_seconds,
            "env_differs": differing,
            "env_looked_up": len(ENV_LOOKUPS),
            # Evidence, not a pass: C code that could read a name it sets differently.
            "c_strings": mapped_c_strings(differing),
        }
        out.append(answer)
    return out


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--import-past-absent":
        result = import_past_absent(sys.argv[2], json.loads(sys.argv[3]))
        sys.stdout.write("\n" + MARK + json.dumps(result) + "\n")
        sys.stdout.flush()
        os._exit(0)
    ap = argparse.ArgumentParser()
    ap.add_argument("plan")
    ap.add_argument("--group-state", help="(internal) the group's environments, restarted")
    args = ap.parse_args()
    with open(args.plan) as f:
        payload = json.load(f)
    TIMEOUT[0] = float(payload.get("timeout", 300))
    if len(payload["plans"]) == 1:
        out = [run_plan(payload["plans"][0])]
    elif args.group_state is None:
        # Start again under the environment the group shares, the environments computed
        # here (from what the engine gave this container) carried over.
        envs, common = group_envs(payload)
        fd, state = tempfile.mkstemp(prefix="k3env-group-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump([envs, common], f)
        argv = [sys.executable, os.path.abspath(__file__), args.plan, "--group-state", state]
        os.execve(sys.executable, argv, common)
    else:
        out = run_group(payload, args.group_state)
    sys.stdout.write("\n" + MARK + json.dumps({"plans": out}) + "\n")
    sys.stdout.flush()
    os._exit(0)  # Dynamo's runtime threads must not hold the container open


if __name__ == "__main__":
    main()
