"""The embedded trainer refuses a value of another type than verl's default for its key, in one line, before it
builds anything: ``settings_from_overrides`` and ``python -m klsweep.trainers.embedded``."""

from __future__ import annotations

import pytest

from klsweep.errors import OverrideError
from klsweep.trainers.embedded.__main__ import main
from klsweep.trainers.embedded.config import settings_from_overrides

ADAPTIVE = {"algorithm.use_kl_in_reward": True, "algorithm.kl_ctrl.type": "adaptive"}
HORIZON = ("algorithm.kl_ctrl.horizon='abc' is not a number but verl computes with it (its default is 10000), so "
           "every trial would fail when verl reads it: write a number without quotes, e.g. 10000")


def test_settings_refuse_a_word_for_a_number_and_true_for_a_float():
    with pytest.raises(OverrideError) as e:
        settings_from_overrides({**ADAPTIVE, "algorithm.kl_ctrl.horizon": "abc", "algorithm.kl_ctrl.target_kl": True})
    assert e.value.problems == [HORIZON, (
        "algorithm.kl_ctrl.target_kl=True is not a number but verl computes with it (its default is 0.1), so every "
        "trial would fail when verl reads it: write a number, not true/false, e.g. 0.1")]


def test_settings_take_an_int_for_a_float_and_a_float_where_verls_yaml_writes_a_whole_number():
    s = settings_from_overrides({**ADAPTIVE, "algorithm.kl_ctrl.kl_coef": 1,
                                 "actor_rollout_ref.actor.entropy_coeff": 0.01})
    assert (s.kl_ctrl.kl_coef, s.actor.entropy_coeff) == (1, 0.01)


def test_the_command_refuses_it_in_one_line_with_exit_2(capsys):
    assert main(["algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive",
                 "algorithm.kl_ctrl.horizon=abc"]) == 2
    out = capsys.readouterr()
    assert out.err.splitlines() == [f"error: {HORIZON}"]
