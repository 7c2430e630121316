"""What the end of a sweep, ``sweep status`` and the report say of trials whose reproduce commands are not one plain
run: remedied trials (restart schedules that ran to their end, PRUNED in the study) and tabular trials (a recorded
run of the nearest grid point)."""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd
from rich.console import Console

from klsweep.analysis.frontier import sweep_frontier
from klsweep.analysis.report import write_report
from klsweep.analysis.status import status
from klsweep.analysis.summary import print_summary
from klsweep.analysis.sweep_dir import overrides_of
from klsweep.spec import load_sweep
from klsweep.trainers import reproduce_commands

from .conftest import KL_COEF, VAL, frontier_specs, make_sweep

REPO = Path(__file__).resolve().parents[2]
ONE = [{"metric": VAL, "mode": "max"}]


def _remedied(specs: list[dict], which: list[int], *, told: bool = True) -> list[dict]:
    """``specs`` with trials ``which`` remedied once (kl_runaway at step 4, restarted from step 2 with the KL
    coefficient doubled) and run to their end, recorded as the searcher records them; ``told``: with their values
    (Optuna keeps a one-objective PRUNED trial's last intermediate value, none of a trial of several objectives)."""
    for i in which:
        old = specs[i]["params"][KL_COEF]
        specs[i].update(state="PRUNED", health="warned", told=told,
                        stop_reason="remedied: a restart schedule, not one setting (1× kl_runaway@4 from 2 "
                                    f"kl_loss_coef {old:g}→{2 * old:g})",
                        remedies=[{"restart": 1, "step": 4, "rule": "kl_runaway", "from_step": 2, "key": KL_COEF,
                                   "old": old, "new": 2 * old}])
    return specs


def test_status_gives_the_best_remedied_run_as_its_schedule_when_no_setting_ran_unchanged(tmp_path):
    run_dir = make_sweep(tmp_path / "rem", _remedied(frontier_specs([1.0, 4.0]), [0, 1]), objectives=ONE)
    out = io.StringIO()
    assert status(str(run_dir), Console(file=out, width=2000)) == 0
    lines = out.getvalue().splitlines()
    assert "no setting completed unchanged; the best remedied run:" in lines
    verl = [line for line in lines if line.startswith("python3 -m verl.trainer.main_ppo")]
    assert len(verl) == 2 and "resume_from_path" not in verl[0] and "trainer.save_freq=2" in verl[0]
    assert "trainer.resume_mode=resume_path" in verl[1] and "global_step_2" in verl[1]
    assert f"{KL_COEF}=0.02 " in verl[1]  # trial 1 (the better score): 0.01 doubled by its remedy
    assert any(line.startswith("segment 2 of 2: steps 3 to the end from the checkpoint of step 2") for line in lines)
    assert f"the embedded trainer's own commands: sweep status {run_dir} --commands" in lines
    every = io.StringIO()
    status(str(run_dir), Console(file=every, width=2000), every_command=True)
    embedded = [line for line in every.getvalue().splitlines()
                if line.startswith("python3 -m klsweep.trainers.embedded")]
    assert len(embedded) == 2 and "global_step_2" in embedded[1]


def test_report_of_remedied_trials_gives_their_schedule_and_says_what_they_are(tmp_path):
    run_dir = make_sweep(tmp_path / "rem", _remedied(frontier_specs([1.0, 4.0]), [0, 1]), objectives=ONE)
    assert write_report(run_dir, tmp_path / "out", pngs=False) == 0
    page = (tmp_path / "out" / "report.html").read_text()
    winner = page.split('<h2 id="winner">')[1].split("<h2")[0]
    assert winner.count("<pre>python3 -m verl.trainer.main_ppo") == 2
    assert "trainer.resume_from_path=" in winner and "global_step_2" in winner
    assert "2 search trials, 0 feasible, 2 remedied (restart schedules that ran to the end" in page
    assert "no feasible trial: 2 of 2 search trials were remedied, restart schedules that ran to the end" in page
    assert "stopped by a health rule, pruned, failed" not in page
    assert "No feasible trial. Remedied, restart schedules that ran to the end: trial 0, trial 1.</p>" in page
    frontier = page.split('<h2 id="frontier">')[1].split("</p>")[0]
    assert frontier.endswith("KL frontier: not fitted: no feasible trial to fit: 2 remedied trials ran to the end as "
                             "restart schedules, not one setting each, and are left out of the fit")


def test_frontier_leaves_remedied_trials_out_of_its_fit_and_says_so(tmp_path):
    specs = _remedied(frontier_specs([1.0, 4.0, 9.0, 16.0, 25.0]), [4])
    fitted = sweep_frontier(make_sweep(tmp_path / "five", specs, objectives=ONE), references={}, n_boot=10)
    assert fitted.frontier is not None and fitted.frontier.n == 4 and fitted.remedied == 1
    assert fitted.summary().split("; ⚠")[0].endswith(
        "; 1 remedied trial ran to the end as a restart schedule, not one setting, and is left out of the fit")
    specs = _remedied(frontier_specs([1.0, 4.0, 9.0, 16.0]), [3])
    three = sweep_frontier(make_sweep(tmp_path / "four", specs, objectives=ONE), references={}, n_boot=10)
    assert three.frontier is None and three.reason == (
        f"the KL frontier needs at least 4 feasible trials with a reference KL, response_length/mean and {VAL} at one "
        "step; 3 so far; 1 remedied trial ran to the end as a restart schedule, not one setting, and is left out of "
        "the fit")


def test_a_tabular_trial_reruns_as_its_config_on_the_embedded_trainer_and_on_verl(tmp_path):
    sweep = load_sweep(REPO / "sweeps/conservative.yaml", [
        "trainer=tabular", "tabular={table: benchmarks/tabular/conservative.jsonl.gz}",
        "parameters.horizon={values: [5000]}",
        "objective=[{metric: val-core/arith/acc/mean@1, mode: max}, {metric: actor/reward_kl_penalty, mode: min}]"])
    kl = "algorithm.kl_ctrl.kl_coef"
    df = pd.DataFrame({
        "number": [3], "trial_id": ["a"], "state": ["COMPLETE"], "health": ["healthy"], "steps": [80],
        "wall_s": [1.0], "stop_reason": [""], "value/val-core/arith/acc/mean@1": [0.64],
        "value/actor/reward_kl_penalty": [0.019], f"config/{kl}": [0.82], "config/algorithm.use_kl_in_reward": [True],
        "config/data.train_batch_size": [16]})
    commands = reproduce_commands("tabular", overrides_of(df.iloc[0]))
    assert [label for label, _ in commands] == [
        "reproduce on the embedded trainer (the table served the recorded run of the grid point nearest this config):",
        "the same KL and algorithm settings on verl (add your model, data and batch sizes):"]
    assert commands[0][1].startswith("python3 -m klsweep.trainers.embedded ") and f"{kl}=0.82" in commands[0][1]
    assert commands[1][1].startswith("python3 -m verl.trainer.main_ppo ") and "data.train_batch_size" not in \
        commands[1][1]
    out = io.StringIO()
    print_summary(sweep, df, tmp_path, console=Console(file=out, width=2000))
    lines = out.getvalue().splitlines()
    assert "Pareto front (1 trial): none is better on every objective" in lines
    assert f"verl commands that reproduce them: sweep status {tmp_path} --commands" in lines
    every = io.StringIO()
    print_summary(sweep, df, tmp_path, console=Console(file=every, width=2000), every_command=True)
    printed = [line for line in every.getvalue().splitlines() if line.startswith("python3 -m ")]
    assert printed == [command for _, command in commands]


def test_a_sweep_of_several_objectives_whose_trials_were_all_remedied_names_them_and_their_commands(tmp_path):
    from .conftest import FRONTIER_OBJECTIVES

    run_dir = make_sweep(tmp_path / "rem2", _remedied(frontier_specs([1.0, 4.0]), [0, 1], told=False),
                         objectives=FRONTIER_OBJECTIVES)
    out = io.StringIO()
    assert status(str(run_dir), Console(file=out, width=2000)) == 0
    lines = out.getvalue().splitlines()
    assert "no setting completed unchanged; 2 remedied trials ran to the end as restart schedules, not settings: " \
        "trial 0, trial 1" in lines
    assert "no trial completed healthy: see trials.csv for the stop reasons" not in lines
    assert f"the commands that rerun each, one per restart segment: sweep status {run_dir} --commands" in lines
    every = io.StringIO()
    status(str(run_dir), Console(file=every, width=2000), every_command=True)
    text = every.getvalue().splitlines()
    assert "trial 0, a restart schedule:" in text and "trial 1, a restart schedule:" in text
    resumed = [line for line in text if line.startswith("python3 -m verl.trainer.main_ppo") and "global_step_2" in line]
    assert len(resumed) == 2  # segment 2 of each trial, on verl
