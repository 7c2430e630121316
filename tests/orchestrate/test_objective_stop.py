"""The objective stopper on hand-built curves, and once in a real sweep on the tabular trainer."""

from __future__ import annotations

import json
import math
from pathlib import Path

import optuna
import pandas as pd
import pytest
import yaml
from ray import tune
from ray.tune.stopper import CombinedStopper

from klsweep.analysis.sweep_dir import study_of
from klsweep.cli import main
from klsweep.errors import SweepFileError
from klsweep.health import HealthStopper, load_ruleset
from klsweep.orchestrate.objective_stop import ObjectiveRule, ObjectiveStopper
from klsweep.orchestrate.searcher import KlsweepSearch
from klsweep.spec import load_sweep
from klsweep.spec.schema import ObjectiveStop

REPO = Path(__file__).resolve().parents[2]
VAL = "val-core/arith/acc/mean@1"
KL = "actor/reward_kl_penalty"
#: judge from the first rung, 3 peers needed, 2 of them must beat by 2 noise sds of a difference, raw values
EAGER = ObjectiveStop(min_peers=3, dominated_by=2, margin=2.0, grace=0.0, window=1, min_diffs=4)
PEERS = {"p1": [0.60, 0.62, 0.60], "p2": [0.62, 0.60, 0.62], "p3": [0.58, 0.60, 0.58]}
STEPS = [10, 20, 30]


def _feed(rule: ObjectiveRule, curves: dict[str, list[float]], metric: str = VAL) -> None:
    for trial, values in curves.items():
        for step, value in zip(STEPS, values):
            assert rule.update(trial, step, {metric: value}) is None


def _margin(diffs: list[float], z: float = 2.0) -> float:
    """The margin the module docstring defines, computed here by hand: z·σ·√2, σ = 1.4826·MAD(diffs)/√2."""
    ordered = sorted(diffs)
    median = (ordered[(len(ordered) - 1) // 2] + ordered[len(ordered) // 2]) / 2
    deviations = sorted(abs(d - median) for d in diffs)
    mad = (deviations[(len(deviations) - 1) // 2] + deviations[len(deviations) // 2]) / 2
    return z * 1.4826 * mad / math.sqrt(2) * math.sqrt(2)


def test_noise_is_the_mad_of_successive_differences():
    rule = ObjectiveRule([(VAL, "max")], 30, EAGER)
    _feed(rule, {"a": [0.5, 0.6, 0.5]})
    assert rule.noise() is None  # 2 differences, min_diffs 4
    _feed(rule, {"b": [0.5, 0.5, 0.5]})
    # +0.1, -0.1, 0, 0: median 0, absolute deviations 0.1, 0.1, 0, 0 -> MAD 0.05, σ = 1.4826 * 0.05 / √2
    noise = rule.noise()
    assert noise is not None and noise[0] == pytest.approx(1.4826 * 0.05 / math.sqrt(2)) and len(noise) == 1
    rule.update("b", 40, {VAL: 0.5})
    assert rule.noise() == [0.0]  # +0.1, -0.1, 0, 0, 0: MAD 0


def test_stops_a_clearly_dominated_trial_at_its_rung():
    rule = ObjectiveRule([(VAL, "max")], 30, EAGER)
    _feed(rule, PEERS)
    assert rule.update("t", 10, {VAL: 0.58}) is None  # within the margin (0.059) of two peers
    reason = rule.update("t", 20, {VAL: 0.30})
    # differences: the peers' ±0.02 (6) and the trial's -0.28: median -0.02, MAD 0.04
    margin = _margin([0.02, -0.02, -0.02, 0.02, 0.02, -0.02, -0.28])
    assert margin == pytest.approx(2 * 1.4826 * 0.04)
    assert reason is not None and reason.startswith("objective: at step 20 3 of 3 trials at that step beat")
    assert f"{VAL} 0.3 (margin {margin:.3g})" in reason


def test_never_stops_a_leader_or_a_trial_within_the_margin_of_the_front():
    rule = ObjectiveRule([(VAL, "max")], 30, EAGER.model_copy(update={"dominated_by": 1}))
    _feed(rule, PEERS)
    # the leader at each step (above every peer), then one 0.01 under it (margins 0.03-0.06 as the noise is learned)
    for step, value in zip(STEPS, [0.70, 0.71, 0.70]):
        assert rule.update("leader", step, {VAL: value}) is None
    for step, value in zip(STEPS, [0.69, 0.70, 0.69]):
        assert rule.update("near", step, {VAL: value}) is None
    assert rule.update("below", 10, {VAL: 0.70 - 0.06}) is not None  # just past the margin under the leader


def test_not_judged_before_its_minimum_peers_or_its_grace_nor_at_its_last_step():
    rule = ObjectiveRule([(VAL, "max")], 30, EAGER)
    _feed(rule, {k: PEERS[k] for k in ("p1", "p2")})
    assert rule.update("t", 10, {VAL: 0.1}) is None
    assert rule.update("t", 20, {VAL: 0.0}) is None  # 2 peers at step 20, 3 needed
    graced = ObjectiveRule([(VAL, "max")], 100, EAGER.model_copy(update={"grace": 0.25}))
    _feed(graced, PEERS)
    assert graced.update("t", 10, {VAL: 0.58}) is None
    assert graced.update("t", 20, {VAL: 0.0}) is None  # step 20 < 25 % of 100 steps
    assert graced.update("t", 30, {VAL: 0.0}) is not None
    last = ObjectiveRule([(VAL, "max")], 30, EAGER)
    _feed(last, PEERS)
    assert last.update("t", 10, {VAL: 0.58}) is None
    assert last.update("t", 30, {VAL: 0.0}) is None  # its last step (30 of 30): nothing left to save


def test_multi_objective_dominance_by_a_margin_on_every_objective():
    objectives = [(VAL, "max"), (KL, "min")]
    rule = ObjectiveRule(objectives, 30, EAGER)
    kl = {"p1": [0.10, 0.12, 0.10], "p2": [0.12, 0.10, 0.12], "p3": [0.08, 0.10, 0.08]}
    for trial in PEERS:
        for step, value, k in zip(STEPS, PEERS[trial], kl[trial]):
            assert rule.update(trial, step, {VAL: value, KL: k}) is None
    # far worse on accuracy but with a KL far below every peer: on the front, kept
    assert rule.update("cheap", 10, {VAL: 0.58, KL: 0.08}) is None
    assert rule.update("cheap", 20, {VAL: 0.30, KL: 0.01}) is None
    # far worse on accuracy, KL far above: dominated on both by margin
    assert rule.update("bad", 10, {VAL: 0.58, KL: 0.10}) is None
    reason = rule.update("bad", 20, {VAL: 0.30, KL: 0.60})
    assert reason is not None and f"{KL} 0.6" in reason
    # worse on accuracy, KL above the peers but within the KL margin: not dominated on every objective
    assert rule.update("close", 10, {VAL: 0.58, KL: 0.10}) is None
    assert rule.update("close", 20, {VAL: 0.30, KL: 0.11}) is None


def test_a_restart_drops_the_rungs_after_it_and_the_stopper_writes_the_reason():
    stopper = ObjectiveStopper([(VAL, "max")], 30, EAGER)
    _feed(stopper.rule, PEERS)
    result = {"step": 10, VAL: 0.58, "stop_reason": "", "stop_kind": ""}
    assert stopper("t", result) is False and result["stop_kind"] == ""
    assert stopper("t", {"step": 20, VAL: 0.61}) is False
    assert stopper("t", {"step": 10, VAL: 0.58}) is False  # restarted from a checkpoint before step 20
    assert [s for s, _ in stopper.rule._rungs["t"]] == [10]
    assert stopper("t", {"step": 10, "actor/pg_loss": 0.1}) is False  # another report of step 10 keeps its rung
    assert [s for s, _ in stopper.rule._rungs["t"]] == [10]
    # the health stopper planned a remedy on this report: the trial restarts from a checkpoint, not judged here
    assert stopper("t", {"step": 20, VAL: 0.30, "remedy_note": "remedied: reward_hacking at step 20: ..."}) is False
    result = {"step": 20, VAL: 0.30}
    assert stopper("t", result) is True
    assert result["stop_kind"] == "objective" and str(result["stop_reason"]).startswith("objective: at step 20")
    assert stopper.stop_all() is False


def test_sweep_file_section(tmp_path):
    sweep = load_sweep(str(REPO / "sweeps" / "conservative.yaml"), ["stopping={objective: on}"])
    assert sweep.stopping.objective == ObjectiveStop()
    assert load_sweep(str(REPO / "sweeps" / "conservative.yaml"), ["stopping={objective: off}"]).stopping.objective \
        is None
    with pytest.raises(SweepFileError, match=r"dominated_by \(4\) exceeds min_peers \(3\)"):
        load_sweep(str(REPO / "sweeps" / "conservative.yaml"), ["stopping={objective: {dominated_by: 4}}"])
    with pytest.raises(SweepFileError, match="margin"):
        load_sweep(str(REPO / "sweeps" / "conservative.yaml"), ["stopping={objective: {margin: 0}}"])
    few = load_sweep(str(REPO / "sweeps" / "conservative.yaml"), ["stopping={objective: on}", "budget.trials=3"])
    assert any("stopping.objective: can never stop a trial: it waits for min_peers (3) other trials at a step and "
               "budget.trials is 3" in w for w in few.warnings)
    assert not any("stopping.objective" in w for w in sweep.warnings)


@pytest.mark.slow
def test_a_real_sweep_records_an_objective_stop_pruned_with_its_reason(ray_local, tmp_path):
    """drgrpo_vs_grpo's table, one trial at a time: the four lr 1e-4 runs (0.62-0.68 at step 10) then an lr 1e-3 run
    (0.38 at step 10, 0 from step 20), 20 steps each: the last is stopped at step 10 on the objective, not by health
    (rules off)."""
    good = [{"algorithm.norm_adv_by_std_in_grpo": norm, "loss_agg_mode": agg, "actor_rollout_ref.actor.optim.lr": 1e-4}
            for norm in (False, True) for agg in ("seq-mean-token-sum-norm", "token-mean")]
    bad = {"algorithm.norm_adv_by_std_in_grpo": False, "loss_agg_mode": "seq-mean-token-sum-norm",
           "actor_rollout_ref.actor.optim.lr": 1e-3}
    source = yaml.safe_load((REPO / "sweeps" / "drgrpo_vs_grpo.yaml").read_text())
    source.update(
        trainer="tabular", tabular={"table": str(REPO / "benchmarks" / "tabular" / "drgrpo_vs_grpo.jsonl.gz")},
        seed_trials=[*good, bad], sampler="random", budget={"trials": 5, "max_concurrent": 1, "max_steps": 20},
        health={"preset": "none", "builtin": {"nonfinite_loss": False, "nonfinite_grad_norm_streak": 0,
                                              "no_signal_for": 0, "kl_dead_for": 0, "kl_explosion": 0}},
        stopping={"objective": {"grace": 0.0, "min_diffs": 4, "window": 1, "margin": 2.0, "dominated_by": 2}},
    )
    path = tmp_path / "drgrpo_tab.yaml"
    path.write_text(yaml.safe_dump(source, sort_keys=False))
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 0
    trials = study_of(out).get_trials()
    assert [t.state.name for t in trials] == ["COMPLETE"] * 4 + ["PRUNED"]
    stopped = trials[4]
    assert json.loads(stopped.user_attrs["verl_overrides"])["actor_rollout_ref.actor.optim.lr"] == 1e-3
    assert stopped.user_attrs["stop_reason"].startswith("objective: at step 10 4 of 4 trials at that step beat")
    assert stopped.user_attrs["steps"] == 10 and stopped.user_attrs["health"] == "healthy"
    df = pd.read_csv(out / "trials.csv")
    row = df[df["number"] == 4].iloc[0]
    assert row["state"] == "PRUNED" and row["stop_kind"] == "objective" and row["steps"] == 10
    assert row["stop_reason"] == stopped.user_attrs["stop_reason"]
    assert (df[df["number"] < 4]["steps"] == 20).all()


PARETO_KINDS = ["good0", "good1", "good2", "cheap", "bad"]


def _pareto_space(trial) -> None:
    trial.suggest_categorical("kind", PARETO_KINDS)


def _pareto_overrides(params):
    return {"x.kind": params["kind"]}


def _pareto_trainable(config):
    """6 steps of (val, kl) per step: ``good<i>`` alternate ±0.01 around 0.6 + i/100 and ±0.001 around 0.01;
    ``cheap`` scores 0.3 with KL 0.001 (on the front by its KL); ``bad`` scores 0.2 with KL 0.1 from step 2."""
    kind = config["kind"]
    for step in range(1, 7):
        wiggle = 1 if step % 2 else -1
        if kind.startswith("good"):
            val, kl = 0.6 + int(kind[4:]) / 100 + 0.01 * wiggle, 0.01 + 0.001 * wiggle
        elif kind == "cheap":
            val, kl = 0.3 + 0.01 * wiggle, 0.001
        else:
            val, kl = (0.6, 0.01) if step == 1 else (0.2, 0.1)
        tune.report({"step": step, "total_steps": 6, VAL: val, KL: kl})


@pytest.mark.slow
def test_multi_objective_stop_is_pruned_and_off_the_front(ray_local, tmp_path):
    """Real Ray Tune + Optuna, one trial at a time, HealthStopper (no rule fires) then the objective stopper: the
    trial beaten on both objectives is PRUNED with its reason at step 2; the low-reward, low-KL one is kept."""
    kinds = PARETO_KINDS
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'study.db'}")
    objectives = [(VAL, "max"), (KL, "min")]
    searcher = KlsweepSearch(
        space=_pareto_space, metric=[VAL, KL], mode=["max", "min"],
        points_to_evaluate=[{"kind": k} for k in kinds], sampler=optuna.samplers.RandomSampler(seed=0),
        study_name="s", storage=storage, overrides_of=_pareto_overrides, total_steps=6)
    stopper = CombinedStopper(HealthStopper(load_ruleset({"preset": "none"})), ObjectiveStopper(objectives, 6, EAGER))
    tune.Tuner(
        _pareto_trainable,
        tune_config=tune.TuneConfig(search_alg=searcher, num_samples=len(kinds), max_concurrent_trials=1),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="tune", stop=stopper, verbose=0,
                                  failure_config=tune.FailureConfig(max_failures=0)),
    ).fit()
    study = optuna.load_study(study_name="s", storage=storage)
    by_kind = {t.params["kind"]: t for t in study.trials}
    assert {k: t.state.name for k, t in by_kind.items()} == {
        "good0": "COMPLETE", "good1": "COMPLETE", "good2": "COMPLETE", "cheap": "COMPLETE", "bad": "PRUNED"}
    bad = by_kind["bad"]
    assert bad.user_attrs["steps"] == 2 and bad.user_attrs["health"] == "healthy"
    assert bad.user_attrs["stop_reason"].startswith("objective: at step 2 4 of 4 trials at that step beat")
    assert f"{KL} 0.1 (margin" in bad.user_attrs["stop_reason"]
    assert sorted(t.params["kind"] for t in study.best_trials) == ["cheap", "good2"]
