"""Parameters → Optuna define-by-run space and per-trial verl overrides; OptunaSearch accepts the space."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

import optuna
import pytest

from klsweep.errors import SweepFileError
from klsweep.spec import load_sweep
from klsweep.spec.space import define_space, fixed_overrides, seed_params, trial_overrides

if TYPE_CHECKING:
    from klsweep.spec.schema import Sweep

CONDITIONAL = """\
name: cond
algorithm: ppo
kl_placement: reward
objective: {metric: score, mode: max}
parameters:
  algorithm.kl_ctrl.type: {values: [fixed, adaptive]}
  kl_coef: {distribution: log_uniform_values, min: 0.0001, max: 0.01}
  target_kl: {distribution: log_uniform_values, min: 0.01, max: 1.0, when: {algorithm.kl_ctrl.type: adaptive}}
  horizon: {values: [1000, 10000], when: {algorithm.kl_ctrl.type: adaptive}}
  actor_rollout_ref.actor.ppo_epochs: {distribution: int_uniform, min: 1, max: 3}
  entropy_coeff: {distribution: q_uniform, min: 0.0, max: 0.01, q: 0.005}
  actor_rollout_ref.actor.clip_ratio_c: {value: 3.0}
seed_trials:
  - {algorithm.kl_ctrl.type: adaptive, kl_coef: 0.002, target_kl: 0.03, horizon: 1000}
budget: {trials: 3, max_concurrent: 1, max_steps: 5}
seed: 7
"""


@pytest.fixture
def sweep(tmp_path) -> Sweep:
    path = tmp_path / "cond.yaml"
    path.write_text(CONDITIONAL)
    return load_sweep(path)


def test_define_by_run_samples_conditionals_only_when_their_condition_holds(sweep: Sweep):
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    space = define_space(sweep)
    seen_types = set()
    for _ in range(30):
        trial = study.ask()
        constants = space(trial)
        params = trial.params
        assert constants == {"actor_rollout_ref.actor.clip_ratio_c": 3.0}
        adaptive = params["algorithm.kl_ctrl.type"] == "adaptive"
        seen_types.add(params["algorithm.kl_ctrl.type"])
        assert ("algorithm.kl_ctrl.target_kl" in params) == adaptive
        assert ("algorithm.kl_ctrl.horizon" in params) == adaptive
        assert 1e-4 <= params["algorithm.kl_ctrl.kl_coef"] <= 1e-2
        assert params["actor_rollout_ref.actor.ppo_epochs"] in (1, 2, 3)
        assert params["actor_rollout_ref.actor.entropy_coeff"] in (0.0, 0.005, 0.01)
        study.tell(trial, 0.0)
    assert seen_types == {"fixed", "adaptive"}
    dist = study.trials[0].distributions["algorithm.kl_ctrl.kl_coef"]
    assert dist.log and (dist.low, dist.high) == (1e-4, 1e-2)


def test_seed_trial_comes_first_with_verl_keys(sweep: Sweep):
    (seed,) = seed_params(sweep)
    assert seed == {"algorithm.kl_ctrl.type": "adaptive", "algorithm.kl_ctrl.kl_coef": 0.002,
                    "algorithm.kl_ctrl.target_kl": 0.03, "algorithm.kl_ctrl.horizon": 1000}
    study = optuna.create_study()
    study.enqueue_trial(seed)
    trial = study.ask()
    define_space(sweep)(trial)
    assert {k: trial.params[k] for k in seed} == seed


def test_trial_overrides_are_preset_plus_fixed_plus_params_plus_launcher_keys(sweep: Sweep):
    overrides = trial_overrides(sweep, {"kl_coef": 0.004, "algorithm.kl_ctrl.type": "adaptive"})
    assert overrides["algorithm.kl_ctrl.kl_coef"] == 0.004
    assert overrides["algorithm.kl_ctrl.type"] == "adaptive"
    assert overrides["algorithm.adv_estimator"] == "gae"
    assert overrides["trainer.logger"] == ["console", "file"]
    assert overrides["trainer.total_training_steps"] == 5
    assert overrides["data.seed"] == 7
    # trainer: embedded takes the embedded trainer's sizes, not verl's GPU-cluster ones
    from klsweep.trainers.embedded.config import EMBEDDED_DEFAULTS

    assert overrides["data.train_batch_size"] == EMBEDDED_DEFAULTS["data.train_batch_size"]
    assert overrides["actor_rollout_ref.actor.ppo_mini_batch_size"] == EMBEDDED_DEFAULTS["data.train_batch_size"]


@pytest.mark.slow
def test_optuna_search_accepts_the_define_by_run_space(sweep: Sweep, ray_local):
    from ray import tune
    from ray.tune.search.optuna import OptunaSearch

    def trainable(config):
        tune.report({"score": -math.log(config["algorithm.kl_ctrl.kl_coef"]), "started": time.time(),
                     "clip_c": config["actor_rollout_ref.actor.clip_ratio_c"]})

    searcher = OptunaSearch(space=define_space(sweep), metric="score", mode="max",
                            points_to_evaluate=seed_params(sweep), seed=sweep.seed)
    tuner = tune.Tuner(trainable, tune_config=tune.TuneConfig(search_alg=searcher, num_samples=3,
                                                              max_concurrent_trials=1))
    results = tuner.fit()
    configs = [r.config for r in results]
    assert len(configs) == 3 and not results.errors
    first = min(results, key=lambda r: r.metrics["started"]).config  # one trial at a time: the earliest is first
    assert first["algorithm.kl_ctrl.kl_coef"] == 0.002 and first["algorithm.kl_ctrl.target_kl"] == 0.03
    assert all(r.metrics["clip_c"] == 3.0 for r in results)  # constants reach the trial config


WANDB_SWEEP = """\
name: wb
algorithm: grpo
objective: {metric: score, mode: max}
parameters:
  kl_coef: {values: [0.001, 0.01]}
"""


@pytest.mark.parametrize("mode", ["disabled", "offline", "online"])
def test_verl_logs_to_console_and_file_whatever_the_wandb_mode(tmp_path, mode):
    """verl's own W&B logger stays off in every trial: it would call wandb.init without the sweep's WANDB_MODE and
    WANDB_DIR and make a second W&B run; the sweep's W&B callback is the one W&B run of a trial."""
    path = tmp_path / "wb.yaml"
    path.write_text(WANDB_SWEEP + f"wandb: {{mode: {mode}}}\n")
    sweep = load_sweep(path)
    assert trial_overrides(sweep, {"kl_coef": 0.01})["trainer.logger"] == ["console", "file"]
    assert fixed_overrides(sweep)["trainer.logger"] == ["console", "file"]


def test_other_loggers_of_the_overrides_are_kept(tmp_path):
    path = tmp_path / "wb.yaml"
    path.write_text(WANDB_SWEEP + "overrides:\n  trainer.logger: [console, tensorboard]\n")
    assert fixed_overrides(load_sweep(path))["trainer.logger"] == ["console", "file", "tensorboard"]


@pytest.mark.parametrize("logger", ["[console, wandb]", "wandb", "[console, tracking]"])
@pytest.mark.parametrize("mode", ["disabled", "offline"])
def test_wandb_in_trainer_logger_is_refused_naming_the_wandb_field(tmp_path, logger, mode):
    path = tmp_path / "wb.yaml"
    path.write_text(WANDB_SWEEP + f"overrides:\n  trainer.logger: {logger}\nwandb: {{mode: {mode}}}\n")
    with pytest.raises(SweepFileError) as refused:
        load_sweep(path)
    message = str(refused.value)
    assert message.startswith(f"{path}:7: overrides.trainer.logger: ")
    assert "wandb.init" in message and "two runs per trial" in message and "`wandb: {mode: offline}`" in message
