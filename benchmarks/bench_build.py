"""Benchmark: `k3env build` against a plain `docker build` of the same change, over the twin.

One run prints, for a base of at least 2 GB (the CPU twin: Debian + vLLM + Dynamo + torch):
  * cold derived build (nothing cached: patch target read from the base, layer, load)
  * rebuild after editing one env var, k3env vs `docker build` of an equivalent Dockerfile
    (FROM base, COPY patched file, ENV, LABEL), with BuildKit (the engine's builder,
    DOCKER_BUILDKIT=1) and with the legacy builder (DOCKER_BUILDKIT=0)
  * ratio k3env / docker build, for each builder (goal <= 1.0)
  * beside it, the first build of a Dockerfile that patches the file in the image (FROM base,
    RUN sed on the module's path, ENV, LABEL): what a Dockerfile does from the same inputs
    (the base and the edit, not a patched copy of the file read out of the base beforehand)
  * no-op rebuild (cache hit), as a whole `k3env build` process (goal < 1 s)
Each figure is the median of --repeat runs; every command is a fresh process run as a user
runs it (k3env with its progress output, `docker build` with its own).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from k3env.config.lock import load_lock  # noqa: E402
from k3env.engine.dockerd import DockerEngine  # noqa: E402
from k3env.hashing import file_sha256  # noqa: E402
from k3env.image.build import find_modules_script  # noqa: E402
from k3env.image.twin import ensure_twin  # noqa: E402
from k3env.log import Log  # noqa: E402
from k3env.state import State  # noqa: E402

# The engine's own client (Debian's docker.io): it drives BuildKit embedded in dockerd 20.10
# (DOCKER_BUILDKIT=1); a newer CLI elsewhere on PATH wants the buildx plugin for that.
DOCKER_CLI = "/usr/bin/docker" if Path("/usr/bin/docker").exists() else "docker"
ANCHOR = '__version__ = "dev"'
REPLACEMENT = '__version__ = "dev+k3env-bench"'


def timed(
    argv: list[str], *, cwd: Path, env: dict[str, str] | None = None, cold: bool = False
) -> float:
    """Seconds of one run of ``argv``; ``cold``: a build that must not answer from a cache."""
    start = time.perf_counter()
    proc = subprocess.run(
        argv, cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True
    )
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"benchmark command failed: {' '.join(argv)}\n{proc.stdout}\n{proc.stderr}")
    # BuildKit's plain progress says CACHED for a step it did not run; the legacy builder
    # says "Using cache". A cold figure that came from a cache would not be one.
    if cold and any(w in proc.stdout + proc.stderr for w in (" CACHED", "Using cache")):
        sys.exit(f"a cold build answered from a cache: {' '.join(argv)}\n{proc.stderr}")
    return elapsed


def write_project(root: Path, base_repo: str, base_tag: str, digest: str, value: str) -> None:
    (root / "pins").mkdir(parents=True, exist_ok=True)
    (root / "images").mkdir(exist_ok=True)
    (root / "patches").mkdir(exist_ok=True)
    patch = root / "patches/version.toml"
    patch.write_text(f"[[edits]]\nanchor = '{ANCHOR}'\nreplacement = '{REPLACEMENT}'\n")
    (root / "pins/bench.lock.toml").write_text(
        textwrap.dedent(
            f"""\
            version = 1
            [bases.twin]
            repository = "{base_repo}"
            tag = "{base_tag}"
            digest = "{digest}"
            [container_patches.version]
            file = "patches/version.toml"
            sha256 = "{file_sha256(patch)}"
            module = "vllm.version"
            bases = ["twin"]
            expects = "the dev fallback version string"
            why = "benchmark"
            """
        )
    )
    (root / "images/bench.toml").write_text(
        textwrap.dedent(
            f"""\
            base = "twin"
            repository = "k3env-bench/derived"
            patches = ["version"]
            [env]
            BENCH_VALUE = "{value}"
            """
        )
    )


def docker_context(root: Path, base_ref: str, target: str, text: str, value: str) -> Path:
    ctx = root / "docker-ctx"
    ctx.mkdir(exist_ok=True)
    (ctx / "version.py").write_text(text.replace(ANCHOR, REPLACEMENT, 1))
    (ctx / "Dockerfile").write_text(
        f"FROM {base_ref}\nCOPY version.py {target}\nENV BENCH_VALUE={value}\n"
        f"LABEL io.k3env.bench={value}\n"
    )
    return ctx


def docker_run_context(root: Path, base_ref: str, target: str, value: str) -> Path:
    """The same change made in the image, as a Dockerfile does without the file in hand."""
    ctx = root / "docker-run-ctx"
    ctx.mkdir(exist_ok=True)
    edit = f"s|{ANCHOR}|{REPLACEMENT}|"
    (ctx / "Dockerfile").write_text(
        f"FROM {base_ref}\nRUN sed -i '{edit}' {target}\nENV BENCH_VALUE={value}\n"
        f"LABEL io.k3env.bench={value}\n"
    )
    return ctx


def clean(engine: DockerEngine) -> None:
    """Nothing of an earlier round left: its images, and BuildKit's build cache, which outlives
    them (without this, BuildKit's "first" build of the same file is a cache hit)."""
    for name in ("k3env-bench/derived", "k3env-bench/docker"):
        ids = subprocess.run(
            ["docker", "images", "-q", name], capture_output=True, text=True, check=True
        ).stdout.split()
        if ids:
            subprocess.run(["docker", "rmi", "-f", *set(ids)], capture_output=True, check=True)
    subprocess.run(["docker", "image", "prune", "-f"], capture_output=True, check=True)
    subprocess.run(["docker", "builder", "prune", "-af"], capture_output=True, check=True)


BUILDERS = {"buildkit": {"DOCKER_BUILDKIT": "1"}, "legacy": {"DOCKER_BUILDKIT": "0"}}


@dataclass(frozen=True, kw_only=True)
class Base:
    """The twin the builds derive from, and the file the patch replaces in it."""

    reference: str
    digest: str
    size: int
    target: str  # the patched module's path in the image
    text: str  # its content in the base


@dataclass(frozen=True, kw_only=True)
class BuildTimes:
    cold: list[float]
    warm: list[float]
    noop: list[float]
    docker_cold: dict[str, list[float]]
    docker_warm: dict[str, list[float]]
    docker_run_cold: dict[str, list[float]]


@dataclass(frozen=True, kw_only=True)
class PreflightTimes:
    in_process: list[float]
    command: list[float]
    images: int
    profiles: int
    rules: int


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="every path once (CI: the benchmark still runs, its figures are no verdict)",
    )
    args = ap.parse_args()
    if args.quick:
        args.repeat = 1

    engine = DockerEngine()
    base = twin_base(engine)
    builds = time_builds(engine, base, args.repeat)
    preflight = time_preflight(1 if args.quick else max(args.repeat, 5))
    result = summary(engine, base, args.repeat, builds, preflight)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result, base, args.repeat, preflight.rules)
    return 0


def twin_base(engine: DockerEngine) -> Base:
    """The CPU twin (made when missing), its size, and the module the patch edits."""
    lock = load_lock(REPO / "pins/k3.lock.toml")
    reference, digest = ensure_twin(lock, engine, State(), Log())
    base = engine.inspect(reference)
    assert base is not None
    size = int(
        subprocess.run(
            ["docker", "image", "inspect", "--format", "{{.Size}}", reference],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    probe = engine.run(
        reference, ["python3", "-c", find_modules_script(), "vllm.version"], timeout=120
    )
    target = json.loads(probe.stdout)["vllm.version"]
    original = engine.read_files(reference, [target])[target]
    assert original is not None
    return Base(
        reference=reference,
        digest=digest,
        size=size,
        target=target,
        text=original.content.decode(),
    )


def time_builds(engine: DockerEngine, base: Base, repeat: int) -> BuildTimes:
    """k3env's cold build, env edit and no-op rebuild; docker build's first build and env
    edit, per builder; ``repeat`` rounds, each from nothing cached."""
    base_repo, base_tag = base.reference.rsplit(":", 1)
    k3env = [sys.executable, "-m", "k3env", "build", "--lock", "pins/bench.lock.toml"]
    times = BuildTimes(
        cold=[],
        warm=[],
        noop=[],
        docker_cold={b: [] for b in BUILDERS},
        docker_warm={b: [] for b in BUILDERS},
        docker_run_cold={b: [] for b in BUILDERS},
    )
    with tempfile.TemporaryDirectory(prefix="k3env-bench-") as tmp:
        root = Path(tmp)
        state = {"K3ENV_STATE_DIR": str(root / "state")}
        for i in range(repeat):
            clean(engine)
            shutil.rmtree(root / "state", ignore_errors=True)
            # k3env: cold build (no facts cached), then an env edit, then a no-op rebuild.
            write_project(root, base_repo, base_tag, base.digest, f"{i}-a")
            times.cold.append(timed(k3env, cwd=root, env=state))
            write_project(root, base_repo, base_tag, base.digest, f"{i}-b")
            times.warm.append(timed(k3env, cwd=root, env=state))
            times.noop.append(timed(k3env, cwd=root, env=state))
            # docker build of the same change, per builder: first build, then the env edit.
            # No network for RUN: k3env's own container has none, and a host whose dockerd
            # has no bridge (CI's) cannot give one.
            build = [DOCKER_CLI, "build", "--network=none", "-t", "k3env-bench/docker:x"]
            for name, env in BUILDERS.items():
                clean(engine)
                ctx = docker_context(root, base.reference, base.target, base.text, f"{i}-{name}-a")
                times.docker_cold[name].append(
                    timed([*build, str(ctx)], cwd=root, env=env, cold=True)
                )
                ctx = docker_context(root, base.reference, base.target, base.text, f"{i}-{name}-b")
                times.docker_warm[name].append(timed([*build, str(ctx)], cwd=root, env=env))
                clean(engine)
                ctx = docker_run_context(root, base.reference, base.target, f"{i}-{name}-r")
                times.docker_run_cold[name].append(
                    timed([*build, str(ctx)], cwd=root, env=env, cold=True)
                )
        clean(engine)
    return times


def time_preflight(rounds: int) -> PreflightTimes:
    """Preflight of every image in images/ (no engine): in-process and as a whole command."""
    from k3env.checks.preflight import contexts, run_rules
    from k3env.checks.rules import RULES
    from k3env.config.cluster import DEFAULT_CLUSTER, load_cluster
    from k3env.config.spec import load_specs

    pre_in, pre_cmd = [], []
    for _ in range(rounds):
        start = time.perf_counter()
        pre_lock = load_lock(REPO / "pins/k3.lock.toml")
        pre_specs = load_specs(REPO / "images", pre_lock)
        report = run_rules(
            contexts(pre_lock, pre_specs, load_cluster(REPO / DEFAULT_CLUSTER), None), RULES
        )
        pre_in.append(time.perf_counter() - start)
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "k3env", "preflight", "-q", "--json"],
            cwd=REPO,
            capture_output=True,
        )
        pre_cmd.append(time.perf_counter() - start)
    return PreflightTimes(
        in_process=pre_in,
        command=pre_cmd,
        images=len(pre_specs),
        profiles=len(report.checked),
        rules=report.rules,
    )


def summary(
    engine: DockerEngine, base: Base, repeat: int, b: BuildTimes, pre: PreflightTimes
) -> dict[str, Any]:
    """The medians and ratios, as --json prints them."""
    med = statistics.median
    return {
        "engine": engine.describe(),
        "base": base.reference,
        "base_size_bytes": base.size,
        "repeat": repeat,
        "k3env_cold_s": round(med(b.cold), 3),
        "k3env_env_edit_s": round(med(b.warm), 3),
        **{
            key: value
            for n in BUILDERS
            for key, value in {
                f"docker_{n}_cold_s": round(med(b.docker_cold[n]), 3),
                f"docker_{n}_env_edit_s": round(med(b.docker_warm[n]), 3),
                f"ratio_cold_vs_{n}": round(med(b.cold) / med(b.docker_cold[n]), 3),
                f"ratio_env_edit_vs_{n}": round(med(b.warm) / med(b.docker_warm[n]), 3),
                f"docker_{n}_run_patch_cold_s": round(med(b.docker_run_cold[n]), 3),
                f"ratio_cold_vs_{n}_run_patch": round(med(b.cold) / med(b.docker_run_cold[n]), 3),
            }.items()
        },
        "noop_rebuild_s": round(med(b.noop), 3),
        "preflight_images": pre.images,
        "preflight_profiles": pre.profiles,
        "preflight_in_process_ms": round(med(pre.in_process) * 1000, 2),
        "preflight_command_ms": round(med(pre.command) * 1000, 1),
    }


def print_table(result: dict[str, Any], base: Base, repeat: int, rules: int) -> None:
    print(
        f"base {base.reference}: {base.size / 1e9:.2f} GB on {result['engine']}, median of {repeat}"
    )
    print(f"  {'':36} {'k3env':>8} {'docker build':>13} {'ratio':>7}")
    for b in BUILDERS:
        for what, kk, dk, rk in (
            ("first build (cold)", "k3env_cold_s", f"docker_{b}_cold_s", f"ratio_cold_vs_{b}"),
            ("rebuild after env edit", "k3env_env_edit_s", f"docker_{b}_env_edit_s",
             f"ratio_env_edit_vs_{b}"),
            ("first build, vs RUN sed", "k3env_cold_s", f"docker_{b}_run_patch_cold_s",
             f"ratio_cold_vs_{b}_run_patch"),
        ):  # fmt: skip
            print(
                f"  {what + ', ' + b:36} {result[kk]:>7.3f}s {result[dk]:>12.3f}s "
                f"{result[rk]:>7.3f}"
            )
    print(f"  {'no-op rebuild (cache hit)':36} {result['noop_rebuild_s']:>7.3f}s")
    print("  goal: ratio <= 1.0 (the COPY rows), no-op < 1 s; RUN sed: the same edit in a "
          "Dockerfile from the same inputs")  # fmt: skip
    print(
        f"preflight of all {result['preflight_images']} images in images/ "
        f"({result['preflight_profiles']} profiles, {rules} rules): "
        f"{result['preflight_in_process_ms']} ms in process, "
        f"{result['preflight_command_ms']} ms as `k3env preflight` (goal < 200 ms)"
    )


if __name__ == "__main__":
    raise SystemExit(main())
