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


@pytest.mark.parametrize(("overrides", "message"), [
    ({"trainer.total_training_steps": "abc"},
     "trainer.total_training_steps='abc' is not an integer, but the embedded trainer counts with it: write a whole "
     "number without quotes, e.g. 100"),
    ({"data.seed": None},
     "data.seed=null is not an integer, but the embedded trainer counts with it: write a whole number, e.g. 1"),
    ({"trainer.test_freq": 1.5},
     "trainer.test_freq=1.5 is not an integer, but the embedded trainer counts with it: write a whole number, e.g. 10"),
    ({"actor_rollout_ref.actor.optim.betas": "abc"},
     "actor_rollout_ref.actor.optim.betas='abc' is not a pair of numbers, but the embedded trainer reads Adam's two "
     "betas from it: write a list of two numbers, e.g. [0.9, 0.999]"),
    ({**ADAPTIVE, "algorithm.kl_ctrl.horizon": None},
     "algorithm.kl_ctrl.horizon=null is not a number, but the embedded trainer computes with it: write a number"),
])
def test_settings_refuse_a_value_that_is_not_the_number_the_trainer_reads(overrides, message):
    with pytest.raises(OverrideError) as e:
        settings_from_overrides(overrides)
    assert str(e.value) == message


def test_settings_take_a_whole_float_or_a_numeric_string_for_an_int():
    s = settings_from_overrides({"data.seed": "7", "trainer.total_training_steps": 3.0})
    assert (s.seed, s.total_training_steps) == (7, 3)
    assert isinstance(s.total_training_steps, int)


@pytest.mark.parametrize(("argv", "line"), [
    (["trainer.total_training_steps=abc"],
     "error: trainer.total_training_steps='abc' is not an integer, but the embedded trainer counts with it: write a "
     "whole number without quotes, e.g. 100"),
    (["data.seed=x", "trainer.total_training_steps=2"],
     "error: data.seed='x' is not an integer, but the embedded trainer counts with it: write a whole number without "
     "quotes, e.g. 1"),
    (["trainer.save_freq=null", "trainer.total_training_steps=2"],
     "error: trainer.save_freq=null is not an integer, but the embedded trainer counts with it: write a whole number"),
])
def test_the_command_refuses_a_word_for_an_int_in_one_line_with_exit_2(capsys, argv, line):
    assert main(argv) == 2
    assert capsys.readouterr().err.splitlines() == [line]
