"""Whether one trial's resource request (``budget.resources``) fits a node of the Ray cluster the sweep runs on,
checked once Ray is up and before any trial starts.

Ray Tune reserves a trial's resources as one bundle, which must fit on one node (``tune.with_resources`` with a
dict: a single-bundle ``PlacementGroupFactory``). A request no node can hold leaves the trial PENDING for ever. With
Tune's own output off (``verbose=0``), ``sweep run`` would print nothing: a ``trainer: verl`` sweep asking for 1 GPU
on a machine without one would wait silently.

The largest node is the largest of the alive nodes (``ray.nodes()``). On an autoscaling cluster, it is also the
largest of the node types the autoscaler may still start: those with ``max_count`` > 0 in the cluster config the
autoscaler stores in the GCS. That config is read as Ray Train's worker group reads it before it waits for
resources (``ray._private.state.state.get_cluster_config()``, Ray 2.60).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from klsweep.errors import ClusterError
from klsweep.launchers import multinode
from klsweep.trainers import runs_verl

if TYPE_CHECKING:
    from klsweep.spec.schema import Sweep

#: ``budget.resources`` field → Ray's resource name.
_RAY_NAME = {"gpu": "GPU", "cpu": "CPU"}


def capacity_problem(request: Mapping[str, float], nodes: Iterable[Mapping[str, float]], *, trainer: str) -> str | None:
    """Why a trial's request cannot be placed, or None when the largest node holds it.

    Args:
        request: ``{"cpu": CPUs, "gpu": GPUs}`` per trial (``budget.resources``).
        nodes: the resources of each node that is or may become part of the cluster (Ray's names: ``CPU``, ``GPU``).
        trainer: the sweep's ``trainer:`` (the fixes it names differ for verl's own trials).

    Returns:
        One line naming the field, the request, what the cluster has and the fix.
    """
    nodes = list(nodes)
    for field in ("gpu", "cpu"):
        need = float(request.get(field, 0.0))
        have = [float(node.get(_RAY_NAME[field], 0.0)) for node in nodes]
        largest, total = max(have, default=0.0), sum(have)
        if need <= largest:
            continue
        asks = f"each trial asks for {need:g} {field.upper()}{'' if need == 1 else 's'} (budget.resources.{field})"
        if field == "gpu" and total == 0:
            other = "use trainer: embedded" if runs_verl(trainer) else "set budget.resources.gpu: 0"
            return (f"{asks} but this Ray cluster has 0 GPUs: run on a GPU node, connect to a cluster with "
                    f"--address, or {other}")
        fewer = " (with trainer.n_gpus_per_node)" if field == "gpu" and runs_verl(trainer) else ""
        return (f"{asks} but the largest node of this Ray cluster has {largest:g} ({total:g} in all) and a trial "
                f"runs on one node: lower budget.resources.{field}{fewer} to at most {largest:g}, or connect to a "
                f"cluster with larger nodes with --address")
    return None


def check_trial_fits(sweep: Sweep) -> None:
    """Refuse a sweep whose trials no node of the connected Ray cluster can hold (see the module docstring).

    A multi-node verl sweep must also fit one trial's job on the alive nodes, whose every node must see its data
    and model paths (:func:`klsweep.launchers.multinode.check_cluster`, ``check_paths``).

    Raises:
        ClusterError: the line of :func:`capacity_problem`, or of ``check_cluster``.
    """
    request = {"cpu": sweep.budget.resources.cpu, "gpu": sweep.budget.resources.gpu}
    problem = capacity_problem(request, _cluster_nodes(), trainer=sweep.trainer)
    if problem:
        raise ClusterError(problem)
    if multinode.sweep_is_multinode(sweep):
        multinode.check_cluster(sweep)
        multinode.check_paths(sweep)


def _cluster_nodes() -> list[dict[str, float]]:
    """The resources of the alive nodes, and of every node type the autoscaler may start (none without one)."""
    import ray

    nodes = [dict(node["Resources"]) for node in ray.nodes() if node.get("Alive")]
    try:
        from ray._private.state import state

        config = state.get_cluster_config()
    except Exception:  # a Ray without the autoscaler's config in the GCS: the alive nodes are what there is
        config = None
    for group in getattr(config, "node_group_configs", None) or []:
        if group.max_count != 0:
            nodes.append(dict(group.resources))
    return nodes


def local_gpu_warning(sweep: Sweep) -> str | None:
    """A warning for ``sweep validate`` when trials ask for GPUs and this machine shows none; None otherwise.

    No GPU shows when there is no ``nvidia-smi`` or ``rocm-smi`` on PATH and no ``/dev/nvidia0`` or ``/dev/kfd``.
    ``sweep run`` here would then refuse. Not an error: a sweep is often checked on a laptop and run on a cluster."""
    gpu = sweep.budget.resources.gpu
    if gpu <= 0 or any(shutil.which(tool) for tool in ("nvidia-smi", "rocm-smi")) or any(
            Path(device).exists() for device in ("/dev/nvidia0", "/dev/kfd")):
        return None
    return (f"budget.resources.gpu is {gpu:g} but this machine has no GPU: `sweep run` here would refuse to start. "
            f"Run it on a GPU node, or with --address on a Ray cluster that has GPUs")
