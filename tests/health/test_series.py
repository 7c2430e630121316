"""Window statistics (klsweep.health.series) as the engine reads them: numpy's values, no error near the float limit."""

from __future__ import annotations

import math

import numpy as np
import pytest

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
