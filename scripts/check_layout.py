"""Check k3env's layout: no import cycles, data flows one way, one job per module.

Run by `nox -s lint` and by tests/test_layout.py (which also shows it failing on a cycle).
Rules, read from the source with `ast` (function-level imports count too: a lazy import is
still a dependency):

- no import cycle between k3env modules;
- layers only import downwards: core < config < engine < image < checks < smoke < srt < handoff <
  cluster < bump < commands < cli
  (probes/ runs inside images and imports nothing of k3env but its own package's modules);
- every module opens with a docstring;
- each external library is imported by exactly one module;
- every JSON document is emitted through ``k3env.jsontext.dumps`` (strict: no NaN or Infinity):
  no other module calls ``json.dumps`` or ``json.dump`` (probes/ excepted: stdlib only).

Exit 1 with one line per violation.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

# Lower index = lower layer. The flat core (errors, log, state, ...) is layer 0.
LAYERS = (
    "core", "config", "engine", "image", "checks", "smoke", "srt", "handoff", "cluster", "bump",
    "commands", "cli",
)  # fmt: skip
# External libraries (and the stdlib modules whose use is one concern) -> the one module
# allowed to import them.
OWNERS = {
    "tomllib": "k3env.config.reader",
    "tomlkit": "k3env.config.lock_edit",
    "yaml": "k3env.config.yamlread",  # PyYAML: recipes and srtslurm.yaml people wrote
    "packaging": "k3env.versions",
    "subprocess": "k3env.runner",
    "socket": "k3env.engine._http",
    "http.client": "k3env.engine.registry",
    "urllib.request": None,  # registry.py speaks http.client (deadlines, checked redirects)
    "hashlib": "k3env.hashing",
    "packageurl": "k3env.handoff.sbom",
    "cryptography": "k3env.signing",
    "docker": None,  # not a dependency: k3env speaks to dockerd itself (engine/_http.py)
}


# The one JSON encoder, and the modules that still call json.dumps until their owners move
# them to it (issue 50; each is dropped from here when it does).
JSON_ENCODER = "jsontext"
JSON_WRITERS = ("dumps", "dump")


def json_encodes(path: Path) -> list[int]:
    """Lines where ``path`` calls ``json.dumps`` / ``json.dump`` (under any name ``import json``
    or ``from json import`` gave it)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    modules_as = {"json"}
    functions_as: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules_as |= {a.asname or a.name for a in node.names if a.name == "json"}
        elif isinstance(node, ast.ImportFrom) and node.module == "json" and not node.level:
            functions_as |= {a.asname or a.name for a in node.names if a.name in JSON_WRITERS}
    lines = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in JSON_WRITERS
            and isinstance(node.value, ast.Name)
            and node.value.id in modules_as
        ) or (isinstance(node, ast.Name) and node.id in functions_as):
            lines.append(node.lineno)
    return sorted(lines)


def modules(package: Path) -> dict[str, Path]:
    """Module name -> file for every module of ``package`` (a directory)."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports(name: str, path: Path) -> list[tuple[str, int]]:
    """Every module ``name`` imports (absolute names, relative ones resolved), with lines."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_pkg = path.name == "__init__.py"
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_pkg else 0)]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            out.append((mod, node.lineno))
            # `from k3env.image import twin` imports the module k3env.image.twin.
            out += [(f"{mod}.{a.name}", node.lineno) for a in node.names]
    return out


def _same_probe(name: str, target: str, root: str) -> bool:
    """Whether ``name`` and ``target`` are modules of one probe package under probes/."""
    parts, other = name.split("."), target.split(".")
    return len(parts) >= 4 and parts[:3] == [root, "probes", parts[2]] and other[:3] == parts[:3]


def layer_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) >= 2 and parts[1] in LAYERS:
        return parts[1]
    if len(parts) >= 2 and parts[1] in ("cli", "__main__"):
        return "cli"
    return "core"


def find_cycle(graph: Mapping[str, Iterable[str]]) -> list[str] | None:
    """One import cycle (as a path a -> ... -> a), or None."""
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def check(package: Path) -> list[str]:
    mods = modules(package)
    root = package.name
    problems: list[str] = []
    graph: dict[str, set[str]] = {m: set() for m in mods}
    owners: dict[str, set[str]] = {}
    for name, path in mods.items():
        source = path.read_text()
        if source.strip() and ast.get_docstring(ast.parse(source)) is None:
            problems.append(f"{path}: no module docstring (say the module's one job)")
        for target, _line in imports(name, path):
            if target == root or target.startswith(root + "."):
                if target in mods and target != name:
                    graph[name].add(target)
                continue
            if name.startswith(f"{root}.probes"):
                continue  # probes run inside images with their own Python: stdlib as they need
            for lib in OWNERS:
                if target == lib or target.startswith(lib + "."):
                    owners.setdefault(lib, set()).add(name)
        is_probe = name.startswith(f"{root}.probes")
        exempt = {f"{root}.{JSON_ENCODER}"}
        if not is_probe and name not in exempt:
            problems += [
                f"{path}:{line}: json.dumps/json.dump: emit JSON through "
                f"{root}.{JSON_ENCODER}.dumps (strict: no NaN or Infinity)"
                for line in json_encodes(path)
            ]
        for target in sorted(graph[name]):
            if is_probe and _same_probe(name, target, root):
                continue  # the probe package's own modules (relative imports, carried whole)
            if is_probe:
                problems.append(f"{path}: imports {target}: probes run inside images (stdlib only)")
                continue
            if target.startswith(f"{root}.probes") or target == root:
                continue  # the builder reads a probe's source; __init__ holds the version
            mine, theirs = LAYERS.index(layer_of(name)), LAYERS.index(layer_of(target))
            if theirs > mine:
                problems.append(
                    f"{path}: {layer_of(name)} module imports {target} ({layer_of(target)}): "
                    f"data flows {' < '.join(LAYERS)}"
                )
    for lib, users in sorted(owners.items()):
        allowed = OWNERS[lib]
        extra = sorted(u for u in users if u != allowed)
        if extra:
            problems.append(
                f"{lib} imported by {extra}: only {allowed or 'no module'} may import it"
            )
    cycle = find_cycle(graph)
    if cycle:
        problems.append("import cycle: " + " -> ".join(cycle))
    return problems


def main(argv: list[str]) -> int:
    package = Path(argv[1] if len(argv) > 1 else "k3env")
    problems = check(package)
    for p in problems:
        print(p)
    if not problems:
        print(f"{package}: {len(modules(package))} modules, no cycle, layers hold")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
