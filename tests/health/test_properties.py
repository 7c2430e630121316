"""Property tests: no metric stream, however broken, makes the engine raise."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from klsweep.health import HealthConfig, HealthEngine, load_ruleset
from klsweep.health.rules import PRESETS

KEYS = [
    "actor/kl_loss",
    "actor/kl_coef",
    "actor/reward_kl_penalty",
    "actor/reward_kl_penalty_coeff",
    "critic/kl",
    "actor/entropy",
    "actor/entropy_loss",
    "actor/pg_loss",
    "actor/grad_norm",
    "critic/vf_loss",
    "critic/grad_norm",
    "critic/score/mean",
    "critic/score/max",
    "critic/score/min",
    "critic/rewards/mean",
    "critic/advantages/max",
    "critic/advantages/min",
    "response_length/mean",
    "val-core/openai/gsm8k/acc/mean@1",
    "test_score/x",
    "timing_s/step",
    "other",
]
VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1e-300, -1e308, math.nan, math.inf, -math.inf]),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.none(),
    st.booleans(),
    st.text(max_size=5),
    st.lists(st.floats(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.floats(), max_size=1),
)
REPORTS = st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=8), VALUES, max_size=12)
STEPS = st.one_of(st.integers(min_value=-5, max_value=10**6), st.none(), st.floats(), st.text(max_size=2))
CONFIGS = st.one_of(
    st.none(),
    st.just({}),
    st.fixed_dictionaries(
        {},
        optional={
            "actor_rollout_ref.actor.use_kl_loss": st.one_of(st.booleans(), st.text(max_size=4), st.none()),
            "algorithm.use_kl_in_reward": st.one_of(st.booleans(), st.sampled_from(["true", "false"])),
            "actor_rollout_ref.actor.kl_loss_type": st.sampled_from(["kl", "k3", "low_var_kl+", "abs", "bogus", ""]),
            "actor_rollout_ref.actor.kl_loss_coef": VALUES,
            "algorithm.kl_ctrl.kl_coef": VALUES,
            "actor_rollout_ref.actor.entropy_coeff": VALUES,
        },
    ),
)
CUSTOM = load_ruleset(
    HealthConfig(
        rules=[
            {"name": f"p_{stat}", "metric": metric, "stat": stat, "window": 3, "above": 0.1, "action": "warn"}
            for stat, metric in [
                ("mean", "ref_kl"),
                ("slope", "entropy"),
                ("var", "kl_loss_share"),
                ("std", "val_score"),
                ("min", "kl_coef"),
                ("max", "other"),
            ]
        ]
        + [
            {"name": "p_drop", "metric": "critic/score/mean", "stat": "drop_from_max", "above": 0.1, "action": "stop"},
            {"name": "p_ratio", "metric": "actor/grad_norm", "stat": "ratio_to_first", "below": 0.5, "action": "stop"},
        ]
    )
)
RULESETS = [load_ruleset(p) for p in PRESETS] + [CUSTOM]


@pytest.mark.slow
@settings(max_examples=150, deadline=None, derandomize=True)
@given(stream=st.lists(st.tuples(STEPS, REPORTS), max_size=25), config=CONFIGS, which=st.integers(0, len(RULESETS) - 1))
def test_any_stream_gives_a_verdict_and_a_json_ready_summary(stream, config, which):
    engine = HealthEngine(RULESETS[which], config)
    for step, metrics in stream:
        verdict = engine.update(step, metrics)
        assert verdict.health in ("healthy", "warned", "stopped")
        assert verdict.stop == (verdict.reason is not None)
    summary = engine.summary()
    json.dumps(summary, allow_nan=False)
    assert summary["verdict"] in ("healthy", "warned", "stopped")
    judged_or_na = set(summary["not_applicable"]) | set(summary["fired"])
    rule_names = {r.name for r in RULESETS[which].rules}
    assert {n for n in judged_or_na if not n.startswith("builtin.")} <= rule_names


@settings(max_examples=100, deadline=None, derandomize=True)
@given(metrics=st.one_of(st.none(), st.integers(), st.text(), st.lists(st.integers())))
def test_a_report_that_is_not_a_mapping_is_an_empty_report(metrics):
    engine = HealthEngine(load_ruleset("default"), None)
    assert not engine.update(1, metrics).stop
