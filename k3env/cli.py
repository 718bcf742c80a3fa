"""The ``k3env`` command: argparse subcommands, and the only place errors are caught."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from k3env import __version__
from k3env.config.cluster import DEFAULT_CLUSTER
from k3env.config.lock import DEFAULT_LOCK, Lock, check_files, load_lock
from k3env.config.shapes import DEFAULT_PLATFORM, MACHINES, platform_option
from k3env.config.spec import DEFAULT_IMAGES, ImageSpec, load_specs
from k3env.errors import CheckFailed, ConfigError, K3envError, StateError
from k3env.files import write_atomic
from k3env.log import Log
from k3env.state import State

if TYPE_CHECKING:
    from k3env.engine.protocol import Engine
    from k3env.image.build import BuildResult


def _emit(args: argparse.Namespace, payload: Any, human: Callable[[], None]) -> None:
    """The command's result: kept for ``main`` to print as the one JSON document (``--json``;
    a failure after this adds its error to the same document), or printed for a person."""
    if args.json:
        args.result = payload
    else:
        human()


# ---------------------------------------------------------------------------------------------
# lock
# ---------------------------------------------------------------------------------------------
def cmd_lock(args: argparse.Namespace, log: Log) -> int:
    lock = load_lock(args.lock)
    if args.update_hashes:
        from k3env.config.lock_edit import update_hashes

        changes = update_hashes(lock)
        _emit(
            args,
            {"lock": str(args.lock), "changes": [c.__dict__ for c in changes]},
            lambda: print(
                "\n".join(f"{c.key}: {c.old} -> {c.new}" for c in changes)
                or f"{args.lock}: every pinned file matches its sha256"
            ),
        )
        return 0
    from k3env.config.twinreq import twin_disagreements

    files = check_files(lock)
    stale = [f for f in files if f.expected is not None and f.actual != f.expected]
    disagree = twin_disagreements(lock)
    payload = {
        "lock": str(args.lock),
        "version": lock.version,
        "sha256": lock.sha256,
        "pins": lock.pins_summary(),
        "unresolved": [{"key": u.key, "hint": u.hint} for u in lock.unresolved],
        "files": [
            {"key": f.key, "file": f.file, "expected": f.expected, "actual": f.actual, "ok": f.ok}
            for f in files
        ],
        "stale": [f.key for f in stale],
        "twin_disagreements": disagree,
        "ok": not stale and not disagree and (not args.require_resolved or not lock.unresolved),
    }

    def human() -> None:
        print(f"{args.lock}: version {lock.version}, content sha256 {lock.sha256[:16]}")
        for key, value in lock.pins_summary().items():
            print(f"  {key:34} {value}")
        for u in lock.unresolved:
            print(f"  UNRESOLVED {u.key}  (resolve: {u.hint})")
        for f in files:
            if f.expected is None:
                continue
            state = "ok" if f.ok else ("MISSING" if f.actual is None else "SHA256 DIFFERS")
            print(f"  {state:14} {f.file}  ({f.key})")
        for d in disagree:
            print(f"  TWIN DISAGREES {d}")
        print(f"{len(lock.unresolved)} unresolved pin(s), {len(stale)} stale file hash(es)")

    _emit(args, payload, human)
    if stale:
        raise CheckFailed(
            f"{len(stale)} pinned file(s) differ from the lock: {[f.key for f in stale]}",
            where=str(args.lock),
            fix="restore the files, or record deliberate edits with `k3env lock --update-hashes`",
        )
    if disagree:
        raise CheckFailed(
            f"the twin's requirements and the lock disagree ({len(disagree)}): {disagree[0]}",
            where=str(args.lock),
            fix="regenerate them from the lock with `k3env twin --resolve`",
        )
    if args.require_resolved and lock.unresolved:
        raise CheckFailed(
            f"{len(lock.unresolved)} pin(s) unresolved: {[u.key for u in lock.unresolved]}",
            where=str(args.lock),
            fix="resolve them on a host that reaches their source (hints above)",
        )
    return 0


def cmd_schema(args: argparse.Namespace, log: Log) -> int:
    """The JSON Schema of the lock or of image specs, recorded from k3env's own reader run
    over the real files (so a key the reader would reject is not in it)."""
    from k3env.config.reader import record_schema
    from k3env.config.spec import load_spec

    if args.kind == "lock":
        schema = record_schema(lambda: load_lock(args.lock), "k3env lockfile (pins/*.lock.toml)")
    else:
        lock = load_lock(args.lock)
        paths = sorted(args.images.glob("*.toml"))
        if not paths:
            raise ConfigError("no image specs", where=str(args.images), fix="pass --images DIR")
        schema = record_schema(
            lambda: [load_spec(path, lock) for path in paths], "k3env image spec (images/*.toml)"
        )
    text = json.dumps(schema, indent=2, sort_keys=True) + "\n"
    if args.out:
        write_atomic(args.out, text)
        log.info(f"schema written to {args.out}")
    _emit(args, schema, lambda: None if args.out else print(text, end=""))
    return 0


# ---------------------------------------------------------------------------------------------
# build / twin
# ---------------------------------------------------------------------------------------------
def _engine() -> Engine:
    """The engine, built once per command here and passed in (never at import time)."""
    from k3env.engine.dockerd import DockerEngine

    return DockerEngine()


def cmd_build(args: argparse.Namespace, log: Log) -> int:
    start = time.monotonic()
    lock, _specs, _engine, _state, results = _builds(args, log)
    payload = {
        "lock": str(args.lock),
        "lock_sha256": lock.sha256,
        "twin": args.twin,
        "images": [r.as_json() for r in results],
        "seconds": round(time.monotonic() - start, 3),
    }

    def human() -> None:
        for r in results:
            state = "cached" if r.cached else "built "
            print(f"{state} {r.image:24} {r.reference}  {r.image_id[:19]}  ({r.seconds:.2f} s)")
            for p in r.patches:
                print(f"         patch {p.name}: {p.status} ({p.detail})")

    _emit(args, payload, human)
    return 0


def cmd_twin(args: argparse.Namespace, log: Log) -> int:
    from k3env.image.twin import ensure_twin

    lock = load_lock(args.lock)
    if args.resolve:
        return _resolve_twin(args, lock, log)
    engine = _engine()
    reference, digest = ensure_twin(lock, engine, State(), log, args.platform)
    image = engine.inspect(reference)
    payload = {"reference": reference, "digest": digest, "image_id": image.id if image else None}
    _emit(args, payload, lambda: print(f"{reference}@{digest}"))
    return 0


def _resolve_twin(args: argparse.Namespace, lock: Lock, log: Log) -> int:
    from k3env.config.lock_edit import set_leaves
    from k3env.files import write_atomic
    from k3env.hashing import digest_hex, sha256_digest
    from k3env.image.twin import resolve_debian
    from k3env.image.twinresolve import resolve_twin

    assert lock.twin is not None
    twin = lock.twin.for_platform(args.platform)
    resolved = resolve_twin(
        lock, log, find_links=args.find_links, index_url=args.index_url, platform=args.platform
    )
    files = {"requirements": (twin.requirements, resolved.text)}
    if twin.debian:
        files["debian"] = (twin.debian, resolve_debian(lock, log, args.platform))
    # The files first, then their hashes: an interruption between leaves a mismatch that
    # `k3env lock --check` reports, never a lock that vouches for a file it has not seen.
    hashes = {}
    for key, (rel, text) in files.items():
        write_atomic(lock.resolve_path(rel), text.encode())
        hashes[f"{twin.key}.{key}_sha256"] = digest_hex(sha256_digest(text.encode()))
    changes = set_leaves(args.lock, hashes)
    payload = {
        "platform": args.platform,
        "files": {rel: hashes[f"{twin.key}.{key}_sha256"] for key, (rel, _) in files.items()},
        "packages": resolved.packages,
        "components": resolved.components,
        "changes": [c.__dict__ for c in changes],
    }
    _emit(
        args,
        payload,
        lambda: print(
            f"{twin.requirements}: {resolved.packages} pinned wheels "
            f"(+{resolved.components} baked as components)"
            + (f"; {twin.debian}: the Debian package set" if twin.debian else "")
            + f"; sha256 recorded in {args.lock}"
        ),
    )
    return 0


# ---------------------------------------------------------------------------------------------
# push / export (the cluster handoff)
# ---------------------------------------------------------------------------------------------
def _builds(
    args: argparse.Namespace, log: Log, *, registry_form: bool = False
) -> tuple[Lock, list[ImageSpec], Engine, State, list[BuildResult]]:
    """The one build loop of every command that needs images: load, build (cached), record.
    ``registry_form``: a publish follows, so each image's layers and config must be kept."""
    from k3env.image.build import build_all, make_builder

    lock = load_lock(args.lock)
    specs = load_specs(args.images, lock, tuple(args.image))
    engine = _engine()
    if not log.quiet:  # one more engine call (GET /info): only when someone reads it
        log.info(f"engine: {engine.describe()}")
    state = State()
    builds, each = [], []
    for platform in args.platform:
        builder = make_builder(
            lock, engine, state, log, args.twin, platform, registry_form=registry_form
        )
        builds += build_all(builder, specs)
        each += specs
    return lock, each, engine, state, builds


def cmd_push(args: argparse.Namespace, log: Log) -> int:
    from k3env.handoff.enroot import cluster_commands
    from k3env.handoff.push import publish_images, push_image

    # A --via-engine push sends the engine's own bytes; the registry API sends the kept ones.
    _lock, every, engine, state, builds = _builds(args, log, registry_form=not args.via_engine)
    pushed, specs = [], []
    if args.via_engine:
        if len(args.platform) > 1:
            raise ConfigError(
                "an engine holds one platform per tag: it cannot push an index",
                where="--via-engine", fix="publish through the registry API (drop --via-engine)",
            )  # fmt: skip
        for spec, build in zip(every, builds, strict=True):
            with log.step(f"push {build.reference} to {args.registry} (through the engine)"):
                pushed.append(push_image(engine, state, build, args.registry, log))
                specs.append(spec)
    else:
        # One spec's images for every platform under one tag: an OCI index.
        for spec in {s.name: s for s in every}.values():
            group = [b for s, b in zip(every, builds, strict=True) if s.name == spec.name]
            what = ", ".join(b.platform for b in group)
            with log.step(f"publish {spec.name} ({what}) to {args.registry} (registry API)"):
                for p in publish_images(state, group, args.registry, log):
                    pushed.append(p)
                    specs.append(spec)
    _emit(
        args,
        {"images": [p.as_json() for p in pushed]},
        lambda: print(
            "\n\n".join(
                f"{p.by_digest}  ({p.layers_sent} layer(s) sent, "
                f"{p.layers_skipped} already there)\n" + cluster_commands(spec, p, None)
                for spec, p in zip(specs, pushed, strict=True)
            )
        ),
    )
    return 0


def cmd_export(args: argparse.Namespace, log: Log) -> int:
    from k3env.handoff.enroot import (
        check_squashfs,
        cluster_commands,
        export_image,
        require_ok,
    )
    from k3env.handoff.push import last_push

    if args.check:
        lock = load_lock(args.lock)
        by_name = {s.name: s for s in load_specs(args.images, lock)}
        items = check_squashfs(args.check, lock, by_name, log)
        _emit(
            args,
            {"file": str(args.check), "checks": [i.__dict__ for i in items]},
            lambda: print(
                "\n".join(f"{'ok  ' if i.ok else 'FAIL'} {i.what}: {i.detail}" for i in items)
            ),
        )
        require_ok(args.check, items)
        return 0
    _lock, specs, engine, state, builds = _builds(args, log)
    exported = []
    for build in builds:
        with log.step(f"export {build.reference} -> {args.out}/ (streamed into mksquashfs)"):
            exported.append(export_image(engine, state, build, args.out, log))

    def commands(spec: Any, build: Any, exp: Any) -> str:
        return cluster_commands(spec, last_push(state, build.image_id), exp)

    _emit(
        args,
        {"images": [e.as_json() for e in exported]},
        lambda: print(
            "\n\n".join(
                f"{e.path}  sha256 {e.sha256}  ({e.size / 1e9:.2f} GB)\n" + commands(s, b, e)
                for s, b, e in zip(specs, builds, exported, strict=True)
            )
        ),
    )
    return 0


# ---------------------------------------------------------------------------------------------
# srt-slurm
# ---------------------------------------------------------------------------------------------
def cmd_srt_materialize(args: argparse.Namespace, log: Log) -> int:
    from k3env.handoff.srt import materialize

    m = materialize(load_lock(args.lock), State(), log, source=args.source)
    _emit(
        args,
        m.as_json(),
        lambda: print(
            f"srt-slurm {m.version} ({m.commit[:12]}) + {list(m.patches)} at {m.path}"
            f"{' (cache hit)' if m.reused else ''}\n  srtctl: {m.python.parent / 'srtctl'}"
        ),
    )
    return 0


def cmd_srt_validate(args: argparse.Namespace, log: Log) -> int:
    from k3env.handoff.srt import materialize, validate

    recipes: list[Path] = []
    for r in args.recipe:
        recipes += sorted(r.glob("*.yaml")) if r.is_dir() else [r]
    if not recipes:
        raise ConfigError("no recipes given", where="k3env srt validate", fix="pass RECIPE.yaml")
    missing = [str(r) for r in recipes if not r.is_file()]
    if missing:
        raise ConfigError(f"recipe(s) not found: {missing}", where="k3env srt validate", fix="")
    m = materialize(load_lock(args.lock), State(), log, source=args.source)
    result = validate(m, recipes, log)
    errors = result.errors
    for note in result.not_checked:
        log.info(f"    not checked: {note}")
    _emit(
        args,
        {"srt_slurm": m.as_json(), "recipes": [str(r) for r in recipes],
         "errors": [e.__dict__ for e in errors], "not_checked": result.not_checked},
        lambda: print(
            "\n".join(f"{e.file}: {e.key or '(recipe)'}: {e.message} [{e.stage}]"
                      for e in errors)
            or f"{len(recipes)} recipe(s) valid for srt-slurm {m.version} + {list(m.patches)}"
            + "".join(f"\n  not checked: {n}" for n in result.not_checked)
        ),
    )  # fmt: skip
    if errors:
        raise CheckFailed(
            f"{len(errors)} error(s) in {len({e.file for e in errors})} recipe(s)",
            where=f"srt-slurm {m.version}",
            fix="fix each key above (srt-slurm's own message), or pin an srt-slurm that has it",
        )
    return 0


def cmd_srt_recipe(args: argparse.Namespace, log: Log) -> int:
    from k3env.checks.rules import MODELS
    from k3env.config.cluster import load_cluster
    from k3env.handoff.push import pushed_record
    from k3env.handoff.recipe import recipe, to_yaml
    from k3env.image.envpolicy import merged_env
    from k3env.image.records import last_build

    lock = load_lock(args.lock)
    (spec,) = load_specs(args.images, lock, (args.image,))
    cluster = load_cluster(args.cluster)
    profile_name = str(args.profile or next(iter(spec.profiles), ""))
    if profile_name not in spec.profiles:
        raise ConfigError(
            f"no serve profile {profile_name!r} in {spec.path}",
            where="--profile",
            fix=f"choose from {sorted(spec.profiles)}",
        )
    profile = spec.profiles[profile_name]
    state = State()
    container = args.container
    facts: dict[str, Any] = {}
    if container is None:
        # The cluster's nodes import their own platform's manifest: name that one's digest.
        on = platform_option(cluster.platform)
        build = last_build(state, lock, spec, cluster.platform) or {}
        record = pushed_record(state, str(build.get("image_id", ""))) if build else None
        if record is None:
            raise ConfigError(
                f"image {spec.name} has not been pushed for {cluster.platform} (the platform of "
                f"{cluster.name}): the recipe needs that image by digest",
                where=str(spec.path),
                fix=f"k3env push{on} {spec.name} (or pass --container REF|PATH.sqsh)",
            )
        container = f"{record['reference'].rsplit(':', 1)[0]}@{record['digest']}"
        facts = state.read_record("facts", str(build["image_id"])) or {}
    model_path = args.model_path or cluster.model_path
    if not model_path:
        raise ConfigError(
            "no model path", where=str(args.cluster), fix="set model_path, or pass --model-path"
        )
    model = MODELS.get(profile.tokenizer_model_type or "", {})
    base = lock.bases[spec.base]
    text = to_yaml(
        recipe(
            spec,
            profile,
            cluster,
            merged_env(lock, spec, base),
            container=container,
            model_path=model_path,
            precision="fp4" if model.get("moe_quant") == "mxfp4" else "bf16",
            dynamo_baked=bool((facts.get("versions") or {}).get("dynamo")),
            dynamo_commit=lock.dynamo.commit if lock.dynamo else None,
            aiperf_version=lock.aiperf.version if lock.aiperf else None,
        )
    )
    header = (
        f"# Generated by `k3env srt recipe {spec.name}` from {spec.path} and {args.lock}:\n"
        "# edit those and regenerate. Container patches and env are baked into the image.\n"
        f"# For {cluster.name}: {cluster.platform} nodes ({cluster.machine})"
        + ("; the container is that platform's image" if args.container is None else "")
        + ".\n"
    )
    if args.out:
        write_atomic(args.out, header + text)
        log.info(f"recipe written to {args.out}")
    _emit(
        args,
        {"recipe": header + text, "out": str(args.out) if args.out else None},
        lambda: None if args.out else print(header + text, end=""),
    )
    return 0


# ---------------------------------------------------------------------------------------------
# verify
# ---------------------------------------------------------------------------------------------
def cmd_verify(args: argparse.Namespace, log: Log) -> int:
    from k3env.checks.report import markdown, table
    from k3env.checks.verify import verify_images

    lock, specs, engine, state, builds = _builds(args, log)
    # One container per core; images with the same files share one (and one import).
    reports = verify_images(
        engine,
        state,
        lock,
        list(zip(specs, builds, strict=True)),
        twin=args.twin,
        timeout=args.timeout,
        log=log,
        share=not args.isolated,
    )
    if args.markdown:
        write_atomic(args.markdown, markdown(reports))
        log.info(f"compat matrix written to {args.markdown}")
    failed = [f for r in reports for f in r.failed]
    payload = {
        "twin": args.twin,
        "images": [r.as_json() for r in reports],
        "failures": len(failed),
        "markdown": markdown(reports),
    }

    def human() -> None:
        print(table(reports))
        print()
        print(markdown(reports))

    _emit(args, payload, human)
    if failed:
        raise CheckFailed(
            f"{len(failed)} check(s) failed in {sorted({f.image for f in failed})}",
            where="k3env verify",
            fix="each failure above names the image, profile, check and component, with the "
            "probe's own output",
        )
    return 0


def cmd_matrix(args: argparse.Namespace, log: Log) -> int:
    from k3env.checks.matrix import markdown, run_matrix
    from k3env.checks.verify import verify_image
    from k3env.image.build import make_builder

    lock = load_lock(args.lock)
    unknown = [v for v in args.variant if v not in lock.variants]
    if unknown:
        raise ConfigError(
            f"unknown variant(s) {unknown}",
            where=f"{args.lock} [variants]",
            fix=f"use one of {sorted(lock.variants)}, or add [variants.NAME] to the lock",
        )
    variants = args.variant or sorted(lock.variants)
    specs = load_specs(args.images, lock, tuple(args.image))
    engine = _engine()
    state = State()
    builders: dict[tuple[str, str], Any] = {}

    def verify(vlock: Lock, spec: ImageSpec, platform: str) -> Any:
        builder = builders.setdefault(
            (vlock.sha256, platform),
            make_builder(vlock, engine, state, log, twin=True, platform=platform),
        )
        with log.step(f"build and verify {spec.name} {platform} ({vlock.sha256[:12]})"):
            build = builder.build(spec)
            return verify_image(
                engine, state, vlock, spec, build, twin=True, timeout=args.timeout, log=log
            )

    cells = run_matrix(lock, specs, variants, verify, args.platform)
    text = markdown(lock, cells)
    if args.markdown:
        write_atomic(args.markdown, text)
        log.info(f"version matrix written to {args.markdown}")
    payload = {"variants": ["pinned", *variants], "cells": [c.as_json() for c in cells],
               "markdown": text}  # fmt: skip
    _emit(args, payload, lambda: print(text))
    return 0


# ---------------------------------------------------------------------------------------------
# preflight
# ---------------------------------------------------------------------------------------------
def cmd_preflight(args: argparse.Namespace, log: Log) -> int:
    from k3env.checks.preflight import contexts, run_rules
    from k3env.checks.rules import RULES, RULES_BY_ID
    from k3env.config.cluster import load_cluster

    if args.explain:
        rule = RULES_BY_ID.get(args.explain)
        if rule is None:
            raise ConfigError(
                f"unknown rule {args.explain!r}",
                where="--explain",
                fix=f"choose from {sorted(RULES_BY_ID)}",
            )
        _emit(
            args,
            {k: v for k, v in rule.__dict__.items() if k != "check"},
            lambda: print(rule.explain()),
        )
        return 0
    if args.list_rules:
        _emit(
            args,
            [{"id": r.id, "severity": r.severity, "title": r.title} for r in RULES],
            lambda: print("\n".join(f"{r.id:26} {r.severity:8} {r.title}" for r in RULES)),
        )
        return 0
    start = time.perf_counter()
    lock = load_lock(args.lock)
    specs = load_specs(args.images, lock, tuple(args.image))
    cluster = load_cluster(args.cluster)
    unknown = sorted(set(args.rule) - set(RULES_BY_ID))
    if unknown:
        raise ConfigError(
            f"unknown rule(s) {unknown}", where="--rule", fix=f"choose from {sorted(RULES_BY_ID)}"
        )
    rules = [r for r in RULES if not args.rule or r.id in args.rule]
    report = run_rules(contexts(lock, specs, cluster, State()), rules)
    elapsed = time.perf_counter() - start
    payload = {**report.as_json(), "cluster": str(args.cluster), "platform": cluster.platform,
               "seconds": round(elapsed, 4)}  # fmt: skip

    def human() -> None:
        for f in report.findings:
            print(f.line())
        for name, source in report.facts_from.items():
            print(f"{name}: facts from {source}")
        on = platform_option(cluster.platform)
        for name, facts in report.lacked.items():
            print(f"{name}: lacked facts {list(facts)} (run `k3env verify{on}` to learn them)")
        print(
            f"{len(report.checked)} profile(s), {report.rules} rules, on {cluster.name}: "
            f"{report.errors} error(s), {report.warnings} warning(s) ({elapsed * 1000:.0f} ms)"
        )

    _emit(args, payload, human)
    if report.errors:
        raise CheckFailed(
            f"preflight found {report.errors} error(s)",
            where=", ".join(sorted({f.image for f in report.findings if f.severity == "error"})),
            fix="apply each finding's fix; `k3env preflight --explain RULE` says why",
        )
    return 0


# ---------------------------------------------------------------------------------------------
# bump
# ---------------------------------------------------------------------------------------------
def cmd_bump(args: argparse.Namespace, log: Log) -> int:
    from k3env.bump.body import as_json, body, title
    from k3env.bump.evaluate import evaluate
    from k3env.bump.pins import candidate_lock, commit_branch, commit_to_tag, finish, leaf_changes
    from k3env.config.cluster import load_cluster
    from k3env.engine.registry import resolve_digest
    from k3env.image.wheels import wheel_sha256s

    lock = load_lock(args.lock)
    changes_wanted = leaf_changes(
        lock,
        args.pin,
        args.value,
        resolve_digest=resolve_digest,
        resolve_tag_commit=lambda url, tag: commit_to_tag(args.source or url, tag),
        dynamo_source=args.source,
        wheel_sha256s=lambda reqs, platform: wheel_sha256s(
            reqs, log, find_links=tuple(args.wheels_from or ()), platform=platform
        ),
    )
    new_lock, changes = candidate_lock(lock, changes_wanted)
    if args.edit_only:
        from k3env.config.lock_edit import set_leaves

        set_leaves(lock.path, changes_wanted)
        _emit(
            args,
            {"changes": [c.__dict__ for c in changes]},
            lambda: print("\n".join(f"{c.key}: {c.old} -> {c.new}" for c in changes)),
        )
        return 0
    engine = _engine()
    state = State()
    cluster = load_cluster(args.cluster)
    with log.step("before: build, verify, preflight on the current lock"):
        before = evaluate(lock, load_specs(args.images, lock), engine=engine, state=state,
                          log=log, cluster=cluster, run_verify=not args.skip_verify,
                          srt_source=args.source, twin=args.twin)  # fmt: skip
    with log.step("after: build, verify, preflight on the bumped lock"):
        after = evaluate(new_lock, load_specs(args.images, new_lock), engine=engine, state=state,
                         log=log, cluster=cluster, run_verify=not args.skip_verify,
                         srt_source=args.source, twin=args.twin)  # fmt: skip
    text = body(new_lock, args.pin, changes, before, after)
    written = finish(lock, changes_wanted, after, args.keep_failing)
    if args.body:
        args.body.write_text(text)
    branch = None
    if args.commit and written:
        branch = commit_branch(lock.root, lock, title(args.pin, changes), text)
    payload = {**as_json(args.pin, changes, before, after, written, text), "branch": branch}
    _emit(args, payload, lambda: print(text))
    if after.failed:
        raise CheckFailed(
            "checks fail after the bump: "
            + ("the lock was written (--keep-failing)" if written else "the lock is unchanged"),
            where=str(lock.path),
            fix="read the PR body above: fix the failing checks or patches, then bump again",
        )
    return 0


def cmd_outdated(args: argparse.Namespace, log: Log) -> int:
    from k3env.bump.outdated import outdated

    lock = load_lock(args.lock)
    index_args = ["--no-index", "--find-links", str(args.find_links)] if args.find_links else []
    found = outdated(lock, log, index_args=index_args)
    payload = {"lock": str(args.lock), "pins": [o.as_json() for o in found],
               "outdated": [o.pin for o in found if o.outdated]}  # fmt: skip

    def human() -> None:
        for o in found:
            if o.error:
                print(f"?  {o.pin:24} {o.current}: could not ask its source: {o.error}")
            elif not o.outdated:
                print(f"ok {o.pin:24} {o.current}")
            else:
                what = ", ".join(o.newer) + (f" (tag now names {o.moved})" if o.moved else "")
                print(f"-> {o.pin:24} {o.current}: {what}")
                for line in o.bump[:3]:
                    print(f"     {line}")

    _emit(args, payload, human)
    return 0


# ---------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------
def _image_args(p: argparse.ArgumentParser, *, twin: str | None) -> None:
    """IMAGE... and --images, plus --twin where the command can work over the CPU twin."""
    p.add_argument("image", nargs="*", help="image spec names (default: all in --images)")
    p.add_argument(
        "--images", type=Path, default=DEFAULT_IMAGES, help="image spec directory (default: images)"
    )
    if twin:
        p.add_argument("--twin", action="store_true", help=twin)


def _platforms(text: str) -> list[str]:
    """``--platform linux/amd64,linux/arm64`` (argparse type)."""
    from k3env.config.shapes import PLATFORM_FIX, PLATFORM_RE

    out = [p.strip() for p in text.split(",") if p.strip()]
    for p in out:
        if not PLATFORM_RE.match(p):
            raise argparse.ArgumentTypeError(f"{p!r} is not a platform: {PLATFORM_FIX}")
    return out


def _platform_arg(p: argparse.ArgumentParser, *, many: bool) -> None:
    if many:
        p.add_argument(
            "--platform", type=_platforms, default=[DEFAULT_PLATFORM], metavar="OS/ARCH[,...]",
            help="the platforms to build for, comma-separated (default: linux/amd64); another "
            "architecture's containers run under qemu-user emulation",
        )  # fmt: skip
    else:
        p.add_argument(
            "--platform", default=DEFAULT_PLATFORM, choices=sorted(MACHINES),
            help="the twin's platform (default: %(default)s)",
        )  # fmt: skip


def parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    common.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    common.add_argument(
        "--lock", type=Path, default=DEFAULT_LOCK, help=f"the lockfile (default: {DEFAULT_LOCK})"
    )

    p = argparse.ArgumentParser(
        prog="k3env",
        description=(
            "Build pinned, patched, verified serving images (vLLM, Dynamo) for Slurm clusters, "
            "from one lockfile (pins/) and image specs (images/)."
        ),
    )
    p.add_argument("--version", action="version", version=f"k3env {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    lock = sub.add_parser("lock", parents=[common], help="check the lockfile against what it pins")
    mode = lock.add_mutually_exclusive_group()
    mode.add_argument(
        "--check",
        action="store_true",
        help="report unresolved pins; fail when a pinned file's sha256 differs (default)",
    )
    mode.add_argument(
        "--update-hashes",
        action="store_true",
        help="record the sha256 of pinned files in place (comments and order kept)",
    )
    lock.add_argument(
        "--require-resolved", action="store_true", help="also fail on unresolved pins"
    )
    lock.set_defaults(func=cmd_lock)

    schema = sub.add_parser(
        "schema",
        parents=[common],
        help="write the JSON Schema of the lock or of image specs (for editors)",
        description="The JSON Schema of the lock or of image specs, recorded from k3env's own "
        "reader walking the real files; `schemas/` holds the committed ones (a test fails when "
        "they drift). Editors that read `#:schema` comments (taplo, Even Better TOML) check the "
        "files against them.",
    )
    schema.add_argument("kind", choices=("lock", "spec"), help="which file kind")
    schema.add_argument(
        "--images", type=Path, default=DEFAULT_IMAGES, help="image spec directory (for spec)"
    )
    schema.add_argument("--out", type=Path, help="write the schema here (atomically)")
    schema.set_defaults(func=cmd_schema)

    build = sub.add_parser("build", parents=[common], help="build derived images from specs")
    _image_args(
        build, twin="build over each base's CPU twin (offline default; verification on a CPU host)"
    )
    _platform_arg(build, many=True)
    build.set_defaults(func=cmd_build)

    matrix = sub.add_parser(
        "matrix",
        parents=[common],
        help="verify every image on the twin with each variant of the pinned components",
    )
    _image_args(matrix, twin=None)
    matrix.add_argument(
        "--variant",
        action="append",
        default=[],
        help="a [variants.NAME] of the lock (default: every one), beside the pinned components",
    )
    matrix.add_argument("--markdown", type=Path, help="also write the matrix (markdown) here")
    _platform_arg(matrix, many=True)
    matrix.add_argument(
        "--timeout", type=float, default=600, help="seconds per probe (default: %(default)s)"
    )
    matrix.set_defaults(func=cmd_matrix)

    twin = sub.add_parser("twin", parents=[common], help="build and push the CPU twin base")
    twin.add_argument(
        "--resolve",
        action="store_true",
        help="regenerate the twin's requirements from the lock (uv; needs the package index) "
        "and record their sha256 in the lock; builds nothing",
    )
    twin.add_argument(
        "--find-links",
        action="append",
        default=[],
        metavar="DIR",
        help="with --resolve: also look for wheels here (e.g. the CPU torch build)",
    )
    twin.add_argument("--index-url", help="with --resolve: the package index (default: uv's)")
    _platform_arg(twin, many=False)
    twin.set_defaults(func=cmd_twin)

    push = sub.add_parser(
        "push", parents=[common], help="push images to a registry, record each digest"
    )
    _image_args(push, twin="the images built over the twin")
    push.add_argument(
        "--registry", default="127.0.0.1:5000", help="registry host[:port] (default: %(default)s)"
    )
    push.add_argument(
        "--via-engine",
        action="store_true",
        help="push through the engine (`docker push`, its credentials) instead of the registry API",
    )
    _platform_arg(push, many=True)
    push.set_defaults(func=cmd_push)

    export = sub.add_parser(
        "export",
        parents=[common],
        help="write enroot squashfs images (.sqsh), or --check one against the lock",
    )
    _image_args(export, twin="the images built over the twin")
    export.add_argument(
        "--out", type=Path, default=Path("out/sqsh"), help="output directory (default: out/sqsh)"
    )
    export.add_argument(
        "--check", type=Path, metavar="FILE.sqsh", help="check a squashfs against the lock"
    )
    _platform_arg(export, many=True)
    export.set_defaults(func=cmd_export)

    srt = sub.add_parser("srt", help="srt-slurm: materialize the pinned version, recipes, validate")
    srt_sub = srt.add_subparsers(dest="srt_command", required=True, metavar="SRT_COMMAND")
    source_help = "git URL or local mirror path of srt-slurm (default: the lock's git URL)"
    mat = srt_sub.add_parser(
        "materialize", parents=[common], help="clone the pinned srt-slurm, apply its PR patches"
    )
    mat.add_argument("--source", help=source_help)
    mat.set_defaults(func=cmd_srt_materialize)
    val = srt_sub.add_parser(
        "validate", parents=[common], help="validate recipes with srt-slurm's own config loading"
    )
    val.add_argument("recipe", nargs="+", type=Path, help="recipe YAML files or directories")
    val.add_argument("--source", help=source_help)
    val.set_defaults(func=cmd_srt_validate)
    rec = srt_sub.add_parser(
        "recipe", parents=[common], help="generate an srt-slurm recipe from an image spec profile"
    )
    rec.add_argument("image", help="image spec name")
    rec.add_argument("--profile", help="serve profile (default: the spec's first)")
    rec.add_argument("--images", type=Path, default=DEFAULT_IMAGES, help="image spec directory")
    rec.add_argument("--cluster", type=Path, default=DEFAULT_CLUSTER, help="cluster profile")
    rec.add_argument("--container", help="image reference or .sqsh path (default: pushed digest)")
    rec.add_argument("--model-path", help="model path on the cluster (default: cluster profile)")
    rec.add_argument("--out", type=Path, help="write the recipe here (atomically)")
    rec.set_defaults(func=cmd_srt_recipe)

    ver = sub.add_parser(
        "verify",
        parents=[common],
        help="check each image from inside: args, parsers, tokenizer, imports, patches, env",
    )
    _image_args(ver, twin="verify the images built over the twin")
    ver.add_argument("--markdown", type=Path, help="also write the compat matrix to this file")
    ver.add_argument(
        "--timeout", type=float, default=300, help="seconds per image before the probe is killed"
    )
    ver.add_argument(
        "--isolated",
        action="store_true",
        help="one container and one import per image (by default images with the same files "
        "share one import; each image's checks still run under its own environment)",
    )
    _platform_arg(ver, many=True)
    ver.set_defaults(func=cmd_verify)

    bump = sub.add_parser(
        "bump",
        parents=[common],
        help="change one pin, rebuild, verify, preflight, and write a PR title and body",
    )
    bump.add_argument(
        "pin", help="bases.NAME | dynamo | srt-slurm | aiperf | container_patches.NAME"
    )
    bump.add_argument("value", nargs="?", help="tag, tag@digest, commit or version")
    bump.add_argument("--images", type=Path, default=DEFAULT_IMAGES, help="image spec directory")
    bump.add_argument(
        "--twin",
        action="store_true",
        help="build, verify and test patches over each base's CPU twin (the offline default)",
    )
    bump.add_argument("--cluster", type=Path, default=DEFAULT_CLUSTER, help="cluster profile")
    bump.add_argument(
        "--source", help="git URL or mirror to resolve an srt-slurm or Dynamo tag (or commit)"
    )
    bump.add_argument(
        "--wheels-from",
        action="append",
        metavar="DIR",
        help="find a component's wheels here only (no package index); default: the index",
    )
    bump.add_argument("--body", type=Path, help="write the PR body (markdown) here")
    bump.add_argument(
        "--keep-failing", action="store_true", help="write the lock even when checks fail"
    )
    bump.add_argument("--commit", action="store_true", help="local branch + commit (never pushed)")
    bump.add_argument("--skip-verify", action="store_true", help="build and preflight only")
    bump.add_argument(
        "--edit-only", action="store_true", help="only edit the lock (no build, no checks)"
    )
    bump.set_defaults(func=cmd_bump)

    out = sub.add_parser(
        "outdated",
        parents=[common],
        help="list, for every pin, the newer versions its source offers",
    )
    out.add_argument(
        "--find-links", type=Path, help="a wheel directory instead of the package index"
    )
    out.set_defaults(func=cmd_outdated)

    pre = sub.add_parser(
        "preflight",
        parents=[common],
        help="check serve profiles against the bring-up's failure rules (no engine, < 1 s)",
    )
    _image_args(pre, twin=None)
    pre.add_argument(
        "--cluster", type=Path, default=DEFAULT_CLUSTER, help=f"cluster profile ({DEFAULT_CLUSTER})"
    )
    pre.add_argument("--rule", action="append", default=[], help="run only this rule (repeatable)")
    pre.add_argument("--explain", metavar="RULE", help="print what RULE prevents and its fix")
    pre.add_argument("--list-rules", action="store_true", help="list the rules")
    pre.set_defaults(func=cmd_preflight)
    for name, sub_parser in [
        *sub.choices.items(),
        *(("srt " + n, s) for n, s in srt_sub.choices.items()),
    ]:
        if not sub_parser.description and name in DESCRIPTIONS:
            sub_parser.description = DESCRIPTIONS[name]
    return p


# What each command does, for `--help` and README's command table (rendered from here).
DESCRIPTIONS = {
    "lock": (
        "Validate the lock, report unresolved pins, fail when a pinned file's sha256 differs "
        "(exit 4). With `--update-hashes`: record the sha256 of edited pinned files in place "
        "(comments, key order kept; atomic)."
    ),
    "build": (
        "Build derived images (the spec's pinned components, installed by the base's own pip "
        "`--no-deps --require-hashes` into one deterministic layer, then one layer of patches, "
        "env and provenance, config written by k3env, tagged by the content hash of the inputs; "
        "a rebuild with nothing changed is one inspect); `--twin` builds over each base's CPU "
        "twin."
    ),
    "twin": (
        "Build (cached by content) and push the CPU twin base. With `--resolve`: regenerate its "
        "requirements from the lock (`[twin]` requires / stand_ins / omit plus every "
        "component's pinned wheels and extras, resolved together by uv, every wheel by sha256; "
        "the components themselves are left to the builder) and record their sha256"
    ),
    "matrix": (
        "Build and verify every image on the CPU twin with the pinned components and with each "
        "`[variants.NAME]` of the lock (other releases, by sha256): images x variants as "
        "markdown (`--markdown FILE`) and `--json`, each failure with its first line"
    ),
    "push": (
        "Publish derived images straight to the registry through its API (no engine round-trip):"
        " the layers and config the build kept, base layers mounted from the base's repository "
        "(or copied from its registry), an OCI manifest per platform and, for "
        "`--platform linux/amd64,linux/arm64`, one OCI index under the tag; a tag is never moved"
        " off other bytes. Record each platform's manifest digest by image ID, print the "
        "`enroot import docker://REGISTRY#REPO@sha256:...` line (the platform's own digest) and "
        "the `srtslurm.yaml` `containers:` mapping. `--via-engine`: `docker push` (its "
        "credentials; one platform)"
    ),
    "export": (
        "Write enroot images (`.sqsh`) as `enroot import` lays them out: the rootfs with the "
        "image's own mtimes (Python's `.pyc` stay valid), root 0755, and `/etc/environment`, "
        "`/etc/rc`, `/etc/rc.local`, `/etc/fstab` in enroot's form, streamed from the engine "
        "into `mksquashfs -tar` with enroot's options; the bytes depend on the image only; "
        "sha256 recorded. With `--check FILE.sqsh`: check any squashfs (one `enroot import` "
        "made on the cluster, or an export) against what the image carries and this lock: the "
        "provenance file (its sha256 in the config labels), each `/etc/environment` line, the "
        "`/etc/rc` script, every file of k3env's layer, every installed distribution against "
        "its RECORD, env and patches (exit 4 naming each difference; exit 2 for a file that is "
        "not a k3env image)"
    ),
    "srt materialize": (
        "Clone the pinned srt-slurm (its git URL, or a local mirror), check the tag is the pinned"
        " commit, verify each PR patch's sha256 and apply them in order (`git apply --check` "
        "first: a conflict names the patch, file and hunk), install `srtctl` into its own venv "
        "from the lock's hashed requirements (`--require-hashes`, then `pip check`); cached by "
        "version + commit + patch and requirement hashes, built in a temp dir renamed at the end;"
        " every file of the venv is recorded and an edit to it is an error on the next use"
    ),
    "srt recipe": (
        "An srt-slurm recipe from a serve profile for a cluster profile: the image built for the "
        "cluster's platform, by its pushed manifest digest, `vllm_config` engine flags, env, "
        "frontend type, the profile's `benchmark:` with the lock's aiperf as "
        "`aiperf_package`, `dynamo: {install: false}` when Dynamo is baked (a job-start build "
        'only with `dynamo_install = "from-commit"` in the spec), no `setup_script`'
    ),
    "srt validate": (
        "Load recipes with the materialized srt-slurm's own `load_config` (its marshmallow "
        "schema), ask its job-time registries for the recipe's frontend and benchmark types "
        "(`get_frontend`, `get_runner`), then run `srtctl dry-run` (renders the sbatch script); "
        "each error with file, key path, srt-slurm's message and the stage that found it"
    ),
    "bump": (
        "Change one pin (`bases.NAME TAG` resolves and records the digest; `dynamo TAG|COMMIT` "
        "resolved on the source, name, version, commit and the baked wheels (by sha256) together;"
        " `srt-slurm TAG`; `aiperf VERSION`; `container_patches.NAME`) in place (only the changed"
        " leaves differ), rebuild, verify and preflight before and after, report each container "
        "patch as applies / upstream (drop it) / conflicts, and write a PR title and markdown "
        "body; the lock is replaced atomically only when everything passes (or `--keep-failing`);"
        " `--commit` makes a local branch and commit, never a push; `--twin` builds, verifies and"
        " tests patches over the CPU twins (the offline default). `.github/workflows/pin-"
        "bump.yml` runs it for each pin `k3env outdated` finds, one PR each"
    ),
    "verify": (
        "Check each image from inside, one container per core at once; images with the same "
        "files share one container and one import of the entrypoints, each image's checks "
        "running under its own env (an image whose env the import looked up is probed alone; "
        "`--isolated`: one each); an unchanged image, plan and probe answered from its "
        "record: the serve "
        "lines parse with the image's own vLLM / Dynamo parsers (including vLLM's server-setup "
        "validation; a model path stands in as an empty directory), parser names on the profile "
        "and on the command lines are registered with the process that reads them, the "
        "tokenizer `model_type` loads in Dynamo's Rust frontend (a rejection names the runtime's "
        "supported list), entrypoint modules import, patches are present, every baked env var "
        "is read by a file in the image (the verdict names it, or the search that found none, "
        "with a did-you-mean and the flag that replaced it), versions match the lock, every "
        "installed distribution's Requires-Dist (and the extras in use) holds, an import that "
        "fails on an absent module goes on past it to the first real incompatibility; prints a "
        "table and a markdown compat matrix"
    ),
    "outdated": (
        "For every pin, the newer versions its source offers: a base image's registry tags "
        "(and whether the pinned tag now names another digest), git tags for srt-slurm and "
        "Dynamo, package-index releases for aiperf; each with the `k3env bump` that takes it; "
        "a source that cannot be asked is said so, never reported up to date"
    ),
    "preflight": (
        "Check serve profiles, specs, the lock and a cluster profile against the rules drawn from "
        "the bring-up's failures (`--list-rules`), with no engine (~10 ms)"
    ),
}


COMMON_OPTIONS = ("[-h]", "[--json]", "[-q]", "[--lock LOCK]")


def command_table(p: argparse.ArgumentParser | None = None) -> str:
    """README's command table, rendered from the parser itself (a test fails on drift)."""
    rows = ["| command | what it does |", "|---|---|"]

    def walk(parser: argparse.ArgumentParser) -> None:
        for action in parser._actions:
            if not isinstance(action, argparse._SubParsersAction):
                continue
            for sub in action.choices.values():
                if any(isinstance(a, argparse._SubParsersAction) for a in sub._actions):
                    walk(sub)
                    continue
                usage = " ".join(sub.format_usage().split())
                usage = usage.removeprefix("usage: ").replace("|", "\\|")
                for common in COMMON_OPTIONS:
                    usage = usage.replace(f" {common}", "")
                text = " ".join((sub.description or "").split()).replace("|", "\\|")
                rows.append(f"| `{usage}` | {text} |")

    walk(p or parser())
    return "\n".join(rows) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    log = Log(quiet=args.quiet)
    args.result = None
    try:
        code = int(args.func(args, log))
    except K3envError as e:
        return _fail(args, e)
    except KeyboardInterrupt:
        print("k3env: interrupted", file=sys.stderr)
        return 130
    except OSError as e:
        # A file k3env was told to use (an --out path, a recipe, a directory) that the
        # system refused: the user's to fix, not a bug to show as a traceback.
        return _fail(
            args,
            StateError(
                f"{e.strerror or e}",
                where=str(e.filename) if e.filename else args.command,
                fix="check the path, its permissions and the free disk space",
            ),
        )
    if getattr(args, "json", False):
        _print_json(args.result)
    return code


def _fail(args: argparse.Namespace, error: K3envError) -> int:
    """Report ``error``: on stderr, and with ``--json`` in the one document on stdout (the
    command's result so far, plus ``error``)."""
    if getattr(args, "json", False):
        result = args.result if isinstance(args.result, dict) else {}
        _print_json({**result, "error": error.as_json()})
    print(f"k3env: error: {error.render()}", file=sys.stderr)
    return error.return_code


def _print_json(payload: Any) -> None:
    json.dump(payload, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    sys.exit(main())
