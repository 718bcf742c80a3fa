"""The probe run: the probe package (``probes/probe/``) and the plan carried into one
container of the image at run time (a read-only mount, never baked), run with no network,
no GPU and a time bound; its one JSON document read back.
"""

from __future__ import annotations

import functools
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from k3env import jsontext
from k3env.engine.protocol import BaseImage, Engine
from k3env.errors import EngineError
from k3env.hashing import canonical_sha256, digest_hex, sha256_digest
from k3env.image.build import PROVENANCE_LABEL, PROVENANCE_PATH
from k3env.image.records import ProbeOutput

MARK = "@@k3env-probe@@"


# The probe package's directory in the container, run as ``python /k3env-probe/probe PLAN``.
PROBE_DIR = "probe"


# What the probe process needs to build vLLM's parser without a GPU, and to stay offline.
PROBE_ENV = {
    "VLLM_TARGET_DEVICE": "cpu",
    "CUDA_VISIBLE_DEVICES": "",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "DYN_LOG": "error",
    "VLLM_LOGGING_LEVEL": "ERROR",
    "PYTHONDONTWRITEBYTECODE": "1",
}


def _probe_sources() -> dict[str, bytes]:
    """The probe package's files (``k3env/probes/probe/*.py``) by name."""
    package = resources.files("k3env.probes.probe")
    return {
        f.name: f.read_bytes()
        for f in sorted(package.iterdir(), key=lambda f: f.name)
        if f.name.endswith(".py") and f.is_file()
    }


@functools.cache
def probe_sha256() -> str:
    """The probe package's own sources: a changed probe answers afresh."""
    return canonical_sha256(
        {name: digest_hex(sha256_digest(data)) for name, data in _probe_sources().items()}
    )


def probe_env(config_env: Sequence[str]) -> dict[str, str]:
    """The environment the probe's container has: the image's config Env, then PROBE_ENV."""
    env = dict(item.split("=", 1) for item in config_env if "=" in item)
    return {**env, **PROBE_ENV}


def run_probe(
    engine: Engine,
    image: str,
    python: str,
    plans: Sequence[Mapping[str, Any]],
    envs: Sequence[Mapping[str, str]],
    *,
    timeout: float,
) -> list[ProbeOutput | str]:
    """The probe over one image or a group of images with the same files, in one container of
    ``image`` (the group's first): each plan's output, or why it could not share the import
    (the caller verifies that image on its own)."""
    workdir = Path(tempfile.mkdtemp(prefix="k3env-probe-"))
    try:
        package = workdir / PROBE_DIR
        package.mkdir()
        for name, data in _probe_sources().items():
            (package / name).write_bytes(data)
            (package / name).chmod(0o644)
        package.chmod(0o755)
        payload = {"plans": plans, "envs": envs, "timeout": timeout}
        (workdir / "plan.json").write_text(jsontext.dumps(payload, sort_keys=False))
        workdir.chmod(0o755)
        result = engine.run(
            image,
            [python, f"/k3env-probe/{PROBE_DIR}", "/k3env-probe/plan.json"],
            timeout=timeout,
            env=PROBE_ENV,
            mounts={str(workdir): "/k3env-probe"},
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    for line in reversed(result.stdout.splitlines()):
        if line.startswith(MARK):
            try:
                payload = jsontext.parse(line[len(MARK) :], limit=256 << 20)
                outputs: list[ProbeOutput | str] = []
                for one in payload["plans"]:
                    if "unshared" in one:
                        outputs.append(str(one["unshared"]))
                        continue
                    outputs.append(
                        ProbeOutput(
                            rows=list(one["results"]),
                            facts=dict(one["facts"]),
                            patch_targets=dict(one.get("patch_targets") or {}),
                        )
                    )
                if len(outputs) != len(plans):
                    raise ValueError(f"{len(outputs)} answers for {len(plans)} plans")
                return outputs
            except (ValueError, KeyError, TypeError) as e:
                raise EngineError(
                    f"the probe's verdict line is cut off or malformed ({e}; exit "
                    f"{result.exit_code}): {line[:200]!r}",
                    where=image,
                    fix="raise --timeout if the probe was killed; else report it as a k3env bug",
                ) from e
    how = (
        f"was killed by signal {result.exit_code - 128} (exit {result.exit_code})"
        if result.exit_code > 128
        else f"exited {result.exit_code}"
    )
    raise EngineError(
        f"the probe printed no verdict: it {how}",
        where=image,
        fix="the image's Python could not run the probe: check `python` in the base pin",
        output=(result.stdout + result.stderr).strip()[-3000:] or None,
    )


def files_key(engine: Engine, engine_id: str, image: BaseImage | None) -> tuple[Any, ...]:
    """What an image's files are, for grouping: its layers; for an image k3env built, the
    layers below its own and that layer's files as its provenance lists them (the record's
    sha256 is checked against the image's label). Images with the same key differ only in
    their config (Env) and their provenance record. ``engine_id``: what the engine calls it
    (``naming.engine_id``); ``image``: its inspection."""
    if image is None:
        return ("image", engine_id)
    labels = image.config.get("Labels") or {}
    recorded = labels.get(PROVENANCE_LABEL)
    if not recorded:
        return ("layers", image.diff_ids)
    found = engine.read_files(engine_id, [PROVENANCE_PATH]).get(PROVENANCE_PATH)
    if found is None or digest_hex(sha256_digest(found.content)) != recorded:
        return ("image", engine_id)  # nothing to vouch for its layer: verified on its own
    try:  # the image's own file: hostile until checked
        files = jsontext.parse(found.content).get("files")
    except (ValueError, AttributeError):
        return ("image", engine_id)
    return ("k3env", image.diff_ids[:-1], canonical_sha256(files))
