"""The embedded trainer's public surface: overrides, metric names, determinism, checkpoints, process mode."""

import json
import math
import os
import subprocess
import sys

import pytest

from klsweep.errors import OverrideError
from klsweep.trainers.embedded import VAL_METRIC, EmbeddedTrainer, run
from klsweep.trainers.embedded.__main__ import main

A = "actor_rollout_ref.actor"
TINY = {"trainer.total_training_steps": 3, "trainer.test_freq": 2, "data.train_batch_size": 4,
        "actor_rollout_ref.rollout.n": 4}
EVERYTHING = {  # critic, KL in reward (adaptive) and KL in loss at once, two mini-batches per step
    **TINY, "algorithm.adv_estimator": "gae", "algorithm.use_kl_in_reward": True, "algorithm.kl_ctrl.type": "adaptive",
    "algorithm.kl_ctrl.horizon": 100, "algorithm.kl_ctrl.kl_coef": 0.1, f"{A}.use_kl_loss": True,
    f"{A}.ppo_mini_batch_size": 2, f"{A}.ppo_epochs": 2, f"{A}.entropy_coeff": 0.01,
}


def _without_timing(history):
    return [{k: v for k, v in m.items() if not k.startswith("timing_s/")} for m in history]


@pytest.mark.parametrize(
    "overrides,expected",
    [
        ({f"{A}.kl_los_type": "kl"}, f"did you mean '{A}.kl_loss_type'"),
        ({f"{A}.kl_loss_type": "k4"}, "low_var_kl"),
        ({f"{A}.loss_agg_mode": "seq-sum"}, "seq-mean-token-mean"),
        ({f"{A}.kl_loss_coef": -0.01}, "negative"),
        ({f"{A}.kl_loss_type": "full"}, "not implemented"),
        ({"algorithm.adv_estimator": "drgrpo"}, "norm_adv_by_std_in_grpo"),
        ({"algorithm.adv_estimator": "rloo"}, "implements gae and grpo"),
        ({"data.train_batch_size": 6, f"{A}.ppo_mini_batch_size": 4}, "divisible"),
    ],
)
def test_bad_overrides_give_one_line_naming_the_key(overrides, expected, capsys):
    # process mode's main() builds the trainer from the command line and prints the OverrideError as one line
    assert main([f"{k}={v}" for k, v in overrides.items()]) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: ") and expected in last and "Traceback" not in err


def test_override_error_is_raised_in_process():
    with pytest.raises(OverrideError, match="kl_loss_type"):
        EmbeddedTrainer({f"{A}.kl_loss_type": "k4"})


def test_metrics_have_verls_names_for_gae_with_kl_in_reward_and_loss():
    history = run(EVERYTHING)
    assert [m["step"] for m in history] == [0, 1, 2, 3]
    assert set(history[0]) >= {VAL_METRIC}
    step = history[2]
    expected = {
        "actor/pg_loss", "actor/kl_loss", "actor/kl_coef", "actor/entropy", "actor/ppo_kl", "actor/pg_clipfrac",
        "actor/grad_norm", "actor/lr", "actor/reward_kl_penalty", "actor/reward_kl_penalty_coeff",
        "critic/score/mean", "critic/score/max", "critic/score/min", "critic/rewards/mean", "critic/advantages/mean",
        "critic/advantages/max", "critic/advantages/min", "critic/returns/mean", "critic/vf_loss",
        "critic/vf_explained_var", "response_length/mean", "response_length/max", "response_length/min",
        "response_length/clip_ratio", VAL_METRIC, "timing_s/step", "embedded/gold_score/mean",
    }
    assert expected <= set(step), expected - set(step)
    assert VAL_METRIC not in history[1] and VAL_METRIC in history[3]  # test_freq=2 and the last step
    assert all(math.isfinite(v) for m in history for v in m.values())
    assert 0.0 <= step[VAL_METRIC] <= 1.0
    assert 1 <= step["response_length/min"] <= step["response_length/max"] <= 8


def test_grpo_without_kl_logs_no_kl_metrics():
    metrics = EmbeddedTrainer({**TINY, "algorithm.adv_estimator": "grpo"}).train_step()
    assert not {"actor/kl_loss", "actor/reward_kl_penalty", "critic/vf_loss"} & set(metrics)


def test_same_overrides_give_identical_metrics_and_seed_changes_them():
    first = _without_timing(run(EVERYTHING))
    assert first == _without_timing(run(EVERYTHING))
    assert first != _without_timing(run({**EVERYTHING, "data.seed": 2}))


def test_checkpoint_resume_is_bit_for_bit(tmp_path):
    overrides = {**EVERYTHING, "trainer.total_training_steps": 4, "trainer.val_before_train": False}
    straight = _without_timing(run(overrides))
    first = EmbeddedTrainer(overrides)
    head = [{"step": step, **first.train_step()} for step in (1, 2)]
    first.save(tmp_path)
    resumed = EmbeddedTrainer(overrides)
    resumed.load(tmp_path)
    assert resumed.global_step == 2
    tail = run(overrides, trainer=resumed)
    assert _without_timing(head + tail) == straight


def test_report_returning_true_stops_early():
    seen = []
    history = run({**TINY, "trainer.val_before_train": False}, lambda step, m: seen.append(step) or step == 2)
    assert seen == [1, 2] and len(history) == 2


@pytest.mark.slow
def test_process_mode_writes_verl_file_logger_lines(tmp_path):
    log = tmp_path / "metrics.jsonl"
    argv = [f"{k}={v}" for k, v in TINY.items()] + [f"{A}.use_kl_loss=true", f"{A}.kl_loss_type=k3+",
                                                   "trainer.n_gpus_per_node=8"]
    env = {**os.environ, "VERL_FILE_LOGGER_PATH": str(log)}
    done = subprocess.run([sys.executable, "-m", "klsweep.trainers.embedded", *argv], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [line["step"] for line in lines] == [0, 1, 2, 3]
    assert "actor/kl_loss" in lines[1]["data"] and VAL_METRIC in lines[3]["data"]
    assert [line for line in done.stdout.splitlines() if line.startswith("step:")][1].startswith("step:1 - ")
    assert "trainer.n_gpus_per_node" in done.stderr  # the one "accepted but not used" log line

    bad = subprocess.run([sys.executable, "-m", "klsweep.trainers.embedded", f"{A}.kl_loss_type=k4"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2
    assert "Traceback" not in bad.stderr
    assert bad.stderr.strip().splitlines()[-1].startswith("error: actor_rollout_ref.actor.kl_loss_type='k4'")


def test_console_line_prints_numpy_scalars_as_plain_numbers(tmp_path):
    """With the adaptive in-reward KL controller the console log read 'actor/reward_kl_penalty_coeff:np.float64(...)'
    from step 2 on (the controller's value is a numpy float); it prints plain numbers, in verl's 'step:N - key:value'
    format, and klsweep's log reader reads the line back to the same values."""
    import numpy as np

    from klsweep.health.readers import read_trace
    from klsweep.trainers.embedded.__main__ import console_line

    history = run(EVERYTHING)
    coeff = history[2]["actor/reward_kl_penalty_coeff"]
    assert type(coeff).__module__ == "numpy"
    printed = console_line(2, history[2])
    assert "np." not in printed and f"actor/reward_kl_penalty_coeff:{float(coeff)!r}" in printed
    line = console_line(2, {"actor/pg_loss": 0.5, "actor/reward_kl_penalty_coeff": np.float64(0.125),
                            "actor/grad_norm": np.float32(0.25), "response_length/max": np.int64(7),
                            "actor/kl_loss": np.float64("nan")})
    assert line == ("step:2 - actor/pg_loss:0.5 - actor/reward_kl_penalty_coeff:0.125 - actor/grad_norm:0.25 - "
                    "response_length/max:7 - actor/kl_loss:nan")
    log = tmp_path / "console.log"
    log.write_text(line + "\n")
    [(step, metrics)] = read_trace(log).reports
    assert step == 2 and metrics["actor/reward_kl_penalty_coeff"] == 0.125 and math.isnan(metrics["actor/kl_loss"])
