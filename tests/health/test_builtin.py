"""Built-in checks: non-finite grad norms and losses, KL estimator signs and clamps, KL exactly 0, KL on with
coefficient 0, no learning signal."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from klsweep.health import HealthEngine, load_ruleset
from klsweep.health.readers import read_trace

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"

KL_LOSS = {"actor_rollout_ref.actor.use_kl_loss": True}


def _feed(stream, run_config=None, preset="default"):
    engine = HealthEngine(load_ruleset(preset), run_config)
    return engine, [engine.update(step, metrics) for step, metrics in stream]


def _healthy(step, **over):
    base = {
        "actor/pg_loss": 0.01,
        "actor/kl_loss": 0.01 + 0.001 * step,
        "actor/entropy": 0.3,
        "actor/grad_norm": 0.5,
        "critic/score/mean": 0.5,
        "critic/score/max": 1.0,
        "critic/score/min": 0.0,
        "critic/advantages/max": 1.2,
        "critic/advantages/min": -1.2,
    }
    return {**base, **over}


# ---- a single NaN grad_norm is not fatal (verl-omni#539, verl#870, #751) -------------------------------------------
def test_one_nan_grad_norm_warns_and_counts():
    stream = [(s, _healthy(s, **({"actor/grad_norm": math.nan} if s == 5 else {}))) for s in range(1, 21)]
    engine, v = _feed(stream, KL_LOSS)
    events = [e for x in v for e in x.events if e.rule == "builtin.nonfinite_grad_norm"]
    assert [(e.step, e.action) for e in events] == [(5, "warn")]
    assert events[0].values["count"] == 1.0
    assert engine.summary()["verdict"] == "warned"


def test_a_streak_of_nan_grad_norms_stops_and_the_streak_is_configurable():
    stream = [(s, _healthy(s, **({"actor/grad_norm": math.inf} if s >= 5 else {}))) for s in range(1, 21)]
    _, v = _feed(stream, KL_LOSS)
    assert v[-1].reason.rule == "builtin.nonfinite_grad_norm" and v[-1].reason.step == 7  # streak 3 in default
    _, v = _feed(stream, KL_LOSS, preset="aggressive")
    assert v[-1].reason.step == 9  # streak 5


@pytest.mark.parametrize("key", ["actor/pg_loss", "critic/vf_loss", "actor/kl_loss"])
def test_a_non_finite_loss_stops_at_once(key):
    stream = [(s, _healthy(s, **({key: math.nan} if s == 4 else {}))) for s in range(1, 10)]
    _, v = _feed(stream, KL_LOSS)
    assert v[3].stop and v[3].reason.kind == "nonfinite" and v[3].reason.rule == "builtin.nonfinite_loss"
    assert not v[2].stop


# ---- KL estimator signs and clamps (verl#2928) ---------------------------------------------------------------------
def test_small_negative_k1_means_are_normal():
    stream = [(s, _healthy(s, **{"actor/kl_loss": kl})) for s, kl in enumerate([-0.0004, 0.0, -0.001], start=1)]
    engine, v = _feed(stream, {**KL_LOSS, "actor_rollout_ref.actor.kl_loss_type": "kl"})
    assert not v[-1].stop and engine.summary()["verdict"] == "healthy"


@pytest.mark.parametrize("estimator", ["abs", "k2", "mse", "low_var_kl", "k3", "k3+"])
def test_negative_mean_of_a_nonnegative_estimator_is_a_bug(estimator):
    stream = [(s, _healthy(s, **{"actor/kl_loss": kl})) for s, kl in enumerate([0.002, -0.001], start=1)]
    _, v = _feed(stream, {**KL_LOSS, "actor_rollout_ref.actor.kl_loss_type": estimator})
    assert v[-1].stop and v[-1].reason.rule == "builtin.kl_negative" and v[-1].reason.kind == "misconfigured"
    assert v[-1].reason.step == 2


def test_k3_at_its_clamp_is_an_explosion():
    stream = [(s, _healthy(s, **{"actor/kl_loss": kl})) for s, kl in enumerate([0.05, 2.0, 9.6], start=1)]
    _, v = _feed(stream, KL_LOSS)  # kl_loss_type defaults to low_var_kl (k3)
    assert v[-1].reason.rule == "builtin.kl_explosion" and v[-1].reason.kind == "diverged"
    assert "clamp" in v[-1].reason.message and v[-1].reason.step == 3
    assert not v[1].stop


# ---- "KL is exactly 0" (verl#1573, #2060) --------------------------------------------------------------------------
def test_zero_kl_during_warm_up_then_rising_is_fine_and_ppo_kl_is_never_used():
    stream = [
        (s, _healthy(s, **{"actor/kl_loss": 0.0 if s <= 5 else 0.001 * s, "actor/ppo_kl": 0.0})) for s in range(1, 31)
    ]
    engine, v = _feed(stream, KL_LOSS)
    assert engine.summary()["verdict"] == "healthy"


def test_kl_exactly_zero_after_warm_up_with_kl_on_is_misconfigured():
    stream = [(s, _healthy(s, **{"actor/kl_loss": 0.0})) for s in range(1, 31)]
    _, v = _feed(stream, KL_LOSS)
    assert v[-1].reason.rule == "builtin.kl_dead" and v[-1].reason.kind == "misconfigured"
    assert v[-1].reason.step == 13  # after step 10, 3 reports: 11, 12, 13


def test_ppo_kl_alone_and_kl_off_by_config_are_not_applicable():
    only_ppo_kl = [(s, {"actor/ppo_kl": 0.0, "actor/pg_loss": 0.01}) for s in range(1, 31)]
    engine, v = _feed(only_ppo_kl, KL_LOSS)
    assert not v[-1].stop and "never logged" in engine.summary()["not_applicable"]["builtin.kl_dead"]
    zero_kl = [(s, _healthy(s, **{"actor/kl_loss": 0.0})) for s in range(1, 31)]
    engine, v = _feed(zero_kl, {"actor_rollout_ref.actor.use_kl_loss": False})
    assert not v[-1].stop
    assert "off by config" in engine.summary()["not_applicable"]["builtin.kl_dead"]


# ---- KL on with coefficient 0 (verl#6519) --------------------------------------------------------------------------
def test_kl_on_with_coefficient_zero_is_not_dead_kl_and_its_share_is_zero():
    config = {**KL_LOSS, "actor_rollout_ref.actor.kl_loss_coef": 0.0}
    stream = [(s, _healthy(s, **{"actor/kl_loss": 0.0, "actor/kl_coef": 0.0})) for s in range(1, 31)]
    engine, v = _feed(stream, config)
    assert not v[-1].stop
    assert "coefficient is 0" in engine.summary()["not_applicable"]["builtin.kl_dead"]
    share_rule = {"name": "share", "metric": "kl_loss_share", "above": -1, "action": "advise"}
    engine = HealthEngine(load_ruleset({"preset": "none", "rules": [share_rule]}), config)
    verdict = engine.update(1, _healthy(1, **{"actor/kl_loss": 0.2}))
    assert verdict.events[0].values == {"kl_loss_share": 0.0}


# ---- no learning signal (rllm-org/rllm#54) -------------------------------------------------------------------------
def _zero_advantages(score_min, score_max, steps=10):
    return [
        (s, _healthy(s, **{"critic/advantages/max": 0.0, "critic/advantages/min": 0.0,
                           "actor/kl_loss": 0.007 + 0.003 * s,
                           "critic/score/min": score_min, "critic/score/max": score_max}))
        for s in range(1, steps + 1)
    ]


def test_zero_advantages_for_ten_steps_stop_as_no_signal_not_divergence():
    stream = _zero_advantages(0.0, 0.0)  # every answer scored 0, as in rllm#54
    for preset, step in (("default", 2), ("conservative", 2), ("aggressive", 4)):  # no_signal_for: 2, 2, 4
        _, v = _feed(stream, KL_LOSS, preset=preset)
        assert v[-1].reason.kind == "no_signal" and v[-1].reason.rule == "builtin.no_signal"
        assert v[-1].reason.step == step
        assert sum(x.stop for x in v) == len(v) - step + 1


def test_zero_advantages_while_scores_differ_warn_then_stop_after_uniform_groups_for():
    """Each group scored its answers alike (prompts solved or out of reach) while the batch spans 0..1: verl's 72B
    GRPO-LoRA baseline shows it at steps 38-39 and is healthy, so it warns from ``no_signal_for`` steps and stops only
    at ``uniform_groups_for`` (5) steps."""
    stream = _zero_advantages(0.0, 1.0)
    for preset, warn_from in (("default", 2), ("conservative", 2), ("aggressive", 4)):
        _, v = _feed(stream, KL_LOSS, preset=preset)
        assert [x.stop for x in v] == [False] * 4 + [True] * 6
        assert v[4].reason.kind == "no_signal" and v[4].reason.step == 5
        assert "scores differ" in v[4].reason.message
        warned = [s for s, x in zip(range(1, 5), v) if any(e.rule == "builtin.no_signal" for e in x.events)]
        assert warned == list(range(warn_from, 5))
    _, v = _feed(stream, KL_LOSS, preset={"preset": "default", "builtin": {"uniform_groups_for": 0}})
    assert not any(x.stop for x in v)


def test_score_max_zero_is_no_signal_and_a_recovery_resets_the_streak():
    zero = {"critic/score/max": 0.0, "critic/score/min": 0.0}
    no_advantages = {k: v for k, v in _healthy(0).items() if not k.startswith("critic/advantages")}
    stream = [(s, {**no_advantages, **(zero if s != 2 else {})}) for s in range(1, 5)]
    _, v = _feed(stream, KL_LOSS)
    assert [x.stop for x in v] == [False, False, False, True]
    assert v[-1].reason.kind == "no_signal" and "every score is 0" in v[-1].reason.message


def test_batches_scoring_zero_with_nonzero_advantages_still_train():
    """verl's 0.5B PPO baseline (tests/data/traces/ppo_qwen05b_gsm8k_resp256.log.gz) scores 0 on every response at
    steps 11 and 12 while its critic's advantages span -4.1..28.3: the policy gradient is not 0."""
    trace = read_trace(TRACES / "ppo_qwen05b_gsm8k_resp256.log.gz")
    rows = dict(trace.reports)
    assert rows[11]["critic/score/max"] == rows[12]["critic/score/max"] == 0.0
    assert rows[12]["critic/advantages/max"] == 28.293
    engine = HealthEngine(load_ruleset("default"), rounded=True)
    for step, metrics in trace.reports:
        engine.update(step, metrics)
    assert "builtin.no_signal" not in engine.summary()["fired"]


# ---- the model never updates (ms-swift#5890) -----------------------------------------------------------------------
NO_UPDATE = Path(__file__).resolve().parents[1] / "data" / "shapes" / "no_update.jsonl"


@pytest.mark.parametrize("run_config", [KL_LOSS, None])
def test_zero_grad_norm_with_zero_kl_is_no_update_not_dead_kl(run_config):
    stream = [(row["step"], row["data"]) for row in map(json.loads, NO_UPDATE.read_text().splitlines())]
    engine, v = _feed(stream, run_config)
    reason = engine.summary()["reason"]
    # grad_norm and kl_loss exactly 0 from step 1: 3 steps (no_update_for) at step 3; kl_dead would wait for its
    # warm-up (10) and stop at 13 as a KL misconfiguration
    assert (reason["rule"], reason["kind"], reason["step"]) == ("builtin.no_update", "misconfigured", 3)
    assert reason["message"] == (
        "no update: actor/grad_norm is 0 for 3 steps (steps 1-3) while the policy is flat (actor/kl_loss = 0)"
    )
    assert "learning rate" in reason["advice"] or "optim.lr" in reason["advice"]
    assert "builtin.kl_dead" not in engine.summary()["fired"]


def test_no_update_reads_the_learning_rate_and_the_entropy_when_no_kl_is_logged():
    flat = [(s, {"actor/grad_norm": 0.4, "actor/lr": 0.0, "actor/entropy": 0.70 + 0.01 * (s % 2)}) for s in range(1, 8)]
    engine, _ = _feed(flat)
    reason = engine.summary()["reason"]
    assert reason["rule"] == "builtin.no_update" and reason["step"] == 3
    assert "actor/lr is 0" in reason["message"] and "actor/entropy unchanged" in reason["message"]
    # entropy moving by more than 5 % of its value at the streak's start: the policy moves, no finding
    moving = [(s, {"actor/grad_norm": 0.0, "actor/entropy": 0.70 * 1.06**s}) for s in range(1, 8)]
    engine, _ = _feed(moving)
    assert engine.summary()["verdict"] == "healthy"


def test_a_moving_kl_with_zero_grad_norm_is_not_no_update_and_kl_dead_waits_for_updates():
    moving = [(s, _healthy(s, **{"actor/grad_norm": 0.0})) for s in range(1, 31)]  # kl_loss 0.011 ... 0.04
    engine, _ = _feed(moving, KL_LOSS)
    assert engine.summary()["verdict"] == "healthy"
    frozen = [(s, _healthy(s, **{"actor/grad_norm": 0.0, "actor/kl_loss": 0.0})) for s in range(1, 31)]
    engine = HealthEngine(load_ruleset({"preset": "default", "builtin": {"no_update_for": 0}}), KL_LOSS)
    for step, metrics in frozen:
        engine.update(step, metrics)
    assert engine.summary()["verdict"] == "healthy"
    assert "the actor never updated" in engine.summary()["not_applicable"]["builtin.kl_dead"]
