"""Parity: the losses and rewards the embedded trainer uses equal verl's functions and closed forms.

References that share no code with the trainer (verl's end-to-end ``ppo_loss``, hand-derived closed forms, GAE and
GRPO re-derived from the papers on the trainer's own batch) are in ``test_reference_math.py``.
"""


import numpy as np
import pytest
import torch

from klsweep.trainers.embedded.trainer import EmbeddedTrainer, actor_loss, apply_kl_penalty

A = "actor_rollout_ref.actor"


def _actor_config(kl_loss_type: str, loss_agg_mode: str, entropy_coeff: float = 0.01, loss_scale_factor=None):
    from verl.workers.config import ActorConfig

    return ActorConfig(
        strategy="fsdp", ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=4, rollout_n=2, clip_ratio=0.2,
        loss_agg_mode=loss_agg_mode, loss_scale_factor=loss_scale_factor, entropy_coeff=entropy_coeff,
        use_kl_loss=True, kl_loss_coef=0.3, kl_loss_type=kl_loss_type,
    )


def _tensors(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    shape = (4, 5)
    log_prob = (-torch.rand(shape, generator=g) * 2).requires_grad_(True)
    old = log_prob.detach() + 0.3 * torch.randn(shape, generator=g)
    ref = log_prob.detach() + 0.5 * torch.randn(shape, generator=g)
    entropy = torch.rand(shape, generator=g)
    advantages = torch.randn(shape, generator=g)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.float)
    return log_prob, entropy, old, ref, advantages, mask


def test_actor_loss_closed_form_token_mean_k1_at_ratio_one():
    # ratio = 1 (log_prob == old): pg_loss = token-mean(-A); k1 kl_loss = token-mean(log_prob - ref)
    log_prob, entropy, _, ref, advantages, mask = _tensors(1)
    config = _actor_config("k1", "token-mean", entropy_coeff=0.0)
    loss, metrics = actor_loss(log_prob, entropy, log_prob.detach(), ref, advantages, mask, config)
    n = mask.sum()
    pg = (-advantages * mask).sum() / n
    kl = ((log_prob.detach() - ref) * mask).sum() / n
    assert metrics["actor/pg_loss"] == pytest.approx(pg.item(), rel=1e-5)
    assert loss.item() == pytest.approx((pg + 0.3 * kl).item(), rel=1e-5)
    assert metrics["actor/ppo_kl"] == pytest.approx(0.0, abs=1e-7)


def test_seq_mean_token_sum_norm_uses_loss_scale_factor():
    # verl's agg_loss on L = 0..19 (4x5), valid lengths [3,5,4,5]: seq-mean-token-sum 42.25, /10 = 4.225
    mask = _tensors()[-1]
    config = _actor_config("k1", "seq-mean-token-sum-norm", entropy_coeff=1.0, loss_scale_factor=10)
    L = torch.arange(20.0).reshape(4, 5)
    zeros = torch.zeros(4, 5)
    loss, _ = actor_loss(zeros.clone().requires_grad_(True), L, zeros, zeros, zeros, mask, config)
    assert loss.item() == pytest.approx(-4.225)  # pg 0, kl 0, -1.0 * entropy term


def test_kl_in_reward_equals_verls_apply_kl_penalty():
    from tensordict import TensorDict
    from verl import DataProto
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.ray_trainer import apply_kl_penalty as verl_apply_kl_penalty

    _, _, old, ref, _, mask = _tensors(2)
    scores = torch.zeros(4, 5)
    scores[torch.arange(4), mask.sum(1).long() - 1] = torch.tensor([1.0, 0.2, 0.7, 1.3])
    kld = {  # Schulman 2020 (http://joschu.net/blog/kl-approx.html): k1, |k1| and k3 of log p - log p_ref
        "kl": lambda lp, r: lp - r,
        "abs": lambda lp, r: (lp - r).abs(),
        "low_var_kl": lambda lp, r: torch.exp(r - lp) - (r - lp) - 1,
    }
    for kl_penalty in ("kl", "low_var_kl", "abs"):
        ours_ctrl = core_algos.AdaptiveKLController(init_kl_coef=0.2, target_kl=0.05, horizon=100)
        verl_ctrl = core_algos.AdaptiveKLController(init_kl_coef=0.2, target_kl=0.05, horizon=100)
        rewards, metrics = apply_kl_penalty(scores, old, ref, mask, ours_ctrl, kl_penalty)
        data = DataProto(batch=TensorDict(
            {"response_mask": mask, "token_level_scores": scores, "old_log_probs": old, "ref_log_prob": ref},
            batch_size=[4]))
        data, verl_metrics = verl_apply_kl_penalty(data, verl_ctrl, kl_penalty=kl_penalty)
        torch.testing.assert_close(rewards, data.batch["token_level_rewards"])
        assert metrics == pytest.approx(verl_metrics)
        # the controller's update by hand (Ziegler et al. 2019): the batch mean of each sequence's token-mean KL,
        # its proportional error clipped to ±0.2, β ← β·(1 + error·n_steps/horizon) with n_steps = 4 sequences
        kl = sum(((kld[kl_penalty](old, ref) * mask).sum(1) / mask.sum(1)).tolist()) / 4
        assert metrics["actor/reward_kl_penalty"] == pytest.approx(kl, rel=1e-5)
        assert ours_ctrl.value == pytest.approx(0.2 * (1 + max(-0.2, min(0.2, kl / 0.05 - 1)) * 4 / 100), rel=1e-6)


def _overrides(**extra):
    base = {"trainer.total_training_steps": 4, "trainer.test_freq": -1, "trainer.val_before_train": False,
            "data.train_batch_size": 4, "actor_rollout_ref.rollout.n": 4}
    return {**base, **extra}


def test_adaptive_controller_matches_closed_form():
    target, horizon, beta0 = 0.002, 200, 0.05
    trainer = EmbeddedTrainer(_overrides(**{
        "algorithm.adv_estimator": "gae", "algorithm.use_kl_in_reward": True, "algorithm.kl_ctrl.type": "adaptive",
        "algorithm.kl_ctrl.kl_coef": beta0, "algorithm.kl_ctrl.target_kl": target, "algorithm.kl_ctrl.horizon": horizon,
        "algorithm.kl_penalty": "abs", f"{A}.optim.lr": 3e-3,
    }))
    n = 16  # sequences per step: 4 prompts x 4 samples
    beta = beta0
    for _ in range(4):
        metrics = trainer.train_step()
        assert metrics["actor/reward_kl_penalty_coeff"] == pytest.approx(beta, rel=1e-12)  # beta before the update
        kl = metrics["actor/reward_kl_penalty"]
        beta *= 1 + float(np.clip(kl / target - 1, -0.2, 0.2)) * n / horizon
    assert trainer.kl_ctrl.value == pytest.approx(beta, rel=1e-12)
    assert trainer.kl_ctrl.value != beta0
