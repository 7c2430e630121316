"""Window statistics (klsweep.health.series) as the engine reads them: numpy's values, no error near the float limit."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pydantic import ValidationError

from klsweep.health import HealthConfig
from tests.health.test_engine import _rules, _run


def test_window_statistics_match_numpy():
    rng = np.random.default_rng(0)
    xs = rng.normal(1.0, 0.3, size=30)
    steps = np.arange(1, 31) * 3  # sampled log: every 3rd step
    # windows are in steps: 18 steps ending at step 63 start at step 46, covered from the report at step 45 (7 reports)
    rules = [
        {"name": f"r_{stat}", "metric": "m", "stat": stat, "window": 18, "above": -1e9, "action": "advise"}
        for stat in ("mean", "std", "var", "min", "max", "slope")
    ] + [
        {"name": "r_drop", "metric": "m", "stat": "drop_from_max", "window": 12, "above": -1e9, "action": "advise"},
        {"name": "r_drop_run", "metric": "m", "stat": "drop_from_max", "above": -1e9, "action": "advise"},
        {"name": "r_ratio", "metric": "m", "stat": "ratio_to_first", "above": -1e9, "action": "advise"},
    ]
    _, verdicts = _run(_rules(*rules), [(int(s), {"m": float(x)}) for s, x in zip(steps, xs, strict=True)])
    i = 20
    got = {e.rule: next(iter(e.values.values())) for e in verdicts[i].events}
    w = xs[i - 6 : i + 1]
    assert got["r_mean"] == pytest.approx(w.mean(), rel=1e-12)
    assert got["r_std"] == pytest.approx(w.std(), rel=1e-9)
    assert got["r_var"] == pytest.approx(w.var(), rel=1e-9)
    assert got["r_min"] == w.min() and got["r_max"] == w.max()
    assert got["r_slope"] == pytest.approx(np.polyfit(steps[i - 6 : i + 1], w, 1)[0], rel=1e-9)
    assert got["r_drop"] == pytest.approx((xs[i - 4 : i + 1].max() - xs[i]) / xs[i - 4 : i + 1].max())
    assert got["r_drop_run"] == pytest.approx((xs[: i + 1].max() - xs[i]) / xs[: i + 1].max())
    assert got["r_ratio"] == pytest.approx(xs[i] / xs[0])
    assert "over steps 45-63" in next(e.message for e in verdicts[i].events if e.rule == "r_mean")
    # 18 steps are not covered at step 18 (the first report is step 3), they are at step 21 (reports 3-21)
    assert "r_mean" not in {e.rule for e in verdicts[5].events} and "r_mean" in {e.rule for e in verdicts[6].events}


def test_window_statistics_of_values_near_the_float_limit_do_not_raise():
    # fsum of [0, -7.98e307, -1e308] overflows although every value and the mean are finite
    xs = [0.0, -7.976931348623158e307, -1e308]
    rules = [{"name": f"r_{stat}", "metric": "m", "stat": stat, "window": 3, "above": 1.0, "action": "warn"}
             for stat in ("mean", "var", "std", "slope")]
    engine, verdicts = _run(_rules(*rules), [(s, {"m": x}) for s, x in enumerate(xs, start=1)])
    fired = {e.rule: e.values for e in verdicts[-1].events}
    assert set(fired) == {"r_var", "r_std"}  # the mean is below 1; the slope is not finite, so never above
    assert fired["r_var"]["var3(m)"] == math.inf and fired["r_std"]["std3(m)"] == math.inf
    mean_rule = _rules({"name": "low", "metric": "m", "stat": "mean", "window": 3, "below": -5e307, "action": "warn"})
    _, verdicts = _run(mean_rule, [(s, {"m": x}) for s, x in enumerate(xs, start=1)])
    assert verdicts[-1].events[0].values["mean3(m)"] == pytest.approx(sum(x / 3 for x in xs))


def test_a_slope_over_steps_beyond_the_float_range_is_not_a_number():
    # a step of 1.34e154 squared is an int too large for a float
    rule = {"name": "rising", "metric": "m", "stat": "slope", "window": 3, "above": 0.0, "action": "warn"}
    reports = [(None, {"m": 0.0}), (None, {"m": 0.0}), (1.3407807929942597e154, {"m": 0.0})]
    engine, verdicts = _run(_rules(rule), reports)
    assert not verdicts[-1].events and engine.summary()["verdict"] == "healthy"


def test_ratios_to_the_runs_own_history_match_numpy():
    rng = np.random.default_rng(1)
    xs = rng.uniform(0.5, 1.5, size=40)
    steps = np.arange(1, 41) * 2  # a report every 2 steps
    rules = [
        {"name": "early", "metric": "m", "stat": "ratio_to_early", "early": 10, "above": -1e9, "action": "advise"},
        {"name": "early_mean", "metric": "m", "stat": "ratio_to_early", "early": 10, "window": 6, "above": -1e9,
         "action": "advise"},
        {"name": "median", "metric": "m", "stat": "ratio_to_median", "window": 20, "above": -1e9, "action": "advise"},
    ]
    _, verdicts = _run(_rules(*rules), [(int(s), {"m": float(x)}) for s, x in zip(steps, xs, strict=True)])
    i = 30  # step 62
    got = {e.rule: next(iter(e.values.values())) for e in verdicts[i].events}
    early = np.median(xs[:5])  # the first 10 steps from step 2: steps 2-10
    assert got["early"] == pytest.approx(xs[i] / early, rel=1e-12)
    # 6 steps ending at step 62 start at step 57, covered from the report at step 56: 4 reports
    assert got["early_mean"] == pytest.approx(xs[i - 3 : i + 1].mean() / early, rel=1e-12)
    # 20 steps ending at 62 start at 43, covered from the report at 42: 11 reports
    assert got["median"] == pytest.approx(xs[i] / np.median(xs[i - 10 : i + 1]), rel=1e-12)
    # ratio_to_early is judged once the run has passed its first 10 steps (steps 2-11): from the report at step 12
    assert "early" not in {e.rule for e in verdicts[4].events} and "early" in {e.rule for e in verdicts[5].events}


def test_a_ratio_to_a_median_of_zero_is_not_judged():
    rule = {"name": "r", "metric": "m", "stat": "ratio_to_early", "early": 3, "above": 2.0, "action": "stop"}
    _, verdicts = _run(_rules(rule), [(s, {"m": 0.0 if s <= 3 else 5.0}) for s in range(1, 10)])
    assert not any(v.stop for v in verdicts)


def test_ratio_to_median_without_a_window_is_refused_with_the_fix():
    with pytest.raises(ValidationError, match="ratio_to_median needs 'window'.*window: 50"):
        HealthConfig(preset="none", rules=[{"name": "r", "metric": "m", "stat": "ratio_to_median", "above": 2,
                                            "action": "stop"}])
