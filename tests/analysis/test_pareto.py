"""Pareto fronts, hypervolume and KL comparability on tables whose answers are worked out by hand."""

from __future__ import annotations

import warnings

import pandas as pd
import pytest

from klsweep.analysis.pareto import (
    EmptyFrontWarning,
    KlScaleWarning,
    hypervolume,
    kl_scale,
    least_infeasible,
    pareto_front,
)
from klsweep.errors import ResultsError

KL_TYPE = "config/actor_rollout_ref.actor.kl_loss_type"
AGG = "config/actor_rollout_ref.actor.loss_agg_mode"


def table(rows):
    """rows: (number, state, health, steps, score, kl)."""
    df = pd.DataFrame(rows, columns=["number", "state", "health", "steps", "value/score", "value/kl"])
    df["config/actor_rollout_ref.actor.use_kl_loss"] = True
    df["kl_metric"] = "actor/kl_loss"
    return df


# score (max) and kl (min). By hand:
#   0: (0.8, 0.20) front: nothing has score >= 0.8 with kl <= 0.2 except itself
#   1: (0.5, 0.10) front: the only kl <= 0.10 point with score >= 0.5
#   2: (0.4, 0.15) dominated by 1 (0.5 > 0.4, 0.10 < 0.15)
#   3: (0.8, 0.20) duplicate of 0: also on the front (Optuna keeps duplicates)
#   4: (0.9, 0.05) would dominate everything but health stopped -> infeasible
#   5: (0.3, 0.01) front: lowest kl among feasible
#   6: PRUNED, no values -> infeasible
#   7: (0.7, 0.30) dominated by 0
#   8: (nan, 0.01) COMPLETE but a missing objective -> not on the front
HAND = table([
    (0, "COMPLETE", "healthy", 10, 0.8, 0.20),
    (1, "COMPLETE", "warned", 10, 0.5, 0.10),
    (2, "COMPLETE", "healthy", 10, 0.4, 0.15),
    (3, "COMPLETE", "healthy", 10, 0.8, 0.20),
    (4, "COMPLETE", "stopped", 6, 0.9, 0.05),
    (5, "COMPLETE", "healthy", 10, 0.3, 0.01),
    (6, "PRUNED", "stopped", 3, None, None),
    (7, "COMPLETE", "healthy", 10, 0.7, 0.30),
    (8, "COMPLETE", "healthy", 10, None, 0.01),
])


def test_front_of_hand_built_table():
    front = pareto_front(HAND, [("score", "max"), ("kl", "min")])
    assert list(front["number"]) == [0, 1, 3, 5]
    assert front.attrs["feasible"] is True
    assert front.attrs["objectives"] == [("value/score", "max"), ("value/kl", "min")]


def test_front_accepts_a_dict_and_columns_and_three_objectives():
    df = HAND.assign(**{"value/steps_used": HAND["steps"]})
    # adding "steps_used" (min) to the two objectives: all steps are 10 among feasible, so the front is unchanged
    front = pareto_front(df, {"value/score": "max", "kl": "min", "steps_used": "min"})
    assert list(front["number"]) == [0, 1, 3, 5]
    # maximising kl instead: by hand, 0/3 (0.8, 0.20) and 7 (0.7, 0.30) are non-dominated among feasible
    assert list(pareto_front(df, [("score", "max"), ("kl", "max")])["number"]) == [0, 3, 7]
    # a single objective: the best score (0.8, twice)
    assert list(pareto_front(df, [("score", "max")])["number"]) == [0, 3]


def test_hypervolume_by_hand():
    # feasible front in (score max, kl min) vs reference (0, 1): trials 0/3 (0.8, 0.2), 1 (0.5, 0.1), 5 (0.3, 0.01).
    # Union of the boxes [0, s] x [k, 1]: sweep by score:  score 0.5..0.8 covers kl 0.2..1 -> 0.3 * 0.8 = 0.24;
    # score 0.3..0.5 covers kl 0.1..1 -> 0.2 * 0.9 = 0.18; score 0..0.3 covers kl 0.01..1 -> 0.3 * 0.99 = 0.297.
    expected = 0.24 + 0.18 + 0.297
    assert hypervolume(HAND, [("score", "max"), ("kl", "min")], [0.0, 1.0]) == pytest.approx(expected)
    # a reference point no trial beats gives 0
    assert hypervolume(HAND, [("score", "max"), ("kl", "min")], [0.9, 0.0]) == 0.0
    with pytest.raises(ResultsError, match="reference_point has 1 values but there are 2 objectives"):
        hypervolume(HAND, [("score", "max"), ("kl", "min")], [0.0])


def test_all_infeasible_says_so_and_ranks_the_least_infeasible():
    """Every trial infeasible (optuna#6445) -> an empty front, a warning, and the trials that came closest."""
    df = table([
        (0, "FAIL", "healthy", 2, None, None),
        (1, "COMPLETE", "stopped", 7, 0.6, 0.4),
        (2, "PRUNED", "stopped", 7, None, None),
        (3, "COMPLETE", "stopped", 4, 0.9, 0.2),
    ])
    with pytest.warns(EmptyFrontWarning, match="no feasible trial: all 4 trials"):
        front = pareto_front(df, [("score", "max"), ("kl", "min")])
    assert front.empty and front.attrs["feasible"] is False
    # most steps first (1 and 2: 7 steps; COMPLETE before PRUNED), then 3 (4 steps), then 0 (2 steps)
    assert front.attrs["least_infeasible"] == [1, 2, 3, 0]
    assert list(least_infeasible(df)["infeasible_rank"]) == [1, 2, 3, 4]


def test_a_confirmation_rerun_is_no_point_of_the_front():
    """With budget.confirm, pareto_front(load(dir)) (the README's recipe, and the notebook's chosen point) put a lucky
    seed's re-run on the front and dropped the search trial it re-ran, which `sweep status` showed as the front."""
    df = table([(0, "COMPLETE", "healthy", 10, 0.6, 0.10), (1, "COMPLETE", "healthy", 10, 0.5, 0.05),
                (2, "COMPLETE", "healthy", 10, 0.7, 0.09)])  # trial 2: a re-run of trial 0 with another seed
    df["confirm_of"] = pd.array([None, None, 0], dtype="Int64")
    assert list(pareto_front(df, [("score", "max"), ("kl", "min")])["number"]) == [0, 1]


def test_an_empty_front_of_remedied_trials_says_what_they_are():
    """Trials remedied to the end are PRUNED restart schedules, not health stops: the note said every trial was
    stopped by a health rule although both had run all their steps."""
    from klsweep.results import REMEDIED

    df = table([(0, "PRUNED", "warned", 60, None, None), (1, "PRUNED", "warned", 60, None, None)])
    df["stop_reason"] = f"{REMEDIED} 2x: kl_runaway@47"
    with pytest.warns(EmptyFrontWarning) as said:
        pareto_front(df, [("score", "max"), ("kl", "min")])
    assert str(said[0].message).startswith("no feasible trial: all 2 trials ran to the end as remedied restart "
                                           "schedules, not one setting each; the Pareto front is empty")
    df.loc[1, ["state", "health", "stop_reason"]] = ["PRUNED", "stopped", "kl_runaway"]
    with pytest.warns(EmptyFrontWarning) as said:
        pareto_front(df, [("score", "max"), ("kl", "min")])
    assert str(said[0].message).startswith("no feasible trial: 1 of the 2 trials ran to the end as remedied restart "
                                           "schedules, not one setting each; the others were stopped by a health rule")


def test_unknown_objective_names_the_columns():
    with pytest.raises(ResultsError, match=r"objective 'reward' is not in the trials table.*value/kl, value/score"):
        pareto_front(HAND, [("reward", "max")])
    with pytest.raises(ResultsError, match="mode 'maximize'"):
        pareto_front(HAND, [("score", "maximize")])


def test_kl_scales_mixed_on_the_front_warn_and_synonyms_do_not():
    df = HAND.assign(**{KL_TYPE: "low_var_kl", AGG: "token-mean"})
    df.loc[df["number"] == 1, KL_TYPE] = "k3+"  # same forward value as low_var_kl (verl core_algos.kl_penalty)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        front = pareto_front(df, [("score", "max"), ("kl", "min")])
    assert front.attrs["kl_scale"] == ["actor/kl_loss (low_var_kl, token-mean)"]

    df.loc[df["number"] == 5, AGG] = "seq-mean-token-sum-norm"  # DrGRPO aggregation: another scale
    with pytest.warns(KlScaleWarning, match="the front mixes KL scales"):
        front = pareto_front(df, [("score", "max"), ("kl", "min")])
    assert front.attrs["kl_scale"] == ["actor/kl_loss (low_var_kl, seq-mean-token-sum-norm)",
                                       "actor/kl_loss (low_var_kl, token-mean)"]


def test_trials_ranked_against_kl_on_another_scale_warn_even_when_the_front_holds_one_scale():
    """grpo_kl searches loss_agg_mode: a seq-mean-token-sum trial's KL is a sum over the sequence's tokens (267 where
    token-mean trials log 0.01). It is dominated, so the front holds token-mean trials only.
    The ranking still compares unlike KLs, so the note names each scale and how many trials it has."""
    df = HAND.assign(**{KL_TYPE: "low_var_kl", AGG: "token-mean"})
    df.loc[df["number"] == 7, AGG] = "seq-mean-token-sum"  # dominated by trial 0 (hand table above)
    with pytest.warns(KlScaleWarning) as caught:
        front = pareto_front(df, [("score", "max"), ("kl", "min")])
    assert front.attrs["kl_scale"] == ["actor/kl_loss (low_var_kl, token-mean)"] and 7 not in set(front["number"])
    assert str(caught[0].message).startswith(
        "the trials compared mix KL scales (actor/kl_loss (low_var_kl, seq-mean-token-sum): 1 trial; actor/kl_loss "
        "(low_var_kl, token-mean): 5 trials): the front holds only actor/kl_loss (low_var_kl, token-mean)")
    assert front.attrs["notes"] == [str(caught[0].message)]


def test_kl_scale_of_kl_in_reward_and_defaults():
    df = pd.DataFrame({"config/algorithm.use_kl_in_reward": [True, False],
                       "config/algorithm.kl_penalty": ["k1", None],
                       "kl_metric": ["actor/reward_kl_penalty", "actor/kl_loss"]})
    # verl 0.9.1 defaults: kl_loss_type low_var_kl, loss_agg_mode token-mean
    assert list(kl_scale(df)) == ["actor/reward_kl_penalty (kl, per-sequence token mean)",
                                  "actor/kl_loss (low_var_kl, token-mean)"]
