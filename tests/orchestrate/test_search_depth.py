"""Search depth on real sweeps (embedded trainer, real Ray Tune + Optuna): a 2-objective sweep whose health stops are
an Optuna constraint, every sampler name, ASHA on a single objective, and the refusals with their messages."""

from __future__ import annotations

import functools
import importlib.util
import json

import optuna
import pytest
from ray import tune

from klsweep.analysis import load, pareto_front
from klsweep.cli import main
from klsweep.errors import SweepFileError
from klsweep.orchestrate.samplers import build_sampler
from klsweep.orchestrate.searcher import KlsweepSearch
from klsweep.spec import load_sweep
from klsweep.spec.space import define_space, trial_overrides
from tests.orchestrate.conftest import KL, PARETO_SEEDS, VAL, sweep_file

pytestmark = pytest.mark.slow

State = optuna.trial.TrialState


def _study(out):
    info = json.loads((out / "sweep.json").read_text())
    return optuna.load_study(study_name=info["study_name"], storage=f"sqlite:///{out / 'study.db'}")


def _dominates(a, b):
    """a dominates b for (max accuracy, min KL)."""
    return a[0] >= b[0] and a[1] <= b[1] and (a[0] > b[0] or a[1] < b[1])


def test_pareto_front_holds_only_feasible_trials(pareto_run):
    study = _study(pareto_run)
    assert study.directions == [optuna.study.StudyDirection.MAXIMIZE, optuna.study.StudyDirection.MINIMIZE]
    trials = sorted(study.trials, key=lambda t: t.number)
    assert [t.params["algorithm.kl_ctrl.kl_coef"] for t in trials] == [s["kl_coef"] for s in PARETO_SEEDS]
    small, large, small2 = trials
    # kl_coef 0.05 > the rule's 0.01: stopped at step 2 (the first judged step), kept with both objectives, infeasible
    assert large.state == State.COMPLETE and large.user_attrs["health"] == "stopped"
    assert large.user_attrs["steps"] == 2 and "beta_high" in large.user_attrs["stop_reason"]
    assert large.constraints == {"0": 1.0}
    assert len(large.values) == 2 and all(v == v for v in large.values)
    for t in (small, small2):
        assert t.state == State.COMPLETE and t.user_attrs["steps"] == 4 and t.constraints == {"0": -1.0}
    # the front by hand: the non-dominated feasible trials
    feasible = [t for t in (small, small2)]
    expected = {t.number for t in feasible if not any(_dominates(o.values, t.values) for o in feasible if o is not t)}
    assert {t.number for t in study.best_trials} == expected
    assert large.number not in {t.number for t in study.best_trials}
    # the same front from the results table
    df = load(pareto_run)
    front = pareto_front(df, [(f"value/{VAL}", "max"), (f"value/{KL}", "min")])
    assert set(front["number"]) == expected
    row = df.set_index("number").loc[large.number]
    assert row["health"] == "stopped" and row["state"] == "COMPLETE"
    # the told values are each objective's last reported value, read back from Tune's result.json
    result = next((pareto_run / "tune").glob(f"*{large.user_attrs['ray_trial_id']}*/result.json"))
    rows = [json.loads(line) for line in result.open()]
    assert rows[-1]["training_iteration"] == 2
    assert large.values == [pytest.approx(rows[-1][VAL]), pytest.approx(rows[-1][KL])]


def test_asha_with_two_objectives_is_refused(tmp_path, capsys):
    path = sweep_file(tmp_path, objective=[{"metric": VAL, "mode": "max"}, {"metric": KL, "mode": "min"}],
                      scheduler={"type": "asha", "grace_period": 1, "reduction_factor": 2})
    assert main(["run", path, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "asha" in err and "single objective" in err and "scheduler: none" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def scored(config):
    """A trivial function trainable: 2 steps, an objective that peaks at kl_coef = 0.01 and a KL that falls with it."""
    for step in (1, 2):
        coef = config["algorithm.kl_ctrl.kl_coef"]
        tune.report({VAL: -abs(coef - 0.01) * step, KL: 1.0 / (1.0 + 100 * coef)})


SAMPLER_SPACES = {
    "tpe": {"kl_coef": {"distribution": "log_uniform_values", "min": 0.001, "max": 0.1},
            "kl_loss_type": {"values": ["k1", "k3"]}},
    "gp": {"kl_coef": {"distribution": "log_uniform_values", "min": 0.001, "max": 0.1}},
    "nsga2": {"kl_coef": {"values": [0.001, 0.01, 0.1]}},
    "random": {"kl_coef": {"distribution": "uniform", "min": 0.001, "max": 0.1}},
    "grid": {"kl_coef": {"values": [0.001, 0.01, 0.1]}},
    "cmaes": {"kl_coef": {"distribution": "uniform", "min": 0.001, "max": 0.1}},
}


@pytest.mark.parametrize("name", list(SAMPLER_SPACES))
def test_every_sampler_runs_through_klsweep_search(ray_local, tmp_path, name):
    multi = name == "nsga2"
    val, kl = {"metric": VAL, "mode": "max"}, {"metric": KL, "mode": "min"}  # names the embedded trainer logs
    objective = [val, kl] if multi else val
    sweep = load_sweep(sweep_file(tmp_path, parameters=SAMPLER_SPACES[name], sampler=name, objective=objective,
                                  budget={"trials": 4}, health="none"))
    if name == "gp" and importlib.util.find_spec("scipy") is None:  # GPSampler imports scipy only when it fits
        with pytest.raises(SweepFileError, match="gp needs scipy"):
            build_sampler(sweep)
        return
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'study.db'}")
    sampler = build_sampler(sweep)
    searcher = KlsweepSearch(
        space=define_space(sweep), metric=[VAL, KL] if multi else VAL, mode=["max", "min"] if multi else "max",
        sampler=sampler, study_name="s", storage=storage, overrides_of=functools.partial(trial_overrides, sweep),
        total_steps=2,
    )
    tune.Tuner(
        scored,
        tune_config=tune.TuneConfig(search_alg=searcher, num_samples=4, max_concurrent_trials=1, reuse_actors=True),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="tune", verbose=0),
    ).fit()
    study = optuna.load_study(study_name="s", storage=storage)
    assert len(study.trials) == 4 and all(t.state == State.COMPLETE for t in study.trials)
    coefs = [t.params["algorithm.kl_ctrl.kl_coef"] for t in study.trials]
    for t in study.trials:
        coef = t.params["algorithm.kl_ctrl.kl_coef"]
        assert t.values[0] == pytest.approx(-abs(coef - 0.01) * 2)
        assert json.loads(t.user_attrs["verl_overrides"])["algorithm.kl_ctrl.kl_coef"] == coef
    if name == "grid":  # GridSampler visits each grid point once before repeating
        assert sorted(coefs[:3]) == [0.001, 0.01, 0.1]
    else:
        assert all(0.001 <= c <= 0.1 for c in coefs)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"sampler": "grid",
          "parameters": {"kl_coef": {"distribution": "log_uniform_values", "min": 0.001, "max": 0.1}}},
         "parameters.algorithm.kl_ctrl.kl_coef: sampler grid needs `values: [...]` lists"),
        ({"sampler": "cmaes", "parameters": {"kl_coef": {"values": [0.001, 0.01]}}},
         "cmaes samples numeric, unconditional ranges only"),
        ({"sampler": "cmaes", "parameters": {"kl_coef": {"distribution": "uniform", "min": 0.001, "max": 0.1}},
          "objective": [{"metric": VAL, "mode": "max"}, {"metric": KL, "mode": "min"}]},
         "cmaes optimises a single objective"),
    ],
    ids=["grid-range", "cmaes-categorical", "cmaes-multi"],
)
def test_sampler_refusals_before_anything_starts(tmp_path, capsys, fields, message):
    out = tmp_path / "out"
    assert main(["run", sweep_file(tmp_path, **fields), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not out.exists()  # refused before the results directory or Ray


LRS = [1e-5, 1e-2, 3e-4, 3e-3, 1e-4, 3e-2]


def test_asha_prunes_trials_early_on_one_objective(ray_local, tmp_path):
    """ASHA (grace 1, reduction factor 2, max_t 4 steps) judges at the step-2 rung, the first validation step: a
    trial below the median of those already recorded there stops, and the study records it PRUNED by the scheduler."""
    out = tmp_path / "out"
    path = sweep_file(tmp_path, "asha", parameters={"actor_rollout_ref.actor.optim.lr": {"values": LRS}},
                      seed_trials=[{"actor_rollout_ref.actor.optim.lr": lr} for lr in LRS],
                      scheduler={"type": "asha", "grace_period": 1, "reduction_factor": 2},
                      budget={"trials": len(LRS)})
    main(["run", path, "--out", str(out), "--quiet"])
    study = _study(out)
    assert len(study.trials) == len(LRS)
    pruned = [t for t in study.trials if t.state == State.PRUNED and t.user_attrs["health"] != "stopped"]
    assert pruned, [(t.state.name, t.user_attrs) for t in study.trials]
    step2 = {}
    for t in study.trials:
        result = next((out / "tune").glob(f"*{t.user_attrs['ray_trial_id']}*/result.json"))
        rows = [json.loads(line) for line in result.open()]
        step2[t.number] = rows[1][VAL]
    for t in pruned:
        assert t.user_attrs["steps"] == 2 and t.user_attrs["stop_reason"] == "stopped by the scheduler at step 2"
        assert t.intermediate_values == {2: pytest.approx(step2[t.number])}
        assert step2[t.number] < max(v for n, v in step2.items() if n != t.number)  # below someone's value
    assert any(t.state == State.COMPLETE and t.user_attrs["steps"] == 4 for t in study.trials)
