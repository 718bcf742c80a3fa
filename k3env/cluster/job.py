"""``k3env smoke --cluster``: write the smoke job (recipe, sbatch script, driver), optionally
submit it and follow it, and turn its output into verdicts. The side effects of the cluster
smoke, in steps: resolve the image -> plan -> render -> validate -> write -> submit -> follow ->
collect -> record.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from k3env import jsontext
from k3env.cluster.collect import MANIFEST, ClusterVerdict, collect, record
from k3env.cluster.plan import ClusterSmoke, plan_cluster
from k3env.cluster.slurm import follow, submit
from k3env.cluster.smoke import manifest, plan_json, sbatch_script, smoke_recipe
from k3env.config.cluster import Cluster
from k3env.config.pins import Lock
from k3env.config.shapes import platform_option
from k3env.config.spec import ImageSpec, ServeProfile
from k3env.engine.protocol import Engine
from k3env.errors import CheckFailed, ConfigError, StateError
from k3env.files import read_input, write_atomic
from k3env.image.build import BuildResult
from k3env.image.envpolicy import merged_env
from k3env.image.records import last_build, shipped
from k3env.log import Log
from k3env.quoting import one_line
from k3env.srt.recipe import as_pinned, precision_of, to_yaml
from k3env.srt.recipe_check import srt_loader
from k3env.state import State
from k3env.untrusted import read_tail
from k3env.verdict import FAILED, Gate

DRIVER = resources.files("k3env.probes") / "smoke_driver.py"
RECIPE = "recipe.yaml"
SCRIPT = "smoke.sbatch"
TAIL = 64 << 10  # of the job's own output file


@dataclass(frozen=True, kw_only=True)
class Image:
    """The image the cluster imports: its reference and the digest a verdict is keyed by."""

    container: str
    digest: str | None
    image_id: str | None
    how: str


@dataclass(frozen=True, kw_only=True)
class Written:
    out: Path
    smoke: ClusterSmoke
    image: Image
    validation: Gate | None  # srt-slurm's loader on the recipe; None: no recipe written
    files: tuple[str, ...]

    @property
    def script(self) -> Path:
        return self.out / SCRIPT

    def as_json(self) -> dict[str, Any]:
        return {
            "out": str(self.out),
            "plan": self.smoke.as_json(),
            "container": self.image.container,
            "digest": self.image.digest,
            "image_from": self.image.how,
            "validation": None if self.validation is None else self.validation.as_json(),
            "files": list(self.files),
        }


def resolve_image(
    state: State,
    lock: Lock,
    spec: ImageSpec,
    cluster: Cluster,
    given: str | None,
    image_id: str | None = None,
) -> Image:
    """The image by the digest it was pushed under for the cluster's platform, else its
    exported ``.sqsh``, else ``--container`` (a digest in it keys the verdict). ``image_id``:
    this build's (default: the last recorded build of ``spec`` from ``lock``)."""
    if given:
        digest = given.rsplit("@", 1)[1] if "@sha256:" in given else None
        return Image(container=given, digest=digest, image_id=image_id, how="--container")
    if image_id is None:
        build = last_build(state, lock, spec, cluster.platform)
        image_id = build.image_id if build else ""
    found = shipped(state, image_id)
    if found.pushed is not None:
        p = found.pushed
        return Image(container=p.by_digest, digest=p.digest, image_id=image_id, how="pushed")
    if found.exported is not None:
        e = found.exported
        return Image(container=e.path, digest=f"sha256:{e.sha256}", image_id=image_id,
                     how="exported")  # fmt: skip
    on = platform_option(cluster.platform)
    raise ConfigError(
        f"image {spec.name} has been neither pushed nor exported for {cluster.platform} (the "
        f"platform of {cluster.name}): the smoke job names it by digest or .sqsh",
        where=str(spec.path),
        fix=f"k3env push{on} {spec.name}, or k3env export{on} {spec.name} "
        "(or pass --container REF@sha256:...|PATH.sqsh)",
    )


def _validate(lock: Lock, state: State, log: Log, text: str) -> Gate:
    """The recipe through the pinned srt-slurm's own loader, job lookups and dry-run where it
    is materialized (a failure is an error: nothing is written); else ``not checked``, why."""
    with tempfile.TemporaryDirectory(prefix="k3env-smoke-recipe-") as tmp:
        path = Path(tmp) / RECIPE
        path.write_text(text)
        loader = srt_loader(lock, state, log, [path])[path]
    if loader.verdict == FAILED:
        raise CheckFailed(
            "the smoke recipe does not validate: "
            + "; ".join(f"{k or '(recipe)'}: {m} [{s}]" for k, m, s in loader.errors),
            where=loader.detail,
            fix="the serve profile or the pinned srt-slurm must change (srt-slurm's words)",
        )
    return loader.gate


def write_job(
    lock: Lock,
    spec: ImageSpec,
    profile: ServeProfile,
    cluster: Cluster,
    state: State,
    log: Log,
    *,
    out: Path,
    layers: int | None,
    container: str | None,
    model_path: str | None,
    runtime: str,
    job_timeout: float,
    ready_timeout: float,
    partition: str | None = None,
) -> Written:
    image = resolve_image(state, lock, spec, cluster, container)
    model = model_path or cluster.model_path
    if not model:
        raise ConfigError(
            "no model path",
            where=str(cluster.path),
            fix="set model_path in the cluster profile, or pass --model-path",
        )
    smoke = plan_cluster(
        spec,
        profile,
        cluster,
        merged_env(lock, spec, lock.bases[spec.base]),
        layers=layers,
        ready_timeout=ready_timeout,
    )
    out = out.resolve()
    rendered = smoke_recipe(
        spec,
        profile,
        cluster,
        smoke,
        container=image.container,
        model_path=model,
        precision=precision_of(profile.tokenizer_model_type),
        bin_dir=out / "bin",
        job_timeout=job_timeout,
    )
    # As the pinned srt-slurm loads it: schema 2 for srt-slurm 2.x.
    text = _header(lock, spec, cluster, smoke, out) + to_yaml(as_pinned(rendered, lock.srt_slurm))
    script = sbatch_script(
        smoke,
        container=image.container,
        model_path=model,
        out_dir=out,
        job_timeout=job_timeout,
        runtime=runtime,
        partition=partition,
    )
    validation = _validate(lock, state, log, text)
    job = manifest(smoke, container=image.container, digest=image.digest, image_id=image.image_id)
    files = {
        f"bin/{MANIFEST}": jsontext.dumps(job, indent=1) + "\n",
        "bin/plan.json": plan_json(smoke),
        "bin/driver.py": DRIVER.read_text(),
        RECIPE: text,
        SCRIPT: script,
    }
    for rel, data in files.items():
        write_atomic(out / rel, data, mode=0o755 if rel == SCRIPT else None)
    return Written(
        out=out,
        smoke=smoke,
        image=image,
        validation=validation,
        files=tuple(str(out / r) for r in files),
    )


def _header(lock: Lock, spec: ImageSpec, cluster: Cluster, smoke: ClusterSmoke, out: Path) -> str:
    """The smoke recipe's comment: what made it, and what it runs."""
    return (
        f"# Generated by `k3env smoke --cluster {one_line(str(cluster.path))} "
        f"{one_line(spec.name)}` from {one_line(str(spec.path))} and "
        f"{one_line(str(lock.path))}: regenerate, never edit.\n"
        f"# The smoke job: random weights, {one_line(smoke.topology.said())}; the battery is "
        f"k3env's driver, mounted from {one_line(str(out / 'bin'))}.\n"
    )


def write_cpu_job(
    lock: Lock,
    spec: ImageSpec,
    profile: ServeProfile,
    cluster: Cluster,
    state: State,
    log: Log,
    *,
    engine: Engine,
    build: BuildResult,
    out: Path,
    container: str | None,
    cpus: int,
    partition: str | None,
    job_timeout: float,
    ready_timeout: float,
) -> Written:
    """The CPU partition mode's job (``cluster.cpu_partition``): the CPU smoke's plan of this
    build, its engine, model and driver under ``out``, one sbatch script (no recipe:
    srt-slurm starts its engine on GPU nodes)."""
    from k3env.cluster.cpu_partition import (
        cpu_manifest,
        cpu_sbatch_script,
        cpu_smoke,
        place_tree,
    )
    from k3env.image.bases import select_base
    from k3env.smoke.plan import plan_profile
    from k3env.smoke.prefix import ensure_prefix, smoke_pin
    from k3env.smoke.run import profile_model, write_bin

    if cpus < 1:
        raise ConfigError("--cpus must be 1 or more", where="--cpus", fix="pass N >= 1")
    pin = smoke_pin(lock, build.platform)
    prefix = ensure_prefix(
        lock, pin, engine, state, build.base_id, log, engine_id=build.base_engine_id
    )
    image = _with_sqsh_digest(
        resolve_image(state, lock, spec, cluster, container, image_id=build.image_id), log
    )
    wheel = pin.engine.wheels[0]
    stand_in = f"{wheel.name} {wheel.version} in place of {pin.stands_in_for}"
    baked = merged_env(lock, spec, select_base(lock, spec, build.twin))
    out = out.resolve()
    with tempfile.TemporaryDirectory(prefix="k3env-smoke-cpu-") as tmp:
        root = Path(tmp)
        model = profile_model(root / "model", profile)
        plan = plan_profile(
            spec, profile, model, ready_timeout=ready_timeout, absent=pin.absent, baked=baked
        )
        smoke = cpu_smoke(plan, cluster=cluster.name, cpus=cpus, stand_in=stand_in, env=baked)
        write_bin(root / "bin", plan, pin.absent)
        job = cpu_manifest(smoke, container=image.container, digest=image.digest,
                           image_id=build.image_id, stand_in=stand_in)  # fmt: skip
        (root / "bin" / MANIFEST).write_text(jsontext.dumps(job, indent=1) + "\n")
        with log.step(f"cpu partition job of {spec.name} / {profile.name} in {out}"):
            place_tree(root / "bin", out / "bin", link=False)
            place_tree(root / "model", out / "model", link=False)
            place_tree(prefix, out / "engine", link=True)
    script = cpu_sbatch_script(
        smoke, container=image.container, out_dir=out, cpus=cpus, job_timeout=job_timeout,
        partition=partition,
    )  # fmt: skip
    write_atomic(out / SCRIPT, script, mode=0o755)
    return Written(
        out=out,
        smoke=smoke,
        image=image,
        validation=None,  # the sbatch script only: srt-slurm starts its engine on GPU nodes
        files=tuple(str(out / r) for r in ("bin", "model", "engine", SCRIPT)),
    )


def _with_sqsh_digest(image: Image, log: Log) -> Image:
    """A local ``.sqsh`` named without a digest: its sha256 keys the verdict (what ran)."""
    path = Path(image.container)
    if image.digest is not None or not image.container.endswith(".sqsh") or not path.is_file():
        return image
    from dataclasses import replace

    from k3env.hashing import file_sha256

    with log.step(f"sha256 of {path}"):
        return replace(image, digest=f"sha256:{file_sha256(path)}")


def submit_and_collect(
    written: Written, state: State, log: Log, *, job_timeout: float, interval: float = 2.0
) -> ClusterVerdict:
    """Submit the sbatch script, follow the job to its end (a timeout or Ctrl-C cancels it),
    collect its output and record the verdict."""
    with log.step(f"slurm: smoke job of {written.smoke.image} on {written.smoke.cluster}"):
        job_id = submit(str(written.script), log)
        log.info(f"    submitted: job {job_id}; its directory {written.out / f'job-{job_id}'}")
        # Past the job's own limit Slurm ends it; k3env waits a little longer for that.
        job = follow(job_id, log, timeout=job_timeout + 90, interval=interval)
    got = read_tail(written.out, f"slurm-{job_id}.out", limit=TAIL)
    if got is not None:
        from dataclasses import replace

        job = replace(job, tail=got[0].decode(errors="replace"))
    job_dir = written.out / f"job-{job_id}"
    job_manifest = json.loads(read_input(written.out / "bin" / MANIFEST, error=StateError))
    return record(state, collect(job_dir, job=job, manifest=job_manifest))
