"""The one rule for a trial's knobs after it loads a checkpoint: carried from the checkpoint's step, except the knobs
of the remedies restarting from exactly that step; and the embedded trainer following it after a real load."""

from __future__ import annotations

import pytest

from klsweep.results import Restart
from klsweep.trainers.restore import (
    ACTOR_LR_KEY,
    KL_COEF_KEY,
    held_knobs,
    knobs_after_load,
    restarting_from,
    restore_knobs,
)

CARRIED = {KL_COEF_KEY: 0.0031, ACTOR_LR_KEY: 1e-6}  # what the run had at the checkpoint's step
OVERRIDES = {KL_COEF_KEY: 0.012, ACTOR_LR_KEY: 5e-7, "algorithm.kl_ctrl.type": "adaptive"}  # with the remedies'
KL_AT_40 = Restart(1, 47, "kl_runaway", 40, {KL_COEF_KEY: (0.003, 0.012)})
LR_AT_40 = Restart(1, 47, "entropy_collapse", 40, {ACTOR_LR_KEY: (1e-6, 5e-7)})


def test_the_remedy_restarting_from_the_step_sets_its_knobs_and_the_rest_is_carried():
    assert knobs_after_load(40, CARRIED, OVERRIDES, [KL_AT_40]) == {KL_COEF_KEY: 0.012, ACTOR_LR_KEY: 1e-6}
    assert knobs_after_load(40, CARRIED, OVERRIDES, [LR_AT_40]) == {KL_COEF_KEY: 0.0031, ACTOR_LR_KEY: 5e-7}
    assert knobs_after_load(40, CARRIED, OVERRIDES, []) == CARRIED  # a plain retry or resume


def test_a_checkpoint_later_than_the_remedys_restart_carries_everything():
    """A Tune retry at step 48 of the run the remedy restarted at 40: the controller adapted from 40 to 48, and the
    checkpoint of 48 holds that, not the remedied initial value."""
    assert knobs_after_load(48, CARRIED, OVERRIDES, [KL_AT_40]) == CARRIED
    assert knobs_after_load(36, CARRIED, OVERRIDES, [KL_AT_40]) == CARRIED


def test_remedies_from_the_same_step_all_set_their_knobs():
    """A second restart from step 40 keeps the first one's change: the trial's config holds both."""
    lr_again = Restart(2, 45, "entropy_collapse", 40, {ACTOR_LR_KEY: (1e-6, 5e-7)})
    assert knobs_after_load(40, CARRIED, OVERRIDES, [KL_AT_40, lr_again]) == {KL_COEF_KEY: 0.012,
                                                                               ACTOR_LR_KEY: 5e-7}


def test_a_restart_from_an_earlier_step_abandons_the_one_from_the_later_step():
    """Remedy 1 restarts from 40; remedy 2, from 20, abandons that run. A checkpoint of 40 loaded later is one the
    run from 20 saved: nothing of remedy 1 applies to it, remedy 2's lr applies at 20."""
    lr_at_20 = Restart(2, 33, "entropy_collapse", 20, {ACTOR_LR_KEY: (1e-6, 5e-7)})
    assert restarting_from(40, [KL_AT_40, lr_at_20]) == []
    assert restarting_from(20, [KL_AT_40, lr_at_20]) == [lr_at_20]
    assert knobs_after_load(40, CARRIED, OVERRIDES, [KL_AT_40, lr_at_20]) == CARRIED
    assert knobs_after_load(20, CARRIED, OVERRIDES, [lr_at_20, KL_AT_40]) == {KL_COEF_KEY: 0.0031,
                                                                               ACTOR_LR_KEY: 5e-7}


def test_a_knob_without_a_value_is_left_out():
    """No KL in the reward: nothing carried for it (verl passes no coefficient, the embedded trainer has none)."""
    assert knobs_after_load(40, {ACTOR_LR_KEY: 1e-6}, {ACTOR_LR_KEY: 5e-7}, [KL_AT_40]) == {ACTOR_LR_KEY: 1e-6}
    assert knobs_after_load(40, {}, {ACTOR_LR_KEY: 5e-7}, [KL_AT_40, LR_AT_40]) == {ACTOR_LR_KEY: 5e-7}


TINY = {"trainer.total_training_steps": 4, "trainer.test_freq": 0, "data.train_batch_size": 4,
        "actor_rollout_ref.rollout.n": 2, "algorithm.adv_estimator": "grpo", "algorithm.use_kl_in_reward": True,
        "algorithm.kl_ctrl.type": "adaptive", KL_COEF_KEY: 0.002, "algorithm.kl_ctrl.target_kl": 0.03,
        "algorithm.kl_ctrl.horizon": 500, ACTOR_LR_KEY: 1e-6}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """An embedded run's checkpoints of steps 1 and 2, and the controller's value each holds."""
    from klsweep.trainers.embedded import EmbeddedTrainer

    root = tmp_path_factory.mktemp("checkpoints")
    trainer = EmbeddedTrainer(TINY)
    held = {}
    for step in (1, 2):
        trainer.train_step()
        trainer.save(root / str(step))
        held[step] = trainer.kl_ctrl.value
    assert held[1] != TINY[KL_COEF_KEY] and held[2] != held[1]  # the adaptive controller moved
    return root, held


def test_an_embedded_resume_after_the_remedys_step_keeps_the_checkpoints_controller(checkpoints):
    """Remedy kl_coef at step 1 (×5 of 0.002); a Tune retry later loads the checkpoint of step 2, saved by the
    remedied run: the controller keeps its value there. Loading the checkpoint of step 1 (the remedy's own
    restart) takes the remedied value; an lr remedy from step 2 sets the lr and keeps the controller."""
    from klsweep.trainers.embedded import EmbeddedTrainer

    root, held = checkpoints
    remedy = Restart(1, 3, "kl_runaway", 1, {KL_COEF_KEY: (0.002, 0.01)})
    remedied = {**TINY, KL_COEF_KEY: 0.01}
    later = EmbeddedTrainer(remedied)
    later.load(root / "2")
    restore_knobs(later, later.global_step, remedied, [remedy])
    assert later.global_step == 2 and later.kl_ctrl.value == held[2] != 0.01

    restart = EmbeddedTrainer(remedied)
    restart.load(root / "1")
    restore_knobs(restart, restart.global_step, remedied, [remedy])
    assert restart.kl_ctrl.value == 0.01

    lr = Restart(2, 4, "entropy_collapse", 2, {ACTOR_LR_KEY: (1e-6, 5e-7)})
    both = {**remedied, ACTOR_LR_KEY: 5e-7}
    lowered = EmbeddedTrainer(both)
    lowered.load(root / "2")
    assert held_knobs(lowered) == {KL_COEF_KEY: held[2], ACTOR_LR_KEY: 1e-6}  # AdamW's lr from the checkpoint
    restore_knobs(lowered, lowered.global_step, both, [remedy, lr])
    assert held_knobs(lowered) == {KL_COEF_KEY: held[2], ACTOR_LR_KEY: 5e-7}
