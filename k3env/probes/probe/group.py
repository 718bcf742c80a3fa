"""One import for a group of images.

The host groups images whose files are the same (layers, and k3env's own layer's files but
its provenance record); they differ in their environment. The entrypoints are imported once
under the environment they all share, then each image's checks run in a forked copy with its
own values of the names that differ. An image's verdicts stand on the shared import only with
the evidence that it is the import the image would have made: no name it sets differently
was looked up (or set) during the import, none is read from C when a process starts, the
interpreter starts the same under its environment, and k3env's files were not read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from .envsearch import env_search_plan, search_cached, vllm_env_registry
from .harness import in_fork, read_bytes
from .imports import absent_by_design, entrypoints, import_entrypoint
from .session import Json, Plan, Run

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
Env = dict[str, str]


def _name(key: object) -> str:
    return key.decode(errors="replace") if isinstance(key, bytes) else str(key)


def track_environment(run: Run) -> None:
    """Record every name looked up in os.environ one at a time (``os.environ[name]``,
    ``.get``, ``in``, ``os.getenv``), every name set or removed, and every open of k3env's
    files in /etc/k3env."""
    cls: Any = type(os.environ)
    getitem, setitem, delitem = cls.__getitem__, cls.__setitem__, cls.__delitem__

    def __getitem__(self: Any, key: Any) -> Any:
        run.env_lookups.add(_name(key))
        return getitem(self, key)

    def __setitem__(self: Any, key: Any, value: Any) -> Any:
        run.env_writes.add(_name(key))
        return setitem(self, key, value)

    def __delitem__(self: Any, key: Any) -> Any:
        run.env_writes.add(_name(key))
        return delitem(self, key)

    cls.__getitem__, cls.__setitem__, cls.__delitem__ = __getitem__, __setitem__, __delitem__

    def hook(event: str, args: tuple[Any, ...]) -> None:
        path = args[0] if event == "open" and args else None
        if isinstance(path, str) and path.startswith("/etc/k3env"):
            run.opened_k3env.append(path)

    sys.addaudithook(hook)


def interpreter_state(run: Run, env: Env) -> str:
    """How the interpreter starts under ``env`` (flags, path, prefix, encoding, options)."""
    key = json.dumps(env, sort_keys=True)
    if key in run.interpreters:
        return run.interpreters[key]
    try:
        proc = subprocess.run([sys.executable, "-c", INTERPRETER], env=env,
                              capture_output=True, text=True, timeout=60)  # fmt: skip
    except subprocess.TimeoutExpired:
        return "no answer within 60 s"
    state = proc.stdout.strip() if proc.returncode == 0 else f"exit {proc.returncode}"
    run.interpreters[key] = state
    return state


def group_envs(payload: Json) -> tuple[list[Env], Env]:
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
        common[HASH_SEED] = str(seeds.pop())
    return envs, common


def differing_names(env: Env, common: Env) -> list[str]:
    out = []
    for n in sorted(set(env) | set(common)):
        if env.get(n) == common.get(n):
            continue
        if n == HASH_SEED and env.get(n) in (None, "random"):
            continue  # the shared interpreter's fixed seed is one draw of this image's random
        out.append(n)
    return out


def shared_reason(
    run: Run, raw: Env, raw_first: Env, env: Env, common: Env
) -> tuple[list[str], str | None]:
    """(the names this image sets differently from the shared environment, and why it cannot
    share the import, or None)."""
    differing = differing_names(env, common)
    unknown = [n for n in ENGINE_DEFAULTS if n not in raw and n in raw_first]
    start = [n for n in differing if n.startswith(START_FAMILIES)]
    looked = [n for n in differing if n in run.env_lookups or n in run.env_writes]
    why: str | None
    if unknown:
        why = f"the engine would give it its own {', '.join(unknown)}, not known in this container"
    elif start:
        why = f"it sets {', '.join(start)} differently, read from C when a process starts"
    elif looked:
        why = (
            f"the shared import looked up {', '.join(looked)}, which this image sets "
            "differently from its group"
        )
    elif differing and run.untracked:
        why = f"the shared import's lookups are not all known: {run.untracked[0]}"
    elif run.opened_k3env:
        why = f"the shared import opened {run.opened_k3env[0]} (it differs per image)"
    elif differing and interpreter_state(run, env) != interpreter_state(run, common):
        why = "the interpreter starts differently under this image's environment"
    else:
        why = None
    return differing, why


def mapped_c_strings(run: Run, names: list[str]) -> dict[str, str]:
    """Which of ``names`` a shared library mapped into this process has as a C string: code
    that may read them from C, which the lookups above cannot see (evidence, said in facts)."""
    todo = [n for n in names if n not in run.c_strings]
    if todo:
        try:
            with open("/proc/self/maps") as f:
                libs = sorted({line.split()[-1] for line in f if ".so" in line and "/" in line})
        except OSError:
            libs = []
        for lib in libs:
            data = read_bytes(lib)
            for n in todo:
                if (
                    data is not None
                    and n not in run.c_strings
                    and data.find(n.encode() + b"\0") >= 0
                ):
                    run.c_strings[n] = lib
        for n in todo:
            run.c_strings.setdefault(n, None)
    out: dict[str, str] = {}
    for n in names:
        mapped = run.c_strings[n]
        if mapped:
            out[n] = mapped
    return out


def run_in_env(
    run: Run, run_plan: Callable[[Run, Plan], Json], plan: Plan, env: Env, common: Env
) -> Json:
    """``run_plan`` with this image's values of the names that differ from the shared
    environment; everything else stays as the shared import left it."""
    for n in differing_names(env, common):
        if n in env:
            os.environ[n] = env[n]
        else:
            os.environ.pop(n, None)
    return run_plan(run, plan)


def _in_env(
    run: Run, run_plan: Callable[[Run, Plan], Json], plan: Plan, env: Env, common: Env
) -> Callable[[], Json]:
    return lambda: run_in_env(run, run_plan, plan, env, common)


def run_group(
    run: Run, run_plan: Callable[[Run, Plan], Json], payload: Json, state_path: str
) -> list[Json]:
    """Every image's checks of the group, over the one shared import where it stands."""
    plans: list[Plan] = payload["plans"]
    with open(state_path) as f:
        envs, common = json.load(f)
    raw = payload["envs"]
    track_environment(run)
    t = time.monotonic()
    design = absent_by_design(plans[0])
    for module in sorted({m for plan in plans for m in entrypoints(plan)}):
        import_entrypoint(run, module, design)
    registry = vllm_env_registry()
    for plan in plans:  # the files are the same: search them once for every image's names
        search_cached(run, *env_search_plan(plan, registry))
    shared_seconds = round(time.monotonic() - t, 3)
    out: list[Json] = []
    for i, (plan, env) in enumerate(zip(plans, envs, strict=True)):
        try:
            differing, reason = shared_reason(run, raw[i], raw[0], env, common)
            if reason is None:
                answer, why = in_fork(_in_env(run, run_plan, plan, env, common), run.timeout)
                if answer is None:
                    reason = f"its forked check process failed: {str(why)[-1500:]}"
        except BaseException:
            reason = "the group probe failed for it: " + traceback.format_exc(limit=-4)
        if reason is not None:
            out.append({"unshared": reason})
            continue
        answer["facts"]["shared_import"] = {
            "images": [p["image"] for p in plans],
            "seconds": shared_seconds,
            "env_differs": differing,
            "env_looked_up": len(run.env_lookups),
            # Evidence, not a pass: C code that could read a name it sets differently.
            "c_strings": mapped_c_strings(run, differing),
        }
        out.append(answer)
    return out
