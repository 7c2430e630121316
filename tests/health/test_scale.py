"""Rules judge per-token values: under token-sum aggregations verl logs actor/kl_loss and actor/entropy as sums over
tokens, and the engine divides them by the tokens summed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from klsweep.health import HealthConfig, HealthEngine, load_ruleset
from klsweep.health.signals import TokenScale
from klsweep.spec import load_sweep
from klsweep.spec.space import trial_overrides

GRPO_KL = Path(__file__).resolve().parents[2] / "sweeps" / "grpo_kl.yaml"
A = "actor_rollout_ref.actor"
KL_LOSS = {f"{A}.use_kl_loss": True}


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "token-sum", "seq-mean-token-sum",
                                  "seq-mean-token-sum-norm"])
def test_per_token_value_undoes_verls_agg_loss(mode):
    from verl.trainer.ppo.core_algos import agg_loss

    loss = torch.arange(20, dtype=torch.float64).reshape(4, 5)
    mask = (torch.arange(5) < torch.tensor([3, 5, 4, 5])[:, None]).to(torch.float64)  # valid lengths 3, 5, 4, 5
    logged = agg_loss(loss_mat=loss, loss_mask=mask, loss_agg_mode=mode).item()  # one batch of 4 sequences, width 5
    token_mean = (loss * mask).sum().item() / mask.sum().item()  # 169 / 17
    config = {f"{A}.loss_agg_mode": mode, f"{A}.ppo_mini_batch_size": 4, "actor_rollout_ref.rollout.n": 1,
              "data.max_response_length": 5}
    per_token = TokenScale(config).per_token("actor/kl_loss", logged, {"response_length/mean": 17 / 4})
    if mode == "seq-mean-token-mean":
        assert per_token == logged == pytest.approx(9.125)  # a mean of sequence means: per token, not re-weighted
    else:
        assert per_token == pytest.approx(token_mean, rel=1e-12) == pytest.approx(9.941, abs=1e-3)


def test_a_token_sum_without_response_length_is_not_judged_and_says_why():
    config = {**KL_LOSS, f"{A}.loss_agg_mode": "token-sum"}
    engine = HealthEngine(load_ruleset("default"), config)
    for step in range(1, 20):
        engine.update(step, {"actor/kl_loss": 15.0, "actor/pg_loss": 0.1})
    summary = engine.summary()
    assert summary["verdict"] == "healthy"
    reason = summary["not_applicable"]["builtin.kl_explosion"]
    assert "actor/kl_loss is a sum over tokens under loss_agg_mode=token-sum" in reason
    assert "response_length/mean was not logged" in reason


def test_a_real_explosion_under_token_sum_is_still_caught_per_token():
    config = {**KL_LOSS, f"{A}.loss_agg_mode": "seq-mean-token-sum"}
    engine = HealthEngine(load_ruleset(HealthConfig(preset="none")), config)
    verdict = engine.update(1, {"actor/kl_loss": 9.5 * 200, "response_length/mean": 200.0})
    assert verdict.stop and verdict.reason.rule == "builtin.kl_explosion"
    assert verdict.reason.message.startswith("actor/kl_loss per token = 9.5 >= 9")
    assert engine.summary()["scale"]["actor/kl_loss"] == (
        "actor/kl_loss is a sum over tokens under loss_agg_mode=seq-mean-token-sum: divided by response_length/mean"
    )


@pytest.mark.slow
def test_the_shipped_grpo_kl_sweeps_token_sum_trial_is_not_stopped():
    from klsweep.trainers.embedded import EmbeddedTrainer

    sweep = load_sweep(GRPO_KL)
    overrides = trial_overrides(sweep, {"kl_coef": 0.001, "kl_loss_type": "low_var_kl", "loss_agg_mode": "token-sum"})
    trainer = EmbeddedTrainer({**overrides, "trainer.total_training_steps": 8})
    engine = HealthEngine(load_ruleset(sweep.health), overrides)
    naive = HealthEngine(load_ruleset(sweep.health), {**overrides, f"{A}.loss_agg_mode": "token-mean"})
    sequences = overrides[f"{A}.ppo_mini_batch_size"] * overrides["actor_rollout_ref.rollout.n"]  # 16 × 8
    for step in range(1, 9):
        metrics = trainer.train_step()
        engine.update(step, metrics)
        naive.update(step, metrics)
    # read as per-token values, the logged token sum passes the KL rules' per-token bounds within a few steps (k3's
    # clamp 9: builtin.kl_explosion; KL > 1 for 3 steps: kl_blowup): the false stop
    assert naive.summary()["reason"]["rule"] in ("builtin.kl_explosion", "kl_blowup"), naive.summary()
    assert naive.summary()["stop_step"] <= 5
    assert engine.summary()["verdict"] == "healthy", engine.summary()["stop_reason"]
    per_token = metrics["actor/kl_loss"] / (metrics["response_length/mean"] * sequences)
    assert metrics["actor/kl_loss"] > 9 and per_token < 0.1
    assert engine.summary()["scale"]["actor/kl_loss"].endswith("response_length/mean × 128 sequences (its mini-batch)")
