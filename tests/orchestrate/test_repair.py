"""The repair of Tune's saved search state after a SIGKILL of the driver (klsweep.orchestrate._repair), on the files as
Ray Tune 2.60 writes them (experiment_state JSON, cloudpickled search_gen_state), a real Tune run and a real Optuna
study."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import optuna
import ray.cloudpickle as cloudpickle
from ray import tune
from ray.train._internal.session import _TrainingResult
from ray.tune.trainable.metadata import _TrainingRunMetadata

from klsweep.orchestrate._repair import copy_staged_results, drop_lost_checkpoints, reconcile_search_state
from klsweep.orchestrate.result_json import ResultsFromCheckpoint


def _experiment_state(tune, trials: dict[str, str]) -> None:
    data = [[json.dumps({"trial_id": tid, "status": status}), {}] for tid, status in trials.items()]
    (tune / "experiment_state-2026-12-01_08-36-08.json").write_text(json.dumps({"trial_data": data}))


def _limiter(live: set[str]) -> dict:
    return {"max_concurrent": 1, "batch": False, "live_trials": live, "num_unfinished_live_trials": len(live)}


def test_live_trials_become_exactly_the_trials_tune_resumes(tmp_path):
    """Trial b started after the search state was saved (its limiter entry missing) and before the experiment state
    was: Tune resumes it, so the limiter must forward its end to the study; trial c was suggested but never reached
    Tune's saved state (it will not run); trial a ended."""
    tune = tmp_path / "tune"
    tune.mkdir()
    _experiment_state(tune, {"a": "TERMINATED", "b": "RUNNING"})
    gen = tune / "search_gen_state-2026-12-01_08-36-08.json"
    gen.write_bytes(cloudpickle.dumps({"counter": 2, "name:ConcurrencyLimiter": _limiter({"c"})}))
    study = optuna.create_study()
    finished = study.ask()
    finished.set_user_attr("ray_trial_id", "a")
    study.tell(finished, 1.0)

    reconcile_search_state(str(tune), study)

    state = cloudpickle.loads(gen.read_bytes())
    assert state["name:ConcurrencyLimiter"]["live_trials"] == {"b"}
    assert state["name:ConcurrencyLimiter"]["num_unfinished_live_trials"] == 1
    assert state["counter"] == 2  # a and b are known to Tune; nothing ran unknown to it


def test_a_trial_that_ran_unknown_to_tune_counts_against_the_budget(tmp_path):
    tune = tmp_path / "tune"
    tune.mkdir()
    _experiment_state(tune, {"a": "TERMINATED"})
    gen = tune / "search_gen_state-2026-12-01_08-36-08.json"
    gen.write_bytes(cloudpickle.dumps({"counter": 1, "name:ConcurrencyLimiter": _limiter(set())}))
    study = optuna.create_study()
    for tid in ("a", "b"):  # b started and finished between two experiment saves
        trial = study.ask()
        trial.set_user_attr("ray_trial_id", tid)
        study.tell(trial, 0.5)

    reconcile_search_state(str(tune), study)

    state = cloudpickle.loads(gen.read_bytes())
    assert state["counter"] == 2 and state["name:ConcurrencyLimiter"]["live_trials"] == set()


def _count_to_3(config):
    """Reports steps 1..3 (klsweep's ``step``), each with a checkpoint of its step; a restored run starts after its
    checkpoint's step. With ``config["crash"]``, a file that exists, it deletes the file and raises after step 2."""
    start = 0
    if (checkpoint := tune.get_checkpoint()) is not None:
        with checkpoint.as_directory() as folder:
            start = json.loads(Path(folder, "step.json").read_text())["step"]
    for i in range(start + 1, 4):
        with tempfile.TemporaryDirectory() as folder:
            Path(folder, "step.json").write_text(json.dumps({"step": i}))
            tune.report({"step": i, "start": start}, checkpoint=tune.Checkpoint.from_directory(folder))
        if i == 2 and config.get("crash") and Path(config["crash"]).exists():
            Path(config["crash"]).unlink()
            raise RuntimeError("crash")


def _killed_driver_state(exp: Path, names=None) -> tuple[dict, Path]:
    """Set the one trial of the Tune experiment ``exp`` back to RUNNING in its saved state, as a SIGKILLed driver
    leaves it; with ``names``, a checkpoint folder name, its checkpoint list becomes that checkpoint alone, with
    the metrics ``result.json`` logged with it. Returns the trial's JSON and its folder."""
    (state_file,) = exp.glob("experiment_state-*.json")
    state = json.loads(state_file.read_text())
    ((trial_json, metadata_json),) = state["trial_data"]
    trial = json.loads(trial_json)
    folder = exp / trial["relative_logdir"]
    state["trial_data"][0][0] = json.dumps(trial | {"status": "RUNNING"})
    if names is not None:
        metadata = _TrainingRunMetadata.from_json_state(metadata_json)
        rows = [json.loads(line) for line in (folder / "result.json").read_text().splitlines()]
        (row,) = [r for r in rows if r["checkpoint_dir_name"] == names]
        manager = metadata.checkpoint_manager
        manager._latest_checkpoint_result = _TrainingResult(tune.Checkpoint(str(folder / names)), row)
        manager._checkpoint_results = [manager._latest_checkpoint_result]
        metadata.checkpoint_manager = manager
        state["trial_data"][0][1] = metadata.get_json_state()
    state_file.write_text(json.dumps(state))
    return trial, folder


def _restore(exp: Path) -> tuple[dict, list[tuple[int, int]]]:
    """Resume the experiment; its one trial's last metrics and its ``result.json`` rows as (step, start)."""
    results = tune.Tuner.restore(str(exp), trainable=_count_to_3, resume_unfinished=True).fit()
    assert results.errors == []
    rows = [json.loads(line) for line in Path(results[0].path, "result.json").read_text().splitlines()]
    return results[0].metrics, [(row["step"], row["start"]) for row in rows]


def test_a_checkpoint_tunes_saved_state_names_but_storage_lost_is_dropped_and_the_trial_runs(ray_local, tmp_path):
    """With num_to_keep=1 the driver deletes a trial's previous checkpoint once it registers the next, and saves its
    state only every few seconds: a SIGKILL between leaves a state that names a deleted checkpoint. Here: a finished
    run's state, its trial set back to RUNNING and its checkpoint deleted. ``Tuner.restore`` would end the trial in
    ERROR ("Could not recover from checkpoint"); after the repair it runs again from its start, and its
    ``result.json`` (klsweep's logger) holds each step once."""
    config = tune.RunConfig(storage_path=str(tmp_path), name="exp", callbacks=[ResultsFromCheckpoint()],
                            checkpoint_config=tune.CheckpointConfig(num_to_keep=1))
    assert tune.Tuner(_count_to_3, run_config=config).fit().errors == []
    trial, folder = _killed_driver_state(tmp_path / "exp")
    (checkpoint,) = folder.glob("checkpoint_*")
    shutil.rmtree(checkpoint)

    assert drop_lost_checkpoints(str(tmp_path / "exp")) == [trial["trial_id"]]
    assert drop_lost_checkpoints(str(tmp_path / "exp")) == []  # nothing left to drop
    last, rows = _restore(tmp_path / "exp")
    assert (last["step"], last["start"]) == (3, 0)
    assert rows == [(1, 0), (2, 0), (3, 0)]


def test_a_lost_checkpoint_becomes_the_newer_one_the_driver_registered_before_its_kill(ray_local, tmp_path):
    """The state names step 1's checkpoint, which the driver deleted once it registered step 2's (logged in
    ``result.json``): the trial resumes from step 2's and runs step 3 alone."""
    crash = tmp_path / "crash"
    crash.touch()
    config = tune.RunConfig(storage_path=str(tmp_path), name="exp", callbacks=[ResultsFromCheckpoint()],
                            checkpoint_config=tune.CheckpointConfig(num_to_keep=1))
    assert len(tune.Tuner(_count_to_3, param_space={"crash": str(crash)}, run_config=config).fit().errors) == 1
    trial, folder = _killed_driver_state(tmp_path / "exp", names="checkpoint_000000")
    assert sorted(p.name for p in folder.glob("checkpoint_*")) == ["checkpoint_000001"]

    assert drop_lost_checkpoints(str(tmp_path / "exp")) == [trial["trial_id"]]
    last, rows = _restore(tmp_path / "exp")
    assert (last["step"], last["start"]) == (3, 2)
    assert rows == [(1, 0), (2, 0), (3, 2)]


def test_the_rows_a_killed_driver_had_not_synced_come_from_its_ray_session(ray_local, tmp_path):
    """Tune's driver writes progress.csv in its Ray session's staging folder and syncs it to storage every few
    seconds: here storage holds the rows of an earlier sync (2 of 3), as after a SIGKILL right after a trial ended.
    The staged file replaces it; a file storage holds newer than the staged one is kept. result.json is in storage
    whole already (klsweep's logger writes it there row by row) and has no staged copy."""
    from ray._private.worker import _global_node

    name = tmp_path.name  # the staging folder is per experiment name, in the test session's Ray session
    config = tune.RunConfig(storage_path=str(tmp_path), name=name, callbacks=[ResultsFromCheckpoint()])
    assert tune.Tuner(_count_to_3, run_config=config).fit().errors == []
    (folder,) = [p for p in (tmp_path / name).iterdir() if p.is_dir()]
    result, progress, params = folder / "result.json", folder / "progress.csv", folder / "params.json"
    assert [json.loads(line)["step"] for line in result.read_text().splitlines()] == [1, 2, 3]
    full = progress.read_text()
    progress.write_text("".join(line + "\n" for line in full.splitlines()[:3]))  # header and steps 1-2
    os.utime(progress, (1, 1))  # the earlier sync's time
    params.write_text("newer\n")  # storage's copy is newer than the staged one: kept

    copied = copy_staged_results(Path(_global_node.get_session_dir_path()), str(tmp_path / name))
    assert f"{folder.name}/progress.csv" in copied and f"{folder.name}/params.json" not in copied
    assert f"{folder.name}/result.json" not in copied
    assert progress.read_text() == full and len(full.splitlines()) == 4 and params.read_text() == "newer\n"
    assert copy_staged_results(None, str(tmp_path / name)) == []  # no session recorded (a joined cluster)


class _RowsInStorage(tune.Callback):
    """After klsweep's logger in the callbacks: at each result, the rows of the trial's result.json in storage and
    whether its staging folder holds one."""

    def __init__(self):
        self.seen: list[tuple[int, list[int], bool]] = []

    def on_trial_result(self, iteration, trials, trial, result, **info):
        stored = Path(trial.storage.trial_fs_path, "result.json").read_text().splitlines()
        self.seen.append((result["step"], [json.loads(line)["step"] for line in stored],
                          Path(trial.local_path, "result.json").exists()))


def test_each_reported_row_is_in_storages_result_json_before_the_next_callback_runs(ray_local, tmp_path):
    """Tune copies its staging folder to storage every few seconds, truncating each file before it writes it: a
    SIGKILL during the copy cut a trial's result.json anywhere. klsweep's logger appends each row to the file in
    storage as Tune reports it, and writes none in staging for Tune to copy over it."""
    rows = _RowsInStorage()
    config = tune.RunConfig(storage_path=str(tmp_path), name="exp", callbacks=[ResultsFromCheckpoint(), rows])
    assert tune.Tuner(_count_to_3, run_config=config).fit().errors == []
    assert rows.seen == [(1, [1], False), (2, [1, 2], False), (3, [1, 2, 3], False)]
