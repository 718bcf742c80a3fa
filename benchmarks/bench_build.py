"""Benchmark: `k3env build` against a plain `docker build` of the same change, over the twin.

One run prints, for a base of at least 2 GB (the CPU twin: Debian + vLLM + Dynamo + torch):
  * cold derived build (nothing cached: patch target read from the base, layer, load)
  * rebuild after editing one env var, k3env vs `docker build` of an equivalent Dockerfile
    (FROM base, COPY patched file, ENV, LABEL), with BuildKit (the engine's builder,
    DOCKER_BUILDKIT=1) and with the legacy builder (DOCKER_BUILDKIT=0)
  * ratio k3env / docker build, for each builder (goal <= 1.0)
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
from pathlib import Path

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


def timed(argv: list[str], *, cwd: Path, env: dict[str, str] | None = None) -> float:
    start = time.perf_counter()
    proc = subprocess.run(
        argv, cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True
    )
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"benchmark command failed: {' '.join(argv)}\n{proc.stdout}\n{proc.stderr}")
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


def clean(engine: DockerEngine) -> None:
    for name in ("k3env-bench/derived", "k3env-bench/docker"):
        ids = subprocess.run(
            ["docker", "images", "-q", name], capture_output=True, text=True, check=True
        ).stdout.split()
        if ids:
            subprocess.run(["docker", "rmi", "-f", *set(ids)], capture_output=True, check=True)
    subprocess.run(["docker", "image", "prune", "-f"], capture_output=True, check=True)


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
    lock = load_lock(REPO / "pins/k3.lock.toml")
    reference, digest = ensure_twin(lock, engine, State(), Log())
    base_repo, base_tag = reference.rsplit(":", 1)
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
    k3env = [sys.executable, "-m", "k3env", "build", "--lock", "pins/bench.lock.toml"]
    builders = {"buildkit": {"DOCKER_BUILDKIT": "1"}, "legacy": {"DOCKER_BUILDKIT": "0"}}

    cold: list[float] = []
    warm: list[float] = []
    noop: list[float] = []
    docker_cold: dict[str, list[float]] = {b: [] for b in builders}
    docker_warm: dict[str, list[float]] = {b: [] for b in builders}
    with tempfile.TemporaryDirectory(prefix="k3env-bench-") as tmp:
        root = Path(tmp)
        state = {"K3ENV_STATE_DIR": str(root / "state")}
        for i in range(args.repeat):
            clean(engine)
            shutil.rmtree(root / "state", ignore_errors=True)
            # k3env: cold build (no facts cached), then an env edit, then a no-op rebuild.
            write_project(root, base_repo, base_tag, digest, f"{i}-a")
            cold.append(timed(k3env, cwd=root, env=state))
            write_project(root, base_repo, base_tag, digest, f"{i}-b")
            warm.append(timed(k3env, cwd=root, env=state))
            noop.append(timed(k3env, cwd=root, env=state))
            # docker build of the same change, per builder: first build, then the env edit.
            build = [DOCKER_CLI, "build", "-t", "k3env-bench/docker:x"]
            text = original.content.decode()
            for name, env in builders.items():
                clean(engine)
                ctx = docker_context(root, reference, target, text, f"{i}-{name}-a")
                docker_cold[name].append(timed([*build, str(ctx)], cwd=root, env=env))
                ctx = docker_context(root, reference, target, text, f"{i}-{name}-b")
                docker_warm[name].append(timed([*build, str(ctx)], cwd=root, env=env))
        clean(engine)

    # Preflight of every image in images/ (no engine): in-process and as a whole command.
    from k3env.checks.preflight import contexts, run_rules
    from k3env.checks.rules import RULES
    from k3env.config.cluster import DEFAULT_CLUSTER, load_cluster
    from k3env.config.spec import load_specs

    pre_in, pre_cmd = [], []
    for _ in range(1 if args.quick else max(args.repeat, 5)):
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

    med = statistics.median
    result = {
        "engine": engine.describe(),
        "base": reference,
        "base_size_bytes": size,
        "repeat": args.repeat,
        "k3env_cold_s": round(med(cold), 3),
        "k3env_env_edit_s": round(med(warm), 3),
        **{
            key: value
            for b in builders
            for key, value in {
                f"docker_{b}_cold_s": round(med(docker_cold[b]), 3),
                f"docker_{b}_env_edit_s": round(med(docker_warm[b]), 3),
                f"ratio_cold_vs_{b}": round(med(cold) / med(docker_cold[b]), 3),
                f"ratio_env_edit_vs_{b}": round(med(warm) / med(docker_warm[b]), 3),
            }.items()
        },
        "noop_rebuild_s": round(med(noop), 3),
        "preflight_images": len(pre_specs),
        "preflight_profiles": len(report.checked),
        "preflight_in_process_ms": round(med(pre_in) * 1000, 2),
        "preflight_command_ms": round(med(pre_cmd) * 1000, 1),
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"base {reference}: {size / 1e9:.2f} GB on {result['engine']}, median of {args.repeat}"
        )
        print(f"  {'':28} {'k3env':>8} {'docker build':>13} {'ratio':>7}")
        for b in builders:
            for what, kk, dk, rk in (
                ("first build (cold)", "k3env_cold_s", f"docker_{b}_cold_s", f"ratio_cold_vs_{b}"),
                ("rebuild after env edit", "k3env_env_edit_s", f"docker_{b}_env_edit_s",
                 f"ratio_env_edit_vs_{b}"),
            ):  # fmt: skip
                print(
                    f"  {what + ', vs ' + b:28} {result[kk]:>7.3f}s {result[dk]:>12.3f}s "
                    f"{result[rk]:>7.3f}"
                )
        print(f"  {'no-op rebuild (cache hit)':28} {result['noop_rebuild_s']:>7.3f}s")
        print("  goal: ratio <= 1.0, no-op < 1 s")
        print(
            f"preflight of all {result['preflight_images']} images in images/ "
            f"({result['preflight_profiles']} profiles, {report.rules} rules): "
            f"{result['preflight_in_process_ms']} ms in process, "
            f"{result['preflight_command_ms']} ms as `k3env preflight` (goal < 200 ms)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
