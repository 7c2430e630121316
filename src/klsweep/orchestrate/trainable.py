"""The Ray Tune function trainable: one trial = one training run of the sweep's trainer, reported step by step.

Tune calls :func:`run_trial` with the params Optuna suggested. The sweep turns them into the trial's full verl
override dict, and the trainer runs. Every training step goes to ``tune.report`` with verl's metric names, where the
health stopper (on the driver) and the searcher see it.

An in-process trial saves a checkpoint every ``trainer.save_freq`` steps, verl's cadence key. The default is as for
a verl trial (:func:`klsweep.launchers.resume.save_freq`): the validation cadence ``trainer.test_freq``, else a fifth
of the run. It is denser when the sweep remedies (:func:`klsweep.orchestrate.remedy.checkpoint_every`). A resumed
sweep thus continues an interrupted trial from there instead of from step 0, validation or not. After the load, the
trial's KL coefficient and learning rate are those the checkpoint holds, except the knobs of a remedy that restarts
the trial from exactly that checkpoint's step, which take their remedied values (the rule of every trainer,
:func:`klsweep.trainers.restore.knobs_after_load`).

A process trainer's trial (``trainer: verl``) is one supervised process tree
(:func:`klsweep.launchers.process.run_process_trial`), limited to ``budget.trial_timeout_s``. When Tune stops such a
trial, its actor gives back the trial's resources only once that tree is gone (:class:`EndsWithItsProcess`).

A verl trial with ``trainer.nnodes`` > 1 is the same supervised process, joined to the sweep's cluster as a Ray job of
its own that places its GPUs over several nodes (:mod:`klsweep.launchers.multinode`). This function starts no Ray
task or actor for it: work nested in a Tune trial is scheduled in the trial's placement group and can hang there
(ray-project/ray#25239). Stopping the trial ends the job on every node.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ray import tune

from klsweep.launchers.process import run_process_trial, stop_running_trials
from klsweep.orchestrate.remedy import checkpoint_every, remedies_on, split_config, verl_checkpoints_kept
from klsweep.results import STEP, TOTAL_STEPS, restarts
from klsweep.spec.space import trial_overrides
from klsweep.trainers.restore import restore_knobs

if TYPE_CHECKING:
    from klsweep.spec.schema import Sweep


def run_trial(config: Mapping[str, Any], *, sweep: Sweep) -> None:
    """Train one trial of ``sweep`` with the suggested params ``config``, reporting each step to Ray Tune.

    Args:
        config: the params Optuna suggested (aliases or verl keys → values).
        sweep: the loaded :class:`klsweep.spec.Sweep`.
    """
    params, remedies = split_config(config)  # a remedied trial's config also lists its remedies
    overrides = trial_overrides(sweep, params)
    kind = sweep.kind
    if kind.in_process is None:
        if remedies_on(sweep):  # the checkpoint before a finding must still be there (the trial's own value wins)
            overrides = verl_checkpoints_kept(sweep, overrides) | overrides
        restored = _restored_step()  # a remedy's restart when it is the step the last remedy restarts from
        rewind_to = restored if remedies and remedies[-1]["from_step"] == restored else None
        run_process_trial(overrides, sweep=sweep, timeout_s=sweep.budget.trial_timeout_s, rewind_to=rewind_to,
                          remedies=restarts(remedies), reported_to=restored or 0)
        return

    trainer = kind.in_process(sweep, overrides)
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            trainer.load(folder)
        restore_knobs(trainer, trainer.global_step, overrides, restarts(remedies))
    every = checkpoint_every(sweep, overrides)
    while trainer.global_step < trainer.total_steps:
        metrics: dict[str, Any] = dict(trainer.train_step())
        step = trainer.global_step
        metrics[STEP] = step
        metrics[TOTAL_STEPS] = trainer.total_steps  # the searcher tells a finished trial from an early-stopped one
        if every > 0 and step % every == 0 and step < trainer.total_steps:
            with tempfile.TemporaryDirectory() as folder:
                trainer.save(folder)
                tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(folder))
        else:
            tune.report(metrics)


def _restored_step() -> int | None:
    """The step of the Tune checkpoint a process trial is restored from (``step.json``, written with every report by
    :func:`klsweep.launchers.process._report_with_step_checkpoint`), or None on a fresh start."""
    checkpoint = tune.get_checkpoint()
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as folder:
        return int(json.loads(Path(folder, "step.json").read_text())["step"])


class EndsWithItsProcess:
    """Mixed into the Tune trainable that wraps :func:`run_trial`; the actor's ``cleanup`` waits for the process tree.

    It is a ``__mixins__`` entry, which Ray's ``wrap_function`` (ray/tune/trainable/function_trainable.py) puts before
    ``FunctionTrainable``. Tune calls ``cleanup`` when it stops a trial, before it frees the trial's resources. Here
    ``cleanup`` returns only once the trial's process tree is gone.

    Ray's own ``FunctionTrainable.cleanup`` does not wait for the trial's function (``session.finish(timeout=0)``).
    Without this, a stopped verl trial's vLLM and workers could hold its GPUs for the supervisor's grace period,
    while Tune already starts the next trial on them.
    """
    def cleanup(self) -> None:
        try:
            super().cleanup()  # type: ignore[misc]
        finally:
            stop_running_trials()


run_trial.__mixins__ = (EndsWithItsProcess,)  # type: ignore[attr-defined]
