"""HealthEngine: for/after/any/all semantics, derived quantities, late collapse and reward hacking,
metric names that drift across verl versions, and slow checkpoint steps."""

from __future__ import annotations

import math

import numpy as np
import pytest

from klsweep.health import HealthConfig, HealthEngine, load_ruleset


def _rules(*rules, **builtin):
    return load_ruleset(HealthConfig(preset="none", rules=list(rules), builtin=builtin))


def _run(ruleset, stream, run_config=None):
    engine = HealthEngine(ruleset, run_config)
    verdicts = [engine.update(step, metrics) for step, metrics in stream]
    return engine, verdicts


def test_for_counts_judged_reports_and_absent_metrics_neither_count_nor_reset():
    rule = {"name": "high", "metric": "m", "above": 1.0, "for": 3, "action": "stop", "kind": "diverged"}
    stream = [(1, {"m": 2.0}), (2, {"m": 2.0}), (3, {"other": 1.0}), (4, {"m": "text"}), (5, {"m": 2.0})]
    engine, verdicts = _run(_rules(rule), stream)
    assert [v.stop for v in verdicts] == [False, False, False, False, True]
    assert verdicts[-1].reason.step == 5 and verdicts[-1].reason.values == {"m": 2.0}
    _, verdicts = _run(_rules(rule), [(1, {"m": 2.0}), (2, {"m": 0.5}), (3, {"m": 2.0}), (4, {"m": 2.0})])
    assert not any(v.stop for v in verdicts)  # a false report resets the streak


def test_after_is_a_warm_up_and_any_all_combine():
    rules = [
        {"name": "both", "all": [{"metric": "a", "above": 1}, {"metric": "b", "above": 1}], "action": "warn"},
        {
            "name": "either",
            "any": [{"metric": "a", "above": 1}, {"metric": "b", "above": 1}],
            "action": "warn",
            "after": 2,
        },
    ]
    _, v = _run(_rules(*rules), [(1, {"a": 2, "b": 0}), (2, {"a": 2}), (3, {"a": 0, "b": 2}), (4, {"a": 2, "b": 2})])
    fired = [{e.rule for e in x.events} for x in v]
    assert fired == [set(), set(), {"either"}, {"both", "either"}]
    assert v[-1].health == "warned" and not v[-1].stop


def test_verdict_is_sticky_and_keeps_the_first_reason():
    rules = [
        {"name": "a_high", "metric": "a", "above": 1, "action": "stop"},
        {"name": "b_high", "metric": "b", "above": 1, "action": "stop"},
    ]
    engine, v = _run(_rules(*rules), [(1, {"a": 2}), (2, {"b": 2}), (3, {})])
    assert all(x.stop for x in v) and {x.reason.rule for x in v} == {"a_high"}
    assert engine.summary()["fired"]["b_high"]["first_step"] == 2


def test_ref_kl_follows_the_configured_mechanism():
    rule = {"name": "kl", "metric": "ref_kl", "above": -1, "action": "advise"}
    both = {"actor/kl_loss": 0.3, "actor/reward_kl_penalty": 0.05}
    in_reward = {"algorithm.use_kl_in_reward": True}
    _, v = _run(_rules(rule), [(1, both)], in_reward)
    assert v[0].events[0].values == {"actor/reward_kl_penalty": 0.05}
    _, v = _run(_rules(rule), [(1, both)], {"actor_rollout_ref.actor.use_kl_loss": True})
    assert v[0].events[0].values == {"actor/kl_loss": 0.3}
    engine, v = _run(_rules(rule), [(1, both)], {"trainer.total_training_steps": 10})  # both off (verl defaults)
    assert not v[0].events and "off by config" in engine.summary()["not_applicable"]["kl"]


def test_kl_loss_share_is_the_windowed_share_of_the_actor_loss():
    config = {
        "actor_rollout_ref.actor.use_kl_loss": True,
        "actor_rollout_ref.actor.kl_loss_coef": 0.5,
        "actor_rollout_ref.actor.entropy_coeff": 0.01,
    }
    rows = [(0.02, 0.1, 0.4), (-0.03, 0.12, 0.38), (0.0, 0.2, 0.35)]  # pg_loss, kl_loss, entropy
    stream = [
        (i + 1, {"actor/pg_loss": pg, "actor/kl_loss": kl, "actor/entropy": ent})
        for i, (pg, kl, ent) in enumerate(rows)
    ]
    rule = {"name": "share", "metric": "kl_loss_share", "above": -1, "action": "advise"}
    _, v = _run(_rules(rule), stream, config)
    # actor loss = pg_loss - entropy_coeff * entropy + kl_loss_coef * kl_loss (verl workers/utils/losses.py)
    kl_terms = [0.5 * kl for _, kl, _ in rows]
    totals = [abs(pg - 0.01 * ent + 0.5 * kl) for pg, kl, ent in rows]
    assert v[-1].events[0].values["kl_loss_share"] == pytest.approx(sum(kl_terms) / sum(totals))
    engine, v = _run(_rules(rule), stream, None)
    assert "needs the run config" in engine.summary()["not_applicable"]["share"]


def test_kl_loss_share_window_is_ten_steps_on_a_sampled_log():
    config = {"actor_rollout_ref.actor.use_kl_loss": True, "actor_rollout_ref.actor.kl_loss_coef": 1.0}
    rows = {1: (0.5, 0.5), 6: (0.1, 0.1), 11: (0.2, 0.1), 16: (0.3, 0.1)}  # step: (pg_loss, kl_loss), every 5 steps
    stream = [(s, {"actor/pg_loss": pg, "actor/kl_loss": kl}) for s, (pg, kl) in rows.items()]
    rule = {"name": "share", "metric": "kl_loss_share", "above": -1, "action": "advise"}
    _, v = _run(_rules(rule), stream, config)
    # steps 7-16: the last report at or before step 7 is step 6, so reports 6, 11, 16 (not step 1)
    kl_terms, totals = [0.1, 0.1, 0.1], [0.1 + 0.1, 0.2 + 0.1, 0.3 + 0.1]
    assert v[-1].events[0].values["kl_loss_share"] == pytest.approx(sum(kl_terms) / sum(totals))


# ---- late collapse and reward hacking (ConvSearch-R1#6, TinyZero#85, verl#7412) ------------------------------------
def test_score_collapse_while_kl_climbs_is_tagged_collapsed_with_the_best_pre_collapse_step():
    scores = [0.1 + 0.02 * i for i in range(30)] + [0.68 - 0.06 * i for i in range(1, 15)]
    stream = [
        (
            s,
            {
                "critic/score/mean": sc,
                "actor/kl_loss": 0.01 + 0.004 * s,
                "actor/entropy": 0.3,
                "critic/advantages/max": 1.0,
                "critic/advantages/min": -1.0,
            },
        )
        for s, sc in enumerate(scores, start=1)
    ]
    engine, verdicts = _run(load_ruleset("default"), stream, {"actor_rollout_ref.actor.use_kl_loss": True})
    summary = engine.summary()
    peak_step = int(np.argmax(scores)) + 1
    # first report whose drop from the max of its last 20 reports exceeds 1/2, then 2 more (for: 3)
    first = next(
        i
        for i in range(len(scores))
        if (max(scores[max(0, i - 19) : i + 1]) - scores[i]) / max(scores[max(0, i - 19) : i + 1]) > 0.5
    )
    assert summary["stop_kind"] == "collapsed" and summary["reason"]["rule"] == "score_collapse"
    assert summary["collapsed_at"] == first + 3 and summary["stop_step"] == first + 3
    assert f"collapsed at step {first + 3}" in summary["stop_reason"]
    assert summary["best"] == {"metric": "critic/score/mean", "step": peak_step, "value": max(scores)}


def test_length_halving_at_a_format_only_score_is_reward_hacking():
    lengths = [400.0] * 25 + [400 - 25 * i for i in range(1, 12)]
    stream = [
        (s, {"response_length/mean": n, "critic/score/max": 0.1, "critic/score/mean": 0.08})
        for s, n in enumerate(lengths, start=1)
    ]
    engine, _ = _run(load_ruleset("default"), stream)
    summary = engine.summary()
    assert summary["reason"]["rule"] == "length_collapse" and summary["stop_kind"] == "collapsed"
    first = next(i for i, n in enumerate(lengths) if (400 - n) / 400 > 0.5)
    assert summary["stop_step"] == first + 3

def test_drop_from_max_with_peak_above_waits_for_a_real_peak():
    rule = {"name": "fall", "metric": "v", "stat": "drop_from_max", "peak_above": 0.05, "above": 0.25,
            "action": "stop"}
    values = [0.04, 0.01, 0.03, 0.6, 0.5, 0.42]  # 0.04 -> 0.01 is a 75 % drop from a peak under the floor
    engine, verdicts = _run(_rules(rule), [(s, {"v": v}) for s, v in enumerate(values, start=1)])
    drops = [(max(values[: i + 1]) - v) / max(values[: i + 1]) for i, v in enumerate(values)]
    first = next(i for i, (d, v) in enumerate(zip(drops, values)) if d > 0.25 and max(values[: i + 1]) > 0.05)
    assert [v.stop for v in verdicts] == [i >= first for i in range(len(values))]
    assert engine.summary()["stop_step"] == first + 1 == 6
    engine, _ = _run(_rules(rule), [(1, {"v": 0.04}), (2, {"v": 0.01})])
    assert "waits for a maximum above 0.05; the run's best was 0.04" in engine.summary()["not_applicable"]["fall"]


def test_validation_falling_while_the_training_score_holds_is_reward_hacking():
    # the embedded task's signature: proxy score climbs, gold validation (every 10 steps) falls
    val = {10: 0.58, 20: 0.53, 30: 0.50, 40: 0.42, 50: 0.33}
    stream = [(s, {"critic/score/mean": 1.0 + 0.002 * s, **({"val-core/arith/acc/mean@1": val[s]} if s in val else {})})
              for s in range(1, 51)]
    engine, _ = _run(load_ruleset("default"), stream)
    summary = engine.summary()
    first = next(s for s in sorted(val) if (0.58 - val[s]) / 0.58 > 0.25)
    assert summary["reason"]["rule"] == "reward_hacking" and summary["stop_kind"] == "diverged"
    assert summary["stop_step"] == first == 40
    assert summary["best"] == {"metric": "val-core/arith/acc/mean@1", "step": 10, "value": 0.58}
    # the same validation curve with a collapsing training score is not hacking (score_collapse's business)
    falling = [(s, {**m, "critic/score/mean": 1.0 - 0.015 * s}) for s, m in stream]
    engine, _ = _run(load_ruleset("default"), falling)
    assert engine.summary()["reason"] is None or engine.summary()["reason"]["rule"] != "reward_hacking"



# ---- metric names drift across verl versions (verl#2060, #7412, #1458) ----------------------------------------------
def test_rule_on_actor_entropy_reads_old_entropy_loss_and_absent_kl_is_not_applicable():
    rule = {"name": "low_entropy", "metric": "actor/entropy", "below": 0.1, "action": "stop", "kind": "collapsed"}
    dapo = [
        (s, {"actor/entropy_loss": e, "actor/pg_loss": 0.01, "critic/score/mean": 0.5})
        for s, e in enumerate([0.3, 0.25, 0.2, 0.15, 0.05], start=1)
    ]
    engine, verdicts = _run(load_ruleset(HealthConfig(rules=[rule])), dapo)
    assert verdicts[-1].reason.rule == "low_entropy" and verdicts[-1].reason.step == 5
    assert verdicts[-1].reason.values == {"actor/entropy_loss": pytest.approx(0.05)}
    na = engine.summary()["not_applicable"]
    for name in ("kl_blowup", "kl_runaway", "builtin.kl_explosion", "builtin.kl_dead"):
        assert "never logged" in na[name] and "actor/kl_loss" in na[name]


@pytest.mark.parametrize(
    "key", ["val-core/openai/gsm8k/acc/mean@1", "val/test_score/openai/gsm8k", "test_score/openai/gsm8k"]
)
def test_val_score_reads_the_validation_key_of_each_verl_version(key):
    rule = {"name": "val", "metric": "val_score", "above": -1, "action": "advise"}
    _, v = _run(_rules(rule), [(1, {key: 0.4, "val-aux/openai/gsm8k/reward/std@1": 9.0})])
    assert v[0].events[0].values == {key: 0.4}


# ---- checkpoint steps are many times slower than normal steps ---------------------------------------------------
def test_no_preset_judges_wall_clock_and_checkpoint_steps_stay_healthy():
    for preset in ("default", "seed", "conservative", "aggressive"):
        ruleset = load_ruleset(preset)
        assert not [m for r in ruleset.rules for m in r.metrics if m.startswith(("timing", "perf/time"))]
    stream = [
        (
            s,
            {
                "timing_s/step": 2500.0 if s % 20 == 0 else 180.0,
                "perf/time_per_step": 2500.0 if s % 20 == 0 else 180.0,
                "actor/kl_loss": 0.02,
                "actor/entropy": 0.3,
                "critic/score/mean": 0.5,
                "critic/advantages/max": 1.0,
                "critic/advantages/min": -1.0,
            },
        )
        for s in range(1, 101)
    ]
    for preset in ("default", "conservative", "aggressive"):
        engine, _ = _run(load_ruleset(preset), stream, {"actor_rollout_ref.actor.use_kl_loss": True})
        assert engine.summary()["verdict"] == "healthy"


def test_non_finite_rule_metric_is_skipped_not_compared():
    rule = {"name": "low", "metric": "m", "below": 1.0, "action": "stop"}
    engine, v = _run(_rules(rule, nonfinite_loss=False), [(1, {"m": math.nan}), (2, {"m": -math.inf})])
    assert not v[-1].stop and "low" in engine.summary()["not_applicable"]


@pytest.mark.parametrize("preset", ["default", "conservative", "aggressive"])
def test_reward_hacking_advice_fits_the_runs_kl_placement(preset):
    # validation falls from its best while the training score holds (as above); the advice must name a lever the
    # run has: with no KL term at all (kl_placement none), raising kl_coef changes nothing
    val = {10: 0.58, 20: 0.5, 30: 0.3, 40: 0.2, 50: 0.1, 60: 0.1}  # below each preset's threshold for 11+ steps
    stream = [(s, {"critic/score/mean": 1.0 + 0.002 * s, **({"val-core/arith/acc/mean@1": val[s]} if s in val else {})})
              for s in range(1, 61)]
    no_kl = {"actor_rollout_ref.actor.use_kl_loss": False, "algorithm.use_kl_in_reward": False}
    engine, _ = _run(load_ruleset(preset), stream, no_kl)
    reason = engine.summary()["reason"]
    assert reason["rule"] == "reward_hacking"
    assert "kl_coef" not in reason["advice"]
    assert all(key in reason["advice"] for key in ("algorithm.use_kl_in_reward", "actor_rollout_ref.actor.use_kl_loss"))
    # KL in the reward: kl_coef is the lever
    engine, _ = _run(load_ruleset(preset), stream, {**no_kl, "algorithm.use_kl_in_reward": True})
    assert "raise kl_coef" in engine.summary()["reason"]["advice"]
