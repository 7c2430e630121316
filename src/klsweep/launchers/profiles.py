"""Launch profiles: where a sweep's trials run, picked by name (sweep file ``launcher:`` or ``sweep run --launcher``).

==============  ===============================  ==========================================================
profile         Ray the sweep driver joins       set up with
==============  ===============================  ==========================================================
``local``       a private local Ray (this host)  nothing
``ray-cluster`` the running cluster (``auto``)   ``ray up launchers/ray-cluster.yaml`` (Ray cluster launcher)
``kuberay``     the RayJob's cluster (``auto``)  ``kubectl apply -f launchers/kuberay.yaml`` (KubeRay RayJob)
``slurm``       the allocation's Ray (``auto``)  ``sbatch launchers/slurm.sbatch SWEEP_FILE`` (head + workers)
==============  ===============================  ==========================================================

On every profile a single-node trial is one process on one node (``klsweep.launchers.process``): a verl trial starts
its own Ray there (``+ray_kwargs.ray_init.address=local``) on the GPUs Tune gave the trial. A verl trial with
``trainer.nnodes`` > 1 is one Ray job on the profile's cluster that places its GPUs over several nodes itself
(:mod:`klsweep.launchers.multinode`); on ``local`` that is the private Ray of one machine, which holds such a trial
only when it has the GPUs of all its nodes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Profile:
    """A launch profile.

    Attributes:
        name: the name users write.
        address: the Ray address the sweep driver joins by default (None: a private local Ray).
        file: the file in the repository's ``launchers/`` folder that sets the cluster up (None for local).
    """

    name: str
    address: str | None
    file: str | None


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile("local", None, None),
        Profile("ray-cluster", "auto", "ray-cluster.yaml"),
        Profile("kuberay", "auto", "kuberay.yaml"),
        Profile("slurm", "auto", "slurm.sbatch"),
    )
}


def ray_address(launcher: str, address: str | None = None) -> str | None:
    """The Ray address a sweep driver should join: ``address`` if given, else the profile's default.

    Raises:
        ValueError: ``launcher`` is not a profile name (the message lists them).
    """
    if launcher not in PROFILES:
        raise ValueError(f"launcher {launcher!r} is not a launch profile; use one of: {', '.join(PROFILES)}")
    return address or PROFILES[launcher].address
