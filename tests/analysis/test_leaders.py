"""The confirmation phase in a trials table (budget.confirm): which leaders re-run with which seeds, their ranking by
mean over seeds worked out by hand, what the noise allows to say, and the counts `sweep status` shows."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from klsweep.analysis.leaders import leaders, nothing_to_run, planned, ranking, run_counts, verdicts, within_noise
from klsweep.spec import load_sweep
from tests.orchestrate.conftest import sweep_file

VAL = "val-core/arith/acc/mean@1"


def _sweep(tmp_path, confirm, objectives=None, seed_trials=None):
    fields = {"budget": {"confirm": confirm}}
    if objectives:
        fields["objective"] = objectives
    if seed_trials:
        fields["seed_trials"] = seed_trials
    return load_sweep(sweep_file(tmp_path, **fields))


def _frame(rows):
    """Trials table rows: (number, state, health, value, confirm_of, data.seed)."""
    return pd.DataFrame(rows, columns=["number", "state", "health", f"value/{VAL}", "confirm_of", "config/data.seed"])


SEARCH = [(0, "COMPLETE", "healthy", 0.50, None, 0), (1, "COMPLETE", "healthy", 0.70, None, 0),
          (2, "COMPLETE", "stopped", 0.90, None, 0), (3, "PRUNED", "stopped", None, None, 0),
          (4, "COMPLETE", "healthy", 0.60, None, 0), (5, "COMPLETE", "healthy", 0.70, None, 0)]


def test_leaders_are_the_best_healthy_search_trials_and_the_preset_joins_them(tmp_path):
    sweep = _sweep(tmp_path, {"top": 2, "seeds": 2}, seed_trials=[{"kl_coef": 0.001}])
    df = _frame(SEARCH)
    # trial 2 scores best but a health rule stopped it; 1 and 5 tie at 0.70: the lower number first
    assert leaders(sweep, df, 2) == [1, 5]
    # the seed preset (trial 0, healthy) joins the two leaders; seeds are the sweep's seed 0 + 1, + 2
    assert planned(sweep, df) == [(1, 1), (1, 2), (5, 1), (5, 2), (0, 1), (0, 2)]
    # a confirmation run is never a leader, whatever its value
    df = pd.concat([df, _frame([(6, "COMPLETE", "healthy", 0.99, 4, 1)])], ignore_index=True)
    assert leaders(sweep, df, 3) == [1, 5, 4]
    no_preset = _sweep(tmp_path, {"top": 2, "seeds": 1, "preset": False}, seed_trials=[{"kl_coef": 0.001}])
    assert planned(no_preset, df) == [(1, 1), (5, 1)]
    assert planned(_sweep(tmp_path, None), df) == []


def test_leaders_of_a_pareto_sweep_are_the_front_first(tmp_path):
    kl = "actor/reward_kl_penalty"
    sweep = _sweep(tmp_path, {"top": 3, "seeds": 1}, objectives=[{"metric": VAL, "mode": "max"},
                                                                  {"metric": kl, "mode": "min"}])
    df = _frame(SEARCH).assign(**{f"value/{kl}": [0.1, 0.5, 0.0, None, 0.05, 0.2]})
    # feasible: 0 (0.5, 0.1), 1 (0.7, 0.5), 4 (0.6, 0.05), 5 (0.7, 0.2); 5 dominates 1, 4 dominates 0
    # front = {4, 5}, by accuracy 5 then 4; then the rest by accuracy: 1
    assert leaders(sweep, df, 3) == [5, 4, 1]


def test_ranking_by_mean_over_seeds_by_hand(tmp_path):
    sweep = _sweep(tmp_path, {"top": 2, "seeds": 2}, seed_trials=[{"kl_coef": 0.001}])
    df = _frame(SEARCH + [
        (6, "COMPLETE", "healthy", 0.60, 1, 1), (7, "COMPLETE", "healthy", 0.65, 1, 2),
        (8, "COMPLETE", "healthy", 0.72, 5, 1), (9, "COMPLETE", "healthy", 0.68, 5, 2),
        (10, "COMPLETE", "healthy", 0.52, 0, 1), (11, "PRUNED", "stopped", None, 0, 2),
    ])
    table = ranking(sweep, df).set_index("trial")
    assert list(table.index) == [5, 1, 0]  # 0 had a run stopped: ranked after those whose runs all ended healthy
    # trial 5: 0.70, 0.72, 0.68 -> mean 0.70, sd 0.02; trial 1: 0.70, 0.60, 0.65 -> mean 0.65, sd 0.05
    assert table.loc[5, f"mean/{VAL}"] == pytest.approx(0.70)
    assert table.loc[5, "sd"] == pytest.approx(0.02)
    assert table.loc[1, "sd"] == pytest.approx(0.05)
    assert (table.loc[1, "min"], table.loc[1, "max"]) == (0.60, 0.70)
    assert table.loc[5, "seeds"] == [0, 1, 2] and table.loc[0, "seeds"] == [0, 1]
    assert (table.loc[0, "runs"], table.loc[0, "finished"], table.loc[0, "ok"]) == (3, 3, 2)
    assert run_counts(sweep, df) == (6, 6)
    # 5 against 1: gap 0.05, 2 SE = 2 sqrt(0.02²/3 + 0.05²/3) = 0.0622 -> within noise
    rows = ranking(sweep, df)
    within, gap, bound = within_noise(rows.iloc[0], rows.iloc[1], math.nan, VAL)
    assert within and gap == pytest.approx(0.05) and bound == pytest.approx(2 * math.sqrt((0.02**2 + 0.05**2) / 3))
    lines = verdicts(sweep, rows)
    assert lines[0] == f"by mean over seeds, trial 5 leads: {VAL} mean 0.7 ± 0.02 sd over 3 seeds [0.68, 0.72]"
    assert lines[1].startswith("the runner-up, trial 1: within noise (gap 0.05 ≤ 2 SE = 0.06")
    # the preset: 0.50, 0.52 -> mean 0.51, sd 0.01414; gap 0.19 > 2 sqrt(0.02²/3 + 0.0002/2) = 0.0306
    preset_bound = 2 * math.sqrt(0.02**2 / 3 + 0.0002 / 2)
    assert lines[2] == f"the seed preset (trial 0): behind by 0.19 (> 2 SE = {preset_bound:.4g})"
    assert lines[3].startswith("trial 0: 1 of 3 runs stopped by a health rule or failed")


def test_a_preset_that_did_not_end_healthy_is_not_re_run_and_the_summary_says_why(tmp_path):
    sweep = _sweep(tmp_path, {"top": 2, "seeds": 1}, seed_trials=[{"kl_coef": 0.001}])
    search = _frame(SEARCH)
    search.loc[0, ["state", "health", f"value/{VAL}"]] = ["PRUNED", "stopped", None]
    assert planned(sweep, search) == [(1, 1), (5, 1)]
    df = pd.concat([search, _frame([(6, "COMPLETE", "healthy", 0.6, 1, 1), (7, "COMPLETE", "healthy", 0.7, 5, 1)])],
                   ignore_index=True)
    lines = verdicts(sweep, ranking(sweep, df), df)
    assert lines[-1] == "the seed preset (trial 0) was not re-run: it did not end healthy (PRUNED, health stopped)"


def test_a_mean_of_one_run_takes_the_pooled_sd(tmp_path):
    a = pd.Series({f"mean/{VAL}": 0.7, "sd": 0.03, "ok": 3})
    b = pd.Series({f"mean/{VAL}": 0.6, "sd": math.nan, "ok": 1})
    within, gap, bound = within_noise(a, b, 0.04, VAL)
    assert bound == pytest.approx(2 * math.sqrt(0.03**2 / 3 + 0.04**2)) and within is False
    assert within_noise(b, b, math.nan, VAL)[0] is None  # nothing to estimate the noise from


def test_a_resume_with_every_run_held_says_there_is_nothing_to_run(tmp_path):
    sweep = _sweep(tmp_path, {"top": 2, "seeds": 2}, seed_trials=[{"kl_coef": 0.001}])
    # leaders 1 and 5 and the seed preset 0, each with seeds 1 and 2 (planned's order)
    reruns = [(6 + k, "COMPLETE", "healthy", 0.6, of, seed) for k, (of, seed) in
              enumerate([(1, 1), (1, 2), (5, 1), (5, 2), (0, 1), (0, 2)])]
    df = _frame(SEARCH + reruns)
    assert nothing_to_run(sweep, df) == ("nothing to run: the top 2 and the seed preset (trial 0) are already "
                                         "confirmed with 2 seeds")
    assert nothing_to_run(sweep, _frame(SEARCH + reruns[:-1])) is None  # (0, 2) still to run
    one = _sweep(tmp_path, {"top": 1, "seeds": 1, "preset": False})
    assert nothing_to_run(one, _frame(SEARCH + reruns[:1])) == ("nothing to run: the top 1 are already confirmed "
                                                                "with 1 seed")
    assert nothing_to_run(_sweep(tmp_path, None), df) is None


def test_a_runner_up_that_is_the_seed_preset_is_said_once(tmp_path):
    sweep = _sweep(tmp_path, {"top": 1, "seeds": 2}, seed_trials=[{"kl_coef": 0.001}])
    df = pd.concat([_frame(SEARCH[:2]), _frame([(2, "COMPLETE", "healthy", 0.68, 1, 1),
                                                 (3, "COMPLETE", "healthy", 0.72, 1, 2),
                                                 (4, "COMPLETE", "healthy", 0.52, 0, 1),
                                                 (5, "COMPLETE", "healthy", 0.48, 0, 2)])], ignore_index=True)
    # trial 1: 0.70, 0.68, 0.72 -> mean 0.70, sd 0.02; the preset: 0.50, 0.52, 0.48 -> mean 0.50, sd 0.02
    # gap 0.2 > 2 sqrt(0.02²/3 + 0.02²/3) = 0.03266
    lines = verdicts(sweep, ranking(sweep, df), df)
    bound = 2 * math.sqrt(0.0008 / 3)
    assert lines == [f"by mean over seeds, trial 1 leads: {VAL} mean 0.7 ± 0.02 sd over 3 seeds [0.68, 0.72]",
                     f"the runner-up, trial 0 (the seed preset): behind by 0.2 (> 2 SE = {bound:.4g})"]


def test_status_counts_running_confirmation_runs_and_leaves_confirms_blank_on_search_trials(tmp_path):
    """A driver killed in the confirmation phase leaves runs RUNNING: the header counts them beside the search
    trials, and the confirms column is empty (not <NA>) on a search trial."""
    import io

    from rich.console import Console

    from klsweep.analysis.status import trials_table
    from klsweep.analysis.summary import counts_line

    sweep = _sweep(tmp_path, {"top": 1, "seeds": 2}, seed_trials=[{"kl_coef": 0.001}])
    df = pd.concat([_frame(SEARCH[:2]), _frame([(2, "COMPLETE", "healthy", 0.68, 1, 1), (3, "RUNNING", "", None, 1, 2),
                                                 (4, "RUNNING", "", None, 0, 1)])], ignore_index=True)
    df["confirm_of"] = df["confirm_of"].astype("Int64")  # as analysis.load types it: <NA> on search trials
    # planned: trial 1 and the preset (trial 0), seeds 1 and 2 each: 4 runs, of which 1 finished and 2 run
    assert counts_line(sweep, df) == ("tiny: search 2 finished, 0 running (or interrupted), 1 not started (budget 3 "
                                      "trials × 4 steps); confirmation: 1 of 4 runs finished, 2 running (or "
                                      "interrupted)")
    wide = Console(file=io.StringIO(), width=400)
    wide.print(trials_table(sweep, df))
    rows = [[c.strip() for c in line.split("│")] for line in wide.file.getvalue().splitlines()[2:]]
    assert [row[:4] for row in rows] == [["0", "COMPLETE", "", "0"], ["1", "COMPLETE", "", "0"],
                                         ["2", "COMPLETE", "1", "1"], ["3", "RUNNING", "1", "2"],
                                         ["4", "RUNNING", "0", "1"]]
