"""Which file of the image reads each baked env name: vLLM's own table of the variables it
reads, then the files of the sources the plan names (a Python source that has the name as a
string literal or a pydantic-settings field, a library or binary that has it as a C string),
with a did-you-mean from the names those files mention."""

from __future__ import annotations

import difflib
import importlib
import json
import mmap
import os
import re
import sys
from typing import Any

from .args import serve_flags
from .harness import captured, read_bytes
from .session import Plan, Run
from .versions import distribution, version_of

Tiers = dict[str, list[list[str]]]  # name -> lists of sources, in order of preference


def _dist_files(dist: str) -> list[Any] | None:
    """The installed files of distribution ``dist`` worth searching (Python sources, shared
    libraries), or None when it is not installed."""
    found = distribution(dist)
    if found is None:
        return None
    files = found.files or []
    return [f for f in files if f.suffix == ".py" or ".so" in f.name]


def _special_files(source: str) -> list[str]:
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


def _files_by_level(
    names: list[str],
    tiers: Tiers,
    level: int,
    found: dict[str, str],
    searched: dict[str, list[str]],
) -> dict[str, set[str]]:
    """Each file of tier ``level`` -> the names not yet found that it is searched for."""
    by_file: dict[str, set[str]] = {}
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
    return by_file


def _reads(path: str, data: bytes | mmap.mmap, name: str) -> str | None:
    """How the file at ``path`` reads ``name`` (its path, with the settings field), or None."""
    raw = name.encode()
    # find(), not `in`: on a memory-mapped library `in` walks byte by byte.
    if path.endswith(".py"):
        if data.find(b'"' + raw + b'"') >= 0 or data.find(b"'" + raw + b"'") >= 0:
            return path
        if data.find(b"env_prefix") >= 0:
            field = _settings_field(data, name)
            if field:
                return f"{path} ({field})"
        return None
    hit = data.find(raw + b"\0") >= 0 or (
        name.startswith("LD_") and ".so" in path and data.find(raw[3:] + b"\0") >= 0
    )
    return path if hit else None


def _mentioned(
    path: str, data: bytes | mmap.mmap, wanted: set[str], tokens: dict[str, str]
) -> None:
    """The upper-case names a file mentions, for did-you-mean."""
    if path.endswith(".py"):
        for token in re.findall(rb"[A-Z][A-Z0-9]+_[A-Z0-9_]{2,}", data):
            tokens.setdefault(token.decode(errors="replace"), path)
        if data.find(b"env_prefix") >= 0:
            for prefix, fields in _settings_classes(data):
                for f in fields:
                    tokens.setdefault(prefix + f.upper(), path)
    else:  # in a large library only the names of the families asked about
        for name in wanted:
            family = re.escape(name.split("_", 1)[0].encode() + b"_")
            for token in re.findall(family + rb"[A-Z0-9_]{2,}(?=\0)", data):
                tokens.setdefault(token.decode(errors="replace"), path)


def search(
    names: list[str], tiers: Tiers
) -> tuple[dict[str, str], dict[str, list[str]], dict[str, str]]:
    """For each name, the first file that reads it: a Python source that has the name as a
    string literal, a shared library or binary that has it as a C string (the dynamic
    loader's LD_ names appear without their prefix). ``tiers`` gives, per name, lists of
    sources in order of preference (the family hint before the serving stack); a tier is
    searched only for names the tiers before it did not find. Each file is read once a tier."""
    found: dict[str, str] = {}
    searched: dict[str, list[str]] = {n: [] for n in names}
    tokens: dict[str, str] = {}
    for level in range(max((len(t) for t in tiers.values()), default=0)):
        for path, wanted in _files_by_level(names, tiers, level, found, searched).items():
            wanted = {n for n in wanted if n not in found}
            if not wanted:
                continue
            data = read_bytes(path)
            if data is None:
                continue
            for name in wanted:
                reader = _reads(path, data, name)
                if reader is not None:
                    found[name] = reader
            _mentioned(path, data, wanted, tokens)
    return found, searched, tokens


def _settings_classes(data: bytes | mmap.mmap) -> list[tuple[str, list[str]]]:
    """(env_prefix, [field names]) of each top-level class in a Python source that sets a
    pydantic-settings ``env_prefix``: the class reads PREFIX + FIELD from the environment."""
    out = []
    text = bytes(data).decode("utf-8", "replace")
    for block in re.split(r"(?m)^(?=class \w)", text):
        m = re.search(r"env_prefix\s*=\s*[\"']([A-Za-z0-9_]+)[\"']", block)
        if m and block.startswith("class "):
            fields = re.findall(r"(?m)^    ([A-Za-z_][A-Za-z0-9_]*)\s*:", block)
            out.append((m.group(1), [f for f in fields if f != "model_config"]))
    return out


def _settings_field(data: bytes | mmap.mmap, name: str) -> str | None:
    """How a pydantic-settings class in this source reads ``name`` (its prefix and field,
    matched case-insensitively as pydantic-settings does by default), or None."""
    for prefix, fields in _settings_classes(data):
        if name.upper().startswith(prefix.upper()):
            rest = name[len(prefix) :].upper()
            for f in fields:
                if f.upper() == rest:
                    return f"pydantic-settings: env_prefix {prefix!r} + field {f}"
    return None


def vllm_env_registry() -> dict[str, None]:
    """vLLM's own table of the variables it reads (vllm.envs), or {} without vLLM."""
    try:
        with captured():
            envs = importlib.import_module("vllm.envs")
        return dict.fromkeys(getattr(envs, "environment_variables", {}))
    except BaseException:
        return {}


def env_search_plan(plan: Plan, registry: dict[str, None]) -> tuple[list[str], Tiers]:
    """(names to search, per name the tiers of sources to search in order)."""
    env = plan.get("env", {})
    families = plan.get("env_families", {})
    default = plan.get("env_default_sources", [])
    tiers: Tiers = {}
    for name, declared in env.items():
        if declared:  # a declared reader is a place to look, never a pass by itself
            tiers[name] = [[declared.split()[0]]]
        else:
            hint = [s for prefix, srcs in families.items() if name.startswith(prefix) for s in srcs]
            rest = [s for s in default if s not in hint]
            tiers[name] = [hint, rest] if hint else [rest]
    pending = sorted(n for n in env if n not in registry or env[n])
    return pending, tiers


def search_cached(
    run: Run, names: list[str], tiers: Tiers
) -> tuple[dict[str, str], dict[str, list[str]], dict[str, str]]:
    """``search`` once per (name, tiers) in this process: a group's images share the files."""
    key = {n: json.dumps(tiers[n]) for n in names}
    misses = sorted({n for n in names if (n, key[n]) not in run.searched})
    by_tiers: dict[str, list[str]] = {}
    for n in misses:
        by_tiers.setdefault(key[n], []).append(n)
    for group in by_tiers.values():
        found, searched, tokens = search(group, {n: tiers[n] for n in group})
        for n in group:
            run.searched[(n, key[n])] = (found.get(n), searched[n])
        for token, path in tokens.items():
            run.tokens.setdefault(token, path)
    hits = {n: run.searched[(n, key[n])][0] for n in names}
    return (
        {n: hit for n, hit in hits.items() if hit},
        {n: run.searched[(n, key[n])][1] for n in names},
        run.tokens,
    )


def check_env(run: Run, plan: Plan) -> None:
    report = run.report
    registry = vllm_env_registry()
    if registry:
        report.section("vllm")["env_vars"] = sorted(registry)
    env = plan.get("env", {})
    pending, tiers = env_search_plan(plan, registry)
    found, searched, tokens = search_cached(run, pending, tiers)
    for name in sorted(env):
        declared = env[name]
        if name in registry and not declared:
            report.record("env", name, "pass", "vllm", "in vllm.envs.environment_variables")
            continue
        if name in found:
            owner = "spec-declared " + declared.split()[0] if declared else "image"
            report.record("env", name, "pass", owner, f"read by {found[name]}")
            continue
        blind = _stood_in(plan, name)
        if blind is not None:
            report.record("env", name, "skip", "image", blind)
            continue
        message = _unread(run, name, declared, searched[name], registry, tokens)
        report.record("env", name, "fail", declared.split()[0] if declared else "image", message)


def _stood_in(plan: Plan, name: str) -> str | None:
    """Over the twin, why an unread ``name`` of a native family (``NCCL_``, ``CUDA_``, ...)
    is not checked: its readers here are only the CPU stand-ins (torch) or not installed (the
    GPU libraries that read it natively, which the GPU image carries). None: the search
    could see its readers, so an unread name is a finding."""
    stand_ins = set(plan.get("stand_ins", []))
    if not stand_ins or plan.get("env", {}).get(name):
        return None
    family = [s for prefix, srcs in plan.get("env_families", {}).items()
              if name.startswith(prefix) for s in srcs if not s.startswith(":")]  # fmt: skip
    if not family or any(s not in stand_ins and _dist_files(s) is not None for s in family):
        return None
    here = [f"{s} (a CPU stand-in)" for s in family if s in stand_ins]
    gone = [s for s in family if s not in stand_ins]
    absent = f" and {', '.join(gone)} {'is' if len(gone) == 1 else 'are'} not installed"
    return (
        f"not checked: {name} is read natively by the GPU build's libraries; here its readers "
        f"are {', '.join(here) or 'none'}{absent if gone else ''}, and none of them mentions it"
    )


def _unread(
    run: Run,
    name: str,
    declared: str,
    searched: list[str],
    registry: dict[str, None],
    tokens: dict[str, str],
) -> str:
    """Why nothing reads ``name``, with the closest name read and the flag that replaced it."""
    where = ", ".join(searched) or "nothing installed to search"
    if declared and not searched:
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
        flag = "--" + name.removeprefix("VLLM_").lower().replace("_", "-")
        if flag in serve_flags(run):
            version = run.report.facts["versions"].get("vllm")
            message += f"; vLLM {version} takes {flag} instead"
    return message
