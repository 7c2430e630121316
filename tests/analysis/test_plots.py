"""Figures: the front (greyed infeasible trials, least-infeasible ranking), curves with the preset's thresholds,
importance."""

from __future__ import annotations

import optuna
import pandas as pd
import pytest

from klsweep.analysis.pareto import pareto_front
from klsweep.analysis.plots import (
    curves_figure,
    front_figure,
    front_objectives,
    importance_figure,
    knobs_figure,
)
from klsweep.analysis.sweep_dir import load, load_history, study_of, sweep_info
from klsweep.health import load_ruleset

from .conftest import trial_spec


def test_curves_mark_stops_and_draw_bands(synthetic_sweep):
    run_dir = synthetic_sweep(4)  # trial 3 stopped at step 5 by kl_blowup
    df = load(run_dir)
    fig = curves_figure(load_history(run_dir), df, load_ruleset("conservative"))
    stops = [t for t in fig.data if t.mode == "markers"]
    assert len(stops) == 3  # one ✕ per panel for the one stopped trial
    assert all(t.x == (5,) and "kl_blowup" in t.hovertext for t in stops)
    kl_lines = [s for s in fig.layout.shapes if s.type == "line" and s.yref == "y"]
    assert {s.y0 for s in kl_lines} >= {0.5}  # kl_blowup's threshold on the KL panel
    # the KL axis shows the strictest stop threshold (0.5), not the built-in 5.0 far above the data
    assert fig.layout.yaxis.range[1] == pytest.approx(0.5 + 0.08 * (0.5 - 0.0), rel=0.05)


def test_front_of_all_infeasible_sweep_shows_least_infeasible(synthetic_sweep):
    """Every trial infeasible (optuna#6445): no empty plot; the least infeasible trials are marked with their rank."""
    specs = [dict(trial_spec(i, 10), health="stopped", stop_reason="kl_blowup", steps=2 + 3 * i) for i in range(3)]
    df = load(synthetic_sweep(specs))
    with pytest.warns(UserWarning, match="no feasible trial"):
        fig = front_figure(df, [("critic/score/mean", "max"), ("actor/kl_loss", "min")],
                           front=pareto_front(df, [("critic/score/mean", "max"), ("actor/kl_loss", "min")]))
    ranked = next(t for t in fig.data if t.name == "least infeasible (rank)")
    # trial 2 ran 8 steps, trial 1 5, trial 0 2; infeasible trials are drawn at their last reported values
    assert ranked.text == ("#1", "#2", "#3")
    assert ranked.y[0] == pytest.approx(df.loc[2, "last/critic/score/mean"])
    grey = next(t for t in fig.data if t.name.startswith("infeasible"))
    assert len(grey.x) == 3 and "no feasible trial" in fig.layout.title.subtitle.text


def test_importance_needs_two_complete_trials(synthetic_sweep):
    run_dir = synthetic_sweep(6)
    objectives = [o.model_dump() for o in sweep_info(run_dir).objectives]
    fig = importance_figure(study_of(run_dir), objectives)
    # kl_loss_coef drives both metrics of the synthetic curves; Optuna must rank it first for each objective
    assert [t.name for t in fig.data] == ["critic/score/mean", "actor/kl_loss"]
    assert all(t.y[-1] == "actor_rollout_ref.actor.kl_loss_coef" for t in fig.data)
    # 6 trials, 4 COMPLETE: far from the 50 that give PED-ANOVA 5 trials in its top 10 % (Optuna's own advice)
    complete = sum(t.state == optuna.trial.TrialState.COMPLETE for t in study_of(run_dir).trials)
    assert fig.layout.title.text == f"Parameter importance (Optuna, {complete} COMPLETE trials)"
    assert fig.layout.title.subtitle.text.replace("<br>", " ") == (
        f"{complete} COMPLETE trials are too few for a stable ranking (PED-ANOVA wants 5 trials in its top 10 %: 50 "
        "trials); read it as a hint at most")

    lonely = optuna.create_study(directions=["maximize", "minimize"])
    lonely.add_trial(study_of(run_dir).trials[0])
    fig = importance_figure(lonely, objectives)
    assert not fig.data and "at least 2 COMPLETE trials; this study has 1" in fig.layout.annotations[0].text


def test_knobs_figure_has_an_axis_per_varying_knob():
    df = pd.DataFrame({"config/a.kl_loss_coef": [0.1, 0.01, 0.001], "config/a.kl_loss_type": ["kl", "k3", "kl"],
                       "config/fixed": [1, 1, 1], "value/score": [0.2, 0.5, 0.4]})
    fig = knobs_figure(df, [("score", "max")])
    labels = [d.label for d in fig.data[0].dimensions]
    assert labels == ["a.kl_loss_coef", "a.kl_loss_type", "value/score"]
    assert list(fig.data[0].dimensions[1].values) == [1, 0, 1]  # categories sorted: k3=0, kl=1


def test_single_objective_front_is_against_kl_when_every_feasible_trial_logged_one():
    df = pd.DataFrame({"number": [0, 1, 2], "state": ["COMPLETE", "COMPLETE", "PRUNED"],
                       "health": ["healthy", "healthy", "stopped"], "value/score": [0.5, 0.7, None],
                       "last/ref_kl": [0.1, 0.3, None]})
    assert front_objectives(df, [("score", "max")]) == [("value/score", "max"), ("last/ref_kl", "min")]
    # a DrGRPO trial has no reference KL: the front falls back to the objective alone, plotted by trial number
    drgrpo = df.assign(**{"last/ref_kl": [0.1, None, None]})
    assert front_objectives(drgrpo, [("score", "max")]) == [("value/score", "max")]
    fig = front_figure(drgrpo, [("score", "max")])
    assert fig.layout.xaxis.title.text == "number" and fig.layout.title.text == "Best trials: value/score (max)"
    front = next(t for t in fig.data if t.name.startswith("Pareto front"))
    assert list(front.x) == [1] and list(front.y) == [0.7]
