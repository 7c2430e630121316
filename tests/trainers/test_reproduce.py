"""The reproduce commands of a remedied trial are its schedule: one verl command per segment (issue 17)."""

from __future__ import annotations

import json
import shlex

import pytest

from klsweep.trainers import remedy_schedule, reproduce_commands, reproduce_lines

KL = "algorithm.kl_ctrl.kl_coef"
LR = "actor_rollout_ref.actor.optim.lr"
PROPOSED = {"algorithm.use_kl_in_reward": True, KL: 0.001, LR: 1e-6, "trainer.save_freq": 4}
#: two restarts: the first (at step 47, from 32) changes two knobs, the second (at 60, from 52) one
SCHEDULE = [
    {"restart": 1, "step": 47, "rule": "kl_runaway", "from_step": 32, "key": KL, "old": 0.002, "new": 0.003},
    {"restart": 1, "step": 47, "rule": "kl_runaway", "from_step": 32, "key": LR, "old": 1e-6, "new": 5e-7},
    {"restart": 2, "step": 60, "rule": "kl_runaway", "from_step": 52, "key": KL, "old": 0.004, "new": 0.006},
]


def args_of(command: str) -> dict[str, str]:
    """``python3 -m module k=v ...`` → ``{"module": ..., k: v}`` as the shell splits it."""
    words = shlex.split(command)
    return {"module": words[2], **dict(w.split("=", 1) for w in words[3:])}


def test_a_remedied_verl_trial_reruns_as_one_command_per_segment():
    pairs = reproduce_commands("verl", PROPOSED, json.dumps(SCHEDULE))  # as trials.csv holds it
    assert [label for label, _ in pairs] == [
        "segment 1 of 3 (steps 1-47, where kl_runaway fired; saves the checkpoint of step 32):",
        f"segment 2 of 3 (steps 33-60, where kl_runaway fired; resumes from step 32 with {KL}=0.003, {LR}=5e-07; "
        "saves the checkpoint of step 52):",
        f"segment 3 of 3 (steps 53 to the end; resumes from step 52 with {KL}=0.006):",
    ]
    first, second, third = (args_of(command) for _, command in pairs)
    assert first == {"module": "verl.trainer.main_ppo", "algorithm.use_kl_in_reward": "true", KL: "0.001",
                     LR: "1e-06", "trainer.save_freq": "4"}
    # each later segment: the knobs changed so far, resumed from the previous segment's checkpoint of that step
    assert (second[KL], second[LR], second["trainer.resume_mode"]) == ("0.003", "5e-07", "resume_path")
    assert second["trainer.resume_from_path"] == "'${trainer.default_local_dir}/global_step_32'"
    assert (third[KL], third[LR]) == ("0.006", "5e-07")  # the lr of restart 1 is kept
    assert {first["trainer.save_freq"], second["trainer.save_freq"]} == {"4"}  # 4 saves steps 32 and 52 already
    assert third["trainer.resume_from_path"] == "'${trainer.default_local_dir}/global_step_52'"
    # lines: label, command per segment
    assert reproduce_lines("verl", PROPOSED, SCHEDULE) == [line for pair in pairs for line in pair]


def test_a_segment_saves_the_checkpoint_the_next_one_resumes_from():
    """Without a cadence that saves it (none set; 5 does not divide 32), a segment gets save_freq = that step."""
    for proposed, last in (({KL: 0.001}, None), ({KL: 0.001, "trainer.save_freq": 5}, "5")):
        commands = [args_of(c) for _, c in reproduce_commands("verl", proposed, SCHEDULE)]
        assert [c.get("trainer.save_freq") for c in commands] == ["32", "52", last]  # the last segment: its own


def test_the_embedded_trainer_resumes_on_verl_only_and_an_unremedied_trial_is_one_run():
    pairs = reproduce_commands("embedded", PROPOSED, SCHEDULE)
    modules = [(label.split(" (")[0], args_of(command)["module"]) for label, command in pairs]
    # segment 1 on both, then verl's commands only: the embedded command line does not resume
    assert modules == [("segment 1 of 3", "klsweep.trainers.embedded"), ("segment 1 of 3", "verl.trainer.main_ppo"),
                       ("segment 2 of 3", "verl.trainer.main_ppo"), ("segment 3 of 3", "verl.trainer.main_ppo")]
    for empty in (None, "", float("nan"), []):
        assert reproduce_commands("verl", PROPOSED, empty) == [
            ("", "python3 -m verl.trainer.main_ppo algorithm.use_kl_in_reward=true "
                 "algorithm.kl_ctrl.kl_coef=0.001 actor_rollout_ref.actor.optim.lr=1e-06 trainer.save_freq=4")]
    with pytest.raises(ValueError, match="not a JSON list"):
        remedy_schedule('{"restart": 1}')
