"""``stopping: {median: on}``: :class:`klsweep.orchestrate.median_stop.MedianRule` and its Ray Tune stopper, against
the median of the trials that finished healthy at the same step."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pandas as pd
import pytest

from klsweep.cli import main
from klsweep.orchestrate.median_stop import MedianRule, MedianStopper
from klsweep.results import HEALTH, STOP_KIND, STOP_KIND_OBJECTIVE, STOP_REASON
from klsweep.spec.schema import MedianStop
from tests.test_equivalence import _table_overrides

REPO = Path(__file__).resolve().parents[2]
VAL = "val-core/arith/acc/mean@1"


def _finish(rule: MedianRule, trial: str, curve: dict[int, float]) -> None:
    for step, value in curve.items():
        assert rule.update(trial, step, {VAL: value}) is None
    rule.finish(trial)


def test_a_trial_is_stopped_only_below_the_margin_under_the_median_of_enough_finished_trials():
    rule = MedianRule([(VAL, "max")], total_steps=80, settings=MedianStop(margin=0.1, min_finished=3))
    for i, at_20 in enumerate((0.50, 0.60)):
        _finish(rule, f"done{i}", {20: at_20, 80: 0.7})
        assert rule.update("late", 20, {VAL: 0.1}) is None  # fewer than 3 finished: no stop yet
    _finish(rule, "done2", {20: 0.70, 80: 0.7})
    # median 0.60 at step 20; the margin is 10 % of it: 0.54 is the line
    assert rule.update("close", 20, {VAL: 0.55}) is None
    reason = rule.update("low", 20, {VAL: 0.53})
    assert reason == ("median stopping at step 20: val-core/arith/acc/mean@1 = 0.53, more than 10% below the median "
                      "0.6 of the 3 trials that finished healthy, at the same step")
    assert rule.update("low", 80, {VAL: 0.1}) is None  # never at the last step: a finished trial is a result
    assert rule.update("other", 40, {VAL: 0.0}) is None  # no finished trial reported step 40
    assert rule.update("nan", 20, {VAL: float("nan")}) is None


def test_with_two_objectives_a_trial_is_stopped_only_when_worse_on_both():
    kl = "actor/kl_loss"
    rule = MedianRule([(VAL, "max"), (kl, "min")], total_steps=80, settings=MedianStop(margin=0.0, min_finished=1))
    assert rule.update("done", 10, {VAL: 0.6, kl: 0.1}) is None
    rule.finish("done")
    assert rule.update("t", 10, {VAL: 0.5, kl: 0.05}) is None  # lower score but less KL: kept
    assert rule.update("u", 10, {VAL: 0.7, kl: 0.2}) is None  # more KL but a higher score: kept
    assert rule.update("v", 10, {VAL: 0.5, kl: 0.2}) == (
        "median stopping at step 10: val-core/arith/acc/mean@1 = 0.5, more than 0% below the median 0.6; "
        "actor/kl_loss = 0.2, more than 0% above the median 0.1 of the 1 trials that finished healthy, "
        "at the same step")


def test_the_stopper_counts_a_trial_finished_healthy_only_when_the_health_rules_did_not_stop_it():
    stopper = MedianStopper([(VAL, "max")], total_steps=20, settings=MedianStop(margin=0.0, min_finished=1))
    assert not stopper("sick", {"training_iteration": 10, VAL: 0.9, HEALTH: "healthy"})
    assert not stopper("sick", {"training_iteration": 20, VAL: 0.9, HEALTH: "stopped"})
    assert not stopper("x", {"training_iteration": 10, VAL: 0.1, HEALTH: "healthy"})  # no finished trial yet
    assert not stopper("ok", {"training_iteration": 10, VAL: 0.5, HEALTH: "healthy"})
    assert not stopper("ok", {"training_iteration": 20, VAL: 0.5, HEALTH: "healthy"})
    result = {"training_iteration": 10, VAL: 0.4, HEALTH: "healthy"}
    assert stopper("y", result)
    assert result[STOP_KIND] == STOP_KIND_OBJECTIVE and "the median 0.5 of the 1 trials" in result[STOP_REASON]


@pytest.mark.parametrize("margin", [-0.1, float("nan")])
def test_a_bad_margin_is_refused(margin):
    with pytest.raises(ValueError, match="margin"):
        MedianStop(margin=margin)


def test_a_sweep_records_a_median_stop_pruned_with_its_reason(ray_local, tmp_path):
    """``sweeps/conservative.yaml`` on its table, sweep seed 1, 5 trials one at a time: trials 1-3 finish healthy and
    trial 4 is stopped at step 20 (benchmarks/peers.py finds the same)."""
    out = tmp_path / "out"
    args = ["run", str(REPO / "sweeps" / "conservative.yaml"), *_table_overrides("conservative"), "seed=1",
            "budget.trials=5", "budget.max_concurrent=1", "--out", str(out), "--quiet"]
    assert main(args) == 0
    trials = pd.read_csv(out / "trials.csv").sort_values("number").reset_index(drop=True)
    finished = trials[(trials["state"] == "COMPLETE") & (trials["steps"] == 80)]
    stopped = trials.iloc[4]
    assert stopped["state"] == "PRUNED" and stopped["steps"] == 20
    assert stopped["stop_reason"].startswith("median stopping at step 20:")
    # the median in the reason is the median of the finished trials' validation at step 20, read from Tune's results
    at_20 = []
    for trial_id in finished["trial_id"]:
        [result_json] = (out / "tune").glob(f"*{trial_id}*/result.json")
        rows = [json.loads(line) for line in result_json.read_text().splitlines()]
        at_20.append(next(r[VAL] for r in rows if r.get("training_iteration") == 20))
    assert len(at_20) == 3
    assert f"the median {statistics.median(at_20):.4g} of the 3 trials" in stopped["stop_reason"]
