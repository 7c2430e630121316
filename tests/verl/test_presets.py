"""Algorithm presets against verl 0.9.1's documented defaults, aliases, and composition with verl's own config."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from klsweep.verl.config import check_values, compose
from klsweep.verl.presets import CRITIC_KNOBS, KNOBS, preset_overrides, resolve_key

A = "actor_rollout_ref.actor."

# verl 0.9.1 defaults, copied by hand from verl/trainer/config/ppo_trainer.yaml (algorithm.*) and
# verl/trainer/config/actor/actor.yaml (actor.*), not read from our code
VERL_DEFAULTS = {
    "algorithm.kl_ctrl.kl_coef": 0.001,
    "algorithm.kl_ctrl.target_kl": 0.1,
    "algorithm.kl_ctrl.horizon": 10000,
    "algorithm.kl_ctrl.type": "fixed",
    "algorithm.kl_penalty": "kl",
    A + "kl_loss_coef": 0.001,
    A + "kl_loss_type": "low_var_kl",
    A + "loss_agg_mode": "token-mean",
    A + "entropy_coeff": 0,
    A + "clip_ratio": 0.2,
    A + "ppo_epochs": 1,
    A + "optim.lr": 1e-6,
}


def test_ppo_is_gae_with_critic_and_kl_in_the_reward():
    ppo = preset_overrides("ppo", "reward")
    assert ppo["algorithm.adv_estimator"] == "gae"
    assert ppo["algorithm.use_kl_in_reward"] is True and ppo[A + "use_kl_loss"] is False
    assert set(CRITIC_KNOBS) <= set(ppo)
    assert ppo["actor_rollout_ref.rollout.n"] == 1
    assert {k: ppo[k] for k in VERL_DEFAULTS} == VERL_DEFAULTS


def test_grpo_has_kl_in_the_loss_std_normalisation_and_groups():
    grpo = preset_overrides("grpo", "loss")
    assert grpo["algorithm.adv_estimator"] == "grpo"
    assert grpo[A + "use_kl_loss"] is True and grpo["algorithm.use_kl_in_reward"] is False
    assert grpo["algorithm.norm_adv_by_std_in_grpo"] is True
    assert grpo["actor_rollout_ref.rollout.n"] > 1
    assert not set(CRITIC_KNOBS) & set(grpo)
    assert {k: grpo[k] for k in VERL_DEFAULTS} == VERL_DEFAULTS


def test_drgrpo_is_grpo_plus_three_coupled_overrides_and_a_constant_scale():
    dr = preset_overrides("drgrpo", "none")
    assert dr["algorithm.adv_estimator"] == "grpo"
    assert dr["algorithm.norm_adv_by_std_in_grpo"] is False
    assert dr[A + "loss_agg_mode"] == "seq-mean-token-sum-norm"
    assert dr[A + "use_kl_loss"] is False and dr["algorithm.use_kl_in_reward"] is False
    assert dr[A + "loss_scale_factor"] == 512  # verl's data.max_response_length default
    assert preset_overrides("drgrpo", "none", base={"data.max_response_length": 8})[A + "loss_scale_factor"] == 8


@pytest.mark.parametrize("algorithm", ["ppo", "grpo", "drgrpo"])
def test_every_knob_is_explicit(algorithm):
    assert set(KNOBS) <= set(preset_overrides(algorithm, "none"))


def test_interpolated_defaults_follow_the_value_they_point_to():
    # verl's critic.yaml: ppo_epochs: ${oc.select:actor_rollout_ref.actor.ppo_epochs,1}
    ppo = preset_overrides("ppo", "reward", base={A + "ppo_epochs": 3, A + "ppo_mini_batch_size": 64})
    assert ppo["critic.ppo_epochs"] == 3 and ppo["critic.ppo_mini_batch_size"] == 64


@pytest.mark.slow
@pytest.mark.parametrize("algorithm, placement", [("ppo", "reward"), ("grpo", "loss"), ("drgrpo", "none")])
def test_presets_compose_in_verl_and_pass_its_value_checks(algorithm, placement):
    overrides = preset_overrides(algorithm, placement)
    cfg = compose(overrides)
    check_values(cfg)
    for key, value in overrides.items():
        assert OmegaConf.select(cfg, key) == value, key


@pytest.mark.parametrize(
    "alias, placement, key",
    [
        ("kl_coef", "reward", "algorithm.kl_ctrl.kl_coef"),
        ("kl_coef", "loss", A + "kl_loss_coef"),
        ("kl_loss_type", "reward", "algorithm.kl_penalty"),
        ("kl_loss_type", "loss", A + "kl_loss_type"),
        ("target_kl", "reward", "algorithm.kl_ctrl.target_kl"),
        ("horizon", "reward", "algorithm.kl_ctrl.horizon"),
        ("loss_agg_mode", "none", A + "loss_agg_mode"),
        ("entropy_coeff", "loss", A + "entropy_coeff"),
        ("data.train_batch_size", "loss", "data.train_batch_size"),
    ],
)
def test_aliases_resolve_to_the_live_key(alias, placement, key):
    assert resolve_key(alias, placement) == key


def test_kl_alias_without_a_live_key_is_an_error():
    with pytest.raises(ValueError, match="no effect with kl_placement none"):
        resolve_key("kl_coef", "none")
    with pytest.raises(ValueError, match="ambiguous"):
        resolve_key("kl_loss_type", "both")
