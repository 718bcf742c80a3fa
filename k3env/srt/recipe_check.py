"""Recipes in: check srt-slurm recipes and a cluster's ``srtslurm.yaml`` that people already
have, with the rules k3env runs over its own specs.

Pipeline per recipe: read (``config.srtrecipe``, a cluster's aliases resolved as srt-slurm
resolves them) -> find its image (``model.container`` against this host's push and export
records, else the lock base it is taken as) -> map it to a serve profile with srt-slurm's
defaults (``checks.recipe_map``) -> the rules -> srt-slurm's own loader, job-time lookups
and dry-run where the pinned srt-slurm is materialized here (else said: not checked, never
passed) -> findings on the recipe's own keys and lines.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from k3env.checks.engine_record import cli_for
from k3env.checks.preflight import ERROR, WARNING, Finding, NotChecked, Rule, run_rules
from k3env.checks.recipe_map import (
    EnvEntry,
    ImageOf,
    Mapped,
    frontend_type,
    map_recipe,
    recipe_key,
)
from k3env.config.cluster import Cluster
from k3env.config.pins import Lock
from k3env.config.spec import ImageSpec, load_spec
from k3env.config.srtrecipe import Recipe, job_shape
from k3env.config.srtschema import SrtSchema, check, load_srt_schema
from k3env.config.yamlread import YamlDoc, load_yaml
from k3env.errors import ConfigError
from k3env.image.records import Facts, as_reference, last_build, read, shipped_as
from k3env.log import Log
from k3env.srt.gate import GATE
from k3env.srt.gate import fix as gate_fix
from k3env.srt.validate import RecipeError
from k3env.state import State
from k3env.verdict import FAILED, NOT_CHECKED, PASSED, Gate

LOADER_RULE = "SRT-LOADER"
LOADER_GATE = "srt-slurm"


@dataclass(frozen=True, kw_only=True)
class Loader:
    """What srt-slurm's own loader, job-time lookups and dry-run said of a recipe, as one
    gate (``passed``, ``failed``, or ``not checked`` with why), and the loader's errors."""

    gate: Gate
    errors: tuple[tuple[str, str, str], ...] = ()  # (key, message, stage)

    @classmethod
    def of(cls, status: str, detail: str, errors: tuple[tuple[str, str, str], ...] = ()) -> Loader:
        return cls(gate=Gate(name=LOADER_GATE, status=status, detail=detail), errors=errors)

    @property
    def verdict(self) -> str:
        return self.gate.status

    @property
    def detail(self) -> str:
        return self.gate.detail


@dataclass(frozen=True, kw_only=True)
class RecipeResult:
    recipe: Recipe
    image: ImageOf
    findings: tuple[Finding, ...]
    env: tuple[EnvEntry, ...]
    notes: tuple[str, ...]
    loader: Loader
    lacked: tuple[str, ...]
    # What each rule could not check on this recipe, and why (listed, never passed).
    not_checked: tuple[NotChecked, ...] = ()

    @property
    def errors(self) -> int:
        return sum(f.severity == ERROR for f in self.findings)

    @property
    def warnings(self) -> int:
        return sum(f.severity == WARNING for f in self.findings)

    def as_json(self) -> dict[str, Any]:
        image = {k: v for k, v in self.image.__dict__.items() if k not in ("spec", "facts")}
        return {
            "recipe": str(self.recipe.path),
            "name": self.recipe.name,
            "image": {**image, "spec": self.image.spec.name if self.image.spec else None},
            "findings": [f.as_json() for f in self.findings],
            "env": [e.as_json() for e in self.env],
            "env_changed": [e.name for e in self.env if e.changed],
            "notes": list(self.notes),
            "srt_slurm_loader": self.loader.gate.as_json(),
            "lacked_facts": list(self.lacked),
            "not_checked": [n.as_json() for n in self.not_checked],
            "errors": self.errors,
            "warnings": self.warnings,
        }


# --- the image a recipe names ------------------------------------------------------------------
def _default_base(lock: Lock, container: str) -> tuple[str, str | None]:
    """The lock base ``container`` names (its repository:tag or @digest), else the first
    real base; and how it matched (``None``: it did not)."""
    ref = as_reference(container)
    bare = ref.removeprefix("docker.io/")
    for name, base in lock.bases.items():
        if base.kind == "twin" or base.repository is None:
            continue
        repo = base.repository.removeprefix("docker.io/")
        forms = {f"{repo}:{base.tag}"} if base.tag else set()
        forms |= {f"{repo}@{d}" for d in (base.digest, *base.platforms.values()) if d}
        if bare in forms:
            return name, f"the lock's base {name} itself ({base.display}): no k3env layer"
    real = [n for n, b in lock.bases.items() if b.kind != "twin"]
    if not real:
        raise ConfigError(
            "the lock pins no base image", where=str(lock.path), fix="add [bases.NAME]"
        )
    return real[0], None


def find_image(
    state: State, lock: Lock, images: Path, container: str, base: str | None, platform: str
) -> ImageOf:
    """What ``container`` is: an image k3env pushed or exported (its spec, image ID and the
    facts verify learned about it), else the lock base it is taken as."""
    found = shipped_as(state, container)
    if found is None:
        name, matched = _default_base(lock, container)
        chosen = base or name
        if matched and chosen == name:
            return ImageOf(container=container, base=chosen, how=matched, known=False)
        if base:
            how = (
                f"not an image k3env pushed or exported (no record on this host): judged as "
                f"lock base {base} (--base)"
            )
            return ImageOf(container=container, base=base, how=how, known=False)
        how = (
            "an image k3env cannot place: not pushed or exported by k3env (no record on this "
            "host) and not a lock base; what it carries is not checked (`--base NAME` to "
            "judge it as that base)"
        )
        return ImageOf(container=container, base=name, how=how, known=False, placed=False)
    image, how = found
    spec = _spec_of(lock, images, image.image, image.image_id, state, platform)
    if spec is None:
        how += (
            f"; its spec {image.image} under this lock no longer builds it: its "
            "patches and env are not known from here"
        )
    facts = read(state, Facts, image.image_id)
    chosen = base or (spec.base if spec else _default_base(lock, container)[0])
    return ImageOf(
        container=container,
        base=chosen,
        how=how,
        known=True,
        spec=spec,
        image_id=image.image_id,
        facts=facts.facts if facts else None,
        facts_source=f"{image.image} ({image.image_id})" if facts else None,
    )


def _spec_of(
    lock: Lock, images: Path, name: str, image_id: str, state: State, platform: str
) -> ImageSpec | None:
    """The spec that built ``image_id`` under this lock (its record says so), else None."""
    path = images / f"{name}.toml"
    if not name or not path.is_file():
        return None
    spec = load_spec(path, lock)
    build = last_build(state, lock, spec, platform)
    return spec if build and build.image_id == image_id else None


# --- srt-slurm's recorded schema --------------------------------------------------------------
def recorded_schema(lock: Lock) -> tuple[SrtSchema | None, str]:
    """The schema the lock pins for its srt-slurm (hash-checked), or why there is none to
    check against."""
    from k3env.config.pinned_files import verify_pinned_file

    srt = lock.srt_slurm
    if srt is None or srt.schema is None:
        return None, f"the lock records no srt-slurm schema ({lock.path} [srt_slurm] schema)"
    path = verify_pinned_file(lock, srt.schema, srt.schema_sha256, key="srt_slurm.schema",
                              label="", what="srt-slurm schema",
                              sha_key="srt_slurm.schema_sha256")  # fmt: skip
    schema = load_srt_schema(path)
    if not schema.of(srt):
        return None, (
            f"{srt.schema} was recorded from srt-slurm {schema.version} ({schema.commit[:12]}), "
            f"not the pinned {srt.version} and its patches: run `k3env srt schema`"
        )
    return schema, ""


# --- srtslurm.yaml -----------------------------------------------------------------------------
def check_cluster_config(doc: YamlDoc, lock: Lock) -> str:
    """Refuse what srt-slurm's cluster config does not take (an unknown key, a wrong type):
    srt-slurm only warns, then drops the whole file. Returns what was checked."""
    schema, why = recorded_schema(lock)
    if schema is None:
        return f"keys not checked: {why}"
    errors = check(doc.data, schema.cluster, schema)
    if not errors:
        return f"every key and type is one {schema.said()} takes"
    shown = ", ".join(f"{k} (line {doc.line(k)}): {m}" if doc.line(k) else f"{k}: {m}"
                      for k, m in errors)  # fmt: skip
    raise ConfigError(
        f"{len(errors)} refusal(s) by {schema.said()}: {shown}. srt-slurm would only log a "
        "warning and then ignore the whole file (every default and alias in it)",
        where=doc.where(errors[0][0]),
        fix="remove or fix each; the keys it takes: " + ", ".join(sorted(schema.cluster["fields"])),
    )


# --- srt-slurm's own loader --------------------------------------------------------------------
def srt_loader(lock: Lock, state: State, log: Log, recipes: Sequence[Path]) -> dict[Path, Loader]:
    """srt-slurm's loader, job-time lookups and dry-run for each recipe, when the pinned
    srt-slurm is materialized on this host; else each is ``not checked``, saying why."""
    from k3env.srt.materialize import cache_key, materialize
    from k3env.srt.validate import validate

    srt = lock.srt_slurm
    why = None
    if srt is None:
        why = f"the lock pins no srt-slurm ({lock.path})"
    elif unresolved := [p.label for p in srt.patches if p.sha256 is None]:
        why = (
            f"the pinned srt-slurm {srt.version} cannot be materialized here: patch(es) "
            f"{unresolved} unresolved (see docs/recipes.md: srt-slurm against the real upstream)"
        )
    elif not state.path("srt", cache_key(srt)[:20]).is_dir():
        why = (
            f"the pinned srt-slurm {srt.version} is not materialized on this host "
            "(run `k3env srt materialize`)"
        )
    if why is not None:
        schema, unrecorded = recorded_schema(lock)
        if schema is None:
            return {r: _gated(lock, r, Loader.of(NOT_CHECKED, f"{why}; {unrecorded}"))
                    for r in recipes}  # fmt: skip
        return {r: _gated(lock, r, _by_schema(r, schema, why)) for r in recipes}
    m = materialize(lock, state, log)
    result = validate(m, list(recipes), log)
    what = f"srt-slurm {m.version} + {list(m.patches)}"
    extra = "".join(f"; not checked: {n}" for n in result.not_checked)
    out = {}
    for r in recipes:
        errs = errors_of(r, result.errors)
        out[r] = Loader.of(FAILED if errs else PASSED, what + extra, errs)
    return out


def _by_schema(recipe: Path, schema: SrtSchema, why: str) -> Loader:
    """A recipe's keys and types against srt-slurm's recorded schema: a refusal is the
    loader's (failed); none is not a pass (its loader, lookups and dry-run did not run)."""
    errors = check(load_yaml(recipe).data, schema.recipe, schema)
    if errors:
        return Loader.of(FAILED, f"{schema.said()}; {why}",
                         tuple((k, m, "schema") for k, m in errors))  # fmt: skip
    return Loader.of(
        NOT_CHECKED,
        f"keys and types as {schema.said()}; its loader's own checks, lookups and dry-run "
        f"not run: {why}",
    )


def _gated(lock: Lock, recipe: Path, loader: Loader) -> Loader:
    """The pinned srt-slurm's refusal of a recipe of the schema it does not load, in its words,
    where its own loader did not run to say it (the rules judge the recipe all the same)."""
    from k3env.srt.gate import refusal

    refused = None if lock.srt_slurm is None else refusal(lock.srt_slurm, load_yaml(recipe).data)
    if refused is None or any(key == refused[0] for key, _, _ in loader.errors):
        return loader
    return Loader.of(FAILED, loader.detail, ((*refused, GATE), *loader.errors))


def errors_of(recipe: Path, errors: Sequence[RecipeError]) -> tuple[tuple[str, str, str], ...]:
    """(key, message, stage) of each loader error on ``recipe``; an error no file owns
    (srt-slurm's loader itself failed to import) is every recipe's: none of them loaded."""
    mine = ("", str(recipe.resolve()))
    return tuple((e.key, e.message, e.stage) for e in errors if e.file in mine)


# --- one recipe --------------------------------------------------------------------------------
def check_recipe(
    recipe: Recipe,
    lock: Lock,
    cluster: Cluster,
    image: ImageOf,
    rules: Sequence[Rule],
    loader: Loader,
    *,
    model_type: str | None = None,
) -> RecipeResult:
    cli = cli_for(lock, image.base, cluster.platform, image.facts, image.facts_source,
                  placed=image.placed, container=image.container)  # fmt: skip
    findings: list[Finding] = []
    env: list[EnvEntry] = []
    notes: list[str] = []
    lacked: list[str] = []
    unchecked: list[NotChecked] = []
    # A disaggregated recipe is judged once per worker mode (its flags and env in the
    # aggregate worker's place, keyed where the recipe writes them); what both share, once.
    for view in recipe.workers():
        mapped = map_recipe(view, lock, cluster, image, model_type_given=model_type)
        ctx = replace(mapped.context, job=job_shape(recipe.doc), frontend_type=frontend_type(view),
                      engine_cli=cli.cli, engine_cli_why=cli.why)  # fmt: skip
        report = run_rules([ctx], rules)
        findings += [_finding(view, mapped, f) for f in report.findings]
        env += mapped.env
        notes += mapped.notes
        lacked += next(iter(report.lacked.values()), ())
        unchecked += next(iter(report.not_checked.values()), ())
    findings = list(dict.fromkeys(findings))
    for key, message, stage in loader.errors:
        where = key or "(recipe)"
        fix = "fix the key as srt-slurm's own message says"
        if stage == GATE and lock.srt_slurm is not None:
            fix = gate_fix(lock.srt_slurm, str(recipe.path))
        findings.append(
            Finding(
                rule=LOADER_RULE,
                severity=ERROR,
                image=image.container,
                profile=recipe.name,
                file=str(recipe.path),
                line=recipe.doc.line(key) if key else None,
                key=where,
                message=f"srt-slurm's {stage} ({loader.detail}): {message}",
                fix=fix,
            )
        )
    findings.sort(key=lambda f: (f.severity != ERROR, f.file, f.line or 0, f.key, f.rule))
    return RecipeResult(
        recipe=recipe,
        image=image,
        findings=tuple(findings),
        env=tuple(dict.fromkeys(env)),
        notes=tuple(dict.fromkeys(notes)),
        loader=loader,
        lacked=tuple(dict.fromkeys(lacked)),
        not_checked=tuple(dict.fromkeys(unchecked)),
    )


def _finding(recipe: Recipe, mapped: Mapped, f: Finding) -> Finding:
    key = recipe_key(recipe, mapped, f)
    on_recipe = f.file == str(recipe.path)
    fix = f.fix
    if on_recipe and f.key == "patches":  # the image is the recipe's container, not a spec
        fix = (
            f"run an image that carries it: `k3env adopt {recipe.path}` (the spec bakes the "
            "lock's patches), build and push it, and name its digest in model.container"
        )
    return replace(f, line=recipe.doc.line(key) if on_recipe else None, key=key, fix=fix)


def containers_of(
    state: State, lock: Lock, images: Path, aliases: Mapping[str, str], platform: str
) -> Iterable[tuple[str, str, ImageOf]]:
    """Each ``containers:`` entry of a cluster config with what it is on this host."""
    for alias, value in aliases.items():
        yield alias, value, find_image(state, lock, images, value, None, platform)
