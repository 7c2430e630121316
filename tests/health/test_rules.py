"""Rule schema, HealthConfig forms and their error messages, presets, and the docs page."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from klsweep.errors import SweepFileError
from klsweep.health import PRESETS, HealthConfig, Rule, load_ruleset
from klsweep.health.conditions import DropCondition, ValueCondition, WindowCondition

DOCS = Path(__file__).resolve().parents[2] / "docs" / "health-rules.md"


def test_inline_and_combined_forms_parse_to_conditions():
    r = Rule.model_validate(
        {"name": "a", "metric": "ref_kl", "stat": "mean", "window": 5, "above": 1, "for": 3, "action": "stop"}
    )
    assert isinstance(r.conditions[0], WindowCondition) and r.for_ == 3 and r.match == "all"
    r = Rule.model_validate(
        {
            "name": "b",
            "any": [{"metric": "x", "below": 0}, {"metric": "y", "stat": "drop_from_max", "above": 0.5}],
            "action": "warn",
        }
    )
    assert r.match == "any" and isinstance(r.conditions[0], ValueCondition)
    assert isinstance(r.conditions[1], DropCondition) and r.conditions[1].window is None
    assert r.describe() == "x < 0 or drop_from_max(y) > 0.5"


@pytest.mark.parametrize(
    "rule,message",
    [
        ({"name": "a", "metric": "m", "above": 1, "below": 0, "action": "stop"}, "exactly one of 'above' or 'below'"),
        ({"name": "a", "metric": "m", "stat": "median", "above": 1, "action": "stop"}, "valid statistics are value"),
        ({"name": "a", "metric": "m", "stat": "mean", "above": 1, "action": "stop"}, "window"),
        ({"name": "a", "metric": "m", "above": 1, "action": "stop", "threshold": 2}, "threshold"),
        ({"name": "a", "metric": "m", "above": 1, "action": "halt"}, "'stop', 'warn' or 'advise'"),
        ({"name": "a", "metric": "m", "all": [], "above": 1, "action": "stop"}, "exactly one of 'metric'"),
        ({"name": "a", "metric": "m", "above": 1, "for": 0, "action": "stop"}, "greater than or equal to 1"),
    ],
)
def test_invalid_rules_are_rejected_with_a_message_naming_the_problem(rule, message):
    with pytest.raises(ValidationError) as e:
        HealthConfig.model_validate({"rules": [rule]})
    assert message in str(e.value)


def test_health_config_forms():
    assert HealthConfig.model_validate("seed").preset == "seed"
    assert HealthConfig.model_validate([{"name": "a", "metric": "m", "above": 1, "action": "warn"}]).preset == "default"
    with pytest.raises(ValidationError, match="valid presets are default, seed, conservative, aggressive"):
        HealthConfig.model_validate("strict")
    with pytest.raises(ValidationError, match="unknown built-in check setting"):
        HealthConfig.model_validate({"builtin": {"no_signal": 3}})
    with pytest.raises(ValidationError, match="no_signal_for"):
        HealthConfig.model_validate({"builtin": {"no_signal_for": -1}})
    with pytest.raises(ValidationError, match="rule names must be unique"):
        HealthConfig.model_validate({"rules": [{"name": "a", "metric": "m", "above": 1, "action": "warn"}] * 2})


def test_user_rules_replace_preset_rules_by_name_and_builtin_overrides_merge():
    ruleset = load_ruleset(
        {
            "preset": "default",
            "builtin": {"no_signal_for": 7},
            "rules": [
                {"name": "kl_blowup", "metric": "ref_kl", "above": 3, "action": "stop"},
                {"name": "mine", "metric": "m", "above": 1, "action": "warn"},
            ],
        }
    )
    default = load_ruleset("default")
    names = [r.name for r in ruleset.rules]
    assert names == [r.name for r in default.rules] + ["mine"]
    assert ruleset.rules[0].conditions[0].above == 3
    assert ruleset.builtin.no_signal_for == 7 and ruleset.builtin.kl_dead_for == default.builtin.kl_dead_for
    assert ruleset.name == "default+custom"


def test_load_ruleset_errors_name_the_file_and_field(tmp_path):
    bad = tmp_path / "rules.yaml"
    bad.write_text("rules:\n  - {name: a, metric: m, above: x, action: stop}\n")
    with pytest.raises(SweepFileError) as e:
        load_ruleset(bad)
    # the field as the file writes it, once: not the model's rules.0.conditions.0.value.above, nor the echo that the
    # conditions tuple is then empty
    assert e.value.problems == [f"{bad}: rules.0.above: Input should be a valid number, unable to parse string as a "
                                "number (got 'x')"]
    bad.write_text("rules:\n  - {name: a, all: [{metric: m, above: 1}, {metric: n, below: y}], action: stop}\n")
    with pytest.raises(SweepFileError) as e:
        load_ruleset(bad)
    assert e.value.problems == [f"{bad}: rules.0.all.1.below: Input should be a valid number, unable to parse string "
                                "as a number (got 'y')"]
    bad.write_text("rules: [unclosed\n")
    with pytest.raises(SweepFileError, match="cannot read YAML"):
        load_ruleset(bad)
    with pytest.raises(SweepFileError, match="unknown health preset 'nope'"):
        load_ruleset("nope")


def test_every_preset_rule_has_a_source_and_is_in_the_docs_page():
    docs = DOCS.read_text()
    for name in PRESETS:
        ruleset = load_ruleset(name)
        assert f"## `{name}`" in docs
        for rule in ruleset.rules:
            assert rule.source, (name, rule.name)
            assert f"| `{rule.name}` |" in docs.split(f"## `{name}`")[1].split("\n## ")[0], (name, rule.name)


def test_dumped_config_validates_back_and_a_sweep_file_can_be_the_rules_file(tmp_path):
    config = HealthConfig.model_validate(
        {
            "preset": "seed",
            "rules": [
                {"name": "a", "metric": "m", "stat": "slope", "window": 4, "below": 0, "for": 2, "action": "warn"}
            ],
            "builtin": {"kl_dead_for": 0},
        }
    )
    assert HealthConfig.model_validate(config.model_dump()) == config
    assert HealthConfig.model_validate(config.model_dump(by_alias=True)) == config
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("name: s\nbudget: {trials: 2}\nhealth:\n  preset: conservative\n  builtin: {no_signal_for: 4}\n")
    ruleset = load_ruleset(sweep)
    assert ruleset.builtin.no_signal_for == 4 and ruleset.builtin.kl_explosion == 5.0  # conservative's value


@pytest.mark.parametrize(
    "fields,message",
    [
        ({"remedy": {"kl_coef": "*1.5"}, "action": "warn"}, "has a remedy but action 'warn'"),
        ({"remedy": {"data.seed": "+1"}}, "remedy data.seed: the seed cannot be prescribed"),
        ({"remedy": {"seed": "=3"}}, "remedy seed: the seed cannot be prescribed"),
        ({"remedy": {"kl_coef": 1.5}}, "Input should be a valid string"),
        ({"remedy": {"kl_coef": "x1.5"}}, "kl_coef\n  Value error, 'x1.5' is not an operation on the knob's"),
        ({"remedy": {"kl_coef": "*1.5"}, "max_remedies": -1}, "greater than or equal to 0"),
    ],
)
def test_invalid_remedies_are_rejected_with_the_fix(fields, message):
    rule = {"name": "a", "metric": "ref_kl", "above": 1, "action": "stop", **fields}
    with pytest.raises(ValidationError) as e:
        HealthConfig.model_validate({"rules": [rule]})
    assert message in str(e.value)


def test_remedies_parse_with_a_default_cap_and_presets_prescribe_only_where_the_advice_is_clear():
    rule = Rule.model_validate({"name": "a", "metric": "ref_kl", "above": 1, "action": "stop",
                                "remedy": {"target_kl": "*0.7", "actor_rollout_ref.actor.optim.lr": "/2"}})
    assert rule.remedy == {"target_kl": "*0.7", "actor_rollout_ref.actor.optim.lr": "/2"} and rule.max_remedies == 2
    for name in ("default", "conservative", "aggressive"):
        prescribed = {r.name: r.remedy for r in load_ruleset(name).rules if r.remedy}
        # x4, not x1.5: BENCHMARKS.md has the rescue rates of both
        assert prescribed == {"kl_runaway": {"kl_coef": "*4"}, "reward_hacking": {"kl_coef": "*4"}}, name
    assert not any(r.remedy for r in load_ruleset("seed").rules)  # the seed thresholds stay literal


def test_preset_advice_to_raise_kl_coef_has_an_alternative_for_runs_without_kl():
    """A run with no KL term (DrGRPO, kl_placement none) logs no reference KL, so only rules that read other metrics
    fire there: each of those whose advice names kl_coef also says what to do without one."""
    kl_metrics = {"ref_kl", "actor/kl_loss", "actor/reward_kl_penalty", "critic/kl"}
    checked = 0
    for name in PRESETS:
        for rule in load_ruleset(name).rules:
            if "kl_coef" not in rule.advice or {c.metric for c in rule.conditions} & kl_metrics:
                continue
            checked += 1
            assert rule.advice_without_kl and "kl_coef" not in rule.advice_without_kl, (name, rule.name)
    assert checked >= 5
