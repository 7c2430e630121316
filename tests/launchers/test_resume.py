"""A verl trial that starts again continues from its own last checkpoint: checkpoint cadence,
steps reported once, and the adaptive KL coefficient carried over. The trials run the stand-in for verl's main_ppo
(``fake_trainer.py``: verl's FileLogger, checkpoint layout, resume_mode=auto and KL controllers)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from klsweep.launchers.failures import TrialFailed
from klsweep.launchers.process import attempt_dir, run_process_trial, trial_command
from klsweep.launchers.resume import (
    checkpointed_step,
    has_checkpoint,
    resume_overrides,
    rewind,
    save_freq,
)
from klsweep.results import Restart
from klsweep.trainers.restore import ACTOR_LR_KEY, KL_COEF_KEY

from .conftest import HERE, ran
from .test_process import CRASHES

NCCL = CRASHES[2][0]  # a retryable kind: the trial gets a second attempt
#: verl's adaptive controller with n_steps / horizon = 10 / 100 and a KL of 0.2 against a target of 0.1: the
#: proportional error is clipped to 0.2, so the coefficient grows ×1.02 per step (core_algos.AdaptiveKLController).
ADAPTIVE = {
    "trainer.total_training_steps": 10,
    "algorithm.use_kl_in_reward": True,
    "algorithm.kl_ctrl.type": "adaptive",
    "algorithm.kl_ctrl.kl_coef": 0.1,
    "algorithm.kl_ctrl.target_kl": 0.1,
    "algorithm.kl_ctrl.horizon": 100,
    "data.train_batch_size": 10,
    "actor_rollout_ref.rollout.n": 1,
}


def _argv(run_dir):
    return json.loads((run_dir / "spec.json").read_text())["argv"]


def _logged(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_save_freq_of_a_verl_trial(tmp_path):
    """The trial's own trainer.save_freq is kept; else the validation cadence; else a fifth of the run (verl's
    default -1 never saves, and a retry restarted at step 1)."""
    assert save_freq({"trainer.save_freq": 7, "trainer.test_freq": 5}) == 7
    assert save_freq({"trainer.save_freq": -1}) == -1
    assert save_freq({"trainer.test_freq": 5, "trainer.total_training_steps": 100}) == 5
    assert save_freq({"trainer.total_training_steps": 100}) == 20
    assert save_freq({"trainer.total_training_steps": 3}) == 1
    argv, _ = trial_command({"trainer.total_training_steps": 100}, trainer="verl", trial_dir=tmp_path)
    assert "trainer.save_freq=20" in argv
    # verl keeps every checkpoint by default (five full ones per trial at this cadence); a resume needs the latest
    assert {"trainer.max_actor_ckpt_to_keep=1", "trainer.max_critic_ckpt_to_keep=1"} <= set(argv)
    argv, _ = trial_command({"trainer.max_actor_ckpt_to_keep": 3}, trainer="verl", trial_dir=tmp_path)
    assert "trainer.max_actor_ckpt_to_keep=3" in argv and "trainer.max_actor_ckpt_to_keep=1" not in argv
    argv, _ = trial_command({"trainer.total_training_steps": 100}, trainer="embedded", trial_dir=tmp_path)
    assert not any(a.startswith("trainer.save_freq") for a in argv)  # the embedded trainer checkpoints through Tune


def test_a_retried_verl_trial_resumes_from_its_checkpoint(verl_standin, tmp_path, monkeypatch):
    """Attempt 1 checkpoints at steps 2 and 4 (save_freq = 10 // 5) and dies of NCCL after logging step 5; attempt 2
    resumes at step 5 from global_step_4 (not at step 1), and Tune sees steps 1..10 once each, in order."""
    monkeypatch.setenv("FAKE_TRAINER_STDERR", NCCL)
    seen: list[dict] = []
    overrides = {"trainer.total_training_steps": 10, "crash": "once", "crash_after_step": 5}
    run_process_trial(overrides, trainer=verl_standin, trial_dir=tmp_path, report=seen.append)

    assert [m["step"] for m in seen] == list(range(1, 11))
    first, retry = ran(tmp_path)
    assert [line["step"] for line in _logged(first)] == [1, 2, 3, 4, 5]
    assert [line["step"] for line in _logged(retry)] == [5, 6, 7, 8, 9, 10]
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("global_step_*")) == [
        "global_step_10", "global_step_2", "global_step_4", "global_step_6", "global_step_8"]
    assert (tmp_path / "checkpoints" / "latest_checkpointed_iteration.txt").read_text() == "10"


def test_adaptive_kl_coefficient_carries_over_a_resume(verl_standin, tmp_path, monkeypatch):
    """verl does not checkpoint the in-reward KL controller: run again in the same checkpoint directory, verl alone
    restarts the coefficient at algorithm.kl_ctrl.kl_coef (a jump in the curve); a klsweep retry passes the value the
    controller held at the checkpoint, and the curve goes on as if nothing happened."""
    expected = [0.1 * 1.02 ** (step - 1) for step in range(1, 11)]  # the coefficient used at steps 1..10

    # verl alone (the stand-in run twice by hand with the same default_local_dir): the jump
    standin = [sys.executable, str(HERE / "fake_trainer.py"), "trainer.save_freq=2",
               f"trainer.default_local_dir={tmp_path / 'alone'}",
               *(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in ADAPTIVE.items())]
    coefficients = []
    for n, extra in ((1, ["crash=1", "crash_after_step=5"]), (2, [])):
        run_dir = tmp_path / f"alone-{n}"
        run_dir.mkdir()
        env = {"VERL_FILE_LOGGER_PATH": str(run_dir / "metrics.jsonl"), "PATH": "/usr/bin:/bin"}
        subprocess.run(standin + extra, cwd=run_dir, env=env, check=n == 2, timeout=60)
        coefficients.append({line["step"]: line["data"]["actor/reward_kl_penalty_coeff"] for line in _logged(run_dir)})
    before, after = coefficients
    assert before == pytest.approx(dict(enumerate(expected[:5], start=1)), rel=1e-12)
    assert after[5] == 0.1 and after[6] == pytest.approx(0.102, rel=1e-12)  # restarted from kl_coef: state lost
    assert after[6] < before[5]  # the jump: a curve stitched at step 5 falls from 0.1082 to 0.102

    # a klsweep trial: carried over
    monkeypatch.setenv("FAKE_TRAINER_STDERR", NCCL)
    seen: list[dict] = []
    run_process_trial(ADAPTIVE | {"crash": "once", "crash_after_step": 5}, trainer=verl_standin,
                      trial_dir=tmp_path / "t", report=seen.append)
    assert [m["step"] for m in seen] == list(range(1, 11))
    assert [m["actor/reward_kl_penalty_coeff"] for m in seen] == pytest.approx(expected, rel=1e-12)
    def kl_coef(run_dir):
        return [float(a.split("=")[1]) for a in _argv(run_dir) if a.startswith("algorithm.kl_ctrl.kl_coef=")]

    first, retry = ran(tmp_path / "t")
    assert kl_coef(first) == [0.1]
    # logged at step 5 = the controller's value after step 4's update, the step of the checkpoint it resumed from
    assert kl_coef(retry) == [seen[4]["actor/reward_kl_penalty_coeff"]] == pytest.approx([0.1 * 1.02 ** 4], rel=1e-12)


def test_a_later_start_of_the_trial_continues_its_curve(verl_standin, tmp_path, monkeypatch):
    """A Tune retry or ``sweep resume`` runs the trial again in the same directory: it resumes from the checkpoint and
    reports only the steps the trial had not reported (Tune sees each step once), with the coefficient carried."""
    monkeypatch.setenv("FAKE_TRAINER_STDERR", "Traceback (most recent call last):\nValueError: boom")  # not retried
    first: list[dict] = []
    with pytest.raises(TrialFailed):
        run_process_trial(ADAPTIVE | {"crash": "once", "crash_after_step": 7}, trainer=verl_standin,
                          trial_dir=tmp_path, report=first.append)
    assert [m["step"] for m in first] == [1, 2, 3, 4, 5, 6, 7]
    assert resume_overrides(tmp_path, ADAPTIVE) == {"algorithm.kl_ctrl.kl_coef": pytest.approx(0.1 * 1.02 ** 6)}

    later: list[dict] = []
    run_process_trial(ADAPTIVE | {"crash": "once", "crash_after_step": 7}, trainer=verl_standin, trial_dir=tmp_path,
                      report=later.append)
    assert [m["step"] for m in later] == [8, 9, 10]
    assert [line["step"] for line in _logged(ran(tmp_path)[1])][0] == 7  # resumed from global_step_6
    assert [m["actor/reward_kl_penalty_coeff"] for m in later] == pytest.approx(
        [0.1 * 1.02 ** (s - 1) for s in (8, 9, 10)], rel=1e-12)


def test_steps_logged_but_never_received_are_reported_on_resume(verl_standin, tmp_path, monkeypatch):
    """A driver SIGKILLed after Tune received step 4 of a trial that logged steps 1-7 (verl's checkpoint: step 6).
    ``sweep resume`` restores the trial from Tune's checkpoint of step 4 (``reported_to=4``): steps 5-7 come from
    the first attempt's file as logged, then the new attempt's 8-10. Each step once, none skipped."""
    monkeypatch.setenv("FAKE_TRAINER_STDERR", "Traceback (most recent call last):\nValueError: boom")
    first: list[dict] = []
    with pytest.raises(TrialFailed):
        run_process_trial(ADAPTIVE | {"crash": "once", "crash_after_step": 7}, trainer=verl_standin,
                          trial_dir=tmp_path, report=first.append)
    assert [m["step"] for m in first] == [1, 2, 3, 4, 5, 6, 7]
    later: list[dict] = []
    run_process_trial(ADAPTIVE | {"crash": "once", "crash_after_step": 7}, trainer=verl_standin, trial_dir=tmp_path,
                      report=later.append, reported_to=4)
    assert [m["step"] for m in later] == [5, 6, 7, 8, 9, 10]
    assert later[:3] == first[4:]  # the logged steps as the first attempt logged them
    assert [line["step"] for line in _logged(ran(tmp_path)[1])][0] == 7  # verl resumed from global_step_6
    assert [m["actor/reward_kl_penalty_coeff"] for m in later] == pytest.approx(
        [0.1 * 1.02 ** (s - 1) for s in range(5, 11)], rel=1e-12)


def test_a_run_that_ended_before_the_driver_recorded_it_starts_no_process_on_resume(verl_standin, tmp_path):
    """A driver SIGKILLed after a trial's verl ran all 10 steps (its checkpoint: step 10) but before Tune received
    steps 9 and 10. ``sweep resume`` restores the trial from Tune's checkpoint of step 8: the two steps come from the
    first attempt's file, and no second attempt starts (verl would load step 10, log nothing and exit)."""
    first: list[dict] = []
    run_process_trial(ADAPTIVE, trainer=verl_standin, trial_dir=tmp_path, report=first.append)
    assert [m["step"] for m in first] == list(range(1, 11)) and checkpointed_step(tmp_path / "checkpoints") == 10
    attempts = sorted(tmp_path.glob("attempt-*"))
    later: list[dict] = []
    run_process_trial(ADAPTIVE, trainer=verl_standin, trial_dir=tmp_path, report=later.append, reported_to=8)
    assert later == first[8:]
    assert sorted(tmp_path.glob("attempt-*")) == attempts


def test_a_run_killed_between_its_last_save_and_its_last_log_runs_its_last_step_again(verl_standin, tmp_path):
    """verl saves step 10, then logs it: a kill between leaves checkpoint 10 and no step-10 line. The resume reports
    step 9 from the file and runs again from verl's checkpoint of step 8 to get step 10's metrics."""
    kept = ADAPTIVE | {"trainer.save_freq": 2, "trainer.max_actor_ckpt_to_keep": 3,
                       "trainer.max_critic_ckpt_to_keep": 3}
    first: list[dict] = []
    run_process_trial(kept, trainer=verl_standin, trial_dir=tmp_path, report=first.append)
    metrics = ran(tmp_path)[0] / "metrics.jsonl"
    metrics.write_text("".join(line + "\n" for line in metrics.read_text().splitlines()[:-1]))  # no step 10
    later: list[dict] = []
    run_process_trial(kept, trainer=verl_standin, trial_dir=tmp_path, report=later.append, reported_to=8)
    assert [m["step"] for m in later] == [9, 10] and later[0] == first[8]
    assert [line["step"] for line in _logged(ran(tmp_path)[1])] == [9, 10]  # from global_step_8
    assert later[1]["actor/reward_kl_penalty_coeff"] == pytest.approx(first[9]["actor/reward_kl_penalty_coeff"])


@pytest.mark.slow  # two runs of the stand-in, each starting its own Ray as verl's main_ppo does
def test_a_remedy_restarts_verl_from_its_checkpoint_before_the_finding(verl_standin, tmp_path):
    """A KL runaway (the stand-in's KL = 0.5 × step × 0.01 / β) passes 0.3 at step 7, where Tune pauses the trial
    (the remedy), which restarts it from step 4 with kl_coef = 1.5 × the coefficient logged last: verl
    resumes from global_step_4 (resume_path, not auto: its tracker names 6), the abandoned run's
    checkpoint 6 is gone before the restart, Tune is told steps 5-10 again, and the KL stays below 0.3."""
    from verl.trainer.ppo import core_algos

    # 0.3 s a step: the pause at step 7 lands before the stand-in has run far past it, even on a loaded machine
    runaway = ADAPTIVE | {"trainer.save_freq": 2, "kl_rise": 0.5, "trainer.max_actor_ckpt_to_keep": 3,
                          "trainer.max_critic_ckpt_to_keep": 3, "interval": 0.3}
    first: list[dict] = []

    def pause_at_7(metrics):
        first.append(metrics)
        if metrics["step"] == 7:
            raise SystemExit  # what tune.report does to a trial Tune pauses
    with pytest.raises(SystemExit):
        run_process_trial(runaway, trainer=verl_standin, trial_dir=tmp_path, report=pause_at_7)
    checkpoints = tmp_path / "checkpoints"
    assert [m["actor/reward_kl_penalty"] > 0.3 for m in first] == [False] * 6 + [True]
    # kept: 3, not verl's 1 (2, 4, 6; or 4, 6, 8 when the stand-in saved step 8 before the pause stopped it)
    kept = [s for s in range(2, 11, 2) if has_checkpoint(checkpoints, s)]
    assert kept in ([2, 4, 6], [4, 6, 8])

    remedied = first[-1]["actor/reward_kl_penalty_coeff"] * 1.5
    again: list[dict] = []
    remedy = Restart(1, 7, "kl_runaway", 4, {KL_COEF_KEY: (first[-1]["actor/reward_kl_penalty_coeff"], remedied)})
    run_process_trial(runaway | {"algorithm.kl_ctrl.kl_coef": remedied}, trainer=verl_standin, trial_dir=tmp_path,
                      report=again.append, rewind_to=4, remedies=[remedy])
    argv = _argv(ran(tmp_path)[1])
    assert "trainer.resume_mode=resume_path" in argv
    assert f"trainer.resume_from_path='{checkpoints / 'global_step_4'}'" in argv
    [coef] = [float(a.split("=")[1]) for a in argv if a.startswith("algorithm.kl_ctrl.kl_coef=")]
    assert coef == pytest.approx(remedied, rel=1e-11)  # the remedy's, not the one logged at step 5
    assert [m["step"] for m in again] == [5, 6, 7, 8, 9, 10]
    assert [line["step"] for line in _logged(ran(tmp_path)[1])] == [5, 6, 7, 8, 9, 10]
    # verl's own controller from the remedied coefficient, updated as apply_kl_penalty does (n_steps 10)
    controller = core_algos.AdaptiveKLController(init_kl_coef=remedied, target_kl=0.1, horizon=100)
    expected = []
    for step in range(5, 11):
        expected.append(controller.value)
        controller.update(current_kl=0.5 * step * 0.01 / controller.value, n_steps=10)
    assert [m["actor/reward_kl_penalty_coeff"] for m in again] == pytest.approx(expected, rel=1e-12)
    assert max(m["actor/reward_kl_penalty"] for m in again) < 0.3
    assert (checkpoints / "latest_checkpointed_iteration.txt").read_text() == "10"


def test_rewind_removes_the_abandoned_checkpoints_and_refuses_what_is_no_rewind(tmp_path):
    for step in (2, 4, 6):
        (tmp_path / f"global_step_{step}" / "actor").mkdir(parents=True)
    (tmp_path / "global_step_1").mkdir()  # a checkpoint verl removed past max_actor_ckpt_to_keep: no actor/
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("6")
    assert rewind(tmp_path, 7) is None and rewind(tmp_path, 5) is None  # no checkpoint there
    assert rewind(tmp_path, 1) is None  # removed past max_actor_ckpt_to_keep
    assert checkpointed_step(tmp_path) == 6
    assert rewind(tmp_path, 4) == {"trainer.resume_mode": "resume_path",
                                   "trainer.resume_from_path": str(tmp_path / "global_step_4")}
    assert sorted(p.name for p in tmp_path.glob("global_step_*")) == ["global_step_1", "global_step_2",
                                                                      "global_step_4"]
    assert checkpointed_step(tmp_path) == 4


def _logged_trial(trial_dir, coefficients, checkpoints=(4, 6)):
    """A verl trial directory as a first attempt leaves it: ``attempt-1/metrics.jsonl`` with the coefficient logged at
    each step (``{step: value}``), verl's checkpoints (``global_step_N/actor``) and its tracker naming the last."""
    (trial_dir / "attempt-1").mkdir(parents=True)
    (trial_dir / "attempt-1" / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "data": {"actor/reward_kl_penalty": 0.2, "actor/reward_kl_penalty_coeff": c}}) + "\n"
        for s, c in coefficients.items()))
    for step in checkpoints:
        (trial_dir / "checkpoints" / f"global_step_{step}" / "actor").mkdir(parents=True)
    (trial_dir / "checkpoints" / "latest_checkpointed_iteration.txt").write_text(str(max(checkpoints)))


def test_a_remedy_of_the_lr_restarts_verl_with_the_coefficient_logged_at_its_step(verl_standin, tmp_path):
    """A remedy that halves the actor lr restarts the trial from step 4: verl rebuilds its controller from
    algorithm.kl_ctrl.kl_coef, which must be the coefficient it held at step 4 (logged at step 5), not the trial's
    initial 0.1; the lr is the remedy's. (The stand-in starts no Ray of its own here: that is not what is tested.)"""
    from verl.trainer.ppo import core_algos

    logged = {s: 0.1 * 1.02 ** (s - 1) for s in range(1, 8)}  # ADAPTIVE's coefficient at steps 1..7
    _logged_trial(tmp_path, logged)
    remedy = Restart(1, 7, "entropy_collapse", 4, {ACTOR_LR_KEY: (1e-6, 5e-7)})
    again: list[dict] = []
    run_process_trial(ADAPTIVE | {ACTOR_LR_KEY: 5e-7, "own_ray": 0}, trainer=verl_standin, trial_dir=tmp_path,
                      report=again.append, rewind_to=4, remedies=[remedy])
    argv = _argv(attempt_dir(tmp_path, 2))
    assert f"trainer.resume_from_path='{tmp_path / 'checkpoints' / 'global_step_4'}'" in argv
    assert f"{ACTOR_LR_KEY}=5e-07" in argv
    [coef] = [float(a.split("=")[1]) for a in argv if a.startswith(f"{KL_COEF_KEY}=")]
    assert coef == logged[5]
    controller = core_algos.AdaptiveKLController(init_kl_coef=logged[5], target_kl=0.1, horizon=100)
    expected = []
    for _ in range(5, 11):  # verl's controller, updated as apply_kl_penalty does (KL 0.2, n_steps 10)
        expected.append(controller.value)
        controller.update(current_kl=0.2, n_steps=10)
    assert [m["step"] for m in again] == [5, 6, 7, 8, 9, 10]
    assert [m["actor/reward_kl_penalty_coeff"] for m in again] == pytest.approx(expected, rel=1e-12)


def test_a_retry_of_a_remedy_restart_keeps_the_remedied_coefficient(tmp_path):
    """A remedy restarted the trial from step 4 with kl_coef 0.3, and that attempt failed before it logged step 5.
    A retry resumes from checkpoint 4 again: the remedy's coefficient wins over the one the abandoned run logged at
    step 5. Once the restarted run checkpointed step 6, the coefficient it logged at step 7 is carried."""
    logged = {s: 0.1 * 1.02 ** (s - 1) for s in range(1, 8)}
    _logged_trial(tmp_path, logged, checkpoints=(4,))
    (tmp_path / "attempt-2").mkdir()
    (tmp_path / "attempt-2" / "metrics.jsonl").write_text("")
    remedy = Restart(1, 7, "kl_runaway", 4, {KL_COEF_KEY: (logged[5], 0.3)})
    remedied = ADAPTIVE | {KL_COEF_KEY: 0.3}
    assert resume_overrides(tmp_path, remedied, [remedy]) == {KL_COEF_KEY: 0.3}
    assert resume_overrides(tmp_path, remedied) == {KL_COEF_KEY: logged[5]}  # no remedy restarts there: carried
    lr = Restart(1, 7, "entropy_collapse", 4, {ACTOR_LR_KEY: (1e-6, 5e-7)})
    assert resume_overrides(tmp_path, ADAPTIVE | {ACTOR_LR_KEY: 5e-7}, [lr]) == {KL_COEF_KEY: logged[5]}

    (tmp_path / "attempt-2" / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "data": {"actor/reward_kl_penalty_coeff": 0.3 + s / 100}}) + "\n" for s in (5, 6, 7)))
    (tmp_path / "checkpoints" / "global_step_6" / "actor").mkdir(parents=True)
    (tmp_path / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("6")
    assert resume_overrides(tmp_path, remedied, [remedy]) == {KL_COEF_KEY: 0.37}
