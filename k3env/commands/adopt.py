"""Write an image spec from an srt-slurm recipe (env, engine flags as the role's command line,
parsers and model type, benchmark, the lock's container patches for the base baked in place of
a `setup_script`), commented, atomically (never over an existing file); then regenerate the
recipe from it as `k3env srt recipe` does and compare the two key for key, listing every
difference
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from k3env.commands.app import App
from k3env.config.cluster import DEFAULT_CLUSTER
from k3env.config.lock import load_lock
from k3env.config.spec import DEFAULT_IMAGES
from k3env.errors import ConfigError

if TYPE_CHECKING:
    from k3env.config.cluster import Cluster
    from k3env.config.pins import Lock
    from k3env.config.spec import ImageSpec
    from k3env.config.srtrecipe import Recipe

NAME = "adopt"
HELP = "write an image spec from an srt-slurm recipe, and check the round trip"


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("recipe", type=Path, help="the srt-slurm recipe (YAML)")
    p.add_argument(
        "--base", help="the lock base the recipe's image is (default: as preflight finds it)"
    )
    p.add_argument(
        "--out",
        type=Path,
        help="the spec to write (default: images/SPEC.toml, SPEC from the recipe's name)",
    )
    p.add_argument("--images", type=Path, default=DEFAULT_IMAGES, help="image spec directory")
    p.add_argument("--cluster", type=Path, default=DEFAULT_CLUSTER, help="cluster profile")
    p.add_argument("--model-type", help="the model's tokenizer model_type")


def run(args: argparse.Namespace, app: App) -> int:
    from k3env.config.cluster import load_cluster
    from k3env.config.spec import load_spec
    from k3env.config.srtrecipe import load_recipe
    from k3env.files import write_atomic
    from k3env.srt.adopt import naming, recipe_diff, spec_text
    from k3env.srt.recipe_check import find_image

    lock = load_lock(args.lock)
    cluster = load_cluster(args.cluster)
    source = load_recipe(args.recipe)
    base = (
        args.base
        or find_image(app.state(), lock, args.images, source.container, None, cluster.platform).base
    )
    if base not in lock.bases:
        raise ConfigError(
            f"base {base!r} is not pinned in {args.lock}",
            where="--base",
            fix=f"use one of {sorted(lock.bases)}",
        )
    names = naming(source.name, args.out.stem if args.out else None)
    out = args.out or args.images / f"{names.spec}.toml"
    if out.exists():
        raise ConfigError(
            "refusing to overwrite an existing spec",
            where=str(out),
            fix="pass --out images/OTHER.toml, or remove the file",
        )
    notes: list[str] = []
    text = spec_text(source, lock, base, names, model_type_given=args.model_type, notes=notes)
    # Read back with k3env's own spec reader before anything is written where specs live.
    with tempfile.TemporaryDirectory(prefix="k3env-adopt-") as tmp:
        trial = Path(tmp) / out.name
        trial.write_text(text)
        spec = load_spec(trial, lock)
    regenerated = _regenerate(lock, spec, cluster, source, names.profile)
    differences = recipe_diff(source.data, regenerated)
    write_atomic(out, text)
    app.log.info(f"spec written to {out}")
    payload = {
        "out": str(out),
        "spec": names.spec,
        "profile": names.profile,
        "base": base,
        "round_trip": "equal" if not differences else "differs",
        "differences": [{**d.as_json(), "why": _why(WHY, d.key)} for d in differences],
        "notes": notes,
    }

    def human() -> None:
        print(f"{out}: spec {names.spec}, profile {names.profile}, over base {base}")
        for note in notes:
            print(f"  note: {note}")
        if not differences:
            print(
                f"  round trip: `k3env srt recipe {names.spec}` gives back {args.recipe} key "
                "for key"
            )
        for d in differences:
            reason = _why(WHY, d.key)
            print(f"  differs: {d.text()}" + (f" ({reason})" if reason else ""))

    app.emit(payload, human)
    return 0


# Why a difference between the recipe and the one regenerated from the spec is by design.
WHY = {
    "setup_script": "the spec bakes the lock's container patches instead",
    "dynamo": "the spec bakes the lock's Dynamo (no install at job start)",
    "benchmark.aiperf_package": "the spec bakes the lock's aiperf",
}


def _regenerate(
    lock: Lock, spec: ImageSpec, cluster: Cluster, source: Recipe, profile_name: str
) -> dict[str, Any]:
    """The recipe `k3env srt recipe` makes from the adopted spec, for the round trip."""
    from k3env.config.srtrecipe2 import as_schema2
    from k3env.image.envpolicy import merged_env
    from k3env.srt.recipe import precision_of, recipe

    profile = spec.profiles[profile_name]
    regenerated = recipe(
        spec,
        profile,
        cluster,
        merged_env(lock, spec),
        container=source.container,
        model_path=source.model_path,
        precision=precision_of(profile.tokenizer_model_type),
        dynamo_baked="dynamo" in spec.components,
        dynamo_commit=lock.dynamo.commit if lock.dynamo else None,
        aiperf_version=lock.aiperf.version if lock.aiperf else None,
    )
    # Compared key for key in the recipe's own schema (srt-slurm 2.x's for a schema-2 one).
    return as_schema2(regenerated) if source.schema == 2 else regenerated


def _why(why: dict[str, str], key: str) -> str | None:
    """Why a difference is there by design (the key or its top-level section)."""
    return why.get(key) or why.get(key.split(".")[0])
