"""The cluster smoke job, rendered: an srt-slurm recipe and a plain sbatch script (pure).

Both start the profile's engine as ``cluster.plan`` sized it, in the image the cluster
imports (by the digest it was pushed under, or its exported ``.sqsh``), and run the CPU
smoke's driver against it. The driver, its plan and the job's manifest are files k3env writes
beside them (``bin/``), mounted into the container at ``/k3env-smoke/bin``: the output
directory must be on a file system the nodes see.

- The recipe's benchmark is srt-slurm's ``custom`` type (``benchmark.command``, run by
  ``bash -lc`` in the job's container on the head node, v1.0.36
  ``srtctl/benchmarks/custom.py``); the driver writes into srt-slurm's log directory, mounted
  at ``/logs`` (``k3env-smoke/`` there is what ``--collect`` reads).
- The sbatch script starts one ``srun`` step per node (pyxis: ``--container-image``), then the
  driver on the first node; a serve step that ends first ends the battery; every step is
  stopped (SIGTERM, then SIGKILL) before the script exits, its status the battery's verdict.
  ``RUNTIME=none`` runs the same steps on the nodes themselves (a Slurm without pyxis).

Every value put into the script is one shell word (``quoting.shell_word``); every value put
into the recipe a YAML scalar (``srt.recipe.to_yaml``).
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from k3env import jsontext
from k3env.cluster.collect import MANIFEST
from k3env.cluster.plan import BIN, DRIVER, PLAN, ClusterSmoke
from k3env.config.cluster import Cluster
from k3env.config.spec import ImageSpec, ServeProfile
from k3env.errors import SpecError
from k3env.quoting import one_line, shell_word
from k3env.smoke.plan import battery_gates
from k3env.srt.recipe import recipe

RUNTIMES = ("pyxis", "none")
# After every smoke job script's #SBATCH lines and $DIR: its own directory, manifest and log.
JOB_LINES = (
    'JOB_DIR="${K3ENV_SMOKE_JOB_DIR:-$DIR/job-$SLURM_JOB_ID}"',
    'mkdir -p "$JOB_DIR/logs"',
    f'cp "$DIR/bin/{MANIFEST}" "$JOB_DIR/"',
    'say() { printf \'[k3env-smoke %s] %s\\n\' "$(date +%H:%M:%S)" "$*"'
    ' | tee -a "$JOB_DIR/job.log"; }',
)
# The end of every smoke job script: no result, a gate failed or not run, or no gate passed
# (k3env.verdict's rule), is a failed job.
VERDICT_LINES = (
    'if [ ! -f "$JOB_DIR/result.json" ]; then',
    '  say "the battery wrote no result"; status=1',
    'elif grep -qE \'"status": "(failed|not run)"\' "$JOB_DIR/result.json"; then',
    '  say "a gate of the battery failed or never ran"; status=1',
    'elif ! grep -q \'"status": "passed"\' "$JOB_DIR/result.json"; then',
    '  say "no gate of the battery passed: nothing was shown to work"; status=1',
    "fi",
    'say "done (status $status): k3env smoke --collect $JOB_DIR"',
    'exit "$status"',
)
SRT_OUT = "/logs/k3env-smoke"  # srt-slurm mounts its log directory at /logs
STOP_SECONDS = 60


def pyxis_image(container: str) -> str:
    """A registry reference as pyxis takes it (``REGISTRY#REPO@sha256:...``); a ``.sqsh``
    path as it is."""
    if container.endswith(".sqsh") or container.startswith("/"):
        return container
    first, sep, rest = container.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return f"{first}#{rest}"
    return container


def manifest(
    smoke: ClusterSmoke, *, container: str, digest: str | None, image_id: str | None
) -> dict[str, Any]:
    """What the job runs, for ``--collect`` to key its verdict by (``k3env-smoke.json``)."""
    return {
        "image": smoke.image,
        "profile": smoke.profile,
        "cluster": smoke.cluster,
        "layers": smoke.layers,
        "container": container,
        "digest": digest,
        "image_id": image_id,
        "topology": smoke.topology.as_json(),
        # Planned before the job runs: `--collect` reads a gate missing from the result as
        # not run, never as passed.
        "gates": list(battery_gates(smoke.battery)),
    }


def driver_command(out: str) -> str:
    """The battery as one shell command: the manifest into ``out``, then the driver."""
    return (
        f"mkdir -p {shell_word(out)} && cp {shell_word(f'{BIN}/{MANIFEST}')} {shell_word(out)}/"
        f" && K3ENV_SMOKE_PLAN={shell_word(PLAN)} K3ENV_SMOKE_OUT={shell_word(out)}"
        f" python3 {shell_word(DRIVER)}"
    )


def time_limit(seconds: float) -> str:
    """Slurm's ``HH:MM:SS`` for ``seconds`` (whole minutes, at least one)."""
    minutes = max(1, math.ceil(seconds / 60))
    return f"{minutes // 60:02d}:{minutes % 60:02d}:00"


def smoke_recipe(
    spec: ImageSpec,
    profile: ServeProfile,
    cluster: Cluster,
    smoke: ClusterSmoke,
    *,
    container: str,
    model_path: str,
    precision: str,
    bin_dir: Path,
    job_timeout: float,
) -> dict[str, Any]:
    """The srt-slurm recipe of the smoke job: ``k3env srt recipe``'s for the sized profile
    (its engine command the smoke's, on the smoke's nodes), its benchmark the battery."""
    (engine,) = profile.commands
    sized = replace(profile, commands=(replace(engine, argv=smoke.argv),), benchmark={})
    out = recipe(
        spec,
        sized,
        replace(cluster, nodes=smoke.topology.nodes),
        smoke.env,
        container=container,
        model_path=model_path,
        precision=precision,
        dynamo_baked=False,
        dynamo_commit=None,
    )
    out["name"] = f"{spec.name}-{profile.name}-smoke"
    out["slurm"] = {"time_limit": time_limit(job_timeout)}
    out["benchmark"] = {"type": "custom", "command": driver_command(SRT_OUT)}
    out["container_mounts"] = {str(bin_dir): BIN}
    return out


def sbatch_script(
    smoke: ClusterSmoke,
    *,
    container: str,
    model_path: str,
    out_dir: Path,
    job_timeout: float,
    runtime: str = "pyxis",
    partition: str | None = None,
) -> str:
    """The plain sbatch script of the smoke job (``out_dir``: absolute, seen by the nodes)."""
    if runtime not in RUNTIMES:
        raise ValueError(runtime)
    q = shell_word
    n = smoke.topology.nodes
    names = sorted(smoke.env)
    if bad := [one_line(name) for name in names if not _env_name(name)]:
        raise SpecError(
            f"env name(s) {bad} cannot be exported by a shell",
            where=f"image {smoke.image} env",
            fix="name env vars with letters, digits and underscores",
        )
    exports = [f"export {name}={q(smoke.env[name])}" for name in names]
    pyxis = ",".join(
        [f"{model_path}:{smoke.model_dir}:ro", f"{out_dir}:{out_dir}", f"{out_dir}/bin:{BIN}"]
    )
    engine = " ".join(q(w) for w in smoke.argv)
    gpus = [f"#SBATCH --gpus-per-node={smoke.topology.gpus_per_node}"] if runtime == "pyxis" else []
    lines = [
        "#!/bin/bash",
        f"# Generated by `k3env smoke --cluster`: {one_line(smoke.image)} / "
        f"{one_line(smoke.profile)} on {one_line(smoke.cluster)}, {smoke.topology.said()}.",
        "# Random weights (--load-format dummy); the battery is k3env's smoke driver.",
        "# Collect its verdicts with: k3env smoke --collect JOB_DIR (printed at the end).",
        f"#SBATCH --job-name={q('k3env-smoke-' + smoke.image)}",
        f"#SBATCH --nodes={n}",
        "#SBATCH --ntasks-per-node=1",
        *gpus,
        *([f"#SBATCH --partition={q(partition)}"] if partition else []),
        f"#SBATCH --time={time_limit(job_timeout)}",
        f"#SBATCH --output={q(str(out_dir))}/slurm-%j.out",
        "set -u",
        f"DIR={q(str(out_dir))}",
        f"RUNTIME=${{K3ENV_SMOKE_RUNTIME:-{q(runtime)}}}",
        *JOB_LINES,
        'mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")',
        'HEAD="${NODES[0]}"',
        *exports,
        'export K3ENV_SMOKE_PLAN="$DIR/bin/plan.json" K3ENV_SMOKE_OUT="$JOB_DIR"',
        'if [ "$RUNTIME" = pyxis ]; then',
        f"  CONTAINER=(--container-image={q(pyxis_image(container))}"
        f" --container-mounts={q(pyxis)} --no-container-entrypoint"
        + (f" --container-env={q(','.join(names))}" if names else "")
        + ")",
        "  DRIVER=" + q(DRIVER),
        "else",
        "  CONTAINER=()",
        '  DRIVER="$DIR/bin/driver.py"',
        "fi",
        "serve=()",
        f"for rank in $(seq 0 {n - 1}); do",
        '  node="${NODES[$rank]}"',
        '  say "start vllm-serve rank $rank on $node"',
    ]
    if n > 1:
        lines += [
            f'  flags=(--nnodes {n} --node-rank "$rank" --master-addr "$HEAD")',
            '  [ "$rank" -gt 0 ] && flags+=(--headless)',
        ]
    else:
        lines.append("  flags=()")
    lines += _serve_and_battery(engine)
    return "\n".join(lines) + "\n"


def _serve_and_battery(engine: str) -> list[str]:
    """The end of each rank's start loop, then the battery on the head node: a serve step
    that ends first ends it; then every step is stopped and the verdict is the job's status."""
    container_words = '${CONTAINER[@]+"${CONTAINER[@]}"}'  # empty without pyxis (bash < 4.4 too)
    return [
        f'  srun --nodes=1 --ntasks=1 --overlap --nodelist="$node" {container_words} \\',
        f'    {engine} ${{flags[@]+"${{flags[@]}}"}} >"$JOB_DIR/logs/vllm-serve-$rank.log" 2>&1 &',
        "  serve+=($!)",
        "done",
        'say "battery on $HEAD"',
        f'srun --nodes=1 --ntasks=1 --overlap --nodelist="$HEAD" {container_words} \\',
        '  python3 "$DRIVER" >"$JOB_DIR/logs/driver.log" 2>&1 &',
        "driver=$!",
        "status=0",
        "# A serve step that ends before the battery does ends the battery: its log says why.",
        'while kill -0 "$driver" 2>/dev/null; do',
        '  for i in "${!serve[@]}"; do',
        '    if ! kill -0 "${serve[$i]}" 2>/dev/null; then',
        '      wait "${serve[$i]}"; code=$?',
        '      say "vllm-serve rank $i exited with status $code before the battery finished"',
        '      kill -TERM "$driver" 2>/dev/null; status=1; break 2',
        "    fi",
        "  done",
        "  sleep 2",
        "done",
        "# The driver exits non-zero when a planned gate failed or never ran.",
        'wait "$driver" 2>/dev/null || { say "the battery exited with status $?"; status=1; }',
        f"# srun forwards SIGTERM to its tasks; what still runs {STOP_SECONDS} s later is killed.",
        'for pid in "${serve[@]}"; do kill -TERM "$pid" 2>/dev/null; done',
        f"for _ in $(seq 1 {STOP_SECONDS}); do",
        "  alive=0",
        '  for pid in "${serve[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done',
        '  [ "$alive" = 0 ] && break',
        "  sleep 1",
        "done",
        'for pid in "${serve[@]}"; do kill -KILL "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; done',
        *VERDICT_LINES,
    ]


def _env_name(name: str) -> bool:
    """A name a shell can export."""
    return (
        bool(name)
        and name.isascii()
        and name.replace("_", "a").isalnum()
        and not (name[0].isdigit())
    )


def plan_json(smoke: ClusterSmoke) -> str:
    """The driver's plan file."""
    return jsontext.dumps(dict(smoke.battery), indent=1) + "\n"
