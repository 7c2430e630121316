"""Values verl's config accepts that break verl's adaptive KL controller or loss aggregation at the first update,
found by running verl's own ``get_kl_controller``/``AdaptiveKLController.update`` and ``agg_loss``."""

from __future__ import annotations

import pytest

from klsweep.errors import PreflightError
from klsweep.verl.numerics import numeric_problems
from klsweep.verl.preflight import preflight
from klsweep.verl.presets import preset_overrides

A = "actor_rollout_ref."

#: PPO with the adaptive in-reward controller at 256 prompts × 4 responses = 1,024 responses per step (n_steps)
ADAPTIVE = {
    "algorithm.use_kl_in_reward": True,
    "algorithm.kl_ctrl.type": "adaptive",
    "algorithm.kl_ctrl.kl_coef": 0.002,
    "algorithm.kl_ctrl.target_kl": 0.03,
    "algorithm.kl_ctrl.horizon": 5000,
    "data.train_batch_size": 256,
    A + "rollout.n": 4,
    A + "actor.loss_agg_mode": "token-mean",
}


def _problems(**changes) -> dict[str, str]:
    config = {**ADAPTIVE, **changes}
    return dict(numeric_problems(config.get))


def test_safe_values_pass():
    assert _problems() == {}
    # 205 > 0.2 × 1024 = 204.8: one update under target multiplies the coefficient by 1 - 204.8 / 205 > 0
    assert _problems(**{"algorithm.kl_ctrl.horizon": 205}) == {}


def test_a_horizon_short_for_the_batch_turns_the_coefficient_negative():
    (message,) = _problems(**{"algorithm.kl_ctrl.horizon": 200}).values()
    # 1 + clip(0 / 0.03 - 1, -0.2, 0.2) × 1024 / 200 = 1 - 1.024 = -0.024
    assert "algorithm.kl_ctrl.horizon=200" in message and "1 - 0.2 × 1024 / 200 = -0.024" in message
    assert "becomes negative" in message and "Safe range: algorithm.kl_ctrl.horizon > 204.8" in message
    assert "256 × 4" in message


def test_the_horizon_at_the_boundary_freezes_the_coefficient_at_0():
    # 0.2 × 1024 = 204.8 exactly in binary (0.2's double × 2**10): the factor is 1 - 1 = 0
    (message,) = _problems(**{"algorithm.kl_ctrl.horizon": 204.8}).values()
    assert "= 0, so the coefficient becomes 0" in message


def test_the_horizon_depends_on_the_responses_per_step():
    # the same horizon 200 is safe for 64 × 4 = 256 responses (1 - 0.2 × 256 / 200 = 0.744)
    assert _problems(**{"algorithm.kl_ctrl.horizon": 200, "data.train_batch_size": 64}) == {}


def test_zero_target_divides_by_zero_and_zero_horizon_fails_verls_assert():
    assert "ZeroDivisionError" in _problems(**{"algorithm.kl_ctrl.target_kl": 0.0})["algorithm.kl_ctrl.target_kl"]
    message = _problems(**{"algorithm.kl_ctrl.horizon": 0})["algorithm.kl_ctrl.horizon"]
    assert "asserts horizon > 0" in message and "> 204.8" in message


def test_a_negative_target_only_shrinks_the_coefficient():
    message = _problems(**{"algorithm.kl_ctrl.target_kl": -0.01})["algorithm.kl_ctrl.target_kl"]
    # clip(kl / -0.01 - 1) = -0.2 at any KL >= 0: factor 1 - 0.2 × 1024 / 5000 = 0.95904
    assert "x0.959 per step" in message and "Safe range: target_kl > 0" in message


def test_a_zero_coefficient_under_the_adaptive_controller_stays_zero():
    message = _problems(**{"algorithm.kl_ctrl.kl_coef": 0.0})["algorithm.kl_ctrl.kl_coef"]
    assert "stays 0" in message and "Safe range: kl_coef > 0" in message


def test_the_fixed_controller_and_kl_in_the_loss_never_call_the_adaptive_update():
    assert _problems(**{"algorithm.kl_ctrl.type": "fixed", "algorithm.kl_ctrl.horizon": 0}) == {}
    assert _problems(**{"algorithm.use_kl_in_reward": False, "algorithm.kl_ctrl.target_kl": 0.0}) == {}


@pytest.mark.parametrize(("factor", "loss"), [(0, "inf"), (-512, "-0.00390625")])
def test_loss_scale_factor_of_seq_mean_token_sum_norm(factor, loss):
    # agg_loss on a unit loss of 1 sequence × 2 tokens: token-sum 2, seq-mean 2, divided by the factor
    problems = _problems(**{"algorithm.use_kl_in_reward": False, A + "actor.loss_agg_mode": "seq-mean-token-sum-norm",
                            A + "actor.loss_scale_factor": factor})
    assert f"giving a loss of {loss} for a unit loss" in problems[A + "actor.loss_scale_factor"]
    assert _problems(**{A + "actor.loss_agg_mode": "seq-mean-token-sum-norm", A + "actor.loss_scale_factor": 512}) == {}


@pytest.mark.slow
def test_preflight_refuses_them_with_the_sweep_file_line():
    ppo = {**preset_overrides("ppo", "reward"), **ADAPTIVE, "algorithm.kl_ctrl.horizon": 200}
    with pytest.raises(PreflightError) as e:
        preflight(ppo, runs_verl=False, where={"algorithm.kl_ctrl.horizon": "k31.yaml:14"})
    assert any(line.startswith("k31.yaml:14: algorithm.kl_ctrl.horizon=200 is too short")
               for line in str(e.value).splitlines())


@pytest.mark.parametrize(("clip_ratio_c", "refused"), [(1.0, True), (0.5, True), (1.5, False), (3.0, False)])
def test_dual_clip_lower_bound_must_exceed_1(clip_ratio_c, refused):
    # verl's compute_policy_loss_vanilla asserts clip_ratio_c > 1 at the first actor update
    problems = _problems(**{A + "actor.clip_ratio": 0.2, A + "actor.clip_ratio_low": 0.2,
                            A + "actor.clip_ratio_high": 0.28, A + "actor.clip_ratio_c": clip_ratio_c})
    assert (A + "actor.clip_ratio_c" in problems) == refused
    if refused:
        assert f"clip_ratio_c={clip_ratio_c}: verl's compute_policy_loss_vanilla asserts clip_ratio_c > 1" in \
            problems[A + "actor.clip_ratio_c"]


def test_verls_default_clip_ratio_c_is_the_one_not_rerun():
    from omegaconf import OmegaConf

    from klsweep.verl.config import compose
    from klsweep.verl.numerics import VERL_CLIP_RATIO_C

    assert OmegaConf.select(compose({}), A + "actor.clip_ratio_c") == VERL_CLIP_RATIO_C


@pytest.mark.parametrize("kl_ctrl", [
    {"type": "adaptive", "kl_coef": 0.002, "target_kl": 0.03, "horizon": 5000},
    {"type": "adaptive", "kl_coef": 0.1, "target_kl": 0.5, "horizon": 300},
    {"type": "fixed", "kl_coef": 0.05},
])
def test_the_controller_run_from_verls_source_is_verls_controller(kl_ctrl):
    """The check runs ``get_kl_controller`` from verl's file without importing verl: same coefficients as verl."""
    from types import SimpleNamespace

    from verl.trainer.ppo.core_algos import get_kl_controller

    from klsweep.verl.numerics import verl_kl_controller_factory

    ours, verls = (factory(SimpleNamespace(**kl_ctrl)) for factory in (verl_kl_controller_factory(), get_kl_controller))
    assert type(ours).__name__ == type(verls).__name__
    for current_kl in (0.0, 0.01, 0.03, 0.2, 3.0):
        ours.update(current_kl=current_kl, n_steps=1024)
        verls.update(current_kl=current_kl, n_steps=1024)
        assert ours.value == verls.value
    with pytest.raises(AssertionError, match="horizon"):
        verl_kl_controller_factory()(SimpleNamespace(type="adaptive", kl_coef=1.0, target_kl=0.1, horizon=0))
