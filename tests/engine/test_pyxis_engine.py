"""k3env's image on the cluster's own runtime: Debian's Slurm with pyxis 0.24.0 and enroot 4.1.2,
built by scripts/host-setup.sh from their pinned sources (/opt/k3env-cluster). The `.sqsh`
`k3env export` writes of a real derived image (the test project's: baked env, a container
patch, k3env's provenance) is started by `srun --container-image=...` as a job would: the
process inside sees every baked env var at its baked value, the patched module, and the
provenance; pyxis applies the env precedence pyxis#124 describes (the image's value wins over
the job's unless the job names it with `--container-env`).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import _require, run_json
from .test_slurm_engine import running_slurm

pytestmark = [pytest.mark.engine, pytest.mark.registry]

PREFIX = Path("/opt/k3env-cluster")
PYXIS = PREFIX / "pyxis/lib/slurm/spank_pyxis.so"
ENROOT = PREFIX / "enroot/bin"
PRINT_ENV = "import json, os; print(json.dumps(dict(os.environ)))"


@pytest.fixture
def pyxis_slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A local Slurm whose steps run containers through pyxis and enroot (squashfuse: the
    `.sqsh` is mounted, not unpacked). enroot keeps its paths under this Slurm's directory
    (pyxis passes only PATH from slurmd to enroot: a wrapper first on it sets them)."""
    if not (PYXIS.is_file() and (ENROOT / "enroot").is_file()):
        _require(f"pyxis and enroot in {PREFIX} (scripts/host-setup.sh builds them)")
    root = Path(tmp_path_factory.mktemp("pyxis"))
    wrapper = root / "bin/enroot"
    wrapper.parent.mkdir()
    paths = {k: root / "enroot" / k.lower() for k in ("RUNTIME", "DATA", "CACHE", "TEMP")}
    for p in paths.values():
        p.mkdir(parents=True)
    exports = "".join(f"export ENROOT_{k}_PATH={p}\n" for k, p in paths.items())
    wrapper.write_text(f'#!/bin/sh\n{exports}exec {ENROOT}/enroot "$@"\n')
    wrapper.chmod(0o755)
    (root / "pyxis-run").mkdir()
    plugstack = f"required {PYXIS} runtime_path={root}/pyxis-run use_squashfuse=1\n"
    path = f"{root}/bin:{ENROOT}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    with running_slurm(root, plugstack=plugstack, slurmd_path=path) as env:
        yield env


def _srun(env: dict[str, str], *argv: str, job_env: dict[str, str] | None = None) -> str:
    full = {**os.environ, **env, **(job_env or {})}
    done = subprocess.run(["srun", "--nodes=1", "--ntasks=1", *argv], capture_output=True,
                          text=True, timeout=300, env=full)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _seen(
    env: dict[str, str], *flags: str, job_env: dict[str, str] | None = None
) -> dict[str, str]:
    """The environment of the step's process inside the container."""
    out = _srun(env, *flags, "python3", "-c", PRINT_ENV, job_env=job_env)
    seen: dict[str, str] = json.loads(out.strip().splitlines()[-1])
    return seen


def test_pyxis_and_enroot_run_k3envs_export_with_its_baked_env_as_the_process_sees_it(
    project: Path,
    pyxis_slurm: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    clean_probe_images: None,
) -> None:
    exported = run_json(capsys, "export", "--out", "sqsh")["images"][0]
    sqsh = str(Path(exported["path"]).resolve())
    image = f"--container-image={sqsh}"
    provenance = json.loads(
        subprocess.run(["unsquashfs", "-cat", sqsh, "etc/k3env/provenance.json"],
                       capture_output=True, text=True, check=True).stdout
    )  # fmt: skip
    baked: dict[str, str] = provenance["env"]
    assert baked, "the test image bakes env"
    # The step's process inside the image: every baked var, at its baked value.
    seen = json.loads(
        _srun(pyxis_slurm, image, "python3", "-c", PRINT_ENV).strip().splitlines()[-1]
    )
    assert {k: seen.get(k) for k in baked} == baked
    # k3env's layer as the container sees it: the patch and the provenance.
    files = "/usr/lib/python3/dist-packages/k3test/mod.py /etc/k3env/provenance.json"
    inside = _srun(pyxis_slurm, image, "cat", *files.split())
    assert "idx_mapping.long()" in inside and f'"image": "{provenance["image"]}"' in inside
    # pyxis#124: a job env var of a baked name does not reach the process...
    name = sorted(baked)[0]
    job = {name: "from-the-job"}
    assert _seen(pyxis_slurm, image, job_env=job)[name] == baked[name]
    # ...unless the job names it with --container-env.
    assert _seen(pyxis_slurm, image, f"--container-env={name}", job_env=job)[name] == (
        "from-the-job"
    )
