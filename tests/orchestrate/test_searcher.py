"""KlsweepSearch records each trial's real outcome in the Optuna study (stock OptunaSearch records a stopped trial as
COMPLETE: ray#15283), through real Ray Tune + Optuna and the real HealthStopper: a rule's stop is PRUNED (single
objective) or infeasible (multi-objective), a non-finite loss or no learning signal is FAIL."""

from __future__ import annotations

import math

import optuna
import pytest
from ray import tune

from klsweep.health import HealthStopper, load_ruleset
from klsweep.orchestrate.searcher import KlsweepSearch

pytestmark = pytest.mark.slow

STEPS = 6


KINDS = ["ok", "sick", "raise", "nan", "broken", "flat"]
#: the health rules: one stop rule on ``kl`` (only ``sick`` trials cross it, at step 3) and verl's built-in checks
RULES = {"preset": "none", "rules": [{"name": "kl_high", "metric": "kl", "above": 0.025, "action": "stop",
                                      "kind": "diverged", "advice": "raise kl_coef"}]}


def scripted(config):
    """A trainable whose metric stream is chosen by its ``kind`` param; validation ``val`` only on even steps.

    ``sick``: ``kl`` 0.01 per step (the rule stops it at step 3); ``broken``: ``actor/pg_loss`` NaN from step 3
    (built-in nonfinite_loss); ``flat``: every advantage 0 (built-in no_signal, 2 steps: stops at step 2);
    ``nan``: the last validation value is NaN; ``raise``: raises at step 3; ``ok``: none of these.
    """
    kind = config["kind"]
    for step in range(1, STEPS + 1):
        flat = kind == "flat"
        metrics = {"kl": (0.01 if kind == "sick" else 0.001) * step, "critic/advantages/max": 0.0 if flat else 1.0,
                   "critic/advantages/min": 0.0 if flat else -1.0,
                   "actor/pg_loss": float("nan") if kind == "broken" and step >= 3 else 0.01}
        if step % 2 == 0:
            metrics["val"] = float("nan") if (kind == "nan" and step == STEPS) else 0.1 * step
        if kind == "raise" and step == 3:
            raise RuntimeError("boom")
        tune.report(metrics)


def _overrides(params):
    return {"x.kind": params["kind"]}


def _space(trial):
    trial.suggest_categorical("kind", KINDS)


def _run(tmp_path, *, metric, mode, kinds, constraints=False):
    study_name = "s"
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'study.db'}")
    sampler = optuna.samplers.RandomSampler(seed=0)
    if constraints:
        sampler = optuna.samplers.NSGAIISampler(seed=0, population_size=4)
    searcher = KlsweepSearch(
        space=_space, metric=metric, mode=mode, points_to_evaluate=[{"kind": k} for k in kinds],
        sampler=sampler, study_name=study_name, storage=storage,
        overrides_of=_overrides, total_steps=STEPS,
    )
    tuner = tune.Tuner(
        scripted,
        tune_config=tune.TuneConfig(search_alg=searcher, num_samples=len(kinds), max_concurrent_trials=1),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="tune", stop=HealthStopper(load_ruleset(RULES)),
                                  verbose=0,
                                  failure_config=tune.FailureConfig(max_failures=0)),
    )
    tuner.fit()
    return optuna.load_study(study_name=study_name, storage=storage)


def test_single_objective_states(ray_local, tmp_path):
    study = _run(tmp_path, metric="val", mode="max", kinds=KINDS)
    by_kind = {t.params["kind"]: t for t in study.trials}
    assert len(study.trials) == 6
    ok, sick, crashed, nan, broken, flat = (by_kind[k] for k in KINDS)
    assert ok.state == optuna.trial.TrialState.COMPLETE
    assert ok.value == pytest.approx(0.1 * STEPS)  # the last reported value, not the best
    assert ok.intermediate_values == {2: pytest.approx(0.2), 4: pytest.approx(0.4), 6: pytest.approx(0.6)}
    assert sick.state == optuna.trial.TrialState.PRUNED
    assert sick.user_attrs["stop_reason"].startswith("diverged at step 3 by kl_high: kl = 0.03")
    assert sick.user_attrs["health"] == "stopped" and sick.user_attrs["steps"] == 3
    assert sick.value == pytest.approx(0.2)  # Optuna keeps the last intermediate value of a pruned trial
    assert crashed.state == optuna.trial.TrialState.FAIL
    assert nan.state == optuna.trial.TrialState.FAIL  # stock OptunaSearch leaves this one RUNNING forever
    assert "not finite" in nan.user_attrs["stop_reason"]
    # stopped by a health check whose verdict is "broken", not "worse": FAIL, so no sampler learns from the value
    assert broken.state == flat.state == optuna.trial.TrialState.FAIL
    assert broken.user_attrs["steps"] == 3 and "builtin.nonfinite_loss" in broken.user_attrs["stop_reason"]
    assert flat.user_attrs["steps"] == 2 and "builtin.no_signal" in flat.user_attrs["stop_reason"]
    assert broken.user_attrs["health"] == flat.user_attrs["health"] == "stopped"
    assert all(t.user_attrs["ray_trial_id"] for t in study.trials)
    assert ok.user_attrs["verl_overrides"] == '{"x.kind": "ok"}'


def test_multi_objective_health_is_a_constraint(ray_local, tmp_path):
    study = _run(tmp_path, metric=["val", "kl"], mode=["max", "min"],
                 kinds=["ok", "sick", "ok", "nan", "broken", "flat"], constraints=True)
    states = sorted((t.params["kind"], t.state.name) for t in study.trials)
    assert states == [("broken", "FAIL"), ("flat", "FAIL"), ("nan", "FAIL"), ("ok", "COMPLETE"), ("ok", "COMPLETE"),
                      ("sick", "COMPLETE")]
    # broken and flat had both objectives when stopped (val 0.2 at step 2; kl): still FAIL, not infeasible COMPLETE
    # "sick" was stopped at step 3 with both objectives known (val 0.2 at step 2, kl 0.03 at step 3): it is kept
    # with those values, infeasible, so the sampler learns from it and the Pareto front excludes it.
    (sick,) = [t for t in study.trials if t.params["kind"] == "sick"]
    assert sick.constraints == {"0": 1.0}
    assert sick.values == [pytest.approx(0.2), pytest.approx(0.03)]
    front = study.best_trials
    assert front and all(t.params["kind"] == "ok" for t in front)
    assert all(t.constraints == {"0": -1.0} for t in front)
    for t in front:
        assert t.values == [pytest.approx(0.6), pytest.approx(0.006)]
    assert not any(math.isnan(v) for t in front for v in t.values)


def test_a_step_run_again_replaces_the_abandoned_runs_value(tmp_path):
    # A remedy restarts a trial from its checkpoint of step 3 (klsweep.orchestrate.remedy): step 4 is reported again
    # by the restarted run, and a health stop there makes it PRUNED, whose value Optuna takes from the last
    # intermediate value: the restarted run's 0.1, as in trials.csv, not the abandoned run's 0.4
    from klsweep.results import HEALTH, STEP, STOP_KIND, STOP_REASON

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'study.db'}")
    searcher = KlsweepSearch(space=_space, metric="val", mode="max", sampler=optuna.samplers.RandomSampler(seed=0),
                             study_name="s", storage=storage, overrides_of=_overrides, total_steps=STEPS)
    assert searcher.suggest("t1") is not None
    for step, val in ((2, 0.2), (4, 0.4), (4, 0.1)):
        searcher.on_trial_result("t1", {"val": val, "training_iteration": step})
    searcher.on_trial_complete("t1", {"val": 0.1, "training_iteration": 4, STEP: 4, HEALTH: "stopped",
                                      STOP_REASON: "diverged at step 4 by kl_high", STOP_KIND: "diverged"})
    [trial] = optuna.load_study(study_name="s", storage=storage).trials
    assert trial.state == optuna.trial.TrialState.PRUNED
    assert trial.intermediate_values == {2: pytest.approx(0.2), 4: pytest.approx(0.1)}
    assert trial.value == pytest.approx(0.1)


def test_a_proposed_trial_records_its_overrides_before_it_reports(tmp_path):
    """The full verl overrides are a user attribute from the moment the trial is proposed: a running trial's row in
    trials.csv and `sweep status` read them, not just its searched parameters."""
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'study.db'}")
    searcher = KlsweepSearch(space=_space, metric="val", mode="max", sampler=optuna.samplers.RandomSampler(seed=0),
                             study_name="proposed", storage=storage, overrides_of=_overrides, total_steps=STEPS)
    params = searcher.suggest("trial-a")
    running = optuna.load_study(study_name="proposed", storage=storage).trials[0]
    assert running.state == optuna.trial.TrialState.RUNNING
    assert running.user_attrs["verl_overrides"] == '{"x.kind": "%s"}' % params["kind"]
    assert running.user_attrs["ray_trial_id"] == "trial-a"
