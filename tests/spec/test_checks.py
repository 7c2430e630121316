"""The checks of a schema-valid sweep that read verl: a DrGRPO sweep whose overrides leave DrGRPO."""

from __future__ import annotations

import pytest

from klsweep.errors import SweepFileError
from klsweep.spec import load_sweep
from klsweep.verl.presets import PRESETS

A = "actor_rollout_ref.actor."


def _problems(path) -> list[str]:
    with pytest.raises(SweepFileError) as e:
        load_sweep(path)
    return e.value.problems


def test_a_drgrpo_sweep_whose_overrides_leave_drgrpo_is_refused_with_the_reason(sweep_file):
    assert PRESETS["drgrpo"][A + "loss_agg_mode"] == "seq-mean-token-sum-norm"
    path = sweep_file(f"overrides:\n  {A}loss_agg_mode: seq-mean-token-sum\n", algorithm="drgrpo")
    (problem,) = _problems(path)
    assert problem.startswith(f"{path}:5: overrides.{A}loss_agg_mode: {A}loss_agg_mode='seq-mean-token-sum' under "
                              "algorithm: drgrpo: the trials are not DrGRPO, which needs "
                              f"{A}loss_agg_mode='seq-mean-token-sum-norm'"), problem
    assert "under seq-mean-token-sum or token-sum they are per-sequence sums" in problem
    assert "actor/entropy and actor/kl_loss" in problem
    assert problem.endswith("Remove it (the drgrpo preset sets 'seq-mean-token-sum-norm'), or use algorithm: grpo to "
                            "run GRPO with these settings")
    (std,) = _problems(sweep_file("overrides:\n  algorithm.norm_adv_by_std_in_grpo: true\n", algorithm="drgrpo"))
    assert "algorithm.norm_adv_by_std_in_grpo=True under algorithm: drgrpo: the trials are not DrGRPO" in std


def test_drgrpo_own_values_and_a_comparison_that_includes_them_pass(sweep_file):
    assert load_sweep(sweep_file(f"overrides:\n  {A}loss_agg_mode: seq-mean-token-sum-norm\n", algorithm="drgrpo"))
    assert load_sweep(sweep_file("parameters:\n  loss_agg_mode: {values: [seq-mean-token-sum-norm, token-mean]}\n",
                                 algorithm="drgrpo"))
    assert load_sweep(sweep_file(f"overrides:\n  {A}loss_agg_mode: seq-mean-token-sum\n", algorithm="grpo"))
    (only_others,) = _problems(sweep_file("parameters:\n  loss_agg_mode: {values: [token-mean, token-sum]}\n",
                                          algorithm="drgrpo"))
    assert f"parameters.loss_agg_mode: loss_agg_mode ({A}loss_agg_mode) in ['token-mean', 'token-sum'] under " \
           "algorithm: drgrpo" in only_others
