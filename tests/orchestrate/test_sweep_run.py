"""`sweep run` end to end: a real sweep on the embedded trainer through real Ray Tune and Optuna."""

from __future__ import annotations

import json
import shutil

import optuna
import pandas as pd
import pytest
import yaml

from klsweep.cli import main
from klsweep.orchestrate.searcher import KlsweepSearch

pytestmark = pytest.mark.slow

STEPS = 4
LR = "actor_rollout_ref.actor.optim.lr"
SEEDS = [  # the seed preset first, then one trial per outcome
    {"kl_coef": 0.002, LR: 0.0003},  # healthy: runs its 4 steps
    {"kl_coef": 0.05, LR: 0.0003},  # β above the rule's 0.01: stopped at step 1
    # the actor's weights overflow and sampling raises (torch.multinomial on NaN probabilities): crashes. (A value
    # verl asserts on at its first update, clip_ratio_c 0.5, is refused by preflight before the sweep starts.)
    {"kl_coef": 0.002, LR: 1e6},
]


def tiny_sweep(tmp_path, **extra) -> str:
    """A PPO sweep small enough for a test: 4-prompt × 2-sample batches, 4 steps, validation every 2 steps."""
    sweep = {
        "name": "tiny",
        "algorithm": "ppo",
        "overrides": {
            "algorithm.kl_ctrl.type": "fixed",
            "data.train_batch_size": 4,
            "actor_rollout_ref.rollout.n": 2,
            "trainer.test_freq": 2,
        },
        "parameters": {
            "kl_coef": {"values": [0.002, 0.05]},
            LR: {"values": [0.0003, 1e6]},
        },
        "seed_trials": SEEDS,
        "objective": {"metric": "val-core/arith/acc/mean@1", "mode": "max"},
        "sampler": "random",
        "budget": {"trials": 3, "max_concurrent": 2, "max_steps": STEPS},
        "health": {
            "preset": "default",
            "rules": [{"name": "beta_high", "metric": "actor/reward_kl_penalty_coeff", "above": 0.01,
                       "action": "stop", "kind": "diverged", "advice": "lower kl_coef"}],
        },
        **extra,
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(sweep, sort_keys=False))
    return str(path)


#: Ray trial id → (the step the searcher was told the trial ended at, the last step of its ``result.json`` in the
#: sweep directory at that moment), recorded by ``tiny_run``.
TOLD: dict[str, tuple[int, int | None]] = {}


def _stored_last_step(out, trial_id: str) -> int | None:
    for path in (out / "tune").glob("*/result.json"):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if rows and rows[0].get("trial_id") == trial_id:
            return rows[-1]["step"]
    return None


@pytest.fixture(scope="module")
def tiny_run(ray_local, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("sweep")
    out = tmp_path / "out"
    tell = KlsweepSearch.on_trial_complete

    def told(self, trial_id, result=None, error=False):
        if result and not error:
            TOLD[trial_id] = (result["step"], _stored_last_step(out, trial_id))
        return tell(self, trial_id, result=result, error=error)

    # Tune copies its staging result.json to the sweep directory every TUNE_GLOBAL_CHECKPOINT_S (10 s by default);
    # 600 s: only a copy made at the trial's end can be there when the searcher is told
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(KlsweepSearch, "on_trial_complete", told)
        patch.setenv("TUNE_GLOBAL_CHECKPOINT_S", "600")
        code = main(["run", tiny_sweep(tmp_path), "--out", str(out), "--quiet"])
    return code, out


def test_a_trial_s_results_are_in_the_sweep_directory_when_the_study_says_it_ended(tiny_run):
    """`sweep status` read a trial as COMPLETE with the numbers of an earlier step for a second or two: the study was
    told at once, the sweep directory's result.json only at Tune's next sync."""
    assert len(TOLD) == 2, TOLD  # the healthy trial (4 steps) and the stopped one (1 step); the crash raised
    assert sorted(TOLD.values()) == [(1, 1), (STEPS, STEPS)]


def test_study_records_each_outcome(tiny_run):
    code, out = tiny_run
    assert code == 0  # a trial completed healthy
    info = json.loads((out / "sweep.json").read_text())
    study = optuna.load_study(study_name=info["study_name"], storage=f"sqlite:///{out / 'study.db'}")
    trials = sorted(study.trials, key=lambda t: t.number)
    assert [t.params for t in trials] == [{"algorithm.kl_ctrl.kl_coef": s["kl_coef"], LR: s[LR]} for s in SEEDS]
    healthy, stopped, crashed = trials
    assert healthy.state == optuna.trial.TrialState.COMPLETE and healthy.user_attrs["steps"] == STEPS
    assert 0.0 <= healthy.value <= 1.0
    assert stopped.state == optuna.trial.TrialState.PRUNED
    assert stopped.user_attrs["health"] == "stopped" and stopped.user_attrs["steps"] == 1
    assert "beta_high" in stopped.user_attrs["stop_reason"]
    assert crashed.state == optuna.trial.TrialState.FAIL
    assert crashed.user_attrs["stop_reason"].startswith("trial raised an error"), crashed.user_attrs
    assert not study.get_trials(states=(optuna.trial.TrialState.RUNNING,))
    overrides = json.loads(healthy.user_attrs["verl_overrides"])
    assert overrides["algorithm.use_kl_in_reward"] is True and overrides["algorithm.kl_ctrl.kl_coef"] == 0.002
    assert overrides["trainer.total_training_steps"] == STEPS


def test_trials_csv_matches_the_study(tiny_run):
    _, out = tiny_run
    info = json.loads((out / "sweep.json").read_text())
    study = optuna.load_study(study_name=info["study_name"], storage=f"sqlite:///{out / 'study.db'}")
    df = pd.read_csv(out / "trials.csv")
    assert list(df["number"]) == [t.number for t in study.trials]
    assert list(df["state"]) == [t.state.name for t in study.trials]
    assert list(df["trial_id"]) == [t.user_attrs["ray_trial_id"] for t in study.trials]
    assert list(df["config/algorithm.kl_ctrl.kl_coef"]) == [s["kl_coef"] for s in SEEDS]
    complete = df[df["state"] == "COMPLETE"].iloc[0]
    metric = "val-core/arith/acc/mean@1"
    assert complete[f"value/{metric}"] == pytest.approx(study.trials[0].value)
    assert complete[f"last/{metric}"] == pytest.approx(study.trials[0].value)
    assert complete["kl_metric"] == "actor/reward_kl_penalty"
    assert complete["steps"] == STEPS and complete["wall_s"] > 0
    # the per-step history holds the final step's validation value the study was told
    rows = [json.loads(line) for line in next((out / "tune").glob(f"*{complete['trial_id']}*/result.json")).open()]
    assert rows[-1][metric] == pytest.approx(study.trials[0].value)
    assert [r["training_iteration"] for r in rows] == list(range(1, STEPS + 1))


def test_rerun_into_the_same_directory_is_refused(tiny_run, tmp_path, capsys):
    _, out = tiny_run
    assert main(["run", tiny_sweep(tmp_path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--resume" in err and "--overwrite" in err and "Traceback" not in err


def test_a_copied_sweep_directory_reads_its_own_study(tiny_run, tmp_path):
    # sweep.json names the default storage relative to the directory: rsync from a cluster to a laptop just works,
    # and a copy never reads the original's study
    from klsweep.analysis import load

    _, out = tiny_run
    copy = tmp_path / "elsewhere" / "copy"
    shutil.copytree(out, copy)
    expected = load(out)
    (out / "study.db").rename(out / "study.db.away")
    try:
        assert main(["status", str(copy)]) == 0
        pd.testing.assert_frame_equal(load(copy), expected)
    finally:
        (out / "study.db.away").rename(out / "study.db")
