"""The confirmation phase's Tune trials (budget.confirm): a real tabular sweep whose re-runs are the table's recorded
runs, and `sweep resume` of a sweep whose driver was killed during the phase."""

from __future__ import annotations

import gzip
import json
import os
import signal
import statistics
import subprocess
import sys
import time

import optuna
import pandas as pd
import pytest
import yaml

from klsweep.cli import main
from tests.conftest import REPO
from tests.orchestrate.conftest import sweep_file

VAL = "val-core/arith/acc/mean@1"
DRGRPO_TABLE = REPO / "benchmarks" / "tabular" / "drgrpo_vs_grpo.jsonl.gz"
FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL)


def _table_runs() -> dict[tuple, dict[int, float]]:
    """The drgrpo table's validation accuracy at step 20, by (norm_adv, loss_agg_mode, lr) and seed: read with
    gzip + json, not through klsweep."""
    with gzip.open(DRGRPO_TABLE, "rt") as f:
        records = [json.loads(line) for line in f][1:]
    out: dict[tuple, dict[int, float]] = {}
    for r in records:
        p = r["params"]
        key = (p["algorithm.norm_adv_by_std_in_grpo"], p["actor_rollout_ref.actor.loss_agg_mode"],
               p["actor_rollout_ref.actor.optim.lr"])
        out.setdefault(key, {})[r["seed"]] = float(r["metrics"][VAL][r["steps"].index(20)])
    return out


def _key(params: dict) -> tuple:
    return (params["algorithm.norm_adv_by_std_in_grpo"], params["actor_rollout_ref.actor.loss_agg_mode"],
            params["actor_rollout_ref.actor.optim.lr"])


@pytest.mark.slow
def test_a_tabular_sweep_confirms_its_leaders_with_the_tables_runs(ray_local, tmp_path, capsys):
    sweep = yaml.safe_load((REPO / "sweeps" / "drgrpo_vs_grpo.yaml").read_text())
    sweep.update(name="confirm_tab", trainer="tabular", tabular={"table": str(DRGRPO_TABLE)},
                 budget={"trials": 4, "max_concurrent": 2, "max_steps": 20, "confirm": {"top": 2, "seeds": 2}})
    path = tmp_path / "confirm.yaml"
    path.write_text(yaml.safe_dump(sweep, sort_keys=False))
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    study = optuna.load_study(study_name="confirm_tab", storage=f"sqlite:///{out / 'study.db'}")
    search = [t for t in study.trials if "confirm_of" not in t.user_attrs]
    runs = [t for t in study.trials if "confirm_of" in t.user_attrs]
    assert len(search) == 4
    healthy = [t for t in search if t.state == optuna.trial.TrialState.COMPLETE and t.user_attrs["health"] != "stopped"]
    top = [t.number for t in sorted(healthy, key=lambda t: (-t.values[0], t.number))[:2]]
    expected = {(n, s) for n in top for s in (1, 2)} | ({(0, 1), (0, 2)} if 0 not in top else set())
    assert {(t.user_attrs["confirm_of"], t.user_attrs["confirm_seed"]) for t in runs} == expected
    assert len(runs) == len(expected)  # each run once
    table = _table_runs()
    by_number = {t.number: t for t in study.trials}
    for t in runs:
        leader = by_number[t.user_attrs["confirm_of"]]
        assert {k: v for k, v in t.params.items() if k != "data.seed"} == leader.params
        assert t.params["data.seed"] == t.user_attrs["confirm_seed"]
        assert t.values[0] == table[_key(leader.params)][t.params["data.seed"]]  # the table's run of that seed
    csv = pd.read_csv(out / "trials.csv")
    assert sorted(csv.loc[csv["confirm_of"].notna(), "number"]) == sorted(t.number for t in runs)
    assert set(csv.loc[csv["confirm_of"].isna(), "config/data.seed"]) == {0}
    # the ranking: mean over the table's seeds 0, 1, 2 of each confirmed config
    means = {n: statistics.mean(table[_key(by_number[n].params)].values()) for n, _ in expected}
    winner = max(means, key=lambda n: (means[n], -n))
    name = "the seed preset (trial 0)" if winner == 0 else f"trial {winner}"
    assert f"by mean over seeds, {name} leads: {VAL} mean {means[winner]:.4g}" in printed
    assert f"winner (the leader by mean over seeds): trial {winner} (" in printed
    assert "confirmation: 4 of 4 runs finished" in subprocess.run(
        [sys.executable, "-m", "klsweep.cli", "status", str(out)], capture_output=True, text=True, timeout=120).stdout


@pytest.mark.slow
@pytest.mark.fault
def test_resume_of_a_sweep_killed_during_its_confirmation_phase(tmp_path):
    """SIGKILL of the driver once a confirmation run has finished and the next one runs: the resume runs each
    planned run exactly once, keeps what finished, and leaves nothing RUNNING."""
    out = tmp_path / "out"
    path = sweep_file(tmp_path, "confirm_kill", parameters={"kl_coef": {"distribution": "log_uniform_values",
                                                                         "min": 0.0005, "max": 0.005}},
                      budget={"trials": 3, "max_concurrent": 1, "max_steps": 4, "confirm": {"top": 2, "seeds": 2}},
                      health="default")
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    driver = subprocess.Popen([sys.executable, "-m", "klsweep.cli", "run", path, "--out", str(out), "--quiet"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def confirmation(states):
        try:
            study = optuna.load_study(study_name="confirm_kill", storage=f"sqlite:///{out / 'study.db'}")
            return [t for t in study.trials if "confirm_of" in t.user_attrs and t.state in states]
        except Exception:  # the study is not created yet
            return []

    deadline = time.monotonic() + 400
    while not (confirmation(FINISHED) and confirmation((optuna.trial.TrialState.RUNNING,))):
        assert driver.poll() is None, f"the sweep ended before it could be killed:\n{driver.stdout.read()}"
        assert time.monotonic() < deadline, "no confirmation run finished in time"
        time.sleep(0.2)
    done_before = {t.number: (t.state, t.values) for t in confirmation(FINISHED)}
    driver.send_signal(signal.SIGKILL)
    driver.wait()

    resumed = subprocess.run([sys.executable, "-m", "klsweep.cli", "resume", str(out), "--quiet"], env=env,
                             capture_output=True, text=True, timeout=400)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    study = optuna.load_study(study_name="confirm_kill", storage=f"sqlite:///{out / 'study.db'}")
    assert not [t.number for t in study.trials if t.state not in FINISHED]
    search = [t for t in study.trials if "confirm_of" not in t.user_attrs]
    runs = [t for t in study.trials if "confirm_of" in t.user_attrs]
    assert len(search) == 3
    healthy = [t for t in search if t.state == optuna.trial.TrialState.COMPLETE and t.user_attrs["health"] != "stopped"]
    top = [t.number for t in sorted(healthy, key=lambda t: (-t.values[0], t.number))[:2]]
    pairs = [(t.user_attrs["confirm_of"], t.user_attrs["confirm_seed"]) for t in runs]
    assert sorted(pairs) == sorted((n, s) for n in top for s in (1, 2))  # every planned run, each once
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in runs)
    assert {t.number: (t.state, t.values) for t in runs if t.number in done_before} == done_before
    ray_ids = [t.user_attrs["ray_trial_id"] for t in study.trials]
    assert len(set(ray_ids)) == len(ray_ids)  # each Tune trial told once
    assert "by mean over seeds" in resumed.stdout


def test_a_confirmation_trial_a_killed_driver_left_without_params_is_adopted(tmp_path):
    """The killed driver asked Optuna for an enqueued confirmation run (RUNNING, its user attrs set) and died before
    the trial's params were suggested. The resumed driver's searcher adopts it and suggests the enqueued values into
    it; its own study object had never read that trial (Optuna's cached storage raised KeyError on the trial id)."""
    from klsweep.analysis.sweep_dir import storage_from_url
    from klsweep.orchestrate.confirm_search import SEED_KEY, ConfirmSearch, Phase
    from klsweep.results import ATTR_CONFIRM_OF, ATTR_CONFIRM_SEED

    url = f"sqlite:///{tmp_path / 'study.db'}"
    killed = optuna.create_study(study_name="s", storage=url, direction="maximize")
    killed.add_trial(optuna.trial.create_trial(params={"x": 0.25}, value=0.7,
                                               distributions={"x": optuna.distributions.FloatDistribution(0, 1)}))
    killed.enqueue_trial({"x": 0.25, SEED_KEY: 3}, user_attrs={ATTR_CONFIRM_OF: 0, ATTR_CONFIRM_SEED: 3})
    orphan = killed.ask()
    assert orphan.params == {} and killed.trials[1].state == optuna.trial.TrialState.RUNNING

    def space(trial):
        trial.suggest_float("x", 0, 1)
        return {}

    search = ConfirmSearch(phase=Phase([], [orphan._trial_id]), space=space, metric="m", mode="max",
                           study_name="s", storage=storage_from_url(url), overrides_of=lambda p: p, total_steps=4)
    assert search.suggest("t1") == {"x": 0.25, SEED_KEY: 3}
    stored = optuna.load_study(study_name="s", storage=url).trials
    assert len(stored) == 2 and stored[1].params == {"x": 0.25, SEED_KEY: 3}
    assert search.suggest("t2") == "FINISHED"
