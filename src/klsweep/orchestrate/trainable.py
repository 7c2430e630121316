"""The Ray Tune function trainable: one trial = one training run of the sweep's trainer, reported step by step.

Tune calls :func:`run_trial` with the params Optuna suggested; the sweep turns them into the trial's full verl
override dict, the trainer runs, and every training step goes to ``tune.report`` with verl's metric names, where the
health stopper (on the driver) and the searcher see it. A checkpoint is saved on every validation step so a resumed
sweep continues an interrupted trial from there instead of from step 0.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from typing import Any

from klsweep.results import STEP, TOTAL_STEPS


def run_trial(config: Mapping[str, Any], *, sweep) -> None:
    """Train one trial of ``sweep`` with the suggested params ``config``, reporting each step to Ray Tune.

    Args:
        config: the params Optuna suggested (aliases or verl keys → values).
        sweep: the loaded :class:`klsweep.spec.Sweep`.
    """
    from ray import tune

    from klsweep.space import trial_overrides
    from klsweep.trainers import trainer_kind

    overrides = trial_overrides(sweep, config)
    kind = trainer_kind(sweep.trainer)
    if kind.in_process is None:
        from klsweep.launchers.process import run_process_trial

        run_process_trial(overrides, sweep=sweep)
        return

    trainer = kind.in_process(sweep, overrides)
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            trainer.load(folder)
    test_freq = int(overrides.get("trainer.test_freq") or 0)
    while trainer.global_step < trainer.total_steps:
        metrics: dict[str, Any] = dict(trainer.train_step())
        step = trainer.global_step
        metrics[STEP] = step
        metrics[TOTAL_STEPS] = trainer.total_steps  # the searcher tells a finished trial from an early-stopped one
        if test_freq > 0 and step % test_freq == 0 and step < trainer.total_steps:
            with tempfile.TemporaryDirectory() as folder:
                trainer.save(folder)
                tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(folder))
        else:
            tune.report(metrics)
