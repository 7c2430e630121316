"""The last screen of ``sweep run`` / ``sweep status`` in an 80-column terminal: the trials table with no number cut,
then the winner block (score, knob values, runner-up), ONE reproduce command (verl's) and where the files are."""

from __future__ import annotations

import io
import json
import shlex

import optuna
import pandas as pd
from rich.console import Console

from klsweep.analysis.status import status
from tests.analysis.conftest import KL_COEF, KL_TYPE, make_sweep, trial_spec

SCORE = "critic/score/mean"


def _single_objective_sweep(tmp_path):
    """Eight trials of tests/analysis/conftest (every 4th stopped), one objective, kl_coef and its estimator
    searched."""
    out = make_sweep(tmp_path / "win", 8, objectives=[{"metric": SCORE, "mode": "max"}])
    info = json.loads((out / "sweep.json").read_text())
    info["sweep"]["parameters"] = {KL_COEF: {"distribution": "log_uniform_values", "min": 1e-4, "max": 0.1},
                                   KL_TYPE: {"values": ["low_var_kl", "kl", "k2"]}}
    (out / "sweep.json").write_text(json.dumps(info))
    return out


def _terminal(width: int) -> Console:
    return Console(file=io.StringIO(), width=width, force_terminal=True, color_system=None)


def _plain_lines(console: Console) -> list[str]:
    return [line.rstrip() for line in console.file.getvalue().splitlines()]


def test_the_last_screen_fits_80_columns_and_names_the_winner(tmp_path):
    out = _single_objective_sweep(tmp_path)
    study = optuna.load_study(study_name="win", storage=f"sqlite:///{out / 'study.db'}")
    # the winner and runner-up computed from the study: healthy COMPLETE trials by their told value
    healthy = sorted((t for t in study.trials if t.user_attrs["health"] != "stopped"),
                     key=lambda t: (-t.values[0], t.number))
    best, second = healthy[0], healthy[1]
    console = _terminal(80)
    assert status(str(out), console=console) == 0
    lines = _plain_lines(console)
    # every line fits, but a path longer than a line: it is never split
    assert all(len(line) <= 80 or str(out) in line for line in lines), [line for line in lines if len(line) > 80]
    assert "…" not in console.file.getvalue()  # no number cut to fit

    start = next(i for i, line in enumerate(lines) if line.startswith("winner: "))
    screen = lines[start:]
    assert len(screen) <= 24  # the winner block, the command and the results line fit one terminal screen
    assert screen[0] == (f"winner: trial {best.number} ({best.user_attrs['ray_trial_id']}), {SCORE} = "
                         f"{best.values[0]:.4g} (max)")
    knobs = screen[1].split()
    assert f"kl_loss_coef={best.params[KL_COEF]:.4g}" in knobs and f"kl_loss_type={best.params[KL_TYPE]}" in knobs
    runner = " ".join(line.strip() for line in screen if "runner-up" in line or line.startswith("    "))
    gap = best.values[0] - second.values[0]
    assert f"runner-up: trial {second.number} at {second.values[0]:.4g} ({gap:.3g} lower)" in runner
    assert "one seed each" in runner
    flowing = " ".join(line.strip() for line in screen)  # a line too long for 80 columns wraps at its spaces
    assert flowing.endswith(f"results: {out} (trials.csv, study.db, tune/)")

    # ONE command, verl's, broken into lines a shell joins back: the same words as on a pipe
    commands = [i for i, line in enumerate(screen) if line.startswith("python3 -m ")]
    assert len(commands) == 1 and screen[commands[0]].startswith("python3 -m verl.trainer.main_ppo ")
    end = next(i for i in range(commands[0], len(screen)) if not screen[i].endswith(" \\"))
    joined = shlex.split(" ".join(line.removesuffix(" \\") for line in screen[commands[0]:end + 1]))
    overrides = json.loads(best.user_attrs["verl_overrides"])
    assert f"{KL_COEF}={overrides[KL_COEF]}" in joined and f"{KL_TYPE}={overrides[KL_TYPE]}" in joined
    assert f"sweep status {out} --commands" in flowing  # the embedded trainer's command on request

    piped = Console(file=io.StringIO(), width=100_000)
    status(str(out), console=piped)
    [one_line] = [line for line in _plain_lines(piped) if line.startswith("python3 -m verl.trainer.main_ppo ")]
    assert shlex.split(one_line) == joined


def test_commands_on_request_add_the_embedded_trainers_own(tmp_path):
    out = _single_objective_sweep(tmp_path)
    console = Console(file=io.StringIO(), width=100_000)
    status(str(out), console=console, every_command=True)
    starts = [line.split()[2] for line in _plain_lines(console) if line.startswith("python3 -m ")]
    assert starts == ["klsweep.trainers.embedded", "verl.trainer.main_ppo"]


def test_the_status_table_keeps_every_number_whole_at_80_and_200_columns(tmp_path):
    out = _single_objective_sweep(tmp_path)
    csv_like = pd.DataFrame([{"number": t.number, "kl": t.params[KL_COEF]} for t in optuna.load_study(
        study_name="win", storage=f"sqlite:///{out / 'study.db'}").trials])
    for width, left_out in ((80, True), (200, False)):
        console = _terminal(width)
        status(str(out), console=console)
        lines = _plain_lines(console)
        assert all(len(line) <= width for line in lines)
        table = lines[:lines.index("")]  # the trials table, before the summary's stopped trials
        rows = {line.split("│")[0].strip(): [c.strip() for c in line.split("│")] for line in table
                if "│" in line and line.split("│")[0].strip().isdigit()}
        for number, kl in zip(csv_like["number"], csv_like["kl"]):
            assert rows[str(number)][2] == f"{kl:.4g}"  # kl_coef, whole
        header = next(line for line in lines if line.startswith("trial"))
        assert ("score" not in header) is left_out  # the training score is left out first, and said
        assert any(line.startswith("left out to fit 80 columns: score") for line in lines) is left_out


def test_the_live_table_keeps_every_number_whole_at_80_columns():
    """The live table at 80 columns: no number split over two lines or cut (it split 0.0012 into "0.00" / "12")."""
    from ray.tune.experiment import Trial

    from klsweep.orchestrate.progress import SweepProgress

    params = ["algorithm.kl_ctrl.kl_coef", "algorithm.kl_ctrl.target_kl", "algorithm.kl_ctrl.horizon"]
    val = "val-core/arith/acc/mean@1"
    console = _terminal(80)
    progress = SweepProgress(2, [val], params=params, console=console)
    progress._console = console  # setup() would start a Live display on this terminal
    progress._interactive = False
    spec = trial_spec(0, 80)
    trial = Trial("run_trial", config={params[0]: 0.0012345678, params[1]: 0.0301234, params[2]: 5000},
                  trial_id="193c7_00000", stub=True)
    progress.on_trial_result(1, [trial], trial, {"training_iteration": 47, "actor/reward_kl_penalty": 0.39111111,
                                                 "actor/entropy": 1.4612345, "critic/score/mean": 1.1881234,
                                                 val: 0.609375, "health": spec["health"]})
    console.print(progress._table())
    lines = _plain_lines(console)
    assert all(len(line) <= 80 for line in lines)
    [row] = [line for line in lines if line.startswith("193c7_00000")]
    cells = [c.strip() for c in row.split("│")]
    assert cells[:5] == ["193c7_00000", "RUNNING", "0.001235", "0.03012", "5000"]
    assert "0.3911" in cells and "0.6094" in cells and "…" not in console.file.getvalue()
    assert "47" not in cells  # score, entropy and step left out first (the caption says so)


def test_the_winner_block_carries_the_confirmation_verdict(tmp_path):
    """With budget.confirm run to its end, the winner is the leader by mean over seeds, and the block says whether
    the runner-up is within noise (leaders.verdicts), computed here by hand: 2 SE of the gap of two means."""
    import math

    def constant(score):
        return lambda params, step: {SCORE: score, "actor/kl_loss": 0.01, "actor/entropy": 1.0}

    scores = {0: [0.60, 0.62], 1: [0.64, 0.70]}  # trial: [search run (seed 0), re-run (seed 1)]
    specs = []
    for number, kl in ((0, 0.001), (1, 0.01)):
        specs.append({"params": {KL_COEF: kl, "data.seed": 0}, "steps": 4, "health": "healthy", "stop_reason": "",
                      "metrics": constant(scores[number][0])})
    for number, kl in ((0, 0.001), (1, 0.01)):
        specs.append({"params": {KL_COEF: kl, "data.seed": 1}, "steps": 4, "health": "healthy", "stop_reason": "",
                      "metrics": constant(scores[number][1]), "confirm_of": number})
    out = make_sweep(tmp_path / "conf", specs, objectives=[{"metric": SCORE, "mode": "max"}], max_steps=4)
    info = json.loads((out / "sweep.json").read_text())
    info["sweep"].update(parameters={KL_COEF: {"values": [0.001, 0.01]}}, budget={
        **info["sweep"]["budget"], "trials": 2, "confirm": {"top": 2, "seeds": 1}})
    (out / "sweep.json").write_text(json.dumps(info))

    console = _terminal(80)
    status(str(out), console=console)
    lines = _plain_lines(console)
    start = next(i for i, line in enumerate(lines) if line.startswith("winner"))
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("python3 -m "))
    block = " ".join(line.strip() for line in lines[start:end])
    assert block.startswith("winner (the leader by mean over seeds): trial 1 (t00001)")
    sd = [math.sqrt(sum((x - sum(v) / 2) ** 2 for x in v)) for v in scores.values()]  # n - 1 = 1
    bound = 2 * math.sqrt(sd[0] ** 2 / 2 + sd[1] ** 2 / 2)
    gap = sum(scores[1]) / 2 - sum(scores[0]) / 2
    assert gap <= bound  # 0.06 <= 2 SE 0.0632: within noise
    assert f"the runner-up, trial 0: within noise (gap {gap:.4g} ≤ 2 SE = {bound:.4g})" in block
