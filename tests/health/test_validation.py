"""Validation sets: each ``val-core/<data_source>/...`` key judged on its own, a single-set dip a warning, the keys
judged named in every verdict, and ``health: {validation: KEY}``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from klsweep.cli import main
from klsweep.health import HealthConfig, HealthEngine, load_ruleset
from klsweep.health.readers import read_trace
from klsweep.health.validation import source_of, validation_sets

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"
T12 = TRACES / "gpg_qwen2_7b_math_length_blowup.log.gz"
GSM8K = "val-core/openai/gsm8k/reward/mean@1"
MATH = "val-core/DigitalLearningGmbH/MATH-lighteval/reward/mean@1"


def test_one_key_per_data_source():
    metrics = {GSM8K: 0.8, MATH: 0.5, "val-core/openai/gsm8k/reward/best@1/mean": 0.8,
               "val-aux/openai/gsm8k/reward/std@1": 0.0, "critic/score/mean": 0.3}
    assert validation_sets(metrics) == {MATH: 0.5, GSM8K: 0.8}
    assert source_of(MATH) == "DigitalLearningGmbH/MATH-lighteval"
    assert source_of("val/test_score/openai/gsm8k") == "openai/gsm8k"
    assert validation_sets(metrics, GSM8K) == {GSM8K: 0.8}


def _t12():
    return read_trace(T12)


def test_a_dip_on_one_set_the_other_does_not_share_is_a_warning_that_says_what_the_other_did():
    trace = _t12()
    rows = dict(trace.reports)
    # the log: MATH 0.389 at step 115, 28 % below its best 0.539; GSM8K holds
    best_math = max(m[MATH] for s, m in trace.reports if MATH in m and s <= 115)
    best_gsm8k = max(m[GSM8K] for s, m in trace.reports if GSM8K in m and s <= 115)
    assert (rows[115][MATH], best_math) == (0.389, 0.539)
    engine = HealthEngine(load_ruleset("default"), rounded=True)
    events = {}
    for step, metrics in trace.reports:
        for e in engine.update(step, metrics).events:
            events.setdefault((e.rule, e.step), e)
    hacking = [e for (rule, _), e in events.items() if rule == "reward_hacking"]
    assert [(e.step, e.action) for e in hacking] == [(115, "warn")]
    drop = (best_gsm8k - rows[115][GSM8K]) / best_gsm8k
    assert (f"only 1 of 2 validation sets: {GSM8K} = {rows[115][GSM8K]:.4g}, {drop:.0%} below its best "
            f"{best_gsm8k:.4g}") in hacking[0].message
    assert f"drop_from_max({MATH}) = {(0.539 - 0.389) / 0.539:.4g}" in hacking[0].message


def test_a_dip_on_every_set_stops():
    rule = {"name": "val_drop", "metric": "val_score", "stat": "drop_from_max", "above": 0.25, "action": "stop",
            "kind": "diverged"}
    ruleset = load_ruleset(HealthConfig(preset="none", rules=[rule]))
    stream = [(5, {GSM8K: 0.8, MATH: 0.5}), (10, {GSM8K: 0.5, MATH: 0.3})]
    engine = HealthEngine(ruleset)
    verdicts = [engine.update(s, m) for s, m in stream]
    assert verdicts[-1].stop and verdicts[-1].reason.rule == "val_drop"
    assert GSM8K in verdicts[-1].reason.message and MATH in verdicts[-1].reason.message


def test_the_users_validation_key_is_the_only_one_judged():
    rule = {"name": "val_drop", "metric": "val_score", "stat": "drop_from_max", "above": 0.25, "action": "stop"}
    ruleset = load_ruleset({"preset": "none", "rules": [rule], "validation": MATH})
    engine = HealthEngine(ruleset)
    for step, metrics in [(5, {GSM8K: 0.8, MATH: 0.5}), (10, {GSM8K: 0.8, MATH: 0.3})]:
        verdict = engine.update(step, metrics)
    assert verdict.stop and MATH in verdict.reason.message and GSM8K not in verdict.reason.message
    assert list(engine.summary()["validation"]) == [MATH]
    missing = HealthEngine(load_ruleset({"preset": "none", "rules": [rule], "validation": "val-core/x/acc/mean@1"}))
    missing.update(5, {GSM8K: 0.8})
    assert "health.validation is 'val-core/x/acc/mean@1'" in missing.not_applicable()["val_drop"]


def test_health_check_prints_the_validation_keys_judged(capsys):
    code = main(["health", "check", str(T12)])
    out = capsys.readouterr().out
    trace = _t12()
    first = {k: next(m[k] for _, m in trace.reports if k in m) for k in (GSM8K, MATH)}
    best = {k: max(m[k] for _, m in trace.reports if k in m and _ is not None and _ < 160) for k in (GSM8K, MATH)}
    assert code == 1
    line = next(x for x in out.splitlines() if x.startswith("validation judged: "))
    for key in (MATH, GSM8K):
        assert f"{key} (first {first[key]:.4g}, best {best[key]:.4g}" in line
    assert "only 1 of 2 validation sets" in out


@pytest.mark.parametrize("value", ["nan", "NaN", "-Infinity", "inf"])
def test_a_nan_written_as_a_string_is_a_nan(value, tmp_path):
    """The GRPO reference's log (tests/data/traces/grpo_qwen7b_gsm8k.jsonl), its actor/pg_loss written as the JSON
    string a writer without NaN support gives from step 18: a stop, not a healthy run."""
    lines = (TRACES / "grpo_qwen7b_gsm8k.jsonl").read_text().splitlines()
    out = []
    for line in lines:
        row = json.loads(line)
        if row["step"] >= 18 and "actor/pg_loss" in row["data"]:
            row["data"]["actor/pg_loss"] = value
        out.append(json.dumps(row))
    log = tmp_path / "run.jsonl"
    log.write_text("\n".join(out) + "\n")
    engine = HealthEngine(load_ruleset("default"), rounded=True)
    for step, metrics in read_trace(log).reports:
        verdict = engine.update(step, metrics)
    assert verdict.reason.rule == "builtin.nonfinite_loss" and verdict.reason.step == 18
