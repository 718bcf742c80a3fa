"""Benchmark: `k3env build` against a plain `docker build` of the same change, over the twin.

On the engine DOCKER_HOST names, with the docker client ``--docker-cli`` names (Docker 28: its
own, docker-cli + buildx, which `K3ENV_DOCKER28_CLI=1 scripts/engine28.sh` installs and names
as DOCKER_CLI; Debian 12's 20.10 client cannot drive that BuildKit), for a base of at least
2 GB (the CPU twin: Debian + vLLM + Dynamo + torch; an engine that lacks it pulls it from the
local registry its reference names, where the first engine's run pushed it):
  * cold derived build (nothing cached: patch target read from the base, layer, load)
  * rebuild after editing one env var, k3env vs `docker build` of an equivalent Dockerfile
    (FROM base, COPY patched file, ENV, LABEL), with BuildKit and, below Docker 23 (where the
    client still offers it), with the legacy builder (DOCKER_BUILDKIT=0)
  * ratio k3env / docker build, for each builder (goal <= 1.0)
  * beside it, the first build of a Dockerfile that patches the file in the image (FROM base,
    RUN sed on the module's path, ENV, LABEL): what a Dockerfile does from the same inputs
    (the base and the edit, not a patched copy of the file read out of the base beforehand)
  * no-op rebuild (cache hit), as a whole `k3env build` process (goal < 1 s)
Every `docker build` runs with --network=none (k3env's container in the base has none). Each
round runs k3env's builds and docker's back to back, who goes first alternating; a figure is
the median of --repeat rounds, a ratio the median of each round's ratio (both sides of a round
saw the same machine), and --json gives every round's figures too. Every command is a fresh
process run as a user runs it (k3env with its progress output, `docker build` with its own).
"""

from __future__ import annotations

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

from twin_image import arguments  # noqa: E402

from k3env.config.lock import load_lock  # noqa: E402
from k3env.engine.dockerd import DockerEngine  # noqa: E402
from k3env.engine.registry import tagged_config  # noqa: E402
from k3env.hashing import file_sha256  # noqa: E402
from k3env.image import twin  # noqa: E402
from k3env.image.build import find_modules_script  # noqa: E402
from k3env.log import Log  # noqa: E402
from k3env.state import State  # noqa: E402

# The default client: Debian 12's own (docker.io 20.10), which drives the BuildKit embedded in
# its dockerd (DOCKER_BUILDKIT=1); a newer CLI elsewhere on PATH wants the buildx plugin for that.
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


def out(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def clean(cli: str) -> None:
    """Nothing of an earlier round left: its images, and BuildKit's build cache, which outlives
    them (without this, BuildKit's "first" build of the same file is a cache hit)."""
    for name in ("k3env-bench/derived", "k3env-bench/docker"):
        ids = out([cli, "images", "-q", name]).split()
        if ids:
            subprocess.run([cli, "rmi", "-f", *set(ids)], capture_output=True, check=True)
    subprocess.run([cli, "image", "prune", "-f"], capture_output=True, check=True)
    subprocess.run([cli, "builder", "prune", "-af"], capture_output=True, check=True)


# The builders a client offers for `docker build`: from Docker 23 on, BuildKit (through buildx)
# is the builder and the legacy one is deprecated; below it both, chosen by DOCKER_BUILDKIT.
BUILDERS = {"buildkit": {"DOCKER_BUILDKIT": "1"}, "legacy": {"DOCKER_BUILDKIT": "0"}}


@dataclass(frozen=True, kw_only=True)
class Docker:
    """The engine, its image store and the docker client the anchors are built with."""

    cli: str
    engine: str
    store: str
    client: str
    builders: dict[str, dict[str, str]]


def docker_client(engine: DockerEngine, cli: str) -> Docker:
    version = json.loads(out([cli, "version", "--format", "{{json .}}"]))
    client = f"docker {version['Client']['Version']}"
    if int(str(version["Server"]["Version"]).split(".")[0]) < 23:
        builders = BUILDERS
    else:
        builders = {"buildkit": {}}  # `docker build` as its users run it: buildx's
        client += f" + buildx {out([cli, 'buildx', 'version']).split()[1]}"
    return Docker(cli=cli, engine=engine.describe(), store=engine.image_store(), client=client,
                  builders=builders)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Base:
    """The twin the builds derive from, and the file the patch replaces in it."""

    reference: str
    digest: str
    size: int
    target: str  # the patched module's path in the image
    text: str  # its content in the base


@dataclass(frozen=True, kw_only=True)
class Rounds:
    """Each round's seconds, by figure, and who went first in each round."""

    seconds: dict[str, list[float]]
    first: list[str]


@dataclass(frozen=True, kw_only=True)
class PreflightTimes:
    in_process: list[float]
    command: list[float]
    images: int
    profiles: int
    rules: int


def main() -> int:
    quick = "every path once (CI: the benchmark still runs, its figures are no verdict)"
    ap = arguments(__doc__, quick, repeat=3)
    ap.add_argument(
        "--docker-cli",
        default=DOCKER_CLI,
        metavar="PATH",
        help="the docker client of the anchors (Docker 28: engine28.sh's DOCKER_CLI)",
    )
    args = ap.parse_args()
    if args.quick:
        args.repeat = 1

    engine = DockerEngine()
    docker = docker_client(engine, args.docker_cli)
    base = twin_base(engine, docker.cli)
    builds = time_builds(base, docker, args.repeat)
    preflight = time_preflight(1 if args.quick else max(args.repeat, 5))
    result = summary(docker, base, args.repeat, builds, preflight)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result, base, docker, preflight.rules)
    return 0


def twin_base(engine: DockerEngine, cli: str) -> Base:
    """The CPU twin (pulled from its registry, else made, when missing), its size, and the
    module the patch edits."""
    lock = load_lock(REPO / "pins/k3.lock.toml")
    repository, tag = twin.plan(lock).reference.rsplit(":", 1)
    # A second engine takes the twin from the local registry (the first one's run pushed it):
    # the same image, and neither debootstrap nor pip again.
    if engine.lookup(f"{repository}:{tag}") is None and tagged_config(repository, tag):
        engine.pull(f"{repository}:{tag}", Log().live)
    reference, digest = twin.ensure_twin(lock, engine, State(), Log())
    size = int(out([cli, "image", "inspect", "--format", "{{.Size}}", reference]))
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


@dataclass(frozen=True, kw_only=True)
class Round:
    """What one round's builds need: where, over what, with which client; and the figures."""

    root: Path
    base: Base
    docker: Docker
    seconds: dict[str, list[float]]

    def add(self, figure: str, seconds: float) -> None:
        self.seconds.setdefault(figure, []).append(seconds)


def k3env_builds(r: Round, i: int) -> None:
    """k3env: a cold build (no facts cached), then an env edit, then a no-op rebuild."""
    base_repo, base_tag = r.base.reference.rsplit(":", 1)
    k3env = [sys.executable, "-m", "k3env", "build", "--lock", "pins/bench.lock.toml"]
    state = {"K3ENV_STATE_DIR": str(r.root / "state")}
    clean(r.docker.cli)
    shutil.rmtree(r.root / "state", ignore_errors=True)
    write_project(r.root, base_repo, base_tag, r.base.digest, f"{i}-a")
    r.add("k3env_cold_s", timed(k3env, cwd=r.root, env=state))
    write_project(r.root, base_repo, base_tag, r.base.digest, f"{i}-b")
    r.add("k3env_env_edit_s", timed(k3env, cwd=r.root, env=state))
    r.add("noop_rebuild_s", timed(k3env, cwd=r.root, env=state))


def docker_builds(r: Round, i: int) -> None:
    """docker build of the same change, per builder: first build, then the env edit; and the
    first build of the RUN sed Dockerfile. No network for RUN: k3env's own container has none,
    and a host whose dockerd has no bridge (CI's) cannot give one."""
    build = [r.docker.cli, "build", "--network=none", "-t", "k3env-bench/docker:x"]
    b = r.base
    for name, env in r.docker.builders.items():
        clean(r.docker.cli)
        ctx = docker_context(r.root, b.reference, b.target, b.text, f"{i}-{name}-a")
        r.add(f"docker_{name}_cold_s", timed([*build, str(ctx)], cwd=r.root, env=env, cold=True))
        ctx = docker_context(r.root, b.reference, b.target, b.text, f"{i}-{name}-b")
        r.add(f"docker_{name}_env_edit_s", timed([*build, str(ctx)], cwd=r.root, env=env))
        clean(r.docker.cli)
        ctx = docker_run_context(r.root, b.reference, b.target, f"{i}-{name}-r")
        r.add(f"docker_{name}_run_patch_cold_s",
              timed([*build, str(ctx)], cwd=r.root, env=env, cold=True))  # fmt: skip


def time_builds(base: Base, docker: Docker, repeat: int) -> Rounds:
    """``repeat`` rounds of k3env's builds and docker's, each from nothing cached, who goes
    first alternating."""
    times = Rounds(seconds={}, first=[])
    with tempfile.TemporaryDirectory(prefix="k3env-bench-") as tmp:
        r = Round(root=Path(tmp), base=base, docker=docker, seconds=times.seconds)
        for i in range(repeat):
            sides = (k3env_builds, docker_builds) if i % 2 == 0 else (docker_builds, k3env_builds)
            times.first.append("k3env" if i % 2 == 0 else "docker")
            for side in sides:
                side(r, i)
        clean(docker.cli)
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
    docker: Docker, base: Base, repeat: int, b: Rounds, pre: PreflightTimes
) -> dict[str, Any]:
    """The medians and paired ratios (the median of each round's ratio), as --json prints
    them, and every round's figures."""
    med = statistics.median
    s = b.seconds
    pairs = {
        key: (k3env, f"docker_{n}_{figure}")
        for n in docker.builders
        for key, k3env, figure in (
            (f"ratio_cold_vs_{n}", "k3env_cold_s", "cold_s"),
            (f"ratio_env_edit_vs_{n}", "k3env_env_edit_s", "env_edit_s"),
            (f"ratio_cold_vs_{n}_run_patch", "k3env_cold_s", "run_patch_cold_s"),
        )
    }
    return {
        "engine": docker.engine,
        "store": docker.store,
        "client": docker.client,
        "base": base.reference,
        "base_size_bytes": base.size,
        "repeat": repeat,
        **{figure: round(med(seconds), 3) for figure, seconds in s.items()},
        **{
            key: round(med([x / y for x, y in zip(s[k], s[d], strict=True)]), 3)
            for key, (k, d) in pairs.items()
        },
        "preflight_images": pre.images,
        "preflight_profiles": pre.profiles,
        "preflight_in_process_ms": round(med(pre.in_process) * 1000, 2),
        "preflight_command_ms": round(med(pre.command) * 1000, 1),
        "first": b.first,
        "rounds": {figure: [round(x, 4) for x in seconds] for figure, seconds in s.items()},
    }


def print_table(result: dict[str, Any], base: Base, docker: Docker, rules: int) -> None:
    print(f"base {base.reference}: {base.size / 1e9:.2f} GB; median of {result['repeat']}")
    print(f"engine {docker.engine} / {docker.store} store / client {docker.client}")
    print(f"  {'':36} {'k3env':>8} {'docker build':>13} {'ratio':>7}")
    for b in docker.builders:
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
          "Dockerfile from the same inputs; a ratio is the median of each round's")  # fmt: skip
    print(
        f"preflight of all {result['preflight_images']} images in images/ "
        f"({result['preflight_profiles']} profiles, {rules} rules): "
        f"{result['preflight_in_process_ms']} ms in process, "
        f"{result['preflight_command_ms']} ms as `k3env preflight` (goal < 200 ms)"
    )


if __name__ == "__main__":
    raise SystemExit(main())
