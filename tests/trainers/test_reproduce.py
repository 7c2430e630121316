"""The reproduce commands of a remedied trial are its schedule: per segment the commands of an unremedied trial, each
resuming from the checkpoint the restart went back to; the embedded ones run and resume."""

from __future__ import annotations

import json
import shlex

import pytest

from klsweep.results import remedy_records
from klsweep.trainers import reproduce_commands, reproduce_lines

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
        "segment 1 of 3: steps 1-47 (kl_runaway fired at step 47), saving the checkpoint of step 32 that segment 2 "
        "starts from:",
        f"segment 2 of 3: steps 33-60 (kl_runaway fired at step 60) from the checkpoint of step 32 with {KL}=0.003, "
        f"{LR}=5e-07, saving the checkpoint of step 52 that segment 3 starts from:",
        f"segment 3 of 3: steps 53 to the end from the checkpoint of step 52 with {KL}=0.006:",
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


def test_every_segment_of_an_embedded_trial_has_both_commands_and_an_unremedied_trial_is_one_run():
    pairs = reproduce_commands("embedded", PROPOSED, SCHEDULE)
    modules = [(label.split(":")[0], args_of(command)["module"]) for label, command in pairs]
    assert modules == [(f"segment {i} of 3", module) for i in (1, 2, 3)
                       for module in ("klsweep.trainers.embedded", "verl.trainer.main_ppo")]
    embedded = [args_of(command) for _, command in pairs[::2]]
    assert [c.get("trainer.resume_from_path") for c in embedded] == [
        None, "'${trainer.default_local_dir}/global_step_32'", "'${trainer.default_local_dir}/global_step_52'"]
    for empty in (None, "", float("nan"), []):
        assert reproduce_commands("verl", PROPOSED, empty) == [
            ("", "python3 -m verl.trainer.main_ppo algorithm.use_kl_in_reward=true "
                 "algorithm.kl_ctrl.kl_coef=0.001 actor_rollout_ref.actor.optim.lr=1e-06 trainer.save_freq=4")]
    with pytest.raises(ValueError, match="not a JSON list"):
        remedy_records('{"restart": 1}')


def test_a_restart_back_to_an_earlier_segments_step_is_saved_by_that_segment():
    """remedy4 of a new user's run: the second restart went back to step 32 again, the checkpoint segment 1 saved
    (segment 2 started from it); another case goes back to 28, before segment 2's first step 33."""
    same = [{"restart": 1, "step": 46, "rule": "kl_runaway", "from_step": 32, "key": KL, "old": 0.0024, "new": 0.0095},
            {"restart": 2, "step": 46, "rule": "kl_runaway", "from_step": 32, "key": KL, "old": 0.0101, "new": 0.0404}]
    pairs = reproduce_commands("verl", {KL: 0.0016}, same)
    assert [label for label, _ in pairs] == [
        "segment 1 of 3: steps 1-46 (kl_runaway fired at step 46), saving the checkpoint of step 32 that segments 2 "
        "and 3 start from:",
        f"segment 2 of 3: steps 33-46 (kl_runaway fired at step 46) from the checkpoint of step 32 with {KL}=0.0095:",
        f"segment 3 of 3: steps 33 to the end from the checkpoint of step 32 with {KL}=0.0404:",
    ]
    assert [args_of(c).get("trainer.save_freq") for _, c in pairs] == ["32", None, None]
    earlier = [same[0], {**same[1], "from_step": 28}]
    pairs = reproduce_commands("verl", {KL: 0.0016}, earlier)
    assert pairs[0][0].endswith("saving the checkpoints of steps 28 and 32 that segments 2 and 3 start from:")
    assert [args_of(c).get("trainer.save_freq") for _, c in pairs] == ["4", None, None]  # gcd(28, 32): saves both
    assert args_of(pairs[2][1])["trainer.resume_from_path"] == "'${trainer.default_local_dir}/global_step_28'"


def test_the_embedded_segments_run_and_the_second_resumes_where_the_first_saved(tmp_path, monkeypatch, capsys):
    """Segment 1's embedded command saves step 3; segment 2's continues from it at step 4 with the remedied
    coefficient: its step 4 equals an EmbeddedTrainer loaded from that checkpoint with the coefficient set."""
    from klsweep.trainers.embedded import EmbeddedTrainer
    from klsweep.trainers.embedded.__main__ import main

    monkeypatch.chdir(tmp_path)  # verl's default_local_dir is relative: checkpoints/<project>/<experiment>
    proposed = {"algorithm.adv_estimator": "gae", "algorithm.use_kl_in_reward": True, "algorithm.kl_ctrl.type":
                "adaptive", KL: 0.001, "trainer.total_training_steps": 6, "trainer.test_freq": 0,
                "trainer.val_before_train": False, "data.train_batch_size": 4, "actor_rollout_ref.rollout.n": 2}
    schedule = [{"restart": 1, "step": 5, "rule": "kl_runaway", "from_step": 3, "key": KL, "old": 0.001, "new": 0.5}]
    first, second = [shlex.split(c)[3:] for label, c in reproduce_commands("embedded", proposed, schedule)
                     if "klsweep.trainers.embedded" in c]

    def steps() -> dict[int, dict[str, float]]:
        """The console lines printed, ``step:N - key:value - ...`` (a numpy value as its repr, np.float64(x))."""
        lines = [line.split(" - ") for line in capsys.readouterr().out.splitlines() if line.startswith("step:")]
        return {int(parts[0][5:]): {k: float(v.removeprefix("np.float64(").rstrip(")"))
                                    for k, v in (p.split(":", 1) for p in parts[1:])} for parts in lines}

    assert main(first) == 0
    unremedied = steps()
    assert sorted(unremedied) == [1, 2, 3, 4, 5, 6]
    saved = tmp_path / "checkpoints" / "verl_examples" / "gsm8k"
    assert sorted(p.name for p in saved.iterdir()) == ["global_step_3", "global_step_6",
                                                       "latest_checkpointed_iteration.txt"]
    assert main(second) == 0
    resumed = steps()
    assert sorted(resumed) == [4, 5, 6]
    by_hand = EmbeddedTrainer({**proposed, KL: 0.5})
    by_hand.load(saved / "global_step_3")
    by_hand.kl_ctrl.value = 0.5  # verl rebuilds its KL controller from the config at every start
    want = by_hand.train_step()
    assert resumed[4]["critic/rewards/mean"] == want["critic/rewards/mean"]
    assert resumed[4]["actor/reward_kl_penalty_coeff"] == want["actor/reward_kl_penalty_coeff"]
    # the prescription took: the coefficient at step 4 is the remedied 0.5's, not the unremedied run's ~0.001
    assert abs(resumed[4]["actor/reward_kl_penalty_coeff"] - 0.5) < 0.01
    assert unremedied[4]["actor/reward_kl_penalty_coeff"] < 0.01
