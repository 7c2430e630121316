"""Trial processes and where they run: :func:`run_process_trial` (one supervised training process per trial,
streamed to Ray Tune), failure kinds, and the launch profiles (local, ray-cluster, kuberay, slurm)."""

from klsweep.launchers.failures import KINDS, RETRYABLE, Failure, TrialFailed, classify
from klsweep.launchers.process import run_process_trial, trial_command
from klsweep.launchers.profiles import PROFILES, ray_address

__all__ = [
    "KINDS",
    "PROFILES",
    "RETRYABLE",
    "Failure",
    "TrialFailed",
    "classify",
    "ray_address",
    "run_process_trial",
    "trial_command",
]
