"""Rules on a recipe's own numbers: what it asks of Slurm (nodes, GPUs per node, workers, GPUs a
worker) against its engine's parallel sizes and against the cluster profile. No image needed.

srt-slurm places each worker on ``gpus_per_<role>`` GPUs (``<role>_nodes x gpus_per_node /
<role>_workers`` unless written; ``ResourceConfig`` in src/srtctl/core/schema.py, v1.0.36 and
2.x's ``expand_roles``) and asks Slurm for ``--gpus-per-node=gpus_per_node`` (its sbatch
template); vLLM starts TP x PP x DP ranks a worker, one per GPU.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from k3env.checks.preflight import ERROR, WARNING, Context, Hit
from k3env.config.srtrecipe import JobShape, RoleAsk

# srt-slurm takes these over on the direct vLLM frontend (v1.0.36 + PR #278 + the multi-node
# patch, backends/vllm.py `_VLLM_ORCHESTRATION_FLAGS`: dropped, with a warning at dry-run);
# on the Dynamo worker the recipe's flags follow srt-slurm's own, and argparse keeps the last.
ORCHESTRATED = "vllm"


def _sizes(role: RoleAsk) -> str:
    tp, pp, dp = (role.parallel[k] for k in ("tensor", "pipeline", "data"))
    return f"TP {tp} x PP {pp} x DP {dp}"


def _gpus_key(ctx: Context, job: JobShape, role: RoleAsk) -> str:
    """The recipe key that sets how many GPUs a worker gets: its explicit GPUs a worker, else
    a gpus_per_node that is not the cluster's, else its node count."""
    if "gpus" in role.written:
        return role.key("gpus")
    if job.gpus_per_node != ctx.cluster.gpus_per_node or "nodes" not in role.written:
        return "resources.gpus_per_node"
    return role.key("nodes")


def job_ranks(ctx: Context) -> Iterable[Hit]:
    """Each worker's TP x PP x DP against the GPUs srt-slurm gives it; the workers against the
    nodes their role asks for; an ``nnodes`` flag against those nodes."""
    job = ctx.job
    if job is None:
        return
    for role in job.roles:
        yield from _role_ranks(ctx, job, role)
        yield from _role_fits(job, role)
        yield from _nnodes(ctx, job, role)


def _role_ranks(ctx: Context, job: JobShape, role: RoleAsk) -> Iterable[Hit]:
    if role.workers <= 0:
        yield Hit(
            key=role.key("workers"),
            message=(
                f"the recipe starts no {role.role} worker: {role.key('workers')} is "
                f"{'0' if 'workers' in role.written else 'not written'} (srt-slurm counts "
                f"`{role.role}_workers or 0` workers)"
            ),
            fix=f"write {role.key('workers')}: 1 (or how many {role.role} workers it runs)",
        )
        return
    ranks = role.ranks
    if ranks is None:
        bad = [k for k, v in role.parallel.items() if v is None]
        yield Hit(
            key=role.parallel_keys[bad[0]],
            severity=WARNING,
            message=f"{role.parallel_keys[bad[0]]} is not a whole number: the ranks of a "
            f"{role.role} worker are not counted here (vLLM's parser refuses it)",
            fix="write the size as a number",
        )
        return
    if ranks == role.gpus:
        return
    over = ranks > role.gpus
    yield Hit(
        key=_gpus_key(ctx, job, role),
        severity=ERROR if over else WARNING,
        message=(
            f"{_sizes(role)} = {ranks} ranks in each {role.role} worker, but srt-slurm gives it "
            f"{role.gpus} GPUs ({role.gpus_said}): "
            + (
                f"vLLM cannot place {ranks} ranks on {role.gpus} GPUs, the worker never starts"
                if over
                else f"{role.gpus - ranks} of them sit idle"
            )
        ),
        fix=(
            f"give each {role.role} worker {ranks} GPUs ({role.key('nodes')}: "
            f"{math.ceil(ranks * role.workers / max(ctx.cluster.gpus_per_node, 1))} with "
            f"gpus_per_node: {ctx.cluster.gpus_per_node}), or parallel sizes of {role.gpus} ranks"
        ),
    )


def _role_fits(job: JobShape, role: RoleAsk) -> Iterable[Hit]:
    """The workers' GPUs fit the nodes the role asks for (colocated decode: the prefill's)."""
    host = role
    if role.nodes is None:
        prefill = job.role("prefill")
        if role.role != "decode" or prefill is None or prefill.nodes is None:
            return
        host = prefill
    elif role.role == "prefill" and (decode := job.role("decode")) and decode.nodes is None:
        return  # judged with the decode role that shares its nodes
    sharing = [r for r in job.roles if r is role or (host is not role and r is host)]
    need = sum(r.workers * r.gpus for r in sharing)
    assert host.nodes is not None
    have = host.nodes * job.gpus_per_node
    if need <= have:
        return
    said = " + ".join(f"{r.workers} {r.role} x {r.gpus}" for r in sharing)
    yield Hit(
        key=role.key("workers") if "workers" in role.written else role.key("nodes"),
        message=(
            f"{said} GPUs = {need} GPUs, but {host.key('nodes')} {host.nodes} x "
            f"gpus_per_node {job.gpus_per_node} = {have}: srt-slurm cannot place the workers"
        ),
        fix=f"ask for {math.ceil(need / max(job.gpus_per_node, 1))} node(s), or fewer workers",
    )


def _nnodes(ctx: Context, job: JobShape, role: RoleAsk) -> Iterable[Hit]:
    """An ``nnodes`` flag the recipe writes against the nodes one worker spans."""
    if role.nnodes is None:
        return
    key, value = role.nnodes
    spans = math.ceil(role.gpus / max(job.gpus_per_node, 1))
    direct = ctx.frontend_type == ORCHESTRATED
    if str(value) == str(spans) and not direct:
        return
    if direct:
        yield Hit(
            key=key,
            severity=WARNING,
            message=(
                f"nnodes {value}: on the direct vLLM frontend srt-slurm sets --nnodes itself "
                f"({spans}, the nodes of one {role.role} worker) and drops this key"
            ),
            fix="remove it: srt-slurm derives --nnodes from the allocation",
        )
        return
    yield Hit(
        key=key,
        message=(
            f"--nnodes {value}, but each {role.role} worker spans {spans} node(s) "
            f"({role.gpus_said}, {job.gpus_per_node} a node): srt-slurm passes --nnodes {spans} "
            f"and this one after it, which argparse keeps; the ranks wait for nodes that never join"
        ),
        fix=f"remove it (srt-slurm passes --nnodes {spans}), or size the role's nodes to it",
    )


def job_cluster(ctx: Context) -> Iterable[Hit]:
    """The recipe's ``gpu_type``, ``gpus_per_node`` and node count against the cluster profile."""
    job, c = ctx.job, ctx.cluster
    if job is None:
        return
    if job.gpu_type is not None and job.gpu_type.lower() != c.gpu.lower():
        yield Hit(
            key="resources.gpu_type",
            message=(
                f"gpu_type {job.gpu_type}, but the cluster profile {c.name} has {c.gpu}: the "
                f"rules judge memory, workspaces and NVLink for {c.gpu}"
            ),
            fix=f"write gpu_type: {c.gpu.lower()}, or judge it with --cluster for a "
            f"{job.gpu_type} cluster",
        )
    if job.gpus_per_node != c.gpus_per_node:
        written = "" if job.gpus_per_node_written else " (not written: srt-slurm's default)"
        more = job.gpus_per_node > c.gpus_per_node
        yield Hit(
            key="resources.gpus_per_node",
            message=(
                f"gpus_per_node {job.gpus_per_node}{written}, but a {c.name} node has "
                f"{c.gpus_per_node} {c.gpu} GPUs: srt-slurm asks Slurm for "
                f"--gpus-per-node={job.gpus_per_node} and sizes every worker by it"
                + ("; Slurm cannot give it" if more else "")
            ),
            fix=f"write gpus_per_node: {c.gpus_per_node}, or judge it with --cluster for "
            f"nodes of {job.gpus_per_node} GPUs",
        )
    nodes = sum(r.nodes or 0 for r in job.roles)
    if nodes > c.nodes:
        yield Hit(
            key=next(r.key("nodes") for r in job.roles if r.nodes),
            message=f"the recipe asks for {nodes} nodes, but {c.name} has {c.nodes}",
            fix=f"fit the roles on {c.nodes} node(s), or use the profile of a larger cluster",
        )


def nvlink_domain(ctx: Context) -> int:
    """The GPUs a TP group can span on NVLink in this job: the cluster's domain where it joins
    nodes (GB200/GB300 NVL72), else the GPUs the job has on one node."""
    c = ctx.cluster
    domain = c.nvlink_domain_gpus
    if ctx.job is None or domain > c.gpus_per_node:
        return domain
    return min(domain, ctx.job.gpus_per_node)


def job_tp_nvlink(ctx: Context) -> Iterable[Hit]:
    """Each role's TP group within the NVLink domain the job's nodes give it."""
    job = ctx.job
    if job is None:
        return
    domain = nvlink_domain(ctx)
    for role in job.roles:
        tp = role.parallel["tensor"]
        if tp is None or tp <= domain:
            continue
        where = (
            f"a {ctx.cluster.name} NVLink domain ({ctx.cluster.nvlink_domain_gpus} GPUs)"
            if domain == ctx.cluster.nvlink_domain_gpus
            else f"one node's {domain} GPUs (gpus_per_node {job.gpus_per_node})"
        )
        yield Hit(
            key=role.parallel_keys["tensor"],
            message=(
                f"tensor-parallel-size {tp} spans more than {where}: every layer's all-reduce "
                "crosses the network"
            ),
            fix=f"keep TP within {domain} GPUs and span nodes with pipeline-parallel-size",
        )
