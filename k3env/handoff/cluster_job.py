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

from k3env.config.cluster import Cluster
from k3env.config.pins import Lock
from k3env.config.shapes import platform_option
from k3env.config.spec import ImageSpec, ServeProfile
from k3env.errors import CheckFailed, ConfigError, StateError
from k3env.files import read_input, write_atomic
from k3env.handoff.cluster_smoke import manifest, plan_json, sbatch_script, smoke_recipe
from k3env.handoff.enroot import Exported
from k3env.handoff.push import last_push
from k3env.handoff.recipe import precision_of, to_yaml
from k3env.handoff.recipe_check import srt_loader
from k3env.handoff.slurm import follow, submit
from k3env.image.envpolicy import merged_env
from k3env.image.records import last_build
from k3env.log import Log
from k3env.quoting import one_line
from k3env.smoke.cluster_plan import ClusterSmoke, plan_cluster
from k3env.smoke.collect import MANIFEST, ClusterVerdict, collect, record
from k3env.state import State
from k3env.untrusted import read_tail

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
    validation: dict[str, str]
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
            "validation": self.validation,
            "files": list(self.files),
        }


def resolve_image(
    state: State, lock: Lock, spec: ImageSpec, cluster: Cluster, given: str | None
) -> Image:
    """The image by the digest it was pushed under for the cluster's platform, else its
    exported ``.sqsh``, else ``--container`` (a digest in it keys the verdict)."""
    if given:
        digest = given.rsplit("@", 1)[1] if "@sha256:" in given else None
        return Image(container=given, digest=digest, image_id=None, how="--container")
    build = last_build(state, lock, spec, cluster.platform) or {}
    image_id = str(build.get("image_id") or "")
    pushed = last_push(state, image_id) if image_id else None
    if pushed is not None:
        return Image(
            container=pushed.by_digest, digest=pushed.digest, image_id=image_id, how="pushed"
        )
    exported = state.read_record("exports", image_id) if image_id else None
    if isinstance(exported, dict) and exported.get("path"):
        e = Exported(**{k: exported[k] for k in Exported.__dataclass_fields__ if k in exported})
        return Image(
            container=e.path, digest=f"sha256:{e.sha256}", image_id=image_id, how="exported"
        )
    on = platform_option(cluster.platform)
    raise ConfigError(
        f"image {spec.name} has been neither pushed nor exported for {cluster.platform} (the "
        f"platform of {cluster.name}): the smoke job names it by digest or .sqsh",
        where=str(spec.path),
        fix=f"k3env push{on} {spec.name}, or k3env export{on} {spec.name} "
        "(or pass --container REF@sha256:...|PATH.sqsh)",
    )


def _validate(lock: Lock, state: State, log: Log, text: str) -> dict[str, str]:
    """The recipe through the pinned srt-slurm's own loader, job lookups and dry-run where it
    is materialized (a failure is an error: nothing is written); else ``not validated``."""
    with tempfile.TemporaryDirectory(prefix="k3env-smoke-recipe-") as tmp:
        path = Path(tmp) / RECIPE
        path.write_text(text)
        loader = srt_loader(lock, state, log, [path])[path]
    if loader.verdict == "failed":
        raise CheckFailed(
            "the smoke recipe does not validate: "
            + "; ".join(f"{k or '(recipe)'}: {m} [{s}]" for k, m, s in loader.errors),
            where=loader.detail,
            fix="the serve profile or the pinned srt-slurm must change (srt-slurm's words)",
        )
    verdict = "validated" if loader.verdict == "passed" else "not validated"
    return {"verdict": verdict, "detail": loader.detail}


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
    header = (
        f"# Generated by `k3env smoke --cluster {one_line(str(cluster.path))} "
        f"{one_line(spec.name)}` from {one_line(str(spec.path))} and "
        f"{one_line(str(lock.path))}: regenerate, never edit.\n"
        f"# The smoke job: random weights, {one_line(smoke.topology.said())}; the battery is "
        f"k3env's driver, mounted from {one_line(str(out / 'bin'))}.\n"
    )
    text = header + to_yaml(
        smoke_recipe(
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
    )
    script = sbatch_script(
        smoke,
        container=image.container,
        model_path=model,
        out_dir=out,
        job_timeout=job_timeout,
        runtime=runtime,
    )
    validation = _validate(lock, state, log, text)
    job = manifest(smoke, container=image.container, digest=image.digest, image_id=image.image_id)
    files = {
        f"bin/{MANIFEST}": json.dumps(job, indent=1, sort_keys=True) + "\n",
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
