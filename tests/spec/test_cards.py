"""Sweep-file mistakes caught before any trial starts: inert or doubled KL knobs, values verl only rejects after its
first rollout, negative KL coefficients, KL on with coefficient 0, DrGRPO's preset, typos, batch arithmetic, and
every algorithm knob written into each trial."""

from __future__ import annotations

import pytest

from klsweep.errors import PreflightError, SweepFileError
from klsweep.orchestrate.plan import preflight_sweep
from klsweep.spec import load_sweep
from klsweep.spec.space import trial_overrides
from klsweep.verl.presets import KNOBS


def _problems(path) -> list[str]:
    with pytest.raises(SweepFileError) as e:
        load_sweep(path)
    return e.value.problems


def test_searching_the_inert_kl_coefficient_names_the_live_key(sweep_file):
    path = sweep_file("parameters:\n"
                      "  algorithm.kl_ctrl.kl_coef: {distribution: log_uniform_values, min: 0.0001, max: 0.01}\n")
    (problem,) = _problems(path)
    assert problem.startswith(f"{path}:5: parameters.algorithm.kl_ctrl.kl_coef:")
    assert "no effect in any trial" in problem and "actor_rollout_ref.actor.kl_loss_coef" in problem


@pytest.mark.parametrize(
    "algorithm, placement, live, inert",
    [
        ("grpo", "loss", "actor_rollout_ref.actor.kl_loss_coef", "algorithm.kl_ctrl.kl_coef"),
        ("grpo", "reward", "algorithm.kl_ctrl.kl_coef", "actor_rollout_ref.actor.kl_loss_coef"),
        ("ppo", "reward", "algorithm.kl_ctrl.kl_coef", "actor_rollout_ref.actor.kl_loss_coef"),
        ("ppo", "loss", "actor_rollout_ref.actor.kl_loss_coef", "algorithm.kl_ctrl.kl_coef"),
    ],
)
def test_kl_placement_emits_exactly_one_live_path(sweep_file, algorithm, placement, live, inert):
    sweep = load_sweep(sweep_file(f"kl_placement: {placement}\nparameters:\n  kl_coef: {{values: [0.005]}}\n",
                                  algorithm=algorithm))
    overrides = trial_overrides(sweep, {"kl_coef": 0.005})
    use_loss = overrides["actor_rollout_ref.actor.use_kl_loss"]
    use_reward = overrides["algorithm.use_kl_in_reward"]
    assert (use_loss, use_reward) == (placement == "loss", placement == "reward")
    assert overrides[live] == 0.005
    assert overrides[inert] == 0.001  # verl's default, recorded but unused


def test_both_mechanisms_need_the_explicit_opt_in(sweep_file):
    problems = _problems(sweep_file("overrides:\n  algorithm.use_kl_in_reward: true\n"))
    assert "set by the sweep file's `kl_placement` field" in problems[0]
    sweep = load_sweep(sweep_file("kl_placement: both\n"))
    overrides = trial_overrides(sweep, {})
    assert overrides["actor_rollout_ref.actor.use_kl_loss"] and overrides["algorithm.use_kl_in_reward"]
    (ambiguous,) = _problems(sweep_file("kl_placement: both\nparameters:\n  kl_coef: {values: [0.01]}\n"))
    assert "ambiguous with kl_placement both" in ambiguous


@pytest.mark.parametrize(
    "setup, fix",
    [
        ("kl_placement: reward\n", "Set algorithm.kl_ctrl.type: adaptive"),  # kl_ctrl.type fixed (verl default)
        ("kl_placement: loss\n", "Set kl_placement: reward"),  # use_kl_in_reward false
    ],
)
def test_target_kl_without_the_adaptive_in_reward_controller(sweep_file, setup, fix):
    path = sweep_file(setup + "parameters:\n  target_kl: {min: 0.02, max: 0.1}\n", algorithm="ppo")
    (problem,) = _problems(path)
    assert "target_kl only drives the adaptive controller" in problem and fix in problem


def test_target_kl_conditional_on_adaptive_is_accepted(sweep_file):
    path = sweep_file(
        """
        kl_placement: reward
        parameters:
          algorithm.kl_ctrl.type: {values: [fixed, adaptive]}
          target_kl: {min: 0.02, max: 0.1, when: {algorithm.kl_ctrl.type: adaptive}}
        """,
        algorithm="ppo",
    )
    assert load_sweep(path).warnings == ()
    unconditional = sweep_file(
        "parameters:\n  algorithm.kl_ctrl.type: {values: [fixed, adaptive]}\n  target_kl: {min: 0.02, max: 0.1}\n",
        algorithm="ppo",
    )
    (warning,) = load_sweep(unconditional).warnings
    assert "no effect in some trials" in warning and "when" in warning


@pytest.mark.slow
def test_values_verl_rejects_late_are_rejected_before_any_trial(sweep_file):
    sweep = load_sweep(sweep_file(
        """
        parameters:
          kl_loss_type: {values: [low_var_kl, k4, full, k3+]}
          loss_agg_mode: {values: [token-mean, seq-sum]}
        """
    ))
    with pytest.raises(PreflightError) as e:
        preflight_sweep(sweep)
    lines = str(e.value).splitlines()
    assert any("'k4' is not a KL estimator" in line and "k3+" in line for line in lines)
    assert any("=full is accepted by verl's config but not implemented" in line for line in lines)
    assert any("'seq-sum' is not valid" in line and "seq-mean-token-sum-norm" in line for line in lines)
    assert not any("k3+" in line.split(" is ")[0] for line in lines)  # the + variant is valid
    assert all(line.startswith(str(sweep.source)) for line in lines)  # with the sweep file line


def test_drgrpo_as_adv_estimator_points_to_the_preset(sweep_file):
    (problem,) = _problems(sweep_file("overrides:\n  algorithm.adv_estimator: drgrpo\n"))
    assert "set by the sweep file's `algorithm` field" in problem


def test_negative_kl_coefficient_needs_the_opt_in(sweep_file):
    text = "parameters:\n  actor_rollout_ref.actor.kl_loss_coef: {distribution: uniform, min: -0.001, max: 0.01}\n"
    (problem,) = _problems(sweep_file(text))
    assert "can be -0.001" in problem and "allow_negative_kl: true" in problem
    assert load_sweep(sweep_file("allow_negative_kl: true\n" + text)).parameters


def test_kl_on_with_coefficient_zero_is_a_warning(sweep_file):
    sweep = load_sweep(sweep_file("overrides:\n  actor_rollout_ref.actor.kl_loss_coef: 0\n"))
    (warning,) = sweep.warnings
    assert "use_kl_loss=True with actor_rollout_ref.actor.kl_loss_coef=0" in warning


def test_drgrpo_preset_and_kl_loss_search(sweep_file):
    sweep = load_sweep(sweep_file(algorithm="drgrpo"))
    overrides = trial_overrides(sweep, {})
    assert overrides["algorithm.adv_estimator"] == "grpo"
    assert overrides["algorithm.norm_adv_by_std_in_grpo"] is False
    assert overrides["actor_rollout_ref.actor.loss_agg_mode"] == "seq-mean-token-sum-norm"
    assert overrides["actor_rollout_ref.actor.use_kl_loss"] is False
    assert overrides["actor_rollout_ref.actor.loss_scale_factor"] == overrides["data.max_response_length"]
    search = "parameters:\n  actor_rollout_ref.actor.kl_loss_coef: {values: [0.001, 0.01]}\n"
    (problem,) = _problems(sweep_file(search, algorithm="drgrpo"))
    assert "the KL loss is off" in problem and "kl_placement: loss" in problem
    (alias,) = _problems(sweep_file("parameters:\n  kl_coef: {values: [0.001]}\n", algorithm="drgrpo"))
    assert "no effect with kl_placement none" in alias
    turned_on = load_sweep(sweep_file("kl_placement: loss\n" + search, algorithm="drgrpo"))
    assert trial_overrides(turned_on, {"actor_rollout_ref.actor.kl_loss_coef": 0.01})[
        "actor_rollout_ref.actor.use_kl_loss"] is True


def test_typo_gets_line_and_closest_key(sweep_file):
    path = sweep_file("parameters:\n  actor_rollout_ref.actor.kl_los_type: {values: [kl]}\n")
    (problem,) = _problems(path)
    assert problem.startswith(f"{path}:5:") and "did you mean 'actor_rollout_ref.actor.kl_loss_type'?" in problem


@pytest.mark.slow
def test_micro_batch_larger_than_the_per_gpu_share(sweep_file):
    path = sweep_file(
        """
        overrides:
          data.train_batch_size: 8
          actor_rollout_ref.actor.ppo_mini_batch_size: 4
          actor_rollout_ref.rollout.n: 2
          trainer.n_gpus_per_node: 4
          actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu: 4
        """
    )
    sweep = load_sweep(path, ["trainer=verl", "budget.resources.gpu=4", "budget.resources.cpu=21"])
    with pytest.raises(PreflightError) as e:
        preflight_sweep(sweep)
    (batch,) = [line for line in str(e.value).splitlines() if "mini-batch per GPU" in line]
    assert batch.startswith(f"{sweep.source}:10:")  # the micro-batch line of the file
    assert "4 × 2 / 4 = 2" in batch and "Use at most 2" in batch


def test_every_algorithm_knob_is_explicit_and_trials_differ_only_where_searched(sweep_file):
    sweep = load_sweep(sweep_file("parameters:\n  kl_coef: {values: [0.001, 0.01]}\n"))
    a = trial_overrides(sweep, {"kl_coef": 0.001})
    b = trial_overrides(sweep, {"kl_coef": 0.01})
    assert set(KNOBS) <= set(a)
    for knob in ("actor_rollout_ref.actor.entropy_coeff", "actor_rollout_ref.actor.clip_ratio_low",
                 "actor_rollout_ref.actor.clip_ratio_high", "actor_rollout_ref.actor.clip_ratio_c"):
        assert knob in a
    assert {k for k in a if a[k] != b[k]} == {"actor_rollout_ref.actor.kl_loss_coef"}


def test_clip_ratio_alone_is_inert_in_verl_0_9_1(sweep_file):
    (problem,) = _problems(sweep_file("parameters:\n  actor_rollout_ref.actor.clip_ratio: {values: [0.1, 0.3]}\n"))
    assert "clip_ratio_low and clip_ratio_high" in problem


@pytest.mark.parametrize(("objective", "parameter", "scale"), [
    ("actor/kl_loss", "kl_loss_type: {values: [kl, low_var_kl]}", "each estimator has its own scale"),
    ("actor/kl_loss", "loss_agg_mode: {values: [token-mean, token-sum]}", "token-sum and seq-mean-token-sum sums"),
])
def test_a_kl_objective_compared_across_scales_is_a_warning(sweep_file, objective, parameter, scale):
    # a KL objective across estimators or aggregations compares scales, not drift
    text = (f"objective: [{{metric: val-core/arith/acc/mean@1, mode: max}}, {{metric: {objective}, mode: min}}]\n"
            f"parameters:\n  {parameter}\n")
    sweep = load_sweep(_with_objective(sweep_file, text))
    (warning,) = sweep.warnings
    assert f"objective {objective} is compared across trials with" in warning and scale in warning
    assert "the front would favour the scale" in warning


def test_a_kl_objective_with_one_estimator_or_a_score_objective_is_not_warned(sweep_file):
    same_scale = "objective: {metric: actor/kl_loss, mode: min}\nparameters:\n  kl_coef: {values: [0.01, 0.1]}\n"
    assert load_sweep(_with_objective(sweep_file, same_scale)).warnings == ()
    score = "parameters:\n  kl_loss_type: {values: [kl, low_var_kl]}\n"
    assert load_sweep(sweep_file(score)).warnings == ()


def _with_objective(sweep_file, text: str):
    """A GRPO sweep file whose ``objective`` is the one in ``text``."""
    return sweep_file("name: t\nalgorithm: grpo\n" + text, header=False)
