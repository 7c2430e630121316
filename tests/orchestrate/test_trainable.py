"""An embedded trial saves a checkpoint every trainer.save_freq steps, defaulting as a verl trial's does (the
validation cadence, else a fifth of the run), so an interrupted trial resumes from there even when it never
validates; a checkpoint continues the trial exactly where it was saved."""

from __future__ import annotations

import math

import pytest
from ray import tune

from klsweep.orchestrate.trainable import run_trial
from klsweep.spec import load_sweep
from klsweep.spec.space import trial_overrides
from klsweep.trainers import trainer_kind
from tests.orchestrate.conftest import sweep_file

pytestmark = pytest.mark.slow

STEPS = 10
KL = {"algorithm.kl_ctrl.kl_coef": 0.002}


def _checkpointed_steps(ray_local, tmp_path, **overrides):
    path = sweep_file(tmp_path, budget={"trials": 1, "max_steps": STEPS})
    sweep = load_sweep(path, [f"overrides.{k}={v}" for k, v in overrides.items()])
    tuner = tune.Tuner(tune.with_parameters(run_trial, sweep=sweep), param_space=KL,
                       run_config=tune.RunConfig(storage_path=str(tmp_path / "tune"), verbose=0,
                                                 checkpoint_config=tune.CheckpointConfig(num_to_keep=None)))
    (result,) = tuner.fit()
    assert result.error is None, result.error
    rows = result.metrics_dataframe.to_dict("records")
    return sweep, rows, sorted((metrics["step"], ckpt) for ckpt, metrics in result.best_checkpoints)


def test_a_trial_that_never_validates_checkpoints_a_fifth_of_its_run(ray_local, tmp_path):
    # trainer.test_freq=-1: no validation, so before, no checkpoint either and an interrupted trial restarted at 0
    sweep, rows, checkpoints = _checkpointed_steps(ray_local, tmp_path, **{"trainer.test_freq": -1})
    assert [step for step, _ in checkpoints] == [2, 4, 6, 8]  # every 10 // 5 steps, not the last

    # the step-4 checkpoint continues the trial exactly: its next step is the step 5 the trial reported
    overrides = trial_overrides(sweep, KL)
    trainer = trainer_kind(sweep.trainer).in_process(sweep, overrides)
    with checkpoints[1][1].as_directory() as folder:
        trainer.load(folder)
    assert trainer.global_step == 4
    metrics = trainer.train_step()
    reported = next(row for row in rows if row["step"] == 5)
    for key in ("actor/pg_loss", "actor/reward_kl_penalty", "critic/score/mean"):
        assert math.isclose(metrics[key], reported[key], rel_tol=0, abs_tol=0), key


def test_save_freq_given_wins(ray_local, tmp_path):
    _, _, checkpoints = _checkpointed_steps(ray_local, tmp_path, **{"trainer.save_freq": 3})
    assert [step for step, _ in checkpoints] == [3, 6, 9]
