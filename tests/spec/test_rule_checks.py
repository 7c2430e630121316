"""`sweep validate` warns when a health rule cannot fire within budget.max_steps (its warm-up `after`, its streak `for`
and its windows leave no step to judge): a trial it would stop ends COMPLETE and healthy."""

from __future__ import annotations

import json

import pytest

from klsweep.health import HealthEngine, load_ruleset
from klsweep.spec import load_sweep
from tests.conftest import REPO

METRIC = "actor/grad_norm"
RULES = {  # name: a rule whose condition holds at every report of a constant 5.0
    "late": {"metric": METRIC, "above": 1, "after": 20, "for": 3},
    "windowed": {"metric": METRIC, "stat": "mean", "window": 30, "above": 1, "after": 5, "for": 2},
    "either": {"any": [{"metric": METRIC, "stat": "mean", "window": 30, "above": 1}, {"metric": METRIC, "above": 1}],
               "after": 4, "for": 3},
}


def _fires_at(rule: dict) -> int:
    """The first step at which the health engine stops a run reporting METRIC = 5.0 at every step from step 0."""
    engine = HealthEngine(load_ruleset({"preset": "none", "rules": [rule]}))
    return next(step for step in range(200) if engine.update(step, {METRIC: 5.0}).stop)


def _reach_warnings(sweep_file, rule: dict, max_steps: int) -> list[str]:
    health = json.dumps({"preset": "none", "rules": [rule]})
    sweep = load_sweep(sweep_file(), [f"health={health}", f"budget.max_steps={max_steps}"])
    return [w for w in sweep.warnings if "before these health rules can fire" in w]


@pytest.mark.parametrize("name", RULES)
def test_a_rule_is_named_exactly_when_the_engine_could_not_fire_it_within_max_steps(sweep_file, name):
    rule = {"name": name, **RULES[name], "action": "stop"}
    first = _fires_at(rule)
    assert first == {"late": 23, "windowed": 30, "either": 7}[name]  # after + for; window - 1 + for; any: the value
    [warning] = _reach_warnings(sweep_file, rule, first - 1)
    assert f"{name} (" in warning and f"step {first} at the earliest" in warning
    assert f"Raise budget.max_steps to {first} or more" in warning
    assert _reach_warnings(sweep_file, rule, first) == []


def test_drgrpo_vs_grpo_in_20_steps_is_warned_once_about_the_default_presets_late_rules():
    # the default preset's rules with a warm-up of 20 steps (after: 20) judge from step 21, for 3 to 10 steps
    sweep = load_sweep(REPO / "sweeps" / "drgrpo_vs_grpo.yaml", ["budget.max_steps=20"])
    [warning] = [w for w in sweep.warnings if "health rules" in w]
    assert warning.startswith("command line 'budget.max_steps=20': budget.max_steps: 20 steps end every trial before "
                              "these health rules can fire:")
    named = [part.split(" (")[0] for part in warning.split("fire: ", 1)[1].split(". ")[0].split("), ")]
    assert named == ["entropy_collapse", "score_collapse", "length_collapse", "length_blowup", "entropy_rise",
                     "entropy_low", "entropy_high", "truncation_high"]
    assert "score_collapse (drop_from_max20(critic/score/mean) > 0.5 for 3 steps after step 20: step 23 at the " \
           "earliest)" in warning
    assert "Raise budget.max_steps to 30 or more" in warning  # entropy_low: after 20, for 10
    assert "a rule of the same name in health.rules replaces the preset's" in warning
    assert not [w for w in load_sweep(REPO / "sweeps" / "drgrpo_vs_grpo.yaml").warnings if "health rules" in w]
