"""best_trials: the best healthy trial (one objective) or the Pareto front (several), via analysis.pareto_front."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd

from klsweep.analysis.summary import best_trials
from klsweep.spec.schema import Objective


def sweep_of(*objectives):
    return SimpleNamespace(objectives=[Objective(metric=m, mode=mode) for m, mode in objectives])


DF = pd.DataFrame({
    "number": [0, 1, 2, 3],
    "state": ["COMPLETE", "COMPLETE", "COMPLETE", "PRUNED"],
    "health": ["healthy", "healthy", "stopped", "stopped"],
    "value/score": [0.5, 0.7, 0.9, None],
    "value/kl": [0.1, 0.3, 0.01, None],
    "config/actor_rollout_ref.actor.use_kl_loss": [True, True, True, True],
})


def test_best_trial_single_objective_skips_stopped():
    # trial 2 has the top score but a health rule stopped it
    assert list(best_trials(sweep_of(("score", "max")), DF)["number"]) == [1]


def test_front_several_objectives():
    # feasible: 0 (0.5, 0.1) and 1 (0.7, 0.3): neither dominates the other; 2 is infeasible
    assert list(best_trials(sweep_of(("score", "max"), ("kl", "min")), DF)["number"]) == [0, 1]
    # all infeasible: empty, no exception, and the front says so
    front = best_trials(sweep_of(("score", "max"), ("kl", "min")), DF.assign(health="stopped"))
    assert front.empty and "no feasible trial" in front.attrs["notes"][0]


def test_short_numbers():
    from klsweep._format import short

    assert [short(v) for v in (0.711328125, float("nan"), 80, None, "x")] == ["0.7113", "nan", "80", "", "x"]


def test_summary_prints_compute_saved_per_stop_reason(tmp_path):
    import io

    from rich.console import Console

    from klsweep.analysis.summary import print_summary
    from klsweep.spec import load_sweep
    from tests.orchestrate.conftest import sweep_file

    sweep = load_sweep(sweep_file(tmp_path, budget={"max_steps": 40, "resources": {"cpu": 1, "gpu": 2}}))
    df = pd.DataFrame({
        "number": [0, 1, 2], "trial_id": ["a", "b", "c"], "state": ["COMPLETE", "PRUNED", "PRUNED"],
        "health": ["healthy", "stopped", "healthy"], "steps": [40, 10, 30], "wall_s": [400.0, 100.0, 300.0],
        "stop_reason": ["", "diverged at step 10 by kl_runaway: KL 2 > 1", "stopped by the scheduler at step 30"],
        "stop_kind": ["", "diverged", ""], "value/val-core/arith/acc/mean@1": [0.6, None, None],
    })
    out = io.StringIO()
    print_summary(sweep, df, tmp_path, console=Console(file=out, width=300))
    lines = out.getvalue().splitlines()
    # used 80 steps, saved 30 (kl_runaway) + 10 (scheduler) = 40 of 120; GPU-h: 800 s x 2 used, (300 + 100) s x 2 saved
    assert "compute: 80 trial-steps used, 40 saved (33.3% of 120); 0.444 GPU-h used, 0.222 saved (33.3%)" in lines
    rows = {line.split("│")[0].strip(): [c.strip() for c in line.split("│")[1:]] for line in lines if "│" in line}
    assert rows["health: kl_runaway"] == ["1", "10", "30", "25.0%", "0.0556", "0.167"]
    assert rows["scheduler"] == ["1", "30", "10", "8.3%", "0.167", "0.0556"]  # 300 s x 2 used, 10 x 10 s x 2 saved


def test_summary_reruns_a_remedied_best_trial_as_its_schedule(tmp_path):
    import io
    import json

    from rich.console import Console

    from klsweep.analysis.summary import print_summary
    from klsweep.spec import load_sweep
    from tests.orchestrate.conftest import sweep_file

    sweep = load_sweep(sweep_file(tmp_path, budget={"max_steps": 40}))
    kl = "algorithm.kl_ctrl.kl_coef"
    remedies = [{"restart": 1, "step": 30, "rule": "kl_runaway", "from_step": 20, "key": kl, "old": 0.01, "new": 0.015}]
    df = pd.DataFrame({
        "number": [0], "trial_id": ["a"], "state": ["COMPLETE"], "health": ["healthy"], "steps": [40],
        "wall_s": [400.0], "stop_reason": [""], "stop_kind": [""], "value/val-core/arith/acc/mean@1": [0.6],
        f"config/{kl}": [0.01], "config/algorithm.use_kl_in_reward": [True], "remedies": [json.dumps(remedies)],
    })
    out = io.StringIO()
    print_summary(sweep, df, tmp_path, console=Console(file=out, width=400))
    lines = out.getvalue().splitlines()
    verl = [line for line in lines if line.startswith("python3 -m verl.trainer.main_ppo")]
    assert len(verl) == 2 and f"{kl}=0.01 " in verl[0] + " " and "resume" not in verl[0]
    assert f"{kl}=0.015 " in verl[1] and "global_step_20" in verl[1]
    assert any(line.startswith(f"segment 2 of 2: steps 21 to the end from the checkpoint of step 20 with {kl}=0.015")
               for line in lines)
    assert not [line for line in lines if line.startswith("python3 -m klsweep.trainers.embedded")]  # on request:
    every = io.StringIO()
    print_summary(sweep, df, tmp_path, console=Console(file=every, width=400), every_command=True)
    embedded = [line for line in every.getvalue().splitlines()
                if line.startswith("python3 -m klsweep.trainers.embedded")]
    assert len(embedded) == 2 and "global_step_20" in embedded[1]  # each segment on the embedded trainer too
    # the restart at step 30 from 20 ran 10 steps again: 40 + 10 used
    assert "compute: 50 trial-steps used (of which 10 run again after remedies), none saved (no trial stopped early)" \
        in lines


def test_stopped_trials_are_neither_running_nor_remedied(tmp_path):
    """After Ctrl-C a running trial, and one whose last report planned a remedy, are not listed as stopped."""
    import io

    from rich.console import Console

    from klsweep.analysis.summary import print_summary
    from klsweep.spec import load_sweep
    from tests.orchestrate.conftest import sweep_file

    sweep = load_sweep(sweep_file(tmp_path, budget={"max_steps": 80}))
    df = pd.DataFrame({
        "number": [0, 1, 2], "trial_id": ["a", "b", "c"], "state": ["RUNNING", "RUNNING", "PRUNED"],
        "health": ["warned", "healthy", "stopped"], "steps": [43, 20, 50], "wall_s": [43.0, 20.0, 50.0],
        "stop_reason": ["remedied: kl_runaway at step 43: restarted from step 28 with kl_coef 0.001 → 0.0015", "",
                        "hacked at step 50 by reward_hacking: score up, KL up"],
        "stop_kind": ["", "", "hacked"], "value/val-core/arith/acc/mean@1": [None, None, None],
    })
    out = io.StringIO()
    print_summary(sweep, df, tmp_path, console=Console(file=out, width=300), ended=False)
    text = out.getvalue()
    table = text[text.index("stopped trials"):]
    rows = [line for line in table.splitlines() if "│" in line and "stop_reason" not in line]
    assert [r.split("│")[0].strip() for r in rows][:1] == ["2"]
    assert "remedied:" not in text.split("saved by stop reason")[0]
    assert "hacked at step 50 by reward_hacking" in table


def test_a_failed_trial_shows_the_exception_it_raised(tmp_path):
    """The stopped-trials line of a failed trial is its exception's message, read from Ray Tune's error.txt."""
    import io

    from rich.console import Console

    from klsweep.analysis.summary import print_summary
    from klsweep.results import error_line
    from klsweep.spec import load_sweep
    from tests.orchestrate.conftest import sweep_file

    trial_dir = tmp_path / "tune" / "run_trial_2511a940_7_kl_coef=0.6337_2026-12-01_07-31-06"
    trial_dir.mkdir(parents=True)
    message = "loss_agg_mode='token-sum' was not recorded in t.jsonl.gz (its grid holds ['token-mean'])"
    (trial_dir / "error.txt").write_text(  # Trial.handle_error's layout: a header, then str(RayTaskError)
        "Failure # 1 (occurred at 2026-12-01_07-31-10)\nray::ImplicitFunc.train() (pid=16737)\n"
        '  File "/x/tabular.py", line 141, in nearest\n    raise OverrideError(\n'
        f"klsweep.errors.OverrideError: {message}\n")
    assert error_line(tmp_path, "2511a940") == f"OverrideError: {message}"
    assert error_line(tmp_path, "09d5b825") == ""  # no error.txt: the summary keeps the recorded reason

    sweep = load_sweep(sweep_file(tmp_path, budget={"max_steps": 80}))
    generic = "trial raised an error (see its error.txt in the Tune directory)"
    df = pd.DataFrame({
        "number": [0, 1], "trial_id": ["2511a940", "09d5b825"], "state": ["FAIL", "FAIL"],
        "health": ["healthy", "healthy"], "steps": [0, 0], "wall_s": [0.0, 0.0], "stop_reason": [generic, generic],
        "stop_kind": ["", ""], "value/val-core/arith/acc/mean@1": [None, None],
    })
    out = io.StringIO()
    print_summary(sweep, df, tmp_path, console=Console(file=out, width=400), ended=False)
    rows = {line.split("│")[0].strip(): line.split("│")[-1].strip() for line in out.getvalue().splitlines()
            if "│" in line and "FAIL" in line}
    assert rows == {"0": f"OverrideError: {message}", "1": generic}


def test_summary_names_the_study_where_its_storage_is(tmp_path):
    import io

    from rich.console import Console

    from klsweep.analysis.summary import print_summary
    from klsweep.results import SweepRecord
    from klsweep.spec import load_sweep
    from tests.orchestrate.conftest import sweep_file

    path = sweep_file(tmp_path)
    sweep = load_sweep(path)
    df = pd.DataFrame({
        "number": [0], "trial_id": ["a"], "state": ["COMPLETE"], "health": ["healthy"], "steps": [4],
        "wall_s": [4.0], "stop_reason": [""], "stop_kind": [""], "value/val-core/arith/acc/mean@1": [0.6],
        "config/algorithm.kl_ctrl.kl_coef": [0.01],
    })
    out = tmp_path / "out"
    out.mkdir()

    def last_line(storage: str | None) -> str:
        if storage is not None:
            SweepRecord(name=sweep.name, sweep_file=path, study_name=sweep.name, storage=storage,
                        objectives=[o.model_dump() for o in sweep.objectives],
                        sweep=sweep.model_dump(mode="json")).write(out)
        text = io.StringIO()
        print_summary(sweep, df, out, console=Console(file=text, width=400))
        return text.getvalue().splitlines()[-1]

    assert last_line(None) == f"results: {out} (trials.csv, study.db, tune/)"  # no sweep.json: the default
    assert last_line("sqlite:///study.db") == f"results: {out} (trials.csv, study.db, tune/)"
    custom = tmp_path / "custom study.db"
    assert last_line(f"sqlite:///{custom}") == f"results: {out} (trials.csv, tune/; study: sqlite:///{custom})"
    assert last_line(f"journal://{tmp_path}/study.log") == (
        f"results: {out} (trials.csv, tune/; study: journal://{tmp_path}/study.log)")
    assert last_line(f"journal://{out}/study.log") == f"results: {out} (trials.csv, study.log, tune/)"
    assert last_line("postgresql://klsweep:secret@db.example/sweeps") == (
        f"results: {out} (trials.csv, tune/; study: postgresql://klsweep:***@db.example/sweeps)")
