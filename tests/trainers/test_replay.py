"""The replay trainer: what it plays back from real verl logs (tests/data/traces), and a replay through `sweep run`
judged by health rules."""

from __future__ import annotations

import json
import time

import pandas as pd
import pytest
import yaml

from klsweep.cli import main
from klsweep.errors import OverrideError, TraceReadError
from klsweep.health import load_ruleset
from klsweep.health.check import backtest
from klsweep.health.readers import read_trace
from klsweep.trainers.replay import ReplayTrainer, played_reports
from tests.conftest import NO_SIGNAL, NONFINITE, PPO_CONSOLE, PPO_JSONL, trace

PPO_LOG = trace(PPO_JSONL)
PPO_CONSOLE_LOG = trace(PPO_CONSOLE)
NO_SIGNAL_LOG = trace(NO_SIGNAL)


def play(trainer: ReplayTrainer) -> list[tuple[int, dict]]:
    """Drive the trainer as the Tune trainable does; returns (global_step, metrics) per report."""
    out = []
    while trainer.global_step < trainer.total_steps:
        metrics = trainer.train_step()
        out.append((trainer.global_step, metrics))
    return out


def jsonl(path) -> list[tuple[int, dict]]:
    return [(obj["step"], obj["data"]) for obj in map(json.loads, path.read_text().splitlines())]


def test_replay_plays_every_line_of_a_verl_jsonl():
    assert play(ReplayTrainer({}, trace=PPO_LOG)) == jsonl(PPO_LOG)


def test_replay_stops_at_total_training_steps():
    played = play(ReplayTrainer({"trainer.total_training_steps": 9}, trace=PPO_LOG))
    assert [step for step, _ in played] == [0, 1, 2, 3, 4, 5, 9]  # the log's rows up to step 9
    assert played == jsonl(PPO_LOG)[:7]


def test_console_replay_holds_the_values_of_the_jsonl_made_from_it():
    # The jsonl holds sampled rows of the console log, values converted from its console lines (lengths rounded to
    # 0.1; the validation metric renamed from the old val/test_score/... to val-core/...).
    trainer = ReplayTrainer({}, trace=PPO_CONSOLE_LOG)
    played = dict(play(trainer))
    assert trainer.total_steps == 434 and len(played) == 435  # step:0 ... step:434
    for step, row in jsonl(PPO_LOG):
        common = {k: v for k, v in row.items() if k in played[step]}
        assert len(common) >= 7
        assert {k: played[step][k] for k in common} == pytest.approx(common, rel=1e-3, abs=5e-4), step


def test_played_reports_keep_numbers_last_duplicate_and_steps_in_range():
    reports = [
        (1, {"actor/kl_loss": 0.1, "note": "text", "flag": True, "training_iteration": 7, "time_total_s": 3.0}),
        (3, {"actor/kl_loss": 0.3}),
        (2, {"actor/kl_loss": 0.2}),
        (2, {"actor/kl_loss": 0.25}),  # step 2 logged again (a resumed run): the later report wins
        (5, {"actor/kl_loss": 0.5}),
    ]
    assert played_reports(reports, 4) == [
        (1, {"actor/kl_loss": 0.1}), (2, {"actor/kl_loss": 0.25}), (3, {"actor/kl_loss": 0.3}),
    ]
    unnumbered = [(None, {"a": 1.0}), (None, {"a": 2.0})]  # e.g. a CSV without a step column
    assert played_reports(unnumbered, None) == [(1, {"a": 1.0}), (2, {"a": 2.0})]


def test_save_and_load_continue_where_the_replay_stopped(tmp_path):
    first = ReplayTrainer({}, trace=PPO_LOG)
    for _ in range(8):
        first.train_step()
    first.save(tmp_path)
    resumed = ReplayTrainer({}, trace=PPO_LOG)
    resumed.load(tmp_path)
    assert resumed.global_step == 19  # the 8th row of the log
    assert play(resumed) == jsonl(PPO_LOG)[8:]


def test_speed_spaces_reports_by_their_step_gap():
    trainer = ReplayTrainer({}, trace=NO_SIGNAL_LOG, speed=20.0)  # steps 4 and 7: the second comes 3 / 20 s later
    start = time.perf_counter()  # before the first step: the gap is measured from where the trainer's clock starts
    trainer.train_step()
    trainer.train_step()
    assert time.perf_counter() - start >= 0.15


def test_errors_name_the_log_and_the_fix(tmp_path):
    with pytest.raises(TraceReadError, match="trainer.total_training_steps=3"):
        ReplayTrainer({"trainer.total_training_steps": 3}, trace=NO_SIGNAL_LOG)  # the log has steps 4 and 7
    with pytest.raises(TraceReadError, match="cannot read trace"):
        ReplayTrainer({}, trace=tmp_path / "missing.jsonl")
    with pytest.raises(OverrideError, match="not an integer"):
        ReplayTrainer({"trainer.total_training_steps": "ten"}, trace=NO_SIGNAL_LOG)
    with pytest.raises(StopIteration):
        trainer = ReplayTrainer({}, trace=NO_SIGNAL_LOG)
        play(trainer)
        trainer.train_step()


def replay_sweep(tmp_path, name: str, trace, algorithm: str, objective: str, max_steps: int) -> str:
    sweep = {
        "name": name,
        "algorithm": algorithm,
        "trainer": "replay",
        "replay": {"trace": str(trace)},
        "overrides": {"actor_rollout_ref.rollout.n": 8} if algorithm == "grpo" else {},
        "parameters": {"kl_coef": {"values": [0.001]}},
        "objective": {"metric": objective, "mode": "max"},
        "sampler": "random",
        "budget": {"trials": 1, "max_concurrent": 1, "max_steps": max_steps},
        "health": "default",
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(sweep, sort_keys=False))
    return str(path)


@pytest.mark.slow
def test_sweep_run_replay_of_a_no_signal_run_fails_the_trial(ray_local, tmp_path):
    path = replay_sweep(tmp_path, "replay_no_signal", NO_SIGNAL_LOG, "grpo", "critic/score/mean", max_steps=10)
    assert main(["run", path, "--out", str(tmp_path / "out"), "--quiet"]) == 1  # no trial completed
    [trial] = pd.read_csv(tmp_path / "out" / "trials.csv").to_dict("records")
    assert trial["state"] == "FAIL" and trial["health"] == "stopped"
    assert "no_signal" in trial["stop_reason"] and "step 7" in trial["stop_reason"]  # both rows: advantages 0


@pytest.mark.slow
def test_sweep_run_replay_of_a_healthy_run_stays_healthy(ray_local, tmp_path):
    val = "val-core/openai/gsm8k/reward/mean@1"
    path = replay_sweep(tmp_path, "replay_ppo", PPO_LOG, "ppo", val, max_steps=435)
    main(["run", path, "--out", str(tmp_path / "out"), "--quiet"])
    [trial] = pd.read_csv(tmp_path / "out" / "trials.csv").to_dict("records")
    # every row of the log played: 23 sampled reports, up to the log's own last step 434 (a finished trial, not one
    # cut short by a scheduler: the replay trainer's total_steps is the log's end)
    assert trial["health"] == "healthy" and trial["steps"] == 434 and trial["state"] == "COMPLETE"
    assert trial[f"best/{val}"] == max(d[val] for _, d in jsonl(PPO_LOG) if val in d)


@pytest.mark.slow
def test_sweep_run_replay_of_a_run_whose_losses_went_nan_fails_the_trial_at_step_18(ray_local, tmp_path):
    # Written by verl 0.9.1's FileLogger (orjson: NaN and inf as null from step 18; tests/data/README.md). The replay
    # must stop it as non-finite at step 18, never record it COMPLETE with its last finite score.
    log = trace(NONFINITE)
    path = replay_sweep(tmp_path, "replay_nonfinite", log, "grpo", "critic/score/mean", max_steps=25)
    assert main(["run", path, "--out", str(tmp_path / "out"), "--quiet"]) == 1  # no trial completed
    [trial] = pd.read_csv(tmp_path / "out" / "trials.csv").to_dict("records")
    assert trial["state"] == "FAIL" and trial["health"] == "stopped" and trial["steps"] == 18
    assert trial["stop_reason"].startswith("nonfinite at step 18 by builtin.nonfinite_loss")
    # Ray Tune's own loggers wrote the trial's results (result.json: NaN; progress.csv: nan): read back through the
    # same decoder, they get the same verdict.
    for name in ("result.json", "progress.csv"):
        [written] = (tmp_path / "out").rglob(name)
        _, summary = backtest(read_trace(written), load_ruleset("default"))
        assert (summary["stop_kind"], summary["stop_step"]) == ("nonfinite", 18), name


def test_a_wandb_export_of_several_runs_plays_the_run_named(tmp_path):
    from tests.health.test_decoder import WANDB_TWO_RUNS

    export = tmp_path / "wandb_export.csv"
    export.write_text(WANDB_TWO_RUNS)
    with pytest.raises(TraceReadError, match=r"holds 2 runs \(sweep-a-t03, sweep-a-t07\)"):
        ReplayTrainer({}, trace=export)
    played = play(ReplayTrainer({}, trace=export, run="sweep-a-t07"))
    assert [step for step, _ in played] == [1, 2, 3]  # its step 4 cells are empty: not logged
    assert played[0][1] == {"actor/pg_loss": 0.02} and played[2][1] == {"actor/pg_loss": float("inf")}


def test_a_replay_sweep_names_the_run_of_an_export_in_its_replay_section(tmp_path):
    """`replay: {trace, run}` in a sweep file reaches the trainer each trial builds (the trainer table's factory)."""
    from klsweep.spec import load_sweep
    from klsweep.spec.space import trial_overrides
    from klsweep.trainers import trainer_kind
    from tests.health.test_decoder import WANDB_TWO_RUNS

    export = tmp_path / "wandb_export.csv"
    export.write_text(WANDB_TWO_RUNS)
    path = replay_sweep(tmp_path, "two_runs", export, "grpo", "actor/pg_loss", 3)
    sweep = load_sweep(path, ["replay.run=sweep-a-t07"])
    trainer = trainer_kind("replay").in_process(sweep, trial_overrides(sweep, {"kl_coef": 0.001}))
    assert [step for step, _ in play(trainer)] == [1, 2, 3]
    with pytest.raises(TraceReadError, match="sweep-a-t03, sweep-a-t07"):
        trainer_kind("replay").in_process(load_sweep(path), {})
