"""load: GPU-seconds and the result.json of a trial killed mid-write."""

from __future__ import annotations

from klsweep.analysis import load, load_history


def test_load_gives_gpu_seconds(synthetic_sweep):
    # 4 trials, 10 steps at 2 s/step; trial 3 stopped at step 5; 0.5 GPU per trial
    df = load(synthetic_sweep(4, max_steps=10, gpu=0.5))
    assert list(df["gpu_s"]) == [10.0, 10.0, 10.0, 5.0]


def test_a_half_written_last_line_is_dropped(synthetic_sweep):
    run_dir = synthetic_sweep(2, max_steps=10)
    result = next((run_dir / "tune").glob("*t00001*/result.json"))
    result.write_text(result.read_text() + '{"training_iteration": 11, "actor/kl_')  # killed mid-write
    df = load(run_dir).set_index("trial_id")
    assert df.loc["t00001", "wall_s"] == 20.0  # step 10's time_total_s, the last complete line
    history = load_history(run_dir)
    assert history[history["trial_id"] == "t00001"]["step"].max() == 10


def test_overrides_of_gives_verl_ready_values():
    import math

    from klsweep.analysis.load import overrides_of

    # a column with empty cells is float64 in pandas: ppo_epochs 1.0 must go back to verl as 1 (an int field)
    row = {"config/actor_rollout_ref.actor.ppo_epochs": 1.0, "config/algorithm.kl_ctrl.kl_coef": 0.05,
           "config/trainer.logger": ["console", "file"], "config/data.seed": math.nan, "state": "COMPLETE"}
    assert overrides_of(row) == {"actor_rollout_ref.actor.ppo_epochs": 1, "algorithm.kl_ctrl.kl_coef": 0.05,
                                 "trainer.logger": ["console", "file"]}
    assert isinstance(overrides_of(row)["actor_rollout_ref.actor.ppo_epochs"], int)


def test_confirmation_columns_are_integers_in_trials_csv(synthetic_sweep):
    """Three search trials (seed 0) and a re-run of trial 2 with seed 3: confirm_of 2 and confirm_seed 3 on it,
    empty on the others, written '2' and '3' to trials.csv (a float64 column wrote '2.0')."""
    import csv

    from klsweep.orchestrate.progress import write_trials_csv

    from .conftest import trial_spec

    specs = [trial_spec(i, 10) for i in range(3)]
    for spec in specs:
        spec["params"] = {**spec["params"], "data.seed": 0}
    specs.append({**specs[2], "params": {**specs[2]["params"], "data.seed": 3}, "confirm_of": 2})
    run_dir = synthetic_sweep(specs)
    df = load(run_dir)
    assert str(df["confirm_of"].dtype) == "Int64" and str(df["confirm_seed"].dtype) == "Int64"
    assert df["confirm_of"].tolist()[3] == 2 and df["confirm_seed"].tolist()[3] == 3
    assert df["confirm_of"].isna().tolist() == [True, True, True, False]
    write_trials_csv(run_dir)
    rows = list(csv.DictReader((run_dir / "trials.csv").open()))
    assert [(r["confirm_of"], r["confirm_seed"]) for r in rows] == [("", "")] * 3 + [("2", "3")]
