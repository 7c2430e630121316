"""A verl trial larger than one node: one Ray job on the sweep's own cluster, stopped with its trial.

A verl trial with ``trainer.nnodes > 1`` runs as verl's own multi-node recipes run it: ``python -m
verl.trainer.main_ppo`` with ``RAY_ADDRESS`` set to the cluster's address (verl-facts: "main_ppo with
trainer.nnodes=N trainer.n_gpus_per_node=G on the head, or ray job submit"). ``run_ppo`` in
``verl/trainer/main_ppo.py`` calls ``ray.init(**ray_kwargs.ray_init)`` without an address, which joins
``RAY_ADDRESS``. That process is a new Ray driver, so the run is a Ray job of its own. verl reserves its GPUs itself:
one placement group per node of ``n_gpus_per_node`` bundles ``{"CPU": 3, "GPU": 1}``, ``STRICT_PACK``, waited on
with ``ray.get(pg.ready())`` and no timeout (``RayResourcePool.get_placement_groups`` and
``RayWorkerGroup._init_with_resource_pool`` in ``verl/single_controller/ray/base.py``; 3 is
``ResourcePoolManager.max_colocate_count``), and places one worker actor per bundle.

**Why not nested in the Tune trial.** Ray work started inside a Tune trial is scheduled in the trial's placement
group and can hang there (ray-project/ray#25239). Here the trial's actor reserves no GPU (``budget.resources.gpu:
0``) and starts no Ray task or actor: it starts ``main_ppo`` as a process under
:mod:`klsweep.launchers.supervisor`, exactly as a single-node trial. ``main_ppo`` connects as its own driver, so its
placement groups belong to its job, not to the trial's placement group (``placement_group_capture_child_tasks``
covers only the trial's own tasks). The trial tails verl's file logger on the shared results directory, the same
stream as a single-node trial (:mod:`klsweep.verl.stream`, :mod:`klsweep.launchers._watch`).

**Stopping it on every node.** Ray ties a job's non-detached actors and placement groups to its driver: when the
driver process ends, the GCS kills the job's workers on every node and removes its placement groups. So ending
``main_ppo``'s process tree ends the job everywhere. That happens on a health stop, a remedy's restart, Ctrl-C or
a time limit (the trial's supervisor stops the tree), and on a SIGKILL of the sweep driver. In that last case the
trial actors are the driver's job's actors and die with it; each supervisor sees its trial worker gone and ends
its tree. A job a lost supervisor left running is ended by the next start of the trial, and by ``sweep resume``:
each attempt records its node in ``node.json`` (:func:`stop_recorded_jobs`).

**Capacity.** Tune sees no GPU in such a trial, so it cannot tell that two of them would wait on each other's
placement groups for ever. :func:`trials_that_fit` counts how many fit the cluster's nodes (``ray.nodes()``);
:func:`check_cluster` refuses a sweep of which not even one fits, with the reason, and :func:`max_concurrent` caps
the sweep's concurrent trials to that number. :func:`check_paths` refuses data and model paths a node lacks.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from klsweep.errors import ClusterError
from klsweep.launchers import supervisor
from klsweep.verl.late_failures import CPUS_PER_GPU, PATH_KEYS, paths_of

if TYPE_CHECKING:
    from klsweep.spec.schema import Sweep

#: Written into each attempt directory of a multi-node trial: the node its supervisor runs on.
NODE_FILE = "node.json"


def nodes_of(overrides: Mapping[str, Any]) -> int:
    """``trainer.nnodes`` of a trial's flat overrides (1 when unset or not a whole number)."""
    value = overrides.get("trainer.nnodes", 1)
    return value if isinstance(value, int) and not isinstance(value, bool) else 1


def is_multinode(overrides: Mapping[str, Any]) -> bool:
    """Whether a verl trial spans several nodes (``trainer.nnodes > 1``)."""
    return nodes_of(overrides) > 1


def _gpu_shape(sweep: Sweep) -> tuple[int, int]:
    """``(trainer.nnodes, trainer.n_gpus_per_node)`` of the sweep's trials (verl's defaults where unset)."""
    from klsweep.spec.trainer_checks import verl_default  # on use: klsweep.spec is slow to import (pydantic)

    nnodes, per_node = (sweep.overrides.get(k, verl_default(k)) for k in ("trainer.nnodes", "trainer.n_gpus_per_node"))
    return int(nnodes), int(per_node)


def sweep_is_multinode(sweep: Sweep) -> bool:
    """Whether the sweep's trials are multi-node verl trials."""
    from klsweep.trainers import runs_verl

    return runs_verl(sweep.trainer) and is_multinode(sweep.overrides)


def trials_that_fit(nnodes: int, per_node: int, cpus_per_trial: float, nodes: Iterable[Mapping[str, float]]
                    ) -> tuple[int, str]:
    """How many trials of ``nnodes`` × ``per_node`` GPUs the cluster holds at once, and why no more.

    A node holds ``min(GPU // per_node, CPU // (3 × per_node))`` of verl's per-node placement groups (each bundle
    ``{"CPU": 3, "GPU": 1}``, ``STRICT_PACK``: one node). A trial needs ``nnodes`` of them, and ``cpus_per_trial``
    CPUs in all (its bundles, TransferQueue's actors, the trial's own actor). Counted on the whole nodes, as if no
    other job used them: an upper bound when other work shares the cluster.

    Args:
        nnodes, per_node: ``trainer.nnodes``, ``trainer.n_gpus_per_node``.
        cpus_per_trial: the CPUs one trial reserves in all.
        nodes: each alive node's resources (Ray's names: ``GPU``, ``CPU``).

    Returns:
        ``(count, reason)``: ``reason`` names what limits the count, for messages.
    """
    nodes = list(nodes)
    group_cpus = CPUS_PER_GPU * per_node
    groups = [min(int(n.get("GPU", 0) // per_node), int(n.get("CPU", 0) // group_cpus)) for n in nodes]
    by_groups = sum(groups) // nnodes
    total_cpus = sum(float(n.get("CPU", 0)) for n in nodes)
    by_cpus = int(total_cpus // cpus_per_trial) if cpus_per_trial > 0 else by_groups
    shape = ", ".join(f"{n.get('GPU', 0):g} GPU/{n.get('CPU', 0):g} CPU" for n in nodes) or "no alive node"
    reason = (f"{len(nodes)} node(s) ({shape}) hold {sum(groups)} placement group(s) of {per_node} GPU(s) and "
              f"{group_cpus} CPUs (verl's per-node group, 3 CPUs per GPU) and {total_cpus:g} CPUs in all; a trial "
              f"needs {nnodes} such groups on {nnodes} node(s) and {cpus_per_trial:g} CPUs")
    return min(by_groups, by_cpus), reason


def cpus_per_trial(sweep: Sweep) -> float:
    """The CPUs one multi-node trial reserves on the cluster: verl's bundles and TransferQueue's actors
    (:func:`klsweep.spec.trainer_checks.inner_ray_cpus` of all its GPUs) plus the trial's own actor
    (``budget.resources.cpu``)."""
    from klsweep.spec.trainer_checks import inner_ray_cpus  # on use, as in _gpu_shape

    nnodes, per_node = _gpu_shape(sweep)
    need, _ = inner_ray_cpus(dict(sweep.overrides), nnodes * per_node)
    return need + sweep.budget.resources.cpu


def alive_nodes() -> list[dict[str, float]]:
    """The resources of the connected Ray cluster's alive nodes (``ray.nodes()``)."""
    import ray

    return [dict(node["Resources"]) for node in ray.nodes() if node.get("Alive")]


def check_cluster(sweep: Sweep, nodes: Iterable[Mapping[str, float]] | None = None) -> int:
    """How many of the sweep's multi-node trials the cluster holds at once; refuses a cluster that holds none.

    Call it once Ray is up, before any trial starts (``nodes`` default: :func:`alive_nodes`).

    Raises:
        ClusterError: not one trial fits: what a trial needs, what the cluster has, and the fix. Without this, the
            trial's verl would wait in ``ray.get(pg.ready())`` for ever.
    """
    nnodes, per_node = _gpu_shape(sweep)
    count, reason = trials_that_fit(nnodes, per_node, cpus_per_trial(sweep),
                                    alive_nodes() if nodes is None else nodes)
    if count < 1:
        raise ClusterError(
            f"a trial of this sweep spans trainer.nnodes × trainer.n_gpus_per_node = {nnodes} × {per_node} GPUs, "
            f"but this Ray cluster cannot hold one: {reason}. verl would wait for its placement groups for ever. "
            f"Join a cluster with at least {nnodes} nodes of {per_node} GPUs and {CPUS_PER_GPU * per_node} CPUs "
            "each (--address, launchers/README.md), or lower trainer.nnodes / trainer.n_gpus_per_node")
    return count


def local_paths(sweep: Sweep) -> list[str]:
    """The absolute local data and model paths of the sweep's trials (``data.train_files``, ``data.val_files``,
    ``actor_rollout_ref.model.path``, ``critic.model.path``; not URLs, Hub ids or relative paths)."""
    return [path for key in PATH_KEYS for path in paths_of(sweep.overrides, key)
            if "://" not in path and os.path.isabs(path)]


def nodes_missing(paths: list[str]) -> dict[str, list[str]]:
    """``{path: [node IP, ...]}``: the alive nodes of the connected cluster where each path does not exist, read by
    a zero-CPU task pinned to each node (``NodeAffinitySchedulingStrategy``); paths every node sees are left out."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not paths:
        return {}
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    probe = ray.remote(num_cpus=0)(_missing)
    refs = [probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(paths)
            for n in nodes]
    missing: dict[str, list[str]] = {}
    for node, gone in zip(nodes, ray.get(refs)):
        for path in gone:
            missing.setdefault(path, []).append(node["NodeManagerAddress"])
    return missing


def _missing(paths: list[str]) -> list[str]:
    return [p for p in paths if not os.path.exists(p)]


def check_paths(sweep: Sweep) -> None:
    """Refuse a multi-node sweep whose data or model paths some node of the cluster does not see.

    verl's workers on every node of a trial load the model, and its driver reads the data wherever it runs: a node
    without them fails every trial placed there, after its GPUs were reserved.

    Raises:
        ClusterError: each path with the nodes that lack it, and the fix.
    """
    missing = nodes_missing(local_paths(sweep))
    if missing:
        listed = "; ".join(f"{path} on {', '.join(nodes)}" for path, nodes in missing.items())
        raise ClusterError(f"a multi-node trial reads its data and model on every node it spans, but these paths are "
                           f"missing on nodes of this Ray cluster: {listed}. Put them on storage every node mounts "
                           f"at the same path (NFS, a ReadWriteMany volume), or give paths that exist everywhere")


def max_concurrent(sweep: Sweep) -> int:
    """The sweep's ``budget.max_concurrent``, capped to :func:`check_cluster` for a multi-node sweep (Ray up); a cap
    is said on stderr."""
    wanted = sweep.budget.max_concurrent
    if not sweep_is_multinode(sweep):
        return wanted
    fit = check_cluster(sweep)
    if fit < wanted:
        print(f"multi-node trials: this Ray cluster holds {fit} at once; budget.max_concurrent {wanted} is capped to "
              f"{fit}", file=sys.stderr)
    return min(wanted, fit)


def job_env(env: Mapping[str, str], address: str) -> dict[str, str]:
    """``env`` with ``RAY_ADDRESS`` set to the cluster's address, so that ``main_ppo``'s ``ray.init()`` joins it."""
    return {**env, "RAY_ADDRESS": address}


def cluster_address() -> str:
    """The GCS address of the Ray cluster this process is connected to (a trial worker's: the sweep's cluster)."""
    import ray

    return ray.get_runtime_context().gcs_address


def record_node(run_dir: Path) -> None:
    """Write ``run_dir/node.json``: this node's Ray id and address (inside a Ray worker), for
    :func:`stop_recorded_jobs`."""
    import ray

    node = {"node_id": ray.get_runtime_context().get_node_id(), "ip": ray.util.get_node_ip_address()}
    (Path(run_dir) / NODE_FILE).write_text(json.dumps(node))


def leftover_attempts(trial_dirs: Iterable[Path]) -> list[tuple[Path, dict]]:
    """The attempts of ``trial_dirs`` whose supervisor started (``supervisor.json``) but never wrote ``exit.json``,
    with the node they recorded (:data:`NODE_FILE`)."""
    found = []
    for trial_dir in trial_dirs:
        for run_dir in sorted(Path(trial_dir).glob("attempt-*")):
            if (run_dir / "supervisor.json").exists() and not (run_dir / "exit.json").exists() \
                    and (run_dir / NODE_FILE).exists():
                found.append((run_dir, json.loads((run_dir / NODE_FILE).read_text())))
    return found


def stop_recorded_jobs(trial_dirs: Iterable[Path], *, wait_s: float = 20.0) -> list[Path]:
    """End every multi-node job an attempt of ``trial_dirs`` recorded that still runs; the attempts it stopped.

    For each :func:`leftover_attempts` entry, a zero-CPU task pinned to the recorded node sends SIGTERM to the
    attempt's supervisor when that pid still runs the supervisor of that attempt (its command line names the
    attempt's ``spec.json``). The supervisor then ends ``main_ppo``'s tree, whose job Ray ends on every node, and
    writes ``exit.json``. Waits up to ``wait_s`` seconds for each. Needs Ray connected to the cluster; nodes that are
    gone are skipped (their processes went with them).
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    leftovers = leftover_attempts(trial_dirs)
    if not leftovers:
        return []
    alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
    stop = ray.remote(num_cpus=0)(_stop_supervisor)
    refs, stopped = [], []
    for run_dir, node in leftovers:
        if node.get("node_id") not in alive:
            continue
        pid = int(json.loads((run_dir / "supervisor.json").read_text())["supervisor_pid"])
        strategy = NodeAffinitySchedulingStrategy(node["node_id"], soft=False)
        refs.append(stop.options(scheduling_strategy=strategy).remote(pid, str(run_dir / "spec.json")))
        stopped.append(run_dir)
    signalled = ray.get(refs)
    stopped = [d for d, sent in zip(stopped, signalled) if sent]
    deadline = time.monotonic() + wait_s
    while any(not (d / "exit.json").exists() for d in stopped) and time.monotonic() < deadline:
        time.sleep(0.1)
    return stopped


def _stop_supervisor(pid: int, spec_path: str) -> bool:
    """SIGTERM ``pid`` if it is alive and is the supervisor of ``spec_path``; whether it was sent."""
    if supervisor.proc_stat(pid) is None:
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    if os.fsencode(spec_path) not in argv:
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    return True
