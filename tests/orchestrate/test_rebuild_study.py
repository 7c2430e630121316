"""A missing, empty or corrupt study.db never loses a finished sweep: `status` and `resume` refuse it in one line and
name `sweep rebuild-study`, which rebuilds the study from `tune/` with the trials, states and values it held."""

from __future__ import annotations

import shutil
from pathlib import Path

import optuna
import pytest

from klsweep.cli import main
from tests.orchestrate.conftest import VAL, sweep_file


@pytest.fixture(scope="module")
def finished(ray_local, tmp_path_factory) -> Path:
    """A finished 2-trial sweep: kl_coef 0.002 runs its 4 steps (COMPLETE), 0.05 is stopped at step 2 (PRUNED)."""
    tmp = tmp_path_factory.mktemp("finished")
    path = sweep_file(tmp, seed_trials=[{"kl_coef": 0.002}, {"kl_coef": 0.05}],
                      budget={"trials": 2, "max_concurrent": 1})
    assert main(["run", path, "--out", str(tmp / "out"), "--quiet"]) == 0
    return tmp / "out"


def _trials(db: Path) -> list[tuple]:
    study = optuna.load_study(study_name="tiny", storage=f"sqlite:///{db}")
    return [(t.number, t.state.name, t.params, t.values, t.intermediate_values, t.user_attrs.get("ray_trial_id"),
             t.user_attrs.get("health"), t.user_attrs.get("steps")) for t in study.trials]


def _break(db: Path, how: str, good: bytes) -> None:
    if how == "removed":
        db.unlink()
    elif how == "emptied":
        db.write_bytes(b"")
    else:  # the first pages of the real file: SQLite's header, then nothing
        db.write_bytes(good[:3000])


@pytest.mark.parametrize("how", ["removed", "emptied", "corrupted"])
def test_status_and_resume_refuse_a_lost_study_and_change_nothing(finished, tmp_path, capsys, how):
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    db = out / "study.db"
    good = db.read_bytes()
    csv = (out / "trials.csv").read_bytes()
    _break(db, how, good)
    broken = db.read_bytes() if db.exists() else None
    capsys.readouterr()
    assert main(["status", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert str(db) in err and "holds 2 trial results" in err and f"sweep rebuild-study {out}" in err
    assert main(["resume", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"sweep rebuild-study {out}" in err and "Traceback" not in err
    assert (db.read_bytes() if db.exists() else None) == broken  # neither created nor changed
    assert (out / "trials.csv").read_bytes() == csv
    assert len(list((out / "tune").glob("run_trial_*"))) == 2  # resume ran nothing


def test_rebuild_study_restores_every_trial_and_resume_reruns_none(finished, tmp_path, capsys):
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    before = _trials(finished / "study.db")
    assert [t[1] for t in before] == ["COMPLETE", "PRUNED"]
    (out / "study.db").write_bytes((out / "study.db").read_bytes()[:3000])
    assert main(["rebuild-study", str(out)]) == 0
    said = capsys.readouterr().out
    assert "2 trials" in said and "1 COMPLETE, 1 PRUNED" in said
    assert len(list(out.glob("study.db.broken-*"))) == 1  # the corrupt file is kept
    assert _trials(out / "study.db") == before
    study = optuna.load_study(study_name="tiny", storage=f"sqlite:///{out / 'study.db'}")
    assert study.best_trial.params == {"algorithm.kl_ctrl.kl_coef": 0.002}
    assert study.metric_names == [VAL]
    assert main(["rebuild-study", str(out)]) == 2  # a readable study is never replaced
    assert "nothing to rebuild" in capsys.readouterr().err
    assert main(["resume", str(out), "--quiet"]) == 0
    assert _trials(out / "study.db") == before  # nothing ran again
    assert len(list((out / "tune").glob("run_trial_*"))) == 2
