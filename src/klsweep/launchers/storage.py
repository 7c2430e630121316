"""Trial files in the sweep's results directory, on whichever node a trial runs.

Ray Tune's own trial directory (``tune.get_context().get_trial_dir()``) is a node-local staging directory:
``/tmp/ray/session_*/artifacts/<timestamp>/<experiment>/working_dirs/<trial>`` (``StorageContext`` in
ray/train/_internal/storage.py, Ray 2.60). A trial on another node would keep its logs, ``failure.json`` and
checkpoints there. A resumed sweep (a new timestamp) would never find its checkpoints again.

A process trial writes into its directory under Tune's ``storage_path`` (the sweep's ``--out``) instead. That is how
Ray means a local ``storage_path`` to be used on a cluster: a filesystem every node mounts at the same path (NFS, a
shared volume). Where it is not, Ray's own storage marker is missing on the trial's node. The sweep is then refused
before it starts (:func:`require_shared_results`), or the trial fails with the fix (:func:`trial_directory`).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from klsweep.errors import ClusterError

_FIX = ("put the results directory (--out) on a filesystem every node of the cluster mounts at the same path (NFS, "
        "a shared volume on KubeRay), or run the sweep on a single node")


def trial_directory() -> Path:
    """Inside a Ray Tune trial: the trial's directory in the sweep's results directory,
    ``<storage_path>/<experiment>/<trial>`` (``StorageContext.trial_fs_path``), created if needed. For a storage
    that is not a local path (``s3://...``) it is Tune's own trial directory, which Ray syncs there.

    Raises:
        ClusterError: the results directory is not visible on this node (Ray's storage marker, written by the sweep
            driver into ``<storage_path>/<experiment>``, is missing here).
    """
    from ray import tune
    from ray.train._internal.storage import _VALIDATE_STORAGE_MARKER_FILENAME

    context = tune.get_context()
    storage = context.get_storage()
    if storage.storage_filesystem.type_name != "local":
        return Path(context.get_trial_dir())
    if not Path(storage.experiment_fs_path, _VALIDATE_STORAGE_MARKER_FILENAME).exists():
        from ray.util import get_node_ip_address

        raise ClusterError(f"the sweep's results directory {storage.storage_fs_path} is not visible on node "
                           f"{get_node_ip_address()}, where this trial runs: {_FIX}")
    path = Path(storage.trial_fs_path)
    path.mkdir(parents=True, exist_ok=True)
    return path


def nodes_without(directory: Path) -> list[str]:
    """The IP addresses of the alive nodes of the connected Ray cluster that do not see ``directory``.

    A probe file written here is read back by a zero-CPU task pinned to each node
    (``NodeAffinitySchedulingStrategy``).

    Raises:
        ClusterError: Ray is not initialized.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not ray.is_initialized():
        raise ClusterError("nodes_without needs a connected Ray cluster (ray.init)")
    token = uuid.uuid4().hex
    probe = Path(directory).resolve() / f".klsweep-probe-{token}"
    probe.write_text(token)
    try:
        sees = ray.remote(num_cpus=0)(_reads)
        nodes = [n for n in ray.nodes() if n["Alive"]]
        refs = [sees.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
                .remote(str(probe), token) for n in nodes]
        return [n["NodeManagerAddress"] for n, seen in zip(nodes, ray.get(refs)) if not seen]
    finally:
        probe.unlink()


def _reads(path: str, token: str) -> bool:
    return os.path.exists(path) and Path(path).read_text() == token


def require_shared_results(out_dir: Path) -> None:
    """Refuse a sweep whose results directory some node of the cluster cannot see.

    Call it after ``ray.init``, before the Tuner starts. Trial files of those nodes would never reach ``out_dir``.

    Raises:
        ClusterError: naming the directory, the nodes and the fix.
    """
    missing = nodes_without(out_dir)
    if missing:
        raise ClusterError(f"the results directory {Path(out_dir).resolve()} is not visible on node(s) "
                           f"{', '.join(missing)} of the Ray cluster, where trials run: their logs, failures and "
                           f"checkpoints would stay on those nodes, and a resumed trial would start over: {_FIX}")
