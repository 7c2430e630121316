"""The trainer table: one row per `trainer:` name, the declared Trainer interface, reproduce commands."""

from __future__ import annotations

import pytest

from klsweep.errors import SweepFileError
from klsweep.spec import load_sweep
from klsweep.trainers import TRAINERS, Trainer, trainer_kind
from klsweep.trainers.embedded.config import EMBEDDED_DEFAULTS, VAL_METRIC
from tests.orchestrate.conftest import sweep_file


def test_an_unknown_trainer_lists_the_valid_names():
    with pytest.raises(ValueError, match="trainer 'vllm' is not a klsweep trainer: use one of embedded, verl, replay"):
        trainer_kind("vllm")


def test_a_sweep_file_with_an_unknown_trainer_names_the_valid_ones(tmp_path):
    with pytest.raises(SweepFileError, match="trainer") as e:
        load_sweep(sweep_file(tmp_path, trainer="vllm"))
    assert all(name in str(e.value) for name in TRAINERS)


def test_in_process_trainers_implement_the_trainer_protocol(tmp_path):
    from klsweep.trainers.embedded import EmbeddedTrainer

    trainer = EmbeddedTrainer({"trainer.total_training_steps": 2})
    assert isinstance(trainer, Trainer)
    assert (trainer.global_step, trainer.total_steps) == (0, 2)
    assert TRAINERS["verl"].in_process is None  # every verl trial is a process of its own


def test_only_the_embedded_trainer_brings_defaults_and_a_known_validation_metric():
    assert TRAINERS["embedded"].validation_metric == VAL_METRIC
    assert TRAINERS["embedded"].defaults({})["actor_rollout_ref.actor.ppo_mini_batch_size"] == (
        EMBEDDED_DEFAULTS["data.train_batch_size"])
    defaults = TRAINERS["embedded"].defaults({"data.train_batch_size": 4})
    mini_batch = defaults["actor_rollout_ref.actor.ppo_mini_batch_size"]
    assert mini_batch == 4
    assert [TRAINERS[n].validation_metric for n in ("verl", "replay")] == [None, None]
    assert TRAINERS["verl"].defaults({"data.train_batch_size": 4}) == {}


def test_reproduce_commands_drop_embedded_sizes_from_the_verl_line():
    overrides = {"algorithm.kl_ctrl.kl_coef": 0.002, "data.train_batch_size": 16}
    (label, embedded), (_, verl) = TRAINERS["embedded"].reproduce(overrides)
    assert embedded == "python3 -m klsweep.trainers.embedded algorithm.kl_ctrl.kl_coef=0.002 data.train_batch_size=16"
    # verl's default batch is 1024 prompts: the embedded trainer's 16 is not a setting to carry over
    assert verl == "python3 -m verl.trainer.main_ppo algorithm.kl_ctrl.kl_coef=0.002"
    assert TRAINERS["verl"].reproduce(overrides) == [
        ("", "python3 -m verl.trainer.main_ppo algorithm.kl_ctrl.kl_coef=0.002 data.train_batch_size=16")]


def test_a_replay_trial_has_no_command_to_reproduce_it():
    assert TRAINERS["replay"].reproduce({"algorithm.kl_ctrl.kl_coef": 0.002}) == []


def test_process_mode_is_the_tables_module_and_replay_has_none(tmp_path):
    from klsweep.launchers.process import trial_command

    argv, _ = trial_command({"trainer.total_training_steps": 2}, trainer="embedded", trial_dir=tmp_path)
    assert argv[1:4] == ["-m", "klsweep.trainers.embedded", "trainer.total_training_steps=2"]
    argv, _ = trial_command({}, trainer="verl", trial_dir=tmp_path)
    assert argv[1:3] == ["-m", "verl.trainer.main_ppo"]
    assert any(a.startswith("trainer.default_local_dir=") for a in argv)  # verl's managed keys, for verl only
    embedded, _ = trial_command({}, trainer="embedded", trial_dir=tmp_path)
    assert not any(a.startswith("trainer.default_local_dir=") for a in embedded)
    with pytest.raises(ValueError, match="trainer 'replay' has no process mode; use one of: embedded, verl"):
        trial_command({}, trainer="replay", trial_dir=tmp_path)


def test_the_verl_reproduce_line_names_a_batch_size_the_trial_did_not_take_from_the_embedded_defaults():
    from klsweep.trainers import reproduce_lines
    from klsweep.trainers.embedded.config import EMBEDDED_DEFAULTS

    default = {"data.train_batch_size": EMBEDDED_DEFAULTS["data.train_batch_size"], "algorithm.kl_ctrl.horizon": 1000}
    label, command = reproduce_lines("embedded", default)[2:]
    assert label == "the same KL and algorithm settings on verl (add your model, data and batch sizes):"
    assert "data.train_batch_size" not in command and "algorithm.kl_ctrl.horizon=1000" in command
    label, _ = reproduce_lines("embedded", {**default, "data.train_batch_size": 32})[2:]
    assert label.endswith("batch sizes; this trial ran with data.train_batch_size=32):")
