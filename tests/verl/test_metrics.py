"""klsweep.verl.metrics: the KL defaults match verl's own config; aliases resolve across verl versions."""

from __future__ import annotations

from omegaconf import OmegaConf

from klsweep.verl.config import compose
from klsweep.verl.metrics import KL_DEFAULTS, KlSetup, flat_verl_config, resolve


def test_kl_defaults_are_verl_0_9_1_defaults():
    cfg = compose({})
    for key, value in KL_DEFAULTS.items():
        assert OmegaConf.select(cfg, key) == value, key


def test_kl_setup_from_overrides():
    assert not KlSetup.from_overrides(None).known and not KlSetup.from_overrides({}).known
    s = KlSetup.from_overrides({"algorithm.use_kl_in_reward": "true", "actor_rollout_ref.actor.kl_loss_type": "k3+"})
    assert s.known and s.kl_in_reward and not s.kl_in_loss and s.loss_estimator == "k3+"
    assert s.reward_kl_coef == 0.001 and s.reward_estimator == "kl" and not s.kl_off
    assert KlSetup.from_overrides({"trainer.total_training_steps": 3}).kl_off


def test_resolve_prefers_the_newest_name():
    assert resolve({"actor/entropy_loss": 1, "actor/entropy": 2}, "entropy") == "actor/entropy"
    assert resolve({"critic/kl": 0.1}, "ref_kl") == "critic/kl"
    assert resolve({"critic/kl_coeff": 0.1}, "actor/reward_kl_penalty_coeff") == "critic/kl_coeff"
    assert resolve({"val-core/a/acc/mean@4": 1, "test_score/a": 2}, "val_score") == "val-core/a/acc/mean@4"
    assert resolve({"actor/ppo_kl": 0.0}, "ref_kl") is None


def test_flat_verl_config():
    nested = {"actor_rollout_ref": {"actor": {"kl_loss_coef": 0.1}}, "algorithm.use_kl_in_reward": True, "seed": 1}
    assert flat_verl_config(nested) == {"actor_rollout_ref.actor.kl_loss_coef": 0.1, "algorithm.use_kl_in_reward": True}
