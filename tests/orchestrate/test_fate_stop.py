"""``stopping: {fate: on}``: :class:`klsweep.orchestrate.fate_stop.FateRule`, its Ray Tune stopper and the stopper
chain that tells it of health stops."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from ray.tune.stopper import Stopper

from klsweep.cli import main
from klsweep.errors import SweepFileError
from klsweep.orchestrate.fate_stop import GOLD, PROXY, FateRule, FateStopper, signal_readers
from klsweep.orchestrate.median_stop import MedianStopper
from klsweep.orchestrate.rule_stopper import StopperChain
from klsweep.results import HEALTH, STOP_KIND, STOP_KIND_OBJECTIVE, STOP_REASON
from klsweep.spec import load_sweep
from klsweep.spec.schema import FateStop, MedianStop
from tests.test_equivalence import _table_overrides

REPO = Path(__file__).resolve().parents[2]
VAL = "val-core/arith/acc/mean@1"
KL = "actor/reward_kl_penalty"


def _rule(**settings) -> FateRule:
    knobs = {"margin": 0.1, "grace": 0.1, "window": 1, "min_finished": 1, **settings}
    return FateRule([(VAL, "max")], 20, signal_readers(["kl"], "reward"), FateStop(**knobs))


def _run(rule: FateRule, trial: str, kl: dict[int, float], val: float | dict[int, float] = 0.5) -> list[str | None]:
    """Feed ``kl`` step by step, with the validation ``val`` (one value at every step, or per step)."""
    vals = val if isinstance(val, dict) else dict.fromkeys(kl, val)
    return [rule.update(trial, step, {KL: value, **({VAL: vals[step]} if step in vals else {})})
            for step, value in kl.items()]


def _at(kl: float, val: float | None = 0.5) -> dict:
    return {KL: kl} if val is None else {KL: kl, VAL: val}


def test_a_trial_is_stopped_past_every_finished_trial_by_the_margin_and_at_the_failed_median():
    rule = _rule()
    _run(rule, "ok", {1: 0.10, 5: 0.10, 10: 0.10, 20: 0.10}, 0.6)
    rule.finish("ok")
    assert _run(rule, "early", {5: 0.5}) == [None]  # no trial the health rules stopped yet
    _run(rule, "sick", {5: 0.20, 10: 0.30})
    rule.fail("sick")
    assert rule.update("within", 5, _at(0.109)) is None  # within 10 % of the finished trial's 0.10
    assert rule.update("below", 5, _at(0.15)) is None  # past the finished trial, below the failed one's 0.20
    assert rule.update("before", 1, _at(0.9)) is None  # before the grace (10 % of 20 steps = step 2)
    assert rule.update("unvalidated", 5, _at(0.9, None)) is None  # no validation yet: nothing to record it with
    reason = rule.update("hot", 5, _at(0.25))
    assert reason == ("fate at step 5 (mean of the last 1 steps): actor/reward_kl_penalty 0.25 is more than 10% "
                      "above the 0.1 of the 1 trials that finished healthy and at or above the median 0.2 of the 1 "
                      "trials the health rules stopped: it is heading where the stopped trials went")
    assert rule.update("hot", 20, _at(0.9)) is None  # never at the last step: a finished trial is a result
    assert rule.update("far", 15, _at(0.9)) is None  # the failed trial never reached step 15: no evidence there


def test_a_trial_leading_its_finished_peers_on_validation_is_never_stopped():
    rule = _rule()
    _run(rule, "ok", {5: 0.10, 10: 0.10, 20: 0.10}, {10: 0.6, 20: 0.6})
    rule.finish("ok")
    _run(rule, "sick", {5: 0.30, 10: 0.30})
    rule.fail("sick")
    assert _run(rule, "leader", {10: 0.5}, 0.61) == [None]  # its validation is above the finished trial's
    assert _run(rule, "behind", {10: 0.5}, 0.59)[0] is not None
    assert _run(rule, "unseen", {5: 0.5}, 0.1) == [None]  # no finished trial validated at step 5: not shown behind


def test_before_any_trial_finished_a_trial_at_the_failed_median_is_stopped():
    rule = _rule(min_finished=0)
    for trial, kl in (("a", 0.2), ("b", 0.4), ("c", 0.9)):
        _run(rule, trial, {5: kl})
        rule.fail(trial)
    assert rule.update("below", 5, _at(0.399)) is None  # under the median 0.4 of the three failures
    assert rule.update("same", 5, _at(0.4)) == (
        "fate at step 5 (mean of the last 1 steps): actor/reward_kl_penalty 0.4 is at or above the median 0.4 of the "
        "3 trials the health rules stopped: it is heading where the stopped trials went")
    assert _rule(min_finished=1).update("past", 5, _at(0.45)) is None  # needs a finished trial
    _run(rule, "ok", {5: 0.39, 20: 0.1}, 0.6)
    rule.finish("ok")  # from now on the finished trial's 0.39 bounds it by the margin
    assert rule.update("same again", 5, _at(0.4)) is None
    assert rule.update("past", 5, _at(0.43)) is not None


def test_the_window_averages_a_path_and_a_restart_drops_its_later_steps():
    rule = _rule(window=3)
    _run(rule, "ok", {3: 0.1, 4: 0.1, 5: 0.1, 20: 0.1}, 0.6)
    rule.finish("ok")
    _run(rule, "sick", {3: 0.3, 4: 0.3, 5: 0.3})
    rule.fail("sick")
    # (0.1 + 0.1 + 0.7) / 3 = 0.3: at the failed path
    assert _run(rule, "t", {3: 0.1, 4: 0.1, 5: 0.7})[-1] is not None
    assert rule.update("t", 4, _at(0.1)) is None  # restarted from step 4: step 5's 0.7 is gone
    assert rule.steps["t"] == [3, 4]


def test_every_signal_a_trial_logs_must_be_past():
    rule = FateRule([(VAL, "max")], 20, signal_readers(["kl", "proxy_gap"], "reward"),
                    FateStop(margin=0.0, grace=0.0, window=1, min_finished=1))
    for trial, kl, gap, end in (("ok", 0.1, 0.1, rule.finish), ("sick", 0.3, 0.3, rule.fail)):
        rule.update(trial, 5, {KL: kl, PROXY: 1.0, GOLD: 1.0 - gap, VAL: 0.6})
        end(trial)
    assert rule.update("kl only", 5, {KL: 0.5, PROXY: 1.0, GOLD: 0.9, VAL: 0.5}) is None  # its gap 0.1 is not past
    assert "critic/score/mean − embedded/gold_score/mean 0.5" in rule.update(
        "both", 5, {KL: 0.5, PROXY: 1.0, GOLD: 0.5, VAL: 0.5})


def test_signals_follow_the_kl_placement_and_a_sweep_without_any_is_refused():
    assert set(signal_readers(["kl", "proxy_gap"], "none")) == {"proxy_gap"}
    assert signal_readers(["kl"], "loss")["kl"]({"actor/kl_loss": 0.2, KL: 0.9}) == ("actor/kl_loss", 0.2)
    with pytest.raises(ValueError, match="turn stopping.fate off"):
        FateRule([(VAL, "max")], 20, signal_readers(["kl"], "none"))


@pytest.mark.parametrize("bad", [{"margin": -0.1}, {"grace": 1.0}, {"window": 0}, {"signals": []},
                                 {"signals": ["entropy"]}])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError):
        FateStop(**bad)


class _Health(Stopper):
    """Stops trial ``sick`` at step 2 and writes what the health stopper writes."""

    def __call__(self, trial_id: str, result: dict) -> bool:
        if trial_id == "sick" and result["training_iteration"] == 2:
            result[HEALTH], result[STOP_KIND], result[STOP_REASON] = "stopped", "diverged", "reward_hacking"
            return True
        result[HEALTH] = "healthy"
        return False

    def stop_all(self) -> bool:
        return False


def test_the_chain_tells_the_fate_stopper_of_health_stops_and_a_fate_stop_is_recorded_as_the_others():
    fate = FateStopper([(VAL, "max")], 4, "reward", FateStop(margin=0.1, grace=0.0, window=1, min_finished=1))
    median = MedianStopper([(VAL, "max")], 4, MedianStop(min_finished=5))
    chain = StopperChain(_Health(), fate, median)
    for step in (1, 2, 3, 4):
        assert not chain("ok", {"training_iteration": step, KL: 0.1, VAL: 0.6})
    assert not chain("sick", {"training_iteration": 1, KL: 0.3})
    assert chain("sick", {"training_iteration": 2, KL: 0.3})  # the health stop: fate learns of it
    assert fate.rule.failed == ["sick"] and fate.rule.finished == ["ok"]
    result = {"training_iteration": 2, KL: 0.4, VAL: 0.5}
    assert chain("hot", result)
    assert result[STOP_KIND] == STOP_KIND_OBJECTIVE and result[STOP_REASON].startswith("fate at step 2")
    assert not chain.stop_all()


def test_a_sweep_records_a_fate_stop_pruned_with_its_reason(ray_local, tmp_path):
    """``sweeps/drgrpo_vs_grpo.yaml`` on its table, sweep seed 0, 2 trials one at a time: the seed trial reward-hacks
    (a health stop at step 40), and trial 1's gap between proxy and gold score is at or above the seed trial's at its
    first validation, step 10 (benchmarks/peers.py finds the same)."""
    out = tmp_path / "out"
    args = ["run", str(REPO / "sweeps" / "drgrpo_vs_grpo.yaml"), *_table_overrides("drgrpo_vs_grpo"), "seed=0",
            "budget.trials=2", "budget.max_concurrent=1", "--out", str(out), "--quiet"]
    assert load_sweep(REPO / "sweeps" / "drgrpo_vs_grpo.yaml").stopping.fate is not None
    assert main(args) in (0, 1)
    trials = pd.read_csv(out / "trials.csv").sort_values("number").reset_index(drop=True)
    assert list(trials["state"]) == ["PRUNED", "PRUNED"] and list(trials["steps"]) == [40, 10]
    assert trials.loc[1, "stop_reason"].startswith("fate at step 10 (mean of the last 3 steps): "
                                                   "critic/score/mean − embedded/gold_score/mean")
    # the seed trial's gap over steps 8-10, read from Tune's results, is the median in the reason
    [result_json] = (out / "tune").glob(f"*{trials.loc[0, 'trial_id']}*/result.json")
    rows = {r["training_iteration"]: r for r in map(json.loads, result_json.read_text().splitlines())}
    gap = sum(rows[s][PROXY] - rows[s][GOLD] for s in (8, 9, 10)) / 3
    assert f"at or above the median {gap:.4g} of the 1 trials the health rules stopped" in trials.loc[1, "stop_reason"]


def test_with_two_objectives_a_trial_ahead_on_either_is_a_leader():
    kl_objective = "actor/kl_loss"
    rule = FateRule([(VAL, "max"), (kl_objective, "min")], 20, signal_readers(["kl"], "reward"),
                    FateStop(margin=0.1, grace=0.0, window=1, min_finished=1))
    rule.update("ok", 5, {KL: 0.1, VAL: 0.6, kl_objective: 0.2})
    rule.finish("ok")
    rule.update("sick", 5, {KL: 0.3, VAL: 0.6, kl_objective: 0.2})
    rule.fail("sick")
    assert rule.update("lower kl", 5, {KL: 0.4, VAL: 0.5, kl_objective: 0.1}) is None  # ahead on the second
    assert rule.update("higher val", 5, {KL: 0.4, VAL: 0.7, kl_objective: 0.3}) is None  # ahead on the first
    assert rule.update("behind", 5, {KL: 0.4, VAL: 0.5, kl_objective: 0.3}) is not None


def test_a_sweep_without_reference_kl_and_only_the_kl_signal_is_refused_by_validation():
    with pytest.raises(SweepFileError, match=r"stopping\.fate\.signals: signals \[kl\] on a sweep without a "
                       r"reference KL \(kl_placement none\): fate stopping would have nothing to read"):
        load_sweep(REPO / "sweeps" / "drgrpo_vs_grpo.yaml", ["stopping={fate: {signals: [kl]}}"])
    assert load_sweep(REPO / "sweeps" / "drgrpo_vs_grpo.yaml").stopping.fate.signals == ["kl", "proxy_gap"]


def test_a_kl_path_is_compared_per_token_and_with_trials_of_its_own_estimator():
    """grpo_kl searches kl_loss_type and loss_agg_mode: an abs/token-sum trial logs actor/kl_loss in the hundreds (a
    sum over mini-batch tokens), a low_var_kl/token-mean one below 1. Each is judged against its own estimator's
    trials, per token (divided by response_length/mean × ppo_mini_batch_size × rollout.n = 10 × 4 × 2)."""
    sizes = {"actor_rollout_ref.actor.ppo_mini_batch_size": 4, "actor_rollout_ref.rollout.n": 2}
    configs = {
        "k3": {"actor_rollout_ref.actor.kl_loss_type": "low_var_kl", "actor_rollout_ref.actor.loss_agg_mode":
               "token-mean", **sizes},
        "abs": {"actor_rollout_ref.actor.kl_loss_type": "abs", "actor_rollout_ref.actor.loss_agg_mode": "token-sum",
                **sizes},
    }
    fate = FateStopper([(VAL, "max")], 20, "loss", FateStop(signals=["kl"], grace=0.0, window=1),
                       run_config_of=lambda config: configs[config["kind"]])

    def result(kind: str, kl: float, **more) -> dict:
        return {"actor/kl_loss": kl, "response_length/mean": 10.0, VAL: 0.5, "config": {"kind": kind}, **more}

    fate.stopped("k3 failed", result("k3", 0.1, step=5, health="stopped"))
    assert fate.judge("abs, not compared", 5, result("abs", 140.0)) is None  # no abs trial failed yet
    assert fate.judge("k3 below", 5, result("k3", 0.09)) is None
    assert fate.judge("k3 at", 5, result("k3", 0.1)) == (
        "fate at step 5 (mean of the last 1 steps): actor/kl_loss 0.1 is at or above the median 0.1 of the 1 trials "
        "(kl_loss_type=low_var_kl) the health rules stopped: it is heading where the stopped trials went")
    fate.stopped("abs failed", result("abs", 40.0, step=5, health="stopped"))  # 0.5 per token
    assert fate.judge("abs below", 5, result("abs", 39.0)) is None  # 0.4875 per token
    assert "actor/kl_loss 0.5 is at or above the median 0.5 of the 1 trials (kl_loss_type=abs)" in fate.judge(
        "abs at", 5, result("abs", 40.0))
