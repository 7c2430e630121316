"""load: GPU-seconds and the result.json of a trial killed mid-write."""

from __future__ import annotations

from klsweep.analysis import load, load_history
from klsweep.analysis.sweep_dir import storage_from_url


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

    from klsweep.analysis.sweep_dir import overrides_of

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

    from klsweep.analysis.trials_csv import write_trials_csv

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


def test_a_trial_that_raised_has_its_exception_as_stop_reason_in_trials_csv_and_status(synthetic_sweep):
    """A FAIL trial whose recorded reason is the searcher's 'trial raised an error (see its error.txt ...)' gets the
    exception's line from its Ray Tune error.txt in trials.csv and in `sweep status`; without an error.txt it keeps
    the recorded reason, and a health stop's reason is left as it is."""
    import csv
    import io

    from rich.console import Console

    from klsweep.analysis.status import status
    from klsweep.analysis.trials_csv import write_trials_csv

    from .conftest import trial_spec

    generic = "trial raised an error (see its error.txt in the Tune directory)"
    specs = [trial_spec(i, 10) for i in range(4)]  # trial 3 is stopped by kl_blowup at step 5
    for i in (0, 1):
        specs[i].update(state="FAIL", steps=1, stop_reason=generic)
    run_dir = synthetic_sweep(specs)
    message = "loss_agg_mode='token-sum' was not recorded in t.jsonl.gz (its grid holds ['token-mean'])"
    (run_dir / "tune" / "trainable_t00000_0" / "error.txt").write_text(  # Trial.handle_error's layout
        "Failure # 1 (occurred at 2026-12-01_07-31-10)\nray::ImplicitFunc.train() (pid=16737)\n"
        '  File "/x/tabular.py", line 141, in nearest\n    raise OverrideError(\n'
        f"klsweep.errors.OverrideError: {message}\n")

    write_trials_csv(run_dir)
    rows = list(csv.DictReader((run_dir / "trials.csv").open()))
    assert [r["stop_reason"] for r in rows] == [f"OverrideError: {message}", generic, "",
                                                "kl_blowup: ref_kl > 0.5 for 3 reports"]
    out = io.StringIO()
    assert status(str(run_dir), console=Console(file=out, width=400)) == 0
    lines = [line for line in out.getvalue().splitlines() if "FAIL" in line and "│" in line]
    assert [line.split("│")[-1].strip() for line in lines][-2:] == [f"OverrideError: {message}", generic]


def _open_at_the_barrier(url: str, barrier, results) -> None:
    barrier.wait()
    try:
        storage_from_url(url)
        results.put("ok")
    except Exception as e:  # what a driver or a notebook would have raised
        results.put(f"{type(e).__name__}: {str(e)[:80]}")


def test_processes_opening_a_new_study_database_at_once_all_open_it(tmp_path):
    """A driver creating study.db and a notebook polling it at the same moment: both found no tables and created
    them, and the loser crashed ("table studies already exists", or the alembic version row's UNIQUE constraint); a
    walkthrough test's driver died of it. Six processes at a barrier, five new databases: every open succeeds."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")  # the imports are done: the six reach RDBStorage's create_all together
    for n in range(5):
        barrier, results = ctx.Barrier(6), ctx.Queue()
        url = f"sqlite:///{tmp_path / f'study{n}.db'}"
        processes = [ctx.Process(target=_open_at_the_barrier, args=(url, barrier, results)) for _ in range(6)]
        for p in processes:
            p.start()
        for p in processes:
            p.join(timeout=60)
        assert [results.get(timeout=10) for _ in processes] == ["ok"] * 6
