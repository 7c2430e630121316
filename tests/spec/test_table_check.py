"""`sweep validate` of a tabular sweep: searched categories the table did not record are errors (issue 16)."""

from __future__ import annotations

import pytest

from klsweep.errors import SweepFileError
from klsweep.spec import load_sweep
from tests.conftest import REPO

TABLE = f"tabular={{table: {REPO / 'benchmarks/tabular/grpo_kl.jsonl.gz'}}}"


def test_unrecorded_category_is_named_with_the_fix():
    with pytest.raises(SweepFileError) as e:
        load_sweep(REPO / "sweeps/grpo_kl.yaml", ["trainer=tabular", TABLE])
    [problem] = [p for p in e.value.problems if "did not record" in p]
    # grpo_kl searches 4 loss_agg_modes; the shipped table recorded token-mean only
    assert "parameters.loss_agg_mode" in problem
    assert "['seq-mean-token-mean', 'seq-mean-token-sum-norm', 'token-sum']" in problem
    assert "holds ['token-mean']" in problem
    assert "'parameters.loss_agg_mode={values: [token-mean]}'" in problem
    assert len(e.value.problems) == 1  # kl_loss_type's 5 values are all recorded


def test_the_suggested_override_validates():
    sweep = load_sweep(REPO / "sweeps/grpo_kl.yaml",
                       ["trainer=tabular", TABLE, "parameters.loss_agg_mode={values: [token-mean]}"])
    assert sweep.parameters["loss_agg_mode"].values == ["token-mean"]


def _table(name: str) -> str:
    return f"tabular={{table: {REPO / 'benchmarks/tabular' / name}}}"


def test_another_sweeps_table_is_one_problem_naming_what_it_was_recorded_for_and_the_right_table():
    with pytest.raises(SweepFileError) as e:
        load_sweep(REPO / "sweeps/grpo_kl.yaml", ["trainer=tabular", _table("aggressive.jsonl.gz")])
    [problem] = e.value.problems  # not also the categorical check, not a failure per trial at run time
    assert "tabular.table: " in problem
    assert ("aggressive.jsonl.gz was recorded for sweep 'aggressive' (sweeps/aggressive.yaml), which searches "
            "algorithm.kl_ctrl.kl_coef, algorithm.kl_ctrl.target_kl, algorithm.kl_ctrl.horizon, but this sweep "
            "searches actor_rollout_ref.actor.kl_loss_coef, actor_rollout_ref.actor.kl_loss_type, "
            "actor_rollout_ref.actor.loss_agg_mode") in problem
    assert problem.endswith("Fix: use benchmarks/tabular/grpo_kl.jsonl.gz") or problem.endswith(
        f"Fix: use {REPO / 'benchmarks/tabular/grpo_kl.jsonl.gz'}")


def test_same_keys_but_no_searched_category_recorded_names_the_fitting_table():
    # conservative and aggressive search the same three keys; aggressive's table recorded horizon 20000 only
    with pytest.raises(SweepFileError) as e:
        load_sweep(REPO / "sweeps/conservative.yaml", ["trainer=tabular", _table("aggressive.jsonl.gz")])
    [problem] = e.value.problems
    assert "none of the values this sweep searches for horizon ([500, 1000, 2500, 5000]) was recorded" in problem
    assert "(it holds [20000])" in problem
    assert problem.endswith("conservative.jsonl.gz")  # the one table of the folder that fits
    assert "aggressive.jsonl.gz or" not in problem


def test_a_live_training_setting_other_than_the_recorded_one_is_refused_and_an_inert_or_bookkeeping_one_is_not():
    narrowed = "parameters.loss_agg_mode={values: [token-mean]}"
    with pytest.raises(SweepFileError) as e:
        load_sweep(REPO / "sweeps/grpo_kl.yaml", ["trainer=tabular", _table("grpo_kl.jsonl.gz"), narrowed,
                                                 "overrides.actor_rollout_ref.actor.entropy_coeff=0.01"])
    [problem] = e.value.problems
    assert "its runs were recorded with actor_rollout_ref.actor.entropy_coeff=0 (this sweep: 0.01)" in problem
    assert "Fix: generate a table from this sweep file (benchmarks/tabular/generate.py" in problem
    # another name and fewer steps: the same recorded runs serve it (steps 1..20 of each)
    sweep = load_sweep(REPO / "sweeps/grpo_kl.yaml", ["trainer=tabular", _table("grpo_kl.jsonl.gz"), narrowed,
                                                     "name=other", "budget.max_steps=20"])
    assert sweep.name == "other" and sweep.budget.max_steps == 20
