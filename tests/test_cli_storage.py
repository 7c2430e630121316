"""`sweep run --storage URL`: a storage Optuna cannot open is refused in one line before anything is written, and a
sweep directory whose saved storage cannot be opened is refused by `sweep status`, `sweep resume` and
`sweep run --resume` with the fix."""

from __future__ import annotations

import pytest

from klsweep.cli import main
from klsweep.results import SweepRecord
from klsweep.spec import load_sweep
from tests.orchestrate.conftest import sweep_file

#: URLs Optuna cannot open, and the reason it gives (the first line of its error).
BAD = {
    "mysql://nope": "Failed to import DB access module for the specified storage URL",  # no MySQLdb driver
    "garbage": "Could not parse SQLAlchemy URL from given URL string",
    "sqlite:///{tmp}/no/such/folder/x.db": "unable to open database file",
}


@pytest.mark.parametrize("url", BAD)
def test_a_storage_optuna_cannot_open_is_one_line_and_no_results_directory(tmp_path, capsys, url):
    url = url.format(tmp=tmp_path)
    out = tmp_path / "out"
    assert main(["run", sweep_file(tmp_path), "--out", str(out), "--storage", url]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"sweep run: error: --storage {url}: Optuna cannot open it (")
    assert BAD[url.replace(str(tmp_path), "{tmp}")] in err
    assert "nothing was written" in err and "leave out --storage" in err
    assert not out.exists()  # the retry with a good URL is not refused as "already holds a sweep"


def test_a_storage_that_opens_is_not_left_behind_by_the_check(tmp_path, capsys):
    db, out = tmp_path / "study.db", tmp_path / "out"
    assert main(["run", sweep_file(tmp_path), "--out", str(out), "--storage", f"sqlite:///{db}",
                 "budget.trials=0"]) == 2
    assert "budget.trials" in capsys.readouterr().err  # past the storage check, refused by the sweep file's
    assert not db.exists() and not out.exists()


def _leftover(tmp_path, storage: str):
    """A sweep directory holding only the ``sweep.json`` of a run whose storage was never opened."""
    path = sweep_file(tmp_path)
    sweep = load_sweep(path, ["budget.trials=1"])
    out = tmp_path / "out"
    out.mkdir()
    SweepRecord(name=sweep.name, sweep_file=path, overrides=["budget.trials=1"], study_name=sweep.name,
                storage=storage, objectives=[o.model_dump() for o in sweep.objectives],
                sweep=sweep.model_dump(mode="json")).write(out)
    return path, out


@pytest.mark.parametrize("url", BAD)
def test_a_saved_storage_that_cannot_be_opened_is_one_line_with_the_fix(tmp_path, capsys, url):
    url = url.format(tmp=tmp_path)
    path, out = _leftover(tmp_path, url)
    for argv in (["status", str(out)], ["resume", str(out)], ["run", path, "--out", str(out), "--resume"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err
        assert err.startswith(f"sweep {argv[0]}: error: {out}: its Optuna storage {url} (sweep.json) cannot be opened")
        assert BAD[url.replace(str(tmp_path), "{tmp}")] in err
        assert f"no trial ran there: start the sweep again with a storage that opens: sweep run {path} " \
               f"budget.trials=1 --out {out} --overwrite" in err
    assert sorted(p.name for p in out.iterdir()) == ["sweep.json"]


def test_a_saved_storage_gone_after_trials_ran_says_to_make_it_reachable_not_to_overwrite(tmp_path, capsys):
    _, out = _leftover(tmp_path, "mysql://nope")
    trial = out / "tune" / "trainable_abc_00000"
    trial.mkdir(parents=True)
    (trial / "result.json").write_text('{"trial_id": "abc", "step": 1}\n')
    assert main(["status", str(out)]) == 2
    err = capsys.readouterr().err
    assert "its trials' results are in tune/: make the storage reachable again" in err and "--overwrite" not in err


def test_a_storage_holding_a_study_of_the_sweeps_name_from_another_directory_is_refused(tmp_path, capsys):
    """Two sweeps of one name into one --storage: the second loaded the first's study, ran its budget minus the
    first's trials, and both directories showed both sweeps' trials."""
    import optuna

    db = tmp_path / "shared.db"
    url = f"sqlite:///{db}"
    path = sweep_file(tmp_path)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="tiny", storage=url)
    study.add_trial(optuna.trial.create_trial(value=0.5))  # the other directory's sweep, one trial
    for out, extra in ((tmp_path / "b", []), (tmp_path / "a", ["--overwrite"])):
        if extra:  # a directory whose own sweep recorded another study there: --overwrite does not delete this one
            out.mkdir()
            sweep = load_sweep(path)
            SweepRecord(name="tiny", sweep_file=path, study_name="tiny-a", storage=url,
                        objectives=[o.model_dump() for o in sweep.objectives],
                        sweep=sweep.model_dump(mode="json")).write(out)
        assert main(["run", path, "--out", str(out), "--storage", url, *extra]) == 2
        err = capsys.readouterr().err.splitlines()[-1]  # after the preflight's warnings, one line
        assert err.startswith("sweep run: error: ") and "Traceback" not in err, err
        assert (f"--storage {url} already holds a study named 'tiny' (1 trials) of another sweep directory" in err
                and "name=tiny-2" in err and f"optuna delete-study --study-name tiny --storage {url}" in err), err
        assert sorted(p.name for p in out.iterdir()) == ["driver.lock", "sweep.json"] if extra else not out.exists()
    assert len(optuna.load_study(study_name="tiny", storage=url).trials) == 1  # the other sweep's study untouched
