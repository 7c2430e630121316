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
