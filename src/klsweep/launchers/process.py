"""One trial = one training process, supervised and streamed step by step to Ray Tune.

The process is ``python -m verl.trainer.main_ppo`` (GPU nodes) or ``python -m klsweep.trainers.embedded`` (CPU). It
writes verl's file-logger lines ``{"step": N, "data": {...}}`` to ``$VERL_FILE_LOGGER_PATH``. verl's
``verl.utils.tracking.FileLogger`` is unbuffered and truncates the file on start, so every attempt gets a new path.
The trial tails that file (:class:`klsweep.verl.stream.MetricsTail`) and wakes when it is written (inotify,
:mod:`klsweep.launchers._watch`). Each training step becomes one ``ray.tune.report(data | {"step": N})``, in order,
while the process still runs (:class:`klsweep.verl.stream.StepReports`). verl's step-0 line (validation before
training) is merged into step 1's report. So Tune's ``training_iteration`` equals verl's step, and ASHA
(``time_attr="training_iteration"``) stops at the steps it names. :mod:`klsweep.launchers.supervisor` ends the whole
process tree in three cases: Tune stops the trial; the process fails or runs past its time limit; or the sweep driver
dies (ray#23971, ray#34125).

Layout of a trial directory (in the sweep's results directory, :func:`klsweep.launchers.storage.trial_directory`)::

    attempt-1/            one per start of the trial (a retry or a resume makes attempt-2, ...)
      metrics.jsonl       $VERL_FILE_LOGGER_PATH
      stdout.log stderr.log supervisor.log spec.json supervisor.json exit.json
      node.json           a multi-node trial's: the node its supervisor runs on (klsweep.launchers.multinode)
      hydra/              hydra.run.dir (verl)
    checkpoints/          trainer.default_local_dir (verl): shared by the attempts, so a retried trial resumes
                          from its own last checkpoint (verl's trainer.resume_mode=auto) and never from another's
    failure.json          the last failed attempt's :class:`klsweep.launchers.failures.Failure`
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from klsweep.launchers import multinode
from klsweep.launchers.attempt import run_attempt
from klsweep.launchers.attempt import stop_running_trials as stop_running_trials  # the trial actor's cleanup
from klsweep.launchers.checkpoints import policy, retain_finished, trial_save_freq
from klsweep.launchers.failures import TrialFailed
from klsweep.launchers.resume import (
    CHECKPOINTS_KEPT,
    SAVE_FREQ_KEY,
    checkpointed_step,
    has_checkpoint,
    logged_steps,
    repair_tracker,
    resume_overrides,
    rewind,
)
from klsweep.launchers.storage import trial_directory
from klsweep.trainers import TRAINERS, runs_verl, trainer_kind
from klsweep.verl.config import format_overrides
from klsweep.verl.stream import StepReports

if TYPE_CHECKING:
    from klsweep.results import Restart
    from klsweep.spec.schema import Sweep

#: Starts of a trial's own local Ray that timed out (kind ``ray_start``) before the trial fails, as the sweep
#: driver's own start (``klsweep.orchestrate._ray_session.start_local_ray``).
RAY_STARTS = 3

#: verl keys klsweep sets on every verl trial (values given by a sweep are replaced): unique names and directories per
#: trial, because trainer.resume_mode=auto resumes from whatever checkpoint sits in default_local_dir.
MANAGED_VERL_KEYS = ("trainer.experiment_name", "trainer.default_local_dir", "hydra.run.dir")
#: verl's own Ray for each trial: never the sweep's cluster, where its placement groups would hang (ray#25239).
RAY_INIT_ADDRESS_KEY = "+ray_kwargs.ray_init.address"
#: Environment variables of the Ray trial worker the trial's process must not inherit: ``RAY_ADDRESS`` would attach
#: verl's Ray to the sweep's cluster; the others are Ray's internal flags (``ray_constants.RAY_INTERNAL_FLAGS``, which
#: Ray itself strips on job submission) naming the sweep's job and raylet.
DROPPED_ENV = ("RAY_ADDRESS", "RAY_JOB_ID", "RAY_RAYLET_PID", "RAY_OVERRIDE_NODE_ID_FOR_TESTING")
#: Set in the trial's environment unless the user's environment sets it: Ray 2.60 turns token authentication on for
#: every new local cluster when ``RAY_AUTH_MODE`` is unset (``enable_token_auth_by_default`` in
#: ray/_private/authentication/authentication_token_setup.py), so each verl trial's own ``ray.init(address="local")``
#: would write ``~/.ray/auth_token`` (concurrent first starts race on it), and a token file left on a node turns auth on
#: for the next ``ray start`` there (``maybe_enable_token_auth_if_token_available``).
RAY_AUTH_MODE_DEFAULT = ("RAY_AUTH_MODE", "disabled")


def trial_command(
    overrides: Mapping[str, Any],
    *,
    trainer: str,
    trial_dir: Path,
    attempt: int = 1,
    gpu_ids: Sequence[str | int] | None = None,
    cpus: float | None = None,
    base_env: Mapping[str, str] | None = None,
    ray_address: str | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of one attempt of a trial.

    Args:
        overrides: the trial's flat verl overrides (``{"algorithm.kl_ctrl.kl_coef": 0.002, ...}``).
        trainer: ``verl`` (``python -m verl.trainer.main_ppo``) or ``embedded``
            (``python -m klsweep.trainers.embedded``).
        trial_dir: the trial's directory; names derive from its last component.
        attempt: 1 for the first start of the trial, 2 for its first retry, ...
        gpu_ids: the trial's GPUs (``ray.get_gpu_ids()``); ``CUDA_VISIBLE_DEVICES`` is set to exactly these
            (empty: no GPU visible). None leaves ``CUDA_VISIBLE_DEVICES`` as in ``base_env``.
        cpus: the trial's CPUs (Ray's assigned ``CPU``); ``OMP_NUM_THREADS`` is set to its floor, at least 1, as Ray
            sets it for its own workers (``set_omp_num_threads_if_unset`` in ray/_private/utils.py). None leaves
            ``OMP_NUM_THREADS`` as in ``base_env``.
        base_env: the environment to start from (default ``os.environ``).
        ray_address: a multi-node trial's cluster (:mod:`klsweep.launchers.multinode`): ``RAY_ADDRESS`` is set to
            it, so verl's ``ray.init()`` joins the cluster as a job of its own, and no ``ray_init.address`` is added.

    Returns:
        ``(argv, env)``. For verl, argv has ``trainer.save_freq``:
        :func:`klsweep.launchers.checkpoints.trial_save_freq`. It has ``trainer.max_actor_ckpt_to_keep`` and
        ``trainer.max_critic_ckpt_to_keep``: the trial's own, else 1, since a resume needs only the latest. It ends
        with the managed keys:

        - ``trainer.experiment_name``: the trial directory's name;
        - ``trainer.default_local_dir``: ``trial_dir/checkpoints``;
        - ``hydra.run.dir``: ``attempt-N/hydra``;
        - ``trainer.logger``: the sweep's list plus ``file``, default ``[console,file]``;
        - ``+ray_kwargs.ray_init.address=local``, unless the sweep sets that key or ``ray_address`` is given.

        ``env`` has ``VERL_FILE_LOGGER_PATH=trial_dir/attempt-N/metrics.jsonl``. It has ``RAY_AUTH_MODE=disabled``
        unless ``base_env`` sets it (:data:`RAY_AUTH_MODE_DEFAULT`). It has none of :data:`DROPPED_ENV`.

    Raises:
        ValueError: ``trainer`` is not a trainer of :data:`klsweep.trainers.TRAINERS` with a process mode.
    """
    module = trainer_kind(trainer).module
    if module is None:
        with_process = [name for name, kind in TRAINERS.items() if kind.module]
        raise ValueError(f"trainer {trainer!r} has no process mode; use one of: {', '.join(with_process)}")
    trial_dir = Path(trial_dir).resolve()
    run_dir = attempt_dir(trial_dir, attempt)
    values = dict(overrides)
    if runs_verl(trainer):
        values = {k: v for k, v in values.items() if k.lstrip("+") not in MANAGED_VERL_KEYS}
        values[SAVE_FREQ_KEY] = trial_save_freq(values)
        values = CHECKPOINTS_KEPT | values
        logger = values.pop("trainer.logger", ["console"])
        logger = [logger] if isinstance(logger, str) else list(logger)
        values["trainer.experiment_name"] = _experiment_name(trial_dir.name)
        values["trainer.default_local_dir"] = str(trial_dir / "checkpoints")
        values["hydra.run.dir"] = str(run_dir / "hydra")
        values["trainer.logger"] = logger + ([] if "file" in logger else ["file"])
        if ray_address is None and not any(k.lstrip("+") == RAY_INIT_ADDRESS_KEY.lstrip("+") for k in values):
            values[RAY_INIT_ADDRESS_KEY] = "local"
    argv = [sys.executable, "-m", module, *format_overrides(values)]

    env = {k: v for k, v in (os.environ if base_env is None else base_env).items() if k not in DROPPED_ENV}
    env["VERL_FILE_LOGGER_PATH"] = str(run_dir / "metrics.jsonl")
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault(*RAY_AUTH_MODE_DEFAULT)
    if gpu_ids is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in gpu_ids)
    if cpus is not None:
        env["OMP_NUM_THREADS"] = str(max(1, math.floor(cpus)))
    if ray_address is not None:
        env = multinode.job_env(env, ray_address)
    return argv, env


def own_ray(argv: Sequence[str]) -> bool:
    """Whether the command starts its own Ray (``+ray_kwargs.ray_init.address=local``), whose first job id is
    ``01000000`` on every host (:mod:`klsweep.launchers.isolation`)."""
    return f"{RAY_INIT_ADDRESS_KEY.lstrip('+')}=local" in {a.lstrip("+") for a in argv}


def attempt_dir(trial_dir: Path, attempt: int) -> Path:
    """``trial_dir/attempt-<attempt>``."""
    return Path(trial_dir) / f"attempt-{attempt}"


def _experiment_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:100] or "trial"


def run_process_trial(
    overrides: Mapping[str, Any],
    *,
    sweep: Sweep | None = None,
    trainer: str | None = None,
    trial_dir: Path | None = None,
    report: Callable[[dict[str, Any]], Any] | None = None,
    timeout_s: float | None = None,
    grace_s: float = 5.0,
    retries: int = 1,
    rewind_to: int | None = None,
    remedies: Sequence[Restart] = (),
    reported_to: int | None = None,
    gpu_ids: Sequence[str] | None = None,
    cpus: float | None = None,
    keep_checkpoints: str | None = None,
) -> None:
    """Run one trial's training process to its end, reporting every step; the Ray Tune function trainable body.

    A failure of a :data:`klsweep.launchers.failures.RETRYABLE` kind (NCCL, killed, a slow local Ray start) starts a
    new attempt, up to ``retries`` times; a local Ray that did not start (kind ``ray_start``: no step ran) is started
    again, up to :data:`RAY_STARTS` starts, besides. Other failures raise at once: Tune's ``FailureConfig`` cannot
    tell kinds apart, so keep its ``max_failures=0``. Every attempt of a verl trial resumes from the trial's own last
    checkpoint, in this call or a later one on the same ``trial_dir`` (a Tune retry, ``sweep resume``). Steps that
    earlier attempts logged are not reported again: Tune sees each step once, in order. A verl trial a remedy
    restarts (``rewind_to``) continues from verl's checkpoint at that step (:func:`klsweep.launchers.resume.rewind`)
    and reports the steps after it again.
    Whichever checkpoint it continues from, the KL controller's coefficient follows the rule of every trainer
    (:func:`klsweep.trainers.restore.knobs_after_load`, through :func:`klsweep.launchers.resume.resume_overrides`):
    the value logged at that checkpoint's step is carried over, unless one of ``remedies`` restarts the trial from
    exactly that step and changed it, which keeps its value in ``overrides``.

    Args:
        overrides: the trial's flat verl overrides.
        sweep: the loaded :class:`klsweep.spec.Sweep` (its ``trainer`` is used unless ``trainer`` is given).
        trainer: ``verl`` or ``embedded``.
        trial_dir: where the trial's files go (default: the trial's directory in the sweep's results directory,
            :func:`klsweep.launchers.storage.trial_directory`, on any node).
        report: called with ``data | {"step": N}`` once per training step N ≥ 1, in file order. The default is
            ``ray.tune.report`` with a checkpoint of the step (:func:`_report_with_step_checkpoint`). Tune's
            ``training_iteration`` is thus verl's step, after a restart by Tune too. The step-0 line (validation
            before training) is merged into step 1's call; step 1's own values win. A run that ends cleanly without
            a step 1 gets ``{"step": 0}`` at its end. Raising from it ends the process tree and propagates; Tune
            raises ``SystemExit`` when it stops the trial.
        timeout_s: wall-clock limit of each attempt in seconds; None: none. The sweep's is
            ``budget.trial_timeout_s``. An attempt past it ends with its whole tree and fails with kind ``timeout``,
            "timed out after N s"; it is not retried. A verl checkpoint step takes many times a normal step: size
            the limit for the whole run, not per step.
        grace_s: seconds between SIGTERM and SIGKILL when the tree is stopped.
        retries: how many new attempts a retryable failure gets.
        rewind_to: the step a remedy restarts the trial from (None: none; ignored when verl no longer holds a
            checkpoint of it: the trial then continues as any restarted trial).
        remedies: the trial's restarts so far, oldest first (:func:`klsweep.results.restarts` of its Tune config);
            ``overrides`` hold their values. Only their steps (``from_step``) and keys are read.
        reported_to: the last step Tune holds for this trial (the step of the checkpoint it restored the trial from,
            0 on a fresh start). Logged steps after it (a driver killed before it received them) are reported
            first, from the attempts' files, then the new attempt's steps after the last logged one. None: report
            only steps after the last logged one. A verl trial whose checkpoint is of its last step starts no
            process: it reports those steps and ends (or, when the last step was never logged, runs again from
            the checkpoint before it).
        gpu_ids, cpus: the trial's GPUs and CPUs; default: what Ray assigned to the calling worker
            (:func:`trial_command`).
        keep_checkpoints: the retention policy of a verl trial's checkpoint once it ran to its last step
            (:func:`klsweep.launchers.checkpoints.retain_finished`, on the objectives of ``sweep``); default
            ``$KLSWEEP_KEEP_CHECKPOINTS``, else ``best``. Without ``sweep`` and this, every checkpoint is kept.

    A verl trial that starts its own Ray runs with a private ``/tmp``, or alone on its host; its process starts
    only while no other trial's engine starts on its GPUs (:mod:`klsweep.launchers.isolation`). A multi-node verl
    trial (``trainer.nnodes`` > 1) joins the cluster this Ray worker belongs to as a Ray job of its own
    (:mod:`klsweep.launchers.multinode`); an earlier attempt's job still running is ended first. An attempt whose
    tree klsweep stopped (``exit.json`` reason ``stopped``: the trial actor's cleanup, Ctrl-C) fails with kind
    ``stopped`` and is never retried.

    Raises:
        TrialFailed: the process failed; ``.kind`` is a :data:`klsweep.launchers.failures.KINDS` entry, recorded
            with the stderr tail in ``trial_dir/failure.json``.
        ClusterError: the sweep's results directory is not visible on this node.
        ValueError: no trainer, or no trial directory outside a Tune trial; or a complete line of the metrics file
            is not a file-logger record (the message names the file and line).
    """
    trainer = trainer or (sweep.trainer if sweep is not None else None)
    if trainer is None:
        raise ValueError("run_process_trial needs trainer= or sweep= (whose .trainer names the trainer)")
    if trial_dir is None or report is None:
        from ray import tune

        if tune.get_context().get_trial_id() is None:
            raise ValueError("run_process_trial runs inside a Ray Tune trial, or needs trial_dir= and report=")
        trial_dir = trial_dir or trial_directory()
        report = report or _report_with_step_checkpoint
    import ray

    if gpu_ids is None and ray.is_initialized():
        gpu_ids = [str(i) for i in ray.get_gpu_ids()]
    if cpus is None and ray.is_initialized():
        try:  # a Ray worker's CPUs; a driver (a direct call with Ray up) has none assigned and Ray asserts so
            cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
        except AssertionError:
            cpus = None
    trial_dir = Path(trial_dir).resolve()
    trial_dir.mkdir(parents=True, exist_ok=True)
    job_address = None
    if runs_verl(trainer) and multinode.is_multinode(overrides):
        if not ray.is_initialized():
            raise ValueError("a multi-node verl trial (trainer.nnodes > 1) runs in a Ray worker of the cluster it "
                             "spans: call it inside a Ray Tune trial")
        job_address, gpu_ids = multinode.cluster_address(), None  # verl's job places its GPUs itself
        multinode.stop_recorded_jobs([trial_dir])
    rewound = rewind(trial_dir / "checkpoints", rewind_to) if rewind_to and runs_verl(trainer) else None
    logged = logged_steps(trial_dir)
    if rewound and rewind_to:
        steps = StepReports(report, last_step=rewind_to)
    elif reported_to is not None:  # steps earlier attempts logged after it never reached Tune: report them now
        steps = StepReports(report, last_step=reported_to)
        for step in sorted(s for s in logged if s > reported_to or s == 0 == reported_to):
            steps.line(step, logged[step])
    else:
        steps = StepReports(report, last_step=max(logged, default=0))
    if runs_verl(trainer) and not rewound and _ran_to_the_end(trial_dir, overrides):  # a killed driver missed it
        logged_all = max(logged, default=0) >= overrides["trainer.total_training_steps"]
        rewound = None if logged_all else _rewind_before_the_end(trial_dir, overrides)
        if rewound is None:  # nothing left to run, or no earlier checkpoint to run the last step from
            _finished(steps, trial_dir, sweep, keep_checkpoints)
            return
    retried = slow_starts = 0
    while True:
        attempt = 1 + sum(1 for p in trial_dir.glob("attempt-*") if p.is_dir())
        if rewound:  # the first attempt: rewind set the tracker to the step verl loads
            resumed = {**overrides, **resume_overrides(trial_dir, overrides, remedies), **rewound}
            rewound = None
        elif runs_verl(trainer):
            repair_tracker(trial_dir / "checkpoints")  # a tracker a stopped verl left empty fails every start
            resumed = {**overrides, **resume_overrides(trial_dir, overrides, remedies)}
        else:
            resumed = dict(overrides)
        argv, env = trial_command(resumed, trainer=trainer, trial_dir=trial_dir, attempt=attempt, gpu_ids=gpu_ids,
                                  cpus=cpus, ray_address=job_address)
        verl = runs_verl(trainer)
        failure = run_attempt(argv, env, attempt_dir(trial_dir, attempt), steps, timeout_s=timeout_s, grace_s=grace_s,
                              isolate=verl and own_ray(argv), startup_gpus=(gpu_ids or []) if verl else [],
                              record_node=job_address is not None)
        if failure is None:
            _finished(steps, trial_dir if verl else None, sweep, keep_checkpoints)
            return
        failure.save(trial_dir / "failure.json")
        if failure.kind == "ray_start" and slow_starts < RAY_STARTS - 1:  # no step ran: not one of ``retries``
            slow_starts += 1
            continue
        if not failure.retryable or retried == retries:
            raise TrialFailed(failure.kind, failure.message)
        retried += 1


def _ran_to_the_end(trial_dir: Path, overrides: Mapping[str, Any]) -> bool:
    """Whether verl's checkpoint in ``trial_dir`` is of the run's last step (``trainer.total_training_steps``).

    verl saves it at the last step (``is_last_step`` in ``fit``, verl/trainer/ppo/v1/trainer_base.py), so a run
    that ended before the sweep driver recorded it (a SIGKILL of the driver) has no step left: verl started again
    would load the checkpoint, log no step and exit."""
    total = overrides.get("trainer.total_training_steps")
    return isinstance(total, int) and total > 0 and checkpointed_step(trial_dir / "checkpoints") >= total


def _rewind_before_the_end(trial_dir: Path, overrides: Mapping[str, Any]) -> dict[str, Any] | None:
    """Rewind verl to its newest checkpoint before the last step (:func:`klsweep.launchers.resume.rewind`).

    verl saves the last step before it logs it (``fit``, verl/trainer/ppo/v1/trainer_base.py): a run killed between
    the two holds the last checkpoint but not the last step's metrics, which only running that step again gives.
    Returns the overrides that resume there (the attempt adds the controller's coefficient,
    :func:`klsweep.launchers.resume.resume_overrides`); None when verl holds no earlier checkpoint."""
    checkpoints = trial_dir / "checkpoints"
    total = overrides["trainer.total_training_steps"]
    earlier = [s for s in range(total - 1, 0, -1) if has_checkpoint(checkpoints, s)]
    return rewind(checkpoints, earlier[0]) if earlier else None


def _finished(steps: StepReports, verl_dir: Path | None, sweep: Sweep | None, keep: str | None) -> None:
    """End a trial that ran to its last step: its last report, then, for a verl trial (``verl_dir``), the retention
    of its checkpoints (:func:`klsweep.launchers.checkpoints.retain_finished`) when a sweep or policy is given."""
    steps.finish()
    if verl_dir is not None and (sweep is not None or keep is not None):
        objectives = [(o.metric, o.mode) for o in sweep.objectives] if sweep is not None else []
        retain_finished(verl_dir, objectives, policy(keep))


def _report_with_step_checkpoint(metrics: dict[str, Any]) -> None:
    """``ray.tune.report(metrics)`` with a Tune checkpoint that holds only the step (``step.json``, bytes).

    verl's own checkpoint stays in the trial directory; this one is for Tune. A trial Tune starts again (a
    ``FailureConfig`` retry, ``sweep resume``) is restored from its last checkpoint. ``Trainable.restore`` sets
    ``training_iteration`` from that checkpoint's result (ray/tune/trainable/trainable.py). Without it, the
    restarted trial's iterations would begin again at 1 while its steps go on. ASHA and the searcher count
    ``training_iteration``, so they would see the steps after the restart as steps 1, 2, ...
    """
    from ray import tune

    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "step.json").write_text(json.dumps({"step": metrics["step"]}))
        tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(folder))
