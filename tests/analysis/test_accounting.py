"""Compute accounting: trial-steps and GPU-hours used and saved, worked out by hand."""

from __future__ import annotations

import pandas as pd
import pytest

from klsweep.analysis.accounting import compute_accounting


def test_accounting_by_hand():
    df = pd.DataFrame({
        "state": ["COMPLETE", "COMPLETE", "PRUNED", "FAIL", "COMPLETE"],
        "health": ["healthy", "stopped", "healthy", "healthy", "warned"],
        "steps": [20, 5, 10, 0, 20],
        "wall_s": [400.0, 50.0, 300.0, 0.0, 200.0],
    })
    table = compute_accounting(df, max_steps=20, gpu=2.0).set_index("outcome")
    # health stop: trial 1 ran 5 steps at 10 s/step, 15 steps saved -> 150 s = 1/24 h, x2 GPUs
    assert table.loc["health stop", "steps_saved"] == 15
    assert table.loc["health stop", "gpu_h_saved"] == pytest.approx(150 * 2 / 3600)
    # scheduler stop: trial 2 ran 10 steps at 30 s/step, 10 saved -> 300 s
    assert table.loc["scheduler stop", "wall_h_saved"] == pytest.approx(300 / 3600)
    # failed at step 0: its 20 steps not run were lost, not saved
    assert table.loc["failed", "steps_saved"] == 0 and table.loc["failed", "wall_h_saved"] == 0
    assert table.loc["full budget", "trials"] == 2 and table.loc["full budget", "steps_saved"] == 0
    assert table.loc["total", "steps_used"] == 55
    assert table.loc["total", "gpu_h_used"] == pytest.approx(950 * 2 / 3600)
    assert table.loc["total", "steps_saved"] == 25
    assert table.loc["total", "gpu_h_saved"] == pytest.approx((150 + 300) * 2 / 3600)


def test_a_failure_is_not_a_saving():
    """11 of 16 trials failing at step 0 once showed as 880 steps saved (82.5 %); a failure after 30 of 80 steps
    counts its 30 steps as used and its 50 missing ones as neither used nor saved."""
    df = pd.DataFrame({"state": ["FAIL"] * 11 + ["FAIL", "COMPLETE"],
                       "health": ["healthy"] * 13, "steps": [0] * 11 + [30, 80], "wall_s": [0.0] * 11 + [60.0, 80.0]})
    table = compute_accounting(df, max_steps=80, gpu=1.0).set_index("outcome")
    assert table.loc["failed", "trials"] == 12 and table.loc["failed", "steps_saved"] == 0
    assert table.loc["failed", "steps_used"] == 30 and table.loc["failed", "gpu_h_saved"] == 0
    assert table.loc["total", "steps_saved"] == 0 and table.loc["total", "saved_share"] == 0
    assert table.loc["total", "gpu_h_used"] == pytest.approx(140 / 3600)


def test_accounting_by_stop_reason_by_hand():
    """Each stopped trial's remaining budget is its saving, grouped by what stopped it; shares are of the whole
    sweep's steps (used + saved), so the groups add up to the total."""
    df = pd.DataFrame({
        "state": ["COMPLETE", "PRUNED", "PRUNED", "PRUNED", "PRUNED", "FAIL", "RUNNING", "FAIL"],
        "health": ["healthy", "stopped", "stopped", "stopped", "healthy", "healthy", "healthy", "stopped"],
        "steps": [40, 10, 20, 30, 25, 0, 12, 5],
        "wall_s": [400.0, 50.0, 400.0, 60.0, 100.0, 0.0, 24.0, 5.0],
        "stop_reason": ["", "diverged at step 10 by kl_runaway: KL 2.1 > 1", "collapsed at step 20 by "
                        "entropy_collapse: entropy 0.01 < 0.05", "diverged at step 30 by kl_runaway: KL 3 > 1",
                        "stopped at step 25: 2 peers beat it by more than the noise", "trial raised an error", "",
                        "nonfinite at step 5 by nonfinite_loss: actor/pg_loss is nan"],
        "stop_kind": ["", "diverged", "collapsed", "diverged", "objective", "", "", "nonfinite"],
    })
    table = compute_accounting(df, max_steps=40, gpu=0.5, by="reason").set_index("reason")
    assert list(table.index) == ["health: entropy_collapse", "health: kl_runaway", "health: nonfinite_loss",
                                 "objective stopper", "failed", "full budget", "running", "total"]
    # kl_runaway: trials 1 (10 steps, 5 s/step, 30 left -> 150 s) and 3 (30 steps, 2 s/step, 10 left -> 20 s)
    assert table.loc["health: kl_runaway", "trials"] == 2
    assert table.loc["health: kl_runaway", "steps_used"] == 40
    assert table.loc["health: kl_runaway", "steps_saved"] == 40
    assert table.loc["health: kl_runaway", "gpu_h_saved"] == pytest.approx(170 * 0.5 / 3600)
    # entropy_collapse: 20 steps at 20 s/step, 20 left -> 400 s; nonfinite_loss: 5 at 1 s/step, 35 left -> 35 s
    assert table.loc["health: entropy_collapse", "wall_h_saved"] == pytest.approx(400 / 3600)
    assert table.loc["health: nonfinite_loss", "steps_saved"] == 35
    # the objective stopper: 25 steps at 4 s/step, 15 left -> 60 s
    assert table.loc["objective stopper", "steps_saved"] == 15
    assert table.loc["objective stopper", "gpu_h_saved"] == pytest.approx(60 * 0.5 / 3600)
    # failed at step 0: 40 steps lost, none saved; running: nothing saved yet
    assert table.loc["failed", "steps_saved"] == 0 and table.loc["failed", "wall_h_saved"] == 0
    assert table.loc["running", "steps_saved"] == 0 and table.loc["running", "steps_used"] == 12
    # the whole sweep: used 40+10+20+30+25+0+12+5 = 142, saved 30+20+10+15+35 = 110 (the failure saved nothing)
    assert table.loc["total", "steps_used"] == 142 and table.loc["total", "steps_saved"] == 110
    assert table.loc["health: kl_runaway", "saved_share"] == pytest.approx(40 / 252)
    assert table.loc["total", "saved_share"] == pytest.approx(110 / 252)
    # GPU-hours: used 1039 s, saved 150 + 400 + 20 + 60 + 35 = 665 s (the failed trial has no s/step)
    assert table.loc["total", "gpu_h_saved_share"] == pytest.approx(665 / (1039 + 665))
    assert table.loc["health: entropy_collapse", "gpu_h_saved_share"] == pytest.approx(400 / (1039 + 665))


def test_accounting_by_outcome_counts_objective_stops_apart_from_the_scheduler():
    df = pd.DataFrame({"state": ["PRUNED", "PRUNED"], "health": ["healthy", "healthy"], "steps": [10, 30],
                       "wall_s": [10.0, 30.0], "stop_kind": ["objective", ""],
                       "stop_reason": ["peers beat it", "stopped by the scheduler at step 30"]})
    table = compute_accounting(df, max_steps=40, gpu=0.0).set_index("outcome")
    assert table.loc["objective stop", "steps_saved"] == 30 and table.loc["scheduler stop", "steps_saved"] == 10
    assert table.loc["total", "saved_share"] == pytest.approx(40 / 80)
    assert table.loc["total", "gpu_h_saved_share"] == 0  # a CPU sweep reserves no GPU-hours
    with pytest.raises(ValueError, match="use 'outcome' or 'reason'"):
        compute_accounting(df, 40, 0.0, by="rule")


def test_steps_a_remedy_ran_again_count_as_used():
    """A restart decided at step s from the checkpoint of step f ran steps f+1..s again: s - f more steps used, at the
    trial's own seconds per step."""
    import json

    kl = "algorithm.kl_ctrl.kl_coef"

    def remedy(restart, step, from_step, key=kl):
        return {"restart": restart, "step": step, "rule": "kl_runaway", "from_step": from_step, "key": key,
                "old": 0.01, "new": 0.015}

    df = pd.DataFrame({
        "state": ["COMPLETE", "COMPLETE", "PRUNED"],
        "health": ["healthy", "healthy", "stopped"],
        "steps": [40, 40, 15],
        "wall_s": [400.0, 200.0, 150.0],
        "stop_reason": ["", "", "diverged at step 15 by kl_runaway: KL 2 > 1 (not remedied: max_remedies 1 of "
                                "kl_runaway reached)"],
        # trial 0: restart 1 (two knobs, one restart) at 30 from 20, restart 2 at 35 from 28; trial 2: at 12 from 8
        "remedies": [json.dumps([remedy(1, 30, 20), remedy(1, 30, 20, "actor_rollout_ref.actor.optim.lr"),
                                 remedy(2, 35, 28)]), float("nan"), json.dumps([remedy(1, 12, 8)])],
    })
    table = compute_accounting(df, max_steps=40, gpu=2.0, by="reason").set_index("reason")
    assert table.loc["full budget", "steps_rerun"] == 17  # 10 + 7, the two-knob restart counted once
    assert table.loc["full budget", "steps_used"] == 40 + 17 + 40
    assert table.loc["full budget", "wall_h_used"] == pytest.approx((400 + 17 * 10 + 200) / 3600)
    assert table.loc["health: kl_runaway", "steps_used"] == 15 + 4
    assert table.loc["health: kl_runaway", "steps_saved"] == 25  # the budget left is that of the last run
    assert table.loc["total", "steps_rerun"] == 21 and table.loc["total", "steps_used"] == 116
    assert table.loc["total", "gpu_h_used"] == pytest.approx((770 + 190) * 2 / 3600)  # (400 + 170 + 200) + (150 + 40) s
    assert table.loc["total", "saved_share"] == pytest.approx(25 / (116 + 25))
    # without remedies nothing is run again
    plain = compute_accounting(df.drop(columns="remedies"), 40, 2.0).set_index("outcome")
    assert plain.loc["total", "steps_rerun"] == 0 and plain.loc["total", "steps_used"] == 95


def test_a_trial_that_played_its_whole_log_saved_nothing():
    """A replay of verl's GRPO log (steps 1-105) under budget.max_steps 200: the two trials that played it to its end
    ran their whole run, none of the 95 steps past it were saved; the health stop at step 3 saved the 102 steps
    the log had left, not 197."""
    df = pd.DataFrame({
        "state": ["COMPLETE", "PRUNED", "COMPLETE"], "health": ["healthy", "stopped", "healthy"],
        "steps": [105, 3, 105], "wall_s": [0.5, 0.02, 0.5],
        "stop_reason": ["", "misconfigured at step 3 by builtin.no_update: no update: actor/lr is 0", ""],
        "stop_kind": ["", "misconfigured", ""],
    })
    for by, stop, run_ended in (("reason", "health: builtin.no_update", "run ended before max_steps"),
                                ("outcome", "health stop", "run ended before max_steps")):
        table = compute_accounting(df, max_steps=200, gpu=0.0, by=by).set_index(by)  # type: ignore[arg-type]
        assert list(table.index) == [stop, run_ended, "total"]
        assert table.loc[run_ended, "trials"] == 2 and table.loc[run_ended, "steps_used"] == 210
        assert table.loc[run_ended, "steps_saved"] == 0 and table.loc[run_ended, "wall_h_saved"] == 0
        assert table.loc[stop, "steps_saved"] == 102
        assert table.loc["total", "steps_used"] == 213 and table.loc["total", "steps_saved"] == 102
        assert table.loc["total", "saved_share"] == pytest.approx(102 / 315)


def test_a_multi_objective_scheduler_stop_short_of_the_budget_still_saves():
    """COMPLETE with a stop reason short of max_steps is a scheduler stop (a multi-objective study keeps its values),
    not a run that ended by itself."""
    df = pd.DataFrame({"state": ["COMPLETE", "COMPLETE"], "health": ["healthy", "healthy"], "steps": [40, 10],
                       "wall_s": [40.0, 10.0], "stop_reason": ["", "stopped at step 10"]})
    table = compute_accounting(df, max_steps=40, gpu=0.0).set_index("outcome")
    assert table.loc["scheduler stop", "steps_saved"] == 30 and table.loc["full budget", "steps_saved"] == 0


def test_median_fate_and_objective_stops_are_counted_apart():
    """The three stoppers of ``stopping:`` all record ``stop_kind`` objective; the compute table by stop reason tells
    them apart by their reasons, as the stoppers write them."""
    from klsweep.orchestrate.fate_stop import FateRule, signal_readers
    from klsweep.orchestrate.median_stop import MedianRule
    from klsweep.spec.schema import FateStop, MedianStop

    val, kl = "val-core/arith/acc/mean@1", "actor/reward_kl_penalty"
    median = MedianRule([(val, "max")], total_steps=40, settings=MedianStop(margin=0.1, min_finished=1))
    median.update("done", 10, {val: 0.6})
    median.finish("done")
    median_reason = median.update("low", 10, {val: 0.3})
    fate = FateRule([(val, "max")], 40, signal_readers(["kl"], "reward"),
                    FateStop(margin=0.1, grace=0.1, window=1, min_finished=1))
    for step in (5, 40):
        fate.update("ok", step, {kl: 0.1, val: 0.6})
    fate.finish("ok")
    fate.update("sick", 5, {kl: 0.2, val: 0.5})
    fate.fail("sick")
    fate_reason = fate.update("hot", 5, {kl: 0.25, val: 0.5})
    assert median_reason and fate_reason
    df = pd.DataFrame({
        "state": ["PRUNED"] * 4 + ["COMPLETE"],
        "health": ["healthy"] * 5,
        "steps": [10, 5, 20, 30, 40],
        "wall_s": [20.0, 10.0, 40.0, 60.0, 80.0],
        "stop_reason": [median_reason, fate_reason, "objective: at step 20 3 of 3 trials at that step beat "
                        f"{val} 0.3 (margin 0.1) by more than the margin on every objective", median_reason, ""],
        "stop_kind": ["objective"] * 4 + [""],
    })
    table = compute_accounting(df, max_steps=40, gpu=0.0, by="reason").set_index("reason")
    assert list(table.index) == ["median stopping", "fate stopping", "objective stopper", "full budget", "total"]
    assert table.loc["median stopping", "trials"] == 2 and table.loc["median stopping", "steps_saved"] == 30 + 10
    assert table.loc["fate stopping", "steps_saved"] == 35 and table.loc["objective stopper", "steps_saved"] == 20
    assert table.loc["total", "steps_saved"] == 40 + 35 + 20


def _with_start_up(result, start_up: float, restarts: tuple[int, ...] = ()) -> None:
    """Rewrite a trial's result.json as a trial's process writes it: the first report after each (re)start (Tune's
    ``iterations_since_restore`` 1) also took the process's start-up, which ``time_this_iter_s`` and ``time_total_s``
    hold."""
    import json

    rows = [json.loads(line) for line in result.read_text().splitlines()]
    step_times = [b["time_total_s"] - a["time_total_s"] for a, b in zip([{"time_total_s": 0.0}, *rows], rows)]
    total, since = 0.0, 0
    for i, (row, step_time) in enumerate(zip(rows, step_times)):
        since = 1 if i == 0 or row["training_iteration"] in restarts else since + 1
        this = step_time + (start_up if since == 1 else 0.0)
        total += this
        row.update(time_this_iter_s=this, time_total_s=total, iterations_since_restore=since)
    result.write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_hours_saved_are_costed_at_a_step_rate_without_the_start_up(synthetic_sweep, capsys):
    """A trial's first report (and the first after a resume) holds its process's start-up: 30 s here, against 2 s
    per step. A trial stopped at step 5 of 10 saved 5 steps x 2 s, not 5 x (30 + 10) / 5 = 40 s; one stopped at its
    first step is costed at the sweep's median rate."""
    from klsweep.analysis import load
    from klsweep.analysis.sweep_dir import STEP_SECONDS
    from klsweep.cli import main
    from tests.analysis.conftest import KL_COEF

    healthy = {"steps": 10, "health": "healthy", "stop_reason": ""}
    stopped = {"health": "stopped", "stop_reason": "diverged at step 5 by kl_runaway: KL 2 > 1"}
    run_dir = synthetic_sweep([{**healthy, "params": {KL_COEF: 0.01}},
                               {**stopped, "params": {KL_COEF: 0.02}, "steps": 5},
                               {**stopped, "params": {KL_COEF: 0.03}, "steps": 1}], max_steps=10, gpu=0.0)
    results = sorted((run_dir / "tune").glob("*/result.json"))
    _with_start_up(results[0], 30.0, restarts=(6,))  # resumed at step 6: its start-up again
    for result in results[1:]:
        _with_start_up(result, 30.0)
    df = load(run_dir)
    assert df.attrs[STEP_SECONDS] == {"t00000": pytest.approx(2.0), "t00001": pytest.approx(2.0)}
    table = compute_accounting(df, max_steps=10, gpu=0.0, by="reason").set_index("reason")
    # saved: 5 steps x 2 s (its own rate) + 9 steps x 2 s (one step: the median of the others' rates)
    assert table.loc["health: kl_runaway", "wall_h_saved"] == pytest.approx((5 + 9) * 2.0 / 3600)
    # used: the trials' whole wall time, start-ups included: 3 x 30 s + 2 resume + 16 steps x 2 s
    assert table.loc["total", "wall_h_used"] == pytest.approx((4 * 30 + 16 * 2) / 3600)
    assert main(["status", str(run_dir)]) == 0
    rows = {line.split("│")[0].strip(): [c.strip() for c in line.split("│")[1:]]
            for line in capsys.readouterr().out.splitlines() if "│" in line}
    assert rows["health: kl_runaway"][-1] == f"{14 * 2.0 / 3600:.3g}"
