"""The repair of Tune's saved search state after a SIGKILL of the driver (klsweep.orchestrate._repair), on the files as
Ray Tune 2.60 writes them (experiment_state JSON, cloudpickled search_gen_state) and a real Optuna study."""

from __future__ import annotations

import json

import optuna
import ray.cloudpickle as cloudpickle

from klsweep.orchestrate._repair import reconcile_search_state


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
