"""``scheduler: asha`` with health rules: :class:`klsweep.orchestrate.asha.HealthAwareASHA`, Ray Tune's real ASHA
scheduler with health-stopped trials out of its rungs and no ASHA stop before a trial has finished healthy."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from ray.tune.schedulers import ASHAScheduler, TrialScheduler

from klsweep.cli import main
from klsweep.orchestrate.asha import HealthAwareASHA
from klsweep.results import HEALTH, STOP_KIND
from tests.test_equivalence import _table_overrides

REPO = Path(__file__).resolve().parents[2]


@dataclass
class _Trial:
    """A trial as ASHA reads it: its id."""

    trial_id: str


def _scheduler(cls: type) -> ASHAScheduler:
    return cls(time_attr="training_iteration", metric="score", mode="max", max_t=80, grace_period=10,
               reduction_factor=3)


def _report(scheduler: ASHAScheduler, trial: _Trial, step: int, score: float) -> str:
    return scheduler.on_trial_result(None, trial, {"training_iteration": step, "score": score})


def test_a_health_stopped_trial_leaves_the_rungs_and_no_stop_comes_before_a_healthy_finish():
    stock, aware = _scheduler(ASHAScheduler), _scheduler(HealthAwareASHA)
    hacker, healthy, late = _Trial("hacker"), _Trial("healthy"), _Trial("late")
    for scheduler in (stock, aware):
        for trial in (hacker, healthy, late):
            scheduler.on_trial_add(None, trial)
        # the run that will reward-hack looks best at steps 10 and 30, then the health rules stop it at 47
        assert _report(scheduler, hacker, 10, 0.9) == TrialScheduler.CONTINUE  # the first value of the rung
        assert _report(scheduler, hacker, 30, 0.9) == TrialScheduler.CONTINUE
        scheduler.on_trial_complete(None, hacker, {"training_iteration": 47, "score": 0.1, HEALTH: "stopped",
                                                   STOP_KIND: "reward_hacking"})
    # stock ASHA kept the hacker's 0.9 (and its last 0.1) in the rungs: 0.6 at step 10 is below the cutoff
    assert _report(stock, healthy, 10, 0.6) == TrialScheduler.STOP
    # health-aware ASHA dropped it: the rungs are empty again, and no trial has finished healthy yet
    rungs = {milestone: dict(recorded) for milestone, recorded in aware._trial_info["healthy"]._rungs}
    assert rungs == {30: {}, 10: {}}
    assert _report(aware, healthy, 10, 0.6) == TrialScheduler.CONTINUE
    assert _report(aware, healthy, 30, 0.65) == TrialScheduler.CONTINUE
    # a trial below the cutoff is kept on until one trial has finished healthy...
    assert _report(aware, late, 10, 0.2) == TrialScheduler.CONTINUE
    aware.on_trial_complete(None, healthy, {"training_iteration": 80, "score": 0.66, HEALTH: "healthy"})
    assert aware.finished_healthy == 1
    # ...and from then on ASHA stops as Ray's does: 0.2 at step 30 is below the 30-rung's cutoff of 0.65
    assert _report(aware, late, 30, 0.2) == TrialScheduler.STOP


def test_an_asha_sweep_whose_seed_trial_the_rules_stop_still_finishes_a_trial(ray_local, tmp_path):
    """``sweeps/conservative.yaml`` on its table, sweep seed 2, 4 trials one at a time: the seed trial scores best
    at steps 10 and 30 and is stopped at step 53 by ``kl_runaway``. With Ray's stock ASHA its values stayed the
    rung cutoffs and trials 1-3 were stopped at steps 10 and 30: no trial finished (benchmarks/peers.py,
    ``klsweep+asha-stock``)."""
    out = tmp_path / "out"
    args = ["run", str(REPO / "sweeps" / "conservative.yaml"), *_table_overrides("conservative"), "seed=2",
            "scheduler={type: asha}", "budget.trials=4", "budget.max_concurrent=1", "--out", str(out), "--quiet"]
    assert main(args) == 0
    trials = pd.read_csv(out / "trials.csv").sort_values("number")
    seed_trial = trials.iloc[0]
    assert seed_trial["health"] == "stopped" and seed_trial["steps"] < 80
    finished = trials[(trials["state"] == "COMPLETE") & (trials["steps"] == 80)]
    assert len(finished) >= 1
    assert (trials["steps"] < 80).sum() >= 2  # ASHA still stops trials once one has finished
