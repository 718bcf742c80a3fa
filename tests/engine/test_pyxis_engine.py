"""k3env's image on the cluster's own runtime: Debian's Slurm with pyxis 0.24.0 and enroot 4.1.2,
built by scripts/host-setup.sh from their pinned sources (/opt/k3env-cluster). The `.sqsh`
`k3env export` writes of a real derived image (the test project's: baked env, a container
patch, k3env's provenance) is started by `srun --container-image=...` as a job would: the
process inside sees every baked env var at its baked value, the patched module, and the
provenance; pyxis applies the env precedence pyxis#124 describes (the image's value wins over
the job's unless the job names it with `--container-env`).

Each test runs once per Slurm release in K3ENV_SLURM_RELEASES (default "22.05", the host's):
"24.11" and "26.05" are Debian trixie's and sid's, in a root of scripts/slurm-root.sh with pyxis
0.24.0 built against them there (made on first use, ~80 s; then ~0.2 s).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ..conftest import REPO
from .conftest import REGISTRY, _require, run_json
from .test_slurm_engine import running_slurm

pytestmark = [pytest.mark.engine, pytest.mark.registry]

PREFIX = Path("/opt/k3env-cluster")
PYXIS = PREFIX / "pyxis/lib/slurm/spank_pyxis.so"
ENROOT = PREFIX / "enroot/bin"
PRINT_ENV = "import json, os; print(json.dumps(dict(os.environ)))"
# Slurm release -> the Debian suite scripts/slurm-root.sh makes its root of (None: the host's).
SUITES = {"22.05": None, "24.11": "trixie", "26.05": "sid"}
RELEASES = os.environ.get("K3ENV_SLURM_RELEASES", "22.05").split()


@dataclass(frozen=True, kw_only=True)
class SlurmRelease:
    version: str
    root: Path  # the file system slurmd runs in ("/": the host's)
    pyxis: Path  # spank_pyxis.so, as slurmd sees it


@pytest.fixture(params=RELEASES, ids=lambda v: f"slurm-{v}")
def slurm_release(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> SlurmRelease:
    """The Slurm the test's cluster runs: the host's, or a newer one whose wrappers (made by
    scripts/slurm-root.sh) go first on PATH, with this checkout bound into its root."""
    version: str = request.param
    if version not in SUITES:
        pytest.fail(f"K3ENV_SLURM_RELEASES: {version!r} is none of {', '.join(SUITES)}")
    suite = SUITES[version]
    if suite is None:
        return SlurmRelease(version=version, root=Path("/"), pyxis=PYXIS)
    made = subprocess.run(["bash", str(REPO / "scripts/slurm-root.sh"), suite],
                          capture_output=True, text=True, timeout=1800)  # fmt: skip
    if made.returncode != 0:
        _require(f"Slurm {version} (scripts/slurm-root.sh {suite}: {made.stderr[-2000:]})")
    wrappers = Path(made.stdout.strip().splitlines()[-1])
    monkeypatch.setenv("PATH", f"{wrappers}:{os.environ['PATH']}")
    # This checkout and its parent (a checkout may itself be a mount: CI's is), recursively.
    binds = [p for p in (REPO.parent, REPO) if p != Path("/")]
    monkeypatch.setenv("K3ENV_SLURM_BINDS", " ".join(map(str, binds)))
    _root_runs_this_python(wrappers / "k3env-enter")
    pyxis = Path("/opt/k3env-pyxis/lib/slurm/spank_pyxis.so")
    return SlurmRelease(version=version, root=wrappers.parent / "root", pyxis=pyxis)


def _root_runs_this_python(enter: Path) -> None:
    """A pyxis importer runs this test's python inside the root: without it every step fails
    at exec (exit 127, far from the cause), so say here which path the root does not see."""
    done = subprocess.run([str(enter), sys.executable, "-c", "import k3env"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    if done.returncode != 0:
        mounts = {}
        for side, pre in (("host", []), ("root", [str(enter)])):
            found = subprocess.run([*pre, "findmnt", "-T", sys.executable],
                                   capture_output=True, text=True, timeout=60)  # fmt: skip
            mounts[side] = found.stdout + found.stderr or "(nothing: the path is not there)\n"
        pytest.fail(f"the Slurm root ({enter}) cannot run {sys.executable} -c 'import k3env' "
                    f"(exit {done.returncode}: {done.stderr[-1000:]}); bind its directory "
                    f"(K3ENV_SLURM_BINDS). findmnt -T on the host:\n{mounts['host']}"
                    f"in the root:\n{mounts['root']}")  # fmt: skip


@pytest.fixture
def pyxis_slurm(
    tmp_path_factory: pytest.TempPathFactory, slurm_release: SlurmRelease
) -> Iterator[dict[str, str]]:
    """A local Slurm whose steps run containers through pyxis and enroot (squashfuse: the
    `.sqsh` is mounted, not unpacked). enroot keeps its paths under this Slurm's directory
    (pyxis passes only PATH from slurmd to enroot: a wrapper first on it sets them)."""
    with _pyxis(Path(tmp_path_factory.mktemp("pyxis")), slurm_release) as env:
        yield env


@contextlib.contextmanager
def _pyxis(
    root: Path, release: SlurmRelease, importer: Path | None = None, *, per_user: bool = False
) -> Iterator[dict[str, str]]:
    """``per_user``: jobs of any user (enroot's paths made per uid by the wrapper; no
    squashfuse, whose /dev/fuse only root opens here: the image is unpacked)."""
    built = release.root / release.pyxis.relative_to("/")
    if not (built.is_file() and (ENROOT / "enroot").is_file()):
        _require(f"pyxis ({built}) and enroot in {PREFIX} (scripts/host-setup.sh builds them)")
    wrapper = root / "bin/enroot"
    wrapper.parent.mkdir(exist_ok=True)
    base = f"{root}/enroot/$(id -u)" if per_user else f"{root}/enroot"
    kinds = ("RUNTIME", "DATA", "CACHE", "TEMP", *(("CONFIG",) if per_user else ()))
    paths = {k: f"{base}/{k.lower()}" for k in kinds}
    if per_user:
        (root / "enroot").mkdir(mode=0o1777)
        (root / "enroot").chmod(0o1777)
    else:
        for p in paths.values():
            Path(p).mkdir(parents=True)
    exports = "".join(f"export ENROOT_{k}_PATH={p}\n" for k, p in paths.items())
    exports += "export ENROOT_ALLOW_HTTP=yes\n"  # the local registry speaks plain HTTP
    made = f"mkdir -p {' '.join(paths.values())}\n" if per_user else ""
    wrapper.write_text(f'#!/bin/sh\n{exports}{made}exec {ENROOT}/enroot "$@"\n')
    wrapper.chmod(0o755)
    (root / "pyxis-run").mkdir()
    fuse = "" if per_user else " use_squashfuse=1"
    plugstack = f"required {release.pyxis} runtime_path={root}/pyxis-run{fuse}"
    plugstack += f" importer={importer}\n" if importer else "\n"
    path = f"{root}/bin:{ENROOT}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    with running_slurm(root, plugstack=plugstack, slurmd_path=path) as env:
        version = subprocess.run(["sinfo", "--version"], capture_output=True, text=True,
                                 env={**os.environ, **env}, timeout=60).stdout  # fmt: skip
        assert version.split()[-1].startswith(f"{release.version}."), version
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


CPU_IMAGE = "kimi-k3-direct-f"


def _cpu_job(
    sqsh: str, out: Path, capsys: pytest.CaptureFixture[str], *extra: str
) -> tuple[int, dict[str, Any]]:
    """`k3env smoke --cluster ... --cpu-partition` of the offline default's image."""
    from k3env.cli import main

    argv = ["smoke", "--cluster", "clusters/b200-dgxc.toml", "--cpu-partition", "--twin",
            CPU_IMAGE, "--container", sqsh, "--cpus", str(os.cpu_count() or 1),
            "--job-timeout", "900", "--out", str(out), "--json", "-q", *extra]  # fmt: skip
    code = main(argv)
    return code, json.loads(capsys.readouterr().out)


def _gates(verdict: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {g["gate"]: g for g in verdict["gates"]}


@pytest.mark.twin
def test_the_cluster_smoke_in_cpu_partition_mode_runs_the_real_image_through_pyxis(
    pyxis_slurm: dict[str, str],
    twin_image: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The offline default's image, exported by k3env, started by pyxis and enroot as a job:
    the CPU build of the engine inside serves the battery; the baked env is read from the
    engine process; a flag the engine refuses and a job env pyxis lets win both fail in
    their own words."""
    from k3env.cli import main

    monkeypatch.chdir(REPO)
    monkeypatch.setenv("SLURM_CONF", pyxis_slurm["SLURM_CONF"])
    code = main(["export", "--twin", CPU_IMAGE, "--out", str(tmp_path / "sqsh"), "--json", "-q"])
    exported = json.loads(capsys.readouterr().out)["images"][0]
    assert code == 0
    sqsh = exported["path"]

    started = time.monotonic()
    code, out = _cpu_job(sqsh, tmp_path / "passing", capsys, "--submit")
    assert "collected" in out, out
    ok = out["collected"]
    assert code == 0, json.dumps(ok, indent=1)[:6000]
    assert ok["ok"] is True and ok["mode"] == "cpu-partition" and ok["job"]["state"] == "COMPLETED"
    gates = _gates(ok)
    assert list(gates) == ["env", "listed", "chat", "reasoning", "tool-calls", "benchmark", "stop"]
    assert all(g["status"] == "passed" for g in gates.values()), gates
    # The baked env as the engine's process inside the container holds it (/proc/PID/environ).
    assert "at their baked values in vllm-serve (pid " in gates["env"]["detail"]
    assert "parsed tool_calls ['get_weather']" in gates["tool-calls"]["detail"]
    assert "stopped on SIGINT" in gates["stop"]["detail"]
    assert ok["digest"] == f"sha256:{exported['sha256']}"
    assert str(ok["recorded"]).endswith("/b200-dgxc.cpu-partition.json")
    passing = time.monotonic() - started

    refusing = _refused_flag(sqsh, tmp_path, capsys)
    overriding = _job_env(sqsh, tmp_path, capsys, pyxis_slurm)
    print(f"\npyxis CPU partition jobs: passing {passing:.0f} s, refused flag {refusing:.0f} s, "
          f"job env {overriding:.0f} s")  # fmt: skip


def _refused_flag(sqsh: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> float:
    """A flag the engine refuses: the job fails at the model's listing, in vLLM's words."""
    images = tmp_path / "images"
    images.mkdir()
    spec = (REPO / f"images/{CPU_IMAGE}.toml").read_text()
    bad = spec.replace(
        '"--enable-prefix-caching",', '"--enable-prefix-caching", "--kv-cache-dtype", "fp9",'
    )
    assert bad != spec
    (images / f"{CPU_IMAGE}.toml").write_text(bad)
    shutil.copy(REPO / "schemas/image-spec.schema.json", tmp_path / "image-spec.schema.json")
    started = time.monotonic()
    code, out = _cpu_job(sqsh, tmp_path / "refused", capsys, "--submit", "--images", str(images))
    refused = out["collected"]
    assert code == 4 and refused["ok"] is False and refused["job"]["state"] == "FAILED"
    listed = _gates(refused)["listed"]
    assert listed["status"] == "failed" and listed["detail"].startswith("vllm-serve: exited")
    assert "vllm serve: error: argument --kv-cache-dtype: invalid choice: 'fp9'" in listed["detail"]
    (failure,) = refused["failures"]  # the engine's own line, tied to its stage
    assert failure["stage"] == "init" and failure["file"] == "logs/vllm-serve.log"
    assert failure["line"].startswith("vllm serve: error: argument --kv-cache-dtype: invalid")
    assert _gates(refused)["chat"]["status"] == "not run"
    return time.monotonic() - started


def _job_env(
    sqsh: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], slurm: dict[str, str]
) -> float:
    """The job's env as pyxis applies it (pyxis#124): a baked name the job exports stays the
    image's; one it also names with --container-env reaches the engine, and the env gate says
    so before the engine loads."""
    from k3env.cli import main

    code, out = _cpu_job(sqsh, tmp_path / "env", capsys)
    assert code == 0
    assert out["written"]["validation"] is None  # no srt-slurm recipe
    baked = json.loads((tmp_path / "env/bin/plan.json").read_text())["env"]
    kept, replaced = sorted(baked)[:2]  # a value each takes (PYTHONHASHSEED: an integer)
    assert "7" not in (baked[kept], baked[replaced])
    script = tmp_path / "env/smoke.sbatch"
    text = script.read_text()
    text = text.replace("set -u\n", f"set -u\nexport {kept}=7 {replaced}=7\n")
    text = text.replace(
        "--no-container-entrypoint", f"--no-container-entrypoint --container-env={replaced}"
    )
    script.write_text(text)
    env = {**os.environ, "SLURM_CONF": slurm["SLURM_CONF"]}
    started = time.monotonic()
    done = subprocess.run(["sbatch", "--wait", "--parsable", str(script)], env=env,
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode != 0, done.stdout
    job_dir = tmp_path / "env" / f"job-{done.stdout.strip().split(';')[0]}"
    code = main(["smoke", "--collect", str(job_dir), "--json", "-q"])
    wrong = json.loads(capsys.readouterr().out)["collected"]
    assert code == 4
    env_gate = _gates(wrong)["env"]
    assert env_gate["status"] == "failed"
    assert (
        f"vllm-serve sees {replaced} '7', the image bakes {baked[replaced]!r}"
        in (env_gate["detail"])
    )
    assert env_gate["detail"].startswith("1 baked env value(s) not what")  # not `kept`
    assert _gates(wrong)["listed"]["status"] == "not run"
    return time.monotonic() - started


@pytest.fixture
def staged_slurm(
    tmp_path_factory: pytest.TempPathFactory, slurm_release: SlurmRelease
) -> Iterator[tuple[dict[str, str], Path]]:
    """pyxis with k3env's importer in plugstack.conf (docs/staging.md's admin setup: a wrapper that
    names the cache), and that cache."""
    root = Path(tmp_path_factory.mktemp("staged"))
    cache = root / "cache"
    importer = root / "k3env-importer"
    mode = f'"$(cat {root}/mode 2>/dev/null || echo required)"'
    importer.write_text(f"#!/bin/sh\nexport K3ENV_STAGE_CACHE={cache}\n"
                        f"export K3ENV_STAGE_MODE={mode}\n"
                        f'exec {sys.executable} -m k3env.handoff.importer "$@"\n')  # fmt: skip
    importer.chmod(0o755)
    with _pyxis(root, slurm_release, importer) as env:
        yield env, cache


def _srun_fails(env: dict[str, str], *argv: str) -> str:
    done = subprocess.run(["srun", "--nodes=1", "--ntasks=1", *argv], capture_output=True,
                          text=True, timeout=300, env={**os.environ, **env})  # fmt: skip
    assert done.returncode != 0, done.stdout
    return done.stdout + done.stderr


def test_a_staged_image_starts_from_the_cache_and_a_tampered_one_never(
    project: Path,
    staged_slurm: tuple[dict[str, str], Path],
    capsys: pytest.CaptureFixture[str],
    clean_probe_images: None,
) -> None:
    env, cache = staged_slurm
    pushed = run_json(capsys, "push")["images"][0]
    run_json(capsys, "export", "--out", "sqsh")
    (entry,) = run_json(capsys, "stage", "--cache", str(cache))["staged"]
    assert entry["copied"] and entry["digest"] == pushed["digest"]
    again = run_json(capsys, "stage", "--cache", str(cache))["staged"]
    assert not again[0]["copied"]  # staged once
    provenance = json.loads((Path(entry["path"]).parent / "provenance.json").read_text())
    assert provenance["image"] == entry["image"]  # k3env's own, read from the image, beside it
    image = "--container-image=" + pushed["enroot_uri"].removeprefix("docker://")
    started = time.monotonic()
    out = _srun(env, image, "cat", "/etc/k3env/provenance.json")
    staged_start = time.monotonic() - started
    assert f'"image": "{entry["image"]}"' in out
    # Started from the staged file: enroot imported nothing, and the job's hold is released.
    enroot_cache = cache.parent / "enroot/cache"
    assert not any(enroot_cache.iterdir()), list(enroot_cache.iterdir())
    holds = Path(entry["path"]).parent / "holds"
    assert list(holds.iterdir()) == []
    # A byte changed in place: the importer refuses it, the container never starts.
    staged_file = Path(entry["path"])
    data = bytearray(staged_file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    staged_file.write_bytes(bytes(data))
    words = _srun_fails(env, image, "true")
    assert "refusing to start it" in words, words
    # Not staged (mode required): the step fails before anything starts, naming the fix.
    shutil.rmtree(staged_file.parent)
    words = _srun_fails(env, image, "true")
    assert "is not staged for" in words and "k3env stage" in words, words
    # Mode auto imports with enroot. enroot 4.1.2's permission probe is a HEAD with no Accept
    # header, which this registry (distribution 2.8, no auth) answers 404 for an OCI manifest
    # like k3env's; the test base, pushed by docker as a Docker v2 manifest, is served.
    base = f"{REGISTRY}#k3env-test/base@{_docker_v2_digest('k3env-test/base', '1')}"
    import_start = _two_jobs_miss_at_once(env, cache, base)
    print(f"\nstart through pyxis's importer: staged {staged_start:.1f} s, "
          f"imported and staged (mode auto) {import_start:.1f} s")  # fmt: skip


def _docker_v2_digest(repo: str, tag: str) -> str:
    import urllib.request

    req = urllib.request.Request(
        f"http://{REGISTRY}/v2/{repo}/manifests/{tag}", method="HEAD",
        headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"},
    )  # fmt: skip
    with urllib.request.urlopen(req, timeout=10) as response:
        return str(response.headers["Docker-Content-Digest"])


def _two_jobs_miss_at_once(env: dict[str, str], cache: Path, uri: str) -> float:
    """Mode auto: two steps that miss at once; one imports with enroot and stages, the other
    waits on the digest's lock and finds it staged. One file, nothing partial."""
    (cache.parent / "mode").write_text("auto")
    platform = {"x86_64": "linux_amd64", "aarch64": "linux_arm64"}[os.uname().machine]
    where = cache / platform / uri.rsplit("@sha256:", 1)[1]
    started = time.monotonic()
    argv = ["srun", "--nodes=1", "--ntasks=1", "--overlap", f"--container-image={uri}",
            "cat", "/etc/debian_version"]  # fmt: skip
    steps = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, **env}) for _ in range(2)]  # fmt: skip
    outs = [p.communicate(timeout=600) for p in steps]
    seconds = time.monotonic() - started
    for p, (out, err) in zip(steps, outs, strict=True):
        assert p.returncode == 0 and out.strip(), err[-3000:]
    assert sorted(x.name for x in where.iterdir()) == ["entry.json", "holds", "image.sqsh"]
    assert not list(where.parent.glob(".*import*"))
    entry = json.loads((where / "entry.json").read_text())
    assert entry["imported_on"] and entry["sha256"]
    return seconds


JOB_USER = "k3env-job"


@pytest.fixture
def shared_slurm(slurm_release: SlurmRelease) -> Iterator[tuple[dict[str, str], Path, Path]]:
    """docs/staging.md's admin setup where every user reaches it (pytest's tmp_path is root's,
    0700): k3env installed where a job's user can read it, the importer wrapper running it with the
    system's python3 (root's interpreter is not theirs to run), enroot's paths per user.
    Yields the Slurm env, the cache, and an outside directory (root's, 0700)."""
    import tempfile

    # A job's user has a login shell (enroot starts the container's command with it), where
    # Slurm runs (PATH: the host's usermod, or a Slurm root's); usermod exits 6: no such user.
    shell = subprocess.run(["usermod", "--shell", "/bin/sh", JOB_USER], capture_output=True)
    if shell.returncode == 6:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/bin/sh",
                        JOB_USER], check=True)  # fmt: skip
    else:
        assert shell.returncode == 0, shell.stderr
    root = Path(tempfile.mkdtemp(prefix="k3env-slurm-"))
    root.chmod(0o755)
    try:
        shutil.copytree(REPO / "k3env", root / "pkg/k3env",
                        ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
        for d, _, files in os.walk(root / "pkg"):
            os.chmod(d, 0o755)
            for f in files:
                os.chmod(os.path.join(d, f), 0o644)
        cache = root / "cache"
        importer = root / "k3env-importer"
        importer.write_text(f"#!/bin/sh\nexport K3ENV_STAGE_CACHE={cache}\n"
                            f"export PYTHONPATH={root}/pkg PYTHONDONTWRITEBYTECODE=1\n"
                            'exec /usr/bin/python3 -m k3env.handoff.importer "$@"\n')  # fmt: skip
        importer.chmod(0o755)
        outside = root / "outside"
        outside.mkdir(mode=0o700)
        with _pyxis(root, slurm_release, importer, per_user=True) as env:
            yield env, cache, outside
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _srun_as(user: str, env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    """``srun ARGV`` submitted by ``user`` (its step, its importer, its enroot)."""
    full = {"PATH": os.environ["PATH"], "SLURM_CONF": env["SLURM_CONF"], "TMPDIR": "/tmp"}
    return subprocess.run(["runuser", "-u", user, "--", "srun", "--chdir=/tmp", "--nodes=1",
                           "--ntasks=1", *argv], capture_output=True, text=True, timeout=300,
                          env=full, cwd="/tmp")  # fmt: skip


def test_a_job_of_another_user_starts_a_staged_image_and_never_a_planted_one(
    project: Path,
    shared_slurm: tuple[dict[str, str], Path, Path],
    capsys: pytest.CaptureFixture[str],
    clean_probe_images: None,
) -> None:
    """The importer as pyxis runs it for a job of an unprivileged user (not root): the staged
    image starts; a symlink planted at the entry's holds/ (to a 0700 directory outside) and a
    FIFO at its entry.json fail the step in the importer's words, at once, and nothing outside
    the cache is touched."""
    if not Path("/usr/bin/python3").is_file() or shutil.which("runuser") is None:
        _require("the system's python3 and runuser (a job's user runs the importer)")
    env, cache, outside = shared_slurm
    pushed = run_json(capsys, "push")["images"][0]
    run_json(capsys, "export", "--out", "sqsh")
    (entry,) = run_json(capsys, "stage", "--cache", str(cache))["staged"]
    where = Path(entry["path"]).parent
    image = "--container-image=" + pushed["enroot_uri"].removeprefix("docker://")
    done = _srun_as(JOB_USER, env, image, "cat", "/etc/k3env/provenance.json")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f'"image": "{entry["image"]}"' in done.stdout
    assert list((where / "holds").iterdir()) == []  # held by the job, released after it
    for plant in ("holds", "entry.json"):
        started = time.monotonic()
        target = where / plant
        if plant == "holds":
            target.rmdir()
            target.symlink_to(outside)
        else:
            target.unlink()
            os.mkfifo(target, 0o666)
        failed = _srun_as(JOB_USER, env, image, "true")
        words = failed.stdout + failed.stderr
        assert failed.returncode != 0, words
        assert "refused" in words and ("symlink" in words or "FIFO" in words), words
        assert "Traceback" not in words
        assert time.monotonic() - started < 60  # no hang on the FIFO
        assert list(outside.iterdir()) == [] and stat.S_IMODE(outside.stat().st_mode) == 0o700
        target.unlink()
        done = run_json(capsys, "stage", "--cache", str(cache))["staged"]
        # Staged again: the planted file replaced, the removed link's holds/ made anew.
        assert done[0]["copied"] is (plant == "entry.json") and (where / "holds").is_dir()
