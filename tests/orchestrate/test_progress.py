"""The live view (SweepProgress) shows each trial's searched parameters by their verl leaf names, and a running
trial's step, KL, entropy and score, on a terminal's table and on the one line per finished trial a pipe gets.
TrialsCsv keeps trials.csv current in the sweep directory the trial's Tune experiment is in (a moved one too), and a
table it cannot write is a warning, never a stopped sweep."""

from __future__ import annotations

import io

import optuna
import pandas as pd
from ray.train._internal.storage import StorageContext
from ray.tune.experiment import Trial
from rich.console import Console

from klsweep.orchestrate.progress import SweepProgress, TrialsCsv
from klsweep.results import SweepRecord, default_storage

VAL = "val-core/arith/acc/mean@1"
PARAMS = ["algorithm.kl_ctrl.kl_coef", "actor_rollout_ref.actor.ppo_epochs", "critic.ppo_epochs"]


def test_live_view_shows_parameters_and_running_metrics():
    trial = Trial("run_trial", config={PARAMS[0]: 0.002, PARAMS[1]: 2, PARAMS[2]: 1}, trial_id="abc12345", stub=True)
    out = io.StringIO()
    progress = SweepProgress(3, [VAL], params=PARAMS, console=Console(file=out))  # a file: not a terminal
    progress.setup()
    progress.on_trial_result(1, [trial], trial, {"training_iteration": 3, "actor/reward_kl_penalty": 0.0125,
                                                 "actor/entropy": 1.25, "critic/score/mean": 0.375})
    wide = Console(file=io.StringIO(), width=300)
    wide.print(progress._table())
    header, _, row = wide.file.getvalue().splitlines()[:3]
    # ppo_epochs is the leaf of two searched keys: both keep their whole key
    assert [c.strip() for c in header.split("┃")] == ["trial", "status", "kl_coef", PARAMS[1], PARAMS[2], "step",
                                                       "KL", "entropy", "score", "arith", "health"]
    assert [c.strip() for c in row.split("│")] == ["abc12345", "RUNNING", "0.002", "2", "1", "3", "0.0125", "1.25",
                                                    "0.375", "", ""]
    assert out.getvalue() == ""  # a pipe gets finished trials only

    trial.run_metadata.last_result = {"training_iteration": 4, VAL: 0.5, "health": "healthy"}
    progress.on_trial_complete(2, [trial], trial)
    assert out.getvalue() == (f"[1/3] abc12345 TERMINATED kl_coef=0.002 {PARAMS[1]}=2 {PARAMS[2]}=1 step=4 "
                              f"{VAL}=0.5\n")

    # ended by ASHA before its last step: PRUNED, as the study records it, with the step it stopped at
    early = Trial("run_trial", config={PARAMS[0]: 0.01, PARAMS[1]: 1, PARAMS[2]: 1}, trial_id="def67890", stub=True)
    early.run_metadata.last_result = {"training_iteration": 10, "step": 10, "total_steps": 30, VAL: 0.25,
                                      "health": "healthy"}
    progress.on_trial_complete(3, [trial, early], early)
    assert out.getvalue().splitlines()[-1] == (f"[2/3] def67890 PRUNED kl_coef=0.01 {PARAMS[1]}=1 {PARAMS[2]}=1 "
                                               f"step=10 {VAL}=0.25 (stopped by the scheduler at step 10)")


def test_trials_csv_follows_the_trials_sweep_directory(tmp_path, capsys):
    out = tmp_path / "moved" / "out"  # wherever the sweep directory is now: Tune's restored storage says so
    out.mkdir(parents=True)
    SweepRecord(name="csv", sweep_file="csv.yaml", study_name="csv", storage=default_storage(),
                objectives=[{"metric": VAL, "mode": "max"}], sweep={}).write(out)
    study = optuna.create_study(study_name="csv", storage=f"sqlite:///{out / 'study.db'}", direction="maximize")
    running = study.ask({PARAMS[0]: optuna.distributions.FloatDistribution(0.0005, 0.1, log=True)})
    running.set_user_attr("ray_trial_id", "abc12345")  # as KlsweepSearch.suggest tags it
    trial = Trial("run_trial", stub=True, storage=StorageContext(storage_path=str(out), experiment_dir_name="tune"))
    TrialsCsv().on_trial_start(0, [trial], trial)
    table = pd.read_csv(out / "trials.csv")
    assert table.to_dict("records") == [{"number": 0, "trial_id": "abc12345", "state": "RUNNING",
                                         f"config/{PARAMS[0]}": running.params[PARAMS[0]]}]

    elsewhere = Trial("run_trial", stub=True,
                      storage=StorageContext(storage_path=str(tmp_path / "gone"), experiment_dir_name="tune"))
    TrialsCsv().on_trial_complete(1, [elsewhere], elsewhere)  # no sweep there: said, not raised
    assert "warning: trials.csv not updated (ResultsError:" in capsys.readouterr().err
