"""``k3env bump srt-slurm TAG`` to a release that loads schema 2 (srt-slurm 2.x): what else
moves with the pin, as one transaction.

The lock's version and commit move; then, on that release:

- each PR patch it already has (``srt.fates``: its commits in the history, the same
  change, or it reverses cleanly) is dropped from the lock, its entry and comments with it
  (every other byte kept); a patch that conflicts refuses the bump;
- srtctl's pinned requirements are regenerated from the release's own ``pyproject.toml`` at
  the pinned commit (``[project] dependencies`` and ``[build-system] requires``), by ``uv pip
  compile --generate-hashes`` at the lock's index cut-off (``[twin] resolved_before``);
- the recorded schema is recorded again from the release's own loader where it materializes
  and runs, else said ``not checked`` with why, and the old file kept;
- k3env's recipes (every serve profile) are rendered as the release loads them (schema 2),
  each judged by k3env's model of the gate and by the release's own gate and role expansion
  where it runs; a user's recipes (``--recipes``) are migrated on a copy by the release's own
  ``srtctl migrate``, whose notes say what each must change.

The files it writes (lock, requirements, schema) are kept as they were (``saved``) and put
back by ``restore`` when anything ends the bump first: a failure, Ctrl-C, SIGTERM.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from k3env import jsontext
from k3env.bump.closures import restore
from k3env.config.cluster import Cluster
from k3env.config.lock import load_lock
from k3env.config.lock_edit import Change, candidate, render_leaves, write_lock
from k3env.config.pins import Lock, SrtSlurmPin
from k3env.config.reader import load_toml
from k3env.config.spec import ImageSpec
from k3env.config.srtschema import identity
from k3env.config.yamlread import load_yaml
from k3env.errors import ConfigError, K3envError, PatchError
from k3env.files import write_atomic
from k3env.hashing import sha256_digest
from k3env.image.envpolicy import merged_env
from k3env.log import Log
from k3env.runner import attempt, require_tool, run
from k3env.srt.fates import patch_fates
from k3env.srt.gate import loads_schema, refusal
from k3env.srt.materialize import Materialized, materialize, run_git
from k3env.srt.migrate import migrate
from k3env.srt.recipe import as_pinned, precision_of, recipe, to_yaml
from k3env.srt.validate import record_schema
from k3env.state import State
from k3env.verdict import FAILED, NOT_CHECKED, PASSED, Gate, ok

# srtctl runs on the cluster's login node: CPython 3.11 on x86_64 Linux, as the file pins it.
PYTHON, PLATFORM = "3.11", "x86_64-unknown-linux-gnu"
PYPROJECT_BYTES = 1 << 20


@dataclass(frozen=True, kw_only=True)
class RenderedRecipe:
    """One of k3env's recipes as the release loads it, and who said it loads."""

    name: str  # spec/profile
    text: str  # the YAML
    k3env: Gate  # k3env's model of the release's gate
    release: Gate  # the release's own gate and role expansion (or not checked, why)


@dataclass(frozen=True, kw_only=True)
class Dropped:
    """A PR patch the release already has: out of the lock (its file left for the PR to
    remove)."""

    label: str
    file: str
    detail: str  # how it was found upstream (srt.fates)


@dataclass(frozen=True, kw_only=True)
class UserRecipe:
    path: str
    gate: Gate  # the release's own migrate on a copy (or not checked, why)
    notes: tuple[str, ...]  # what migrate moved and what it left to a person


@dataclass(frozen=True, kw_only=True)
class Crossing:
    """What the bump changed beside the pin, and each thing's verdict."""

    changes: tuple[Change, ...]
    saved: dict[Path, bytes]  # the files' bytes before, for ``restore``
    dropped: tuple[Dropped, ...]
    requirements: Gate
    schema: Gate
    recipes: tuple[RenderedRecipe, ...]
    users: tuple[UserRecipe, ...]

    @property
    def gates(self) -> tuple[Gate, ...]:
        return (self.requirements, self.schema,
                *(g for r in self.recipes for g in (r.k3env, r.release)),
                *(u.gate for u in self.users))  # fmt: skip

    @property
    def failed(self) -> bool:
        return not ok(self.gates)

    def as_json(self) -> dict[str, Any]:
        def gate(g: Gate) -> dict[str, Any]:
            return {"name": g.name, "status": g.status, "detail": g.detail}

        return {
            "dropped": [f.__dict__ for f in self.dropped],
            "requirements": gate(self.requirements),
            "schema": gate(self.schema),
            "recipes": [{"name": r.name, "yaml": r.text, "k3env": gate(r.k3env),
                         "release": gate(r.release)} for r in self.recipes],
            "user_recipes": [{"path": u.path, **gate(u.gate), "notes": list(u.notes)}
                             for u in self.users],
            "failed": self.failed,
        }  # fmt: skip


def crosses(srt: SrtSlurmPin | None, leaves: dict[str, str]) -> bool:
    """Whether a bump to ``leaves`` pins a release that loads schema 2."""
    version = leaves.get("srt_slurm.version")
    return srt is not None and version is not None and loads_schema(
        dataclasses.replace(srt, version=version)) == 2  # fmt: skip


def user_recipes(paths: Sequence[Path]) -> list[Path]:
    """``--recipes FILE|DIR``: each YAML file, parsed now (bad input is refused, naming the
    file and line, before anything is written)."""
    out: list[Path] = []
    for p in paths:
        out += sorted([*p.glob("*.yaml"), *p.glob("*.yml")]) if p.is_dir() else [p]
    for p in out:
        if not isinstance(load_yaml(p).data, dict):
            raise ConfigError("not a recipe (a YAML mapping)", where=str(p),
                              fix="pass srt-slurm recipe files or a directory of them")  # fmt: skip
    return out


def cross(
    lock: Lock,
    leaves: dict[str, str],
    log: Log,
    state: State,
    *,
    source: str | None,
    find_links: Sequence[str],
    index_url: str | None,
    specs: Sequence[ImageSpec],
    cluster: Cluster,
    recipes: Sequence[Path],
) -> Crossing:
    """The bump to ``leaves`` with everything that moves with it, written; the files' old
    bytes kept (and put back here when this fails)."""
    text, changes = render_leaves(lock.path.read_text(), leaves)
    with candidate(lock.path, text) as path:
        bumped = dataclasses.replace(load_lock(path), path=lock.path)
    srt = bumped.srt_slurm
    assert srt is not None
    with log.step(f"srt-slurm {srt.version}: which PR patches it already has"):
        fates = patch_fates(bumped, log, source=source)
    conflicts = [f for f in fates if f.status == "conflicts"]
    if conflicts:
        raise PatchError(
            f"srt-slurm patch(es) conflict with {srt.version}: "
            + "; ".join(f"{f.label}: {f.detail}" for f in conflicts),
            where=f"{lock.path}: srt_slurm.patches",
            fix="rebase the patch on the new version (or drop it if it is upstream), then bump "
            "again",
        )
    gone = {i for i, f in enumerate(fates) if f.status == "upstream"}
    dropped = tuple(Dropped(label=fates[i].label, file=srt.patches[i].file,
                            detail=fates[i].detail) for i in sorted(gone))  # fmt: skip
    text = drop_patches(text, gone)
    changes += [Change(key=f"srt_slurm.patches[{i}]", old=fates[i].label, new="(dropped)")
                for i in sorted(gone)]  # fmt: skip
    paths = [lock.path] + [lock.resolve_path(f) for f in (srt.requirements, srt.schema) if f]
    saved = {p: p.read_bytes() for p in paths if p.is_file()}
    try:
        requirements, req_change = _requirements(bumped, srt, log, source, find_links,
                                                 index_url)  # fmt: skip
        if req_change:
            text, done = render_leaves(text, {"srt_slurm.requirements_sha256": req_change})
            changes += done
        write_lock(lock.path, text)
        now = load_lock(lock.path)
        m, why = _materialized(now, state, log, source)
        schema, schema_changes = _schema(now, m, why, log)
        changes += schema_changes
        rendered = tuple(_render(load_lock(lock.path), specs, cluster, m, why, log))
        users = tuple(_migrate_users(m, why, recipes, log))
    except BaseException:
        restore(saved)
        raise
    return Crossing(changes=tuple(changes), saved=saved, dropped=dropped,
                    requirements=requirements, schema=schema, recipes=rendered,
                    users=users)  # fmt: skip


def drop_patches(text: str, indices: set[int]) -> str:
    """The lock's text without the ``[[srt_slurm.patches]]`` entries at ``indices``: each
    from the blank line before its header to its last line (the comments and blank lines
    that lead into the next table stay with that table); every other byte kept."""
    lines = text.splitlines(keepends=True)
    heads = [i for i, line in enumerate(lines) if line.strip() == "[[srt_slurm.patches]]"]
    cut: set[int] = set()
    for n, start in enumerate(heads):
        if n not in indices:
            continue
        end = start + 1
        while end < len(lines) and not lines[end].lstrip().startswith("["):
            end += 1
        while end > start + 1 and (not lines[end - 1].strip()
                                   or lines[end - 1].lstrip().startswith("#")):  # fmt: skip
            end -= 1
        if start > 0 and not lines[start - 1].strip():
            start -= 1
        cut.update(range(start, end))
    return "".join(line for i, line in enumerate(lines) if i not in cut)


def _pyproject(lock: Lock, srt: SrtSlurmPin, log: Log, source: str | None) -> dict[str, Any]:
    """The release's own ``pyproject.toml`` at the pinned commit (parsed, bounded)."""
    with tempfile.TemporaryDirectory(prefix="k3env-srt-pyproject-") as tmp:
        repo = Path(tmp) / "git"
        run_git(["clone", "--quiet", "--bare", "--", source or srt.git, str(repo)], log,
                what="git clone")  # fmt: skip
        code, out = attempt([require_tool("git", "git"), "cat-file", "blob",
                             f"{srt.commit}:pyproject.toml"], log, cwd=repo)  # fmt: skip
        where = f"srt-slurm {srt.version} ({srt.commit[:12]}): pyproject.toml"
        if code != 0 or len(out) > PYPROJECT_BYTES:
            raise ConfigError(f"no readable pyproject.toml at the pinned commit: {out[-300:]}",
                              where=where, fix="bump to a release tag of srt-slurm")  # fmt: skip
        file = Path(tmp) / "pyproject.toml"
        file.write_text(out)
        try:
            return load_toml(file)
        except ConfigError as e:
            raise ConfigError(e.message, where=where, fix=e.fix) from None


def _requirements(
    lock: Lock,
    srt: SrtSlurmPin,
    log: Log,
    source: str | None,
    find_links: Sequence[str],
    index_url: str | None,
) -> tuple[Gate, str | None]:
    """srtctl's requirements regenerated from the release's pyproject.toml (its
    dependencies and build backend), written; the gate and the file's new sha256."""
    name = "srtctl's pinned requirements"
    if srt.requirements is None:
        return Gate(name=name, status=NOT_CHECKED,
                    detail="the lock pins none (srt_slurm.requirements)"), None  # fmt: skip
    project = _pyproject(lock, srt, log, source)
    deps = project.get("project", {}).get("dependencies")
    backend = project.get("build-system", {}).get("requires", [])
    if not isinstance(deps, list) or not all(isinstance(d, str) for d in [*deps, *backend]):
        raise ConfigError("pyproject.toml declares no [project] dependencies list",
                          where=f"srt-slurm {srt.version} ({srt.commit[:12]}): pyproject.toml",
                          fix="pin its requirements by hand")  # fmt: skip
    cutoff = lock.twin.resolved_before if lock.twin else None
    compiled = _compile([*deps, *backend], log, cutoff, find_links, index_url)
    wrapped = re.sub(r"(.{1,86})(?: |$)", r"#   \1\n", " ".join([*deps, *backend]))
    header = (
        f"# srtctl's dependencies for srt-slurm {srt.version} ({srt.commit[:12]}), from its own\n"
        "# pyproject.toml ([project] dependencies and [build-system] requires), pinned with\n"
        f"# hashes. GENERATED by `k3env bump srt-slurm {srt.version}`:\n"
        f"#   uv pip compile srtctl.in --generate-hashes --python-version {PYTHON} \\\n"
        f"#     --python-platform {PLATFORM} --exclude-newer {cutoff or '(none)'}\n"
        f"# from:\n{wrapped}"
    )
    path = lock.resolve_path(srt.requirements, key="srt_slurm.requirements")
    data = (header + compiled).encode()
    write_atomic(path, data)
    pins = sum(1 for line in compiled.splitlines() if "==" in line)
    return Gate(name=name, status=PASSED,
                detail=f"{pins} pinned from {len(deps) + len(backend)} requirement(s) of its "
                f"pyproject.toml, index before {cutoff or '(no cut-off)'}"), \
        sha256_digest(data).removeprefix("sha256:")  # fmt: skip


def _compile(
    requirements: list[str],
    log: Log,
    cutoff: str | None,
    find_links: Sequence[str],
    index_url: str | None,
) -> str:
    """``uv pip compile --generate-hashes`` of ``requirements`` (``find_links``: only there)."""
    uv = require_tool("uv", "pip install uv")
    with tempfile.TemporaryDirectory(prefix="k3env-srtctl-req-") as tmp:
        (Path(tmp) / "srtctl.in").write_text("".join(f"{r}\n" for r in requirements))
        argv = [uv, "pip", "compile", "srtctl.in", "--generate-hashes", "--no-header",
                "--quiet", "--python-version", PYTHON, "--python-platform", PLATFORM,
                "--output-file", "out.txt"]  # fmt: skip
        if find_links:
            argv += ["--no-index", *(a for d in find_links for a in ("--find-links", d))]
        elif index_url:
            argv += ["--index-url", index_url]
        if cutoff:
            argv += ["--exclude-newer", cutoff]
        with log.step(f"srtctl's requirements (uv pip compile, index before {cutoff})"):
            run(argv, log, cwd=Path(tmp), capture=True, what="uv pip compile")
        return (Path(tmp) / "out.txt").read_text()


def _materialized(
    lock: Lock, state: State, log: Log, source: str | None
) -> tuple[Materialized | None, str]:
    """The bumped release materialized (its patches, its pinned requirements), or why not."""
    try:
        with log.step("materialize the new srt-slurm"):
            return materialize(lock, state, log, source=source), ""
    except K3envError as e:
        return None, f"srt-slurm does not materialize here: {e.said}"


def _schema(lock: Lock, m: Materialized | None, why: str, log: Log) -> tuple[Gate, list[Change]]:
    """The recorded schema again, from the release's own loader (written); else not checked,
    why, and the old file kept."""
    srt = lock.srt_slurm
    assert srt is not None
    name = "recorded schema"
    if srt.schema is None:
        return Gate(name=name, status=NOT_CHECKED, detail="the lock names no schema file"), []
    if m is None:
        return Gate(name=name, status=NOT_CHECKED, detail=f"{why}; {srt.schema} kept"), []
    try:
        doc = {"srt_slurm": identity(srt), **record_schema(m, log)}
    except K3envError as e:  # its last line: the loader's own error
        said = (e.message.strip().splitlines() or ["?"])[-1]
        return Gate(name=name, status=NOT_CHECKED,
                    detail=f"its loader does not run ({said}); {srt.schema} kept"), []  # fmt: skip
    data = (jsontext.dumps(doc, indent=1) + "\n").encode()
    write_atomic(lock.resolve_path(srt.schema, key="srt_slurm.schema"), data)
    text, done = render_leaves(lock.path.read_text(), {
        "srt_slurm.schema_sha256": sha256_digest(data).removeprefix("sha256:")})  # fmt: skip
    write_lock(lock.path, text)
    return Gate(name=name, status=PASSED, detail=f"recorded from {srt.version}'s loader"), done


def _render(
    lock: Lock,
    specs: Sequence[ImageSpec],
    cluster: Cluster,
    m: Materialized | None,
    why: str,
    log: Log,
) -> list[RenderedRecipe]:
    """Every serve profile's recipe as the bumped pin loads it, judged by k3env's model of
    its gate and by the release's own gate and expansion where it runs."""
    srt = lock.srt_slurm
    assert srt is not None
    out: list[tuple[str, dict[str, Any]]] = []
    for spec in specs:
        env = merged_env(lock, spec, lock.bases[spec.base])
        for profile in spec.profiles.values():
            if not any(c.role in ("vllm-serve", "dynamo-worker") for c in profile.commands):
                continue
            data = recipe(spec, profile, cluster, env, container=f"<k3env push {spec.name}>",
                          model_path=cluster.model_path or "/models",
                          precision=precision_of(profile.tokenizer_model_type),
                          dynamo_baked="dynamo" in spec.components,
                          dynamo_commit=lock.dynamo.commit if lock.dynamo else None,
                          aiperf_version=lock.aiperf.version if lock.aiperf else None)  # fmt: skip
            out.append((f"{spec.name}/{profile.name}", as_pinned(data, srt)))
    said = _release_gate(m, [to_yaml(d) for _, d in out], log) if m else None
    rendered = []
    for i, (name, data) in enumerate(out):
        refused = refusal(srt, data)
        mine = Gate(
            name=f"k3env's gate model: {name}",
            status=FAILED if refused else PASSED,
            detail=refused[1] if refused else f"loads as schema {data.get('schema', 1)}",
        )
        if said is None:
            theirs = Gate(name=f"srt-slurm's gate: {name}", status=NOT_CHECKED, detail=why)
        else:
            theirs = Gate(name=f"srt-slurm's gate: {name}", status=said[i][0], detail=said[i][1])
        rendered.append(RenderedRecipe(name=name, text=to_yaml(data), k3env=mine,
                                       release=theirs))  # fmt: skip
    return rendered


def _release_gate(m: Materialized, texts: list[str], log: Log) -> list[tuple[str, str]]:
    """(status, detail) of the release's own gate and role/engine/services expansion
    (``probes/srt_gate.py`` in its environment) for each recipe text."""
    with tempfile.TemporaryDirectory(prefix="k3env-srt-gate-") as tmp:
        files = []
        for i, text in enumerate(texts):
            files.append(Path(tmp) / f"{i}.yaml")
            files[-1].write_text(text)
        with resources.as_file(resources.files("k3env.probes") / "srt_gate.py") as script:
            code, out = attempt([str(m.python), str(script), *map(str, files)], log, cwd=Path(tmp))
    try:
        verdict = jsontext.parse(out.strip().splitlines()[-1])
        if not isinstance(verdict, dict):
            raise ValueError("not a mapping")
    except (ValueError, IndexError) as e:
        why = f"its gate printed no verdict (exit {code}): {out.strip()[-300:]} ({e})"
        return [(NOT_CHECKED, why)] * len(texts)
    if verdict.get("error"):
        return [(NOT_CHECKED, f"its gate does not run: {verdict['error']}")] * len(texts)
    results = verdict.get("results") or {}
    said = []
    for f in files:
        got = results.get(str(f), "no verdict")
        said.append((PASSED, "passes its gate and role expansion") if got is None
                    else (FAILED, str(got)))  # fmt: skip
    return said


def _user(path: Path, status: str, detail: str, notes: tuple[str, ...] = ()) -> UserRecipe:
    return UserRecipe(path=str(path), notes=notes,
                      gate=Gate(name=f"migrate {path}", status=status, detail=detail))  # fmt: skip


def _migrate_users(
    m: Materialized | None, why: str, recipes: Sequence[Path], log: Log
) -> list[UserRecipe]:
    """Each user recipe through the release's own ``srtctl migrate``, on a copy: its notes."""
    out = []
    for path in recipes:
        if m is None:
            out.append(_user(path, NOT_CHECKED, why))
            continue
        with tempfile.TemporaryDirectory(prefix="k3env-srt-users-") as tmp:
            copy = Path(tmp) / "in" / path.name
            copy.parent.mkdir()
            shutil.copyfile(path, copy)
            try:
                (done,) = migrate(m, [copy], Path(tmp) / "out", log)
            except K3envError as e:
                out.append(_user(path, FAILED, e.message))
                continue
        # migrate's own notes (its first line names the copy: not the user's concern)
        notes = tuple(n for n in done.notes if not n.startswith(str(copy)))
        out.append(_user(path, PASSED, "must change" if done.changed else "loads as it is", notes))
    return out


def body_lines(c: Crossing) -> list[str]:
    """The PR body's sections for the crossing (markdown)."""
    lines = ["", "### srt-slurm, across the schema break", ""]
    for f in c.dropped:
        lines.append(f"- `{f.label}`: ⬆️ upstream: drop it ({f.detail}); dropped from the "
                     f"lock, `git rm {f.file}` with this PR")  # fmt: skip
    for g in (c.requirements, c.schema):
        lines.append(f"- {g.name}: **{g.status}**: {g.detail}")
    lines += ["", "#### k3env's recipes as the new pin loads them", ""]
    for r in c.recipes:
        said = (f"**`{r.name}`**: k3env's gate model **{r.k3env.status}** ({r.k3env.detail}); "
                f"srt-slurm's own gate and role expansion **{r.release.status}** "
                f"({r.release.detail})")  # fmt: skip
        lines += [said, "", "```yaml", r.text.rstrip("\n"), "```", ""]
    if c.users:
        lines += ["#### What each user recipe must change (srt-slurm's own `srtctl migrate`)", ""]
        for u in c.users:
            lines.append(f"- `{u.path}`: **{u.gate.status}**: {u.gate.detail}")
            lines += [f"  - {n}" for n in u.notes]
    return lines
