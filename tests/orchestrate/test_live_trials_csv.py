"""TrialsCsv keeps trials.csv current in the sweep directory the trial's Tune experiment is in (a moved one too), and a
table it cannot write is a warning, never a stopped sweep."""

from __future__ import annotations

import optuna
import pandas as pd
from ray.train._internal.storage import StorageContext
from ray.tune.experiment import Trial

from klsweep.orchestrate.live_trials_csv import TrialsCsv
from klsweep.results import SweepRecord, default_storage

VAL = "val-core/arith/acc/mean@1"
PARAMS = ["algorithm.kl_ctrl.kl_coef"]


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
