"""The live view (SweepProgress) shows each trial's searched parameters by their verl leaf names, and a running
trial's step, KL, entropy and score, on a terminal's table and on the one line per finished trial a pipe gets, and
under the table the KL frontier forecast of the sweep the ended trial belongs to."""

from __future__ import annotations

import io
import math

import numpy as np
from ray.train._internal.storage import StorageContext
from ray.tune.experiment import Trial
from rich.console import Console

from klsweep.orchestrate.progress import SweepProgress

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
    # a trial outside a sweep (no storage, no study to number it): its Tune id alone
    assert out.getvalue() == (f"[1/3] abc12345 TERMINATED kl_coef=0.002 {PARAMS[1]}=2 {PARAMS[2]}=1 step=4 "
                              f"{VAL}=0.5\n")

    # ended by ASHA before its last step: PRUNED, as the study records it, with the step it stopped at
    early = Trial("run_trial", config={PARAMS[0]: 0.01, PARAMS[1]: 1, PARAMS[2]: 1}, trial_id="def67890", stub=True)
    early.run_metadata.last_result = {"training_iteration": 10, "step": 10, "total_steps": 30, VAL: 0.25,
                                      "health": "healthy"}
    progress.on_trial_complete(3, [trial, early], early)
    assert out.getvalue().splitlines()[-1] == (f"[2/3] def67890 PRUNED kl_coef=0.01 {PARAMS[1]}=1 {PARAMS[2]}=1 "
                                               f"step=10 {VAL}=0.25 (stopped by the scheduler at step 10)")


def _render(progress: SweepProgress) -> str:
    wide = Console(file=io.StringIO(), width=400)
    wide.print(progress.renderable())
    return wide.file.getvalue()


def _sweep_trial(run_dir, trial_id: str) -> Trial:
    """A Tune trial of the sweep in ``run_dir`` (its experiment directory is ``run_dir/tune``, as sweep run's)."""
    return Trial("run_trial", stub=True, trial_id=trial_id,
                 storage=StorageContext(storage_path=str(run_dir), experiment_dir_name="tune"))


def test_live_view_shows_the_kl_frontier_forecast_once_enough_trials_are_feasible(tmp_path):
    """Five finished trials and one running on the Gao RL law (alpha 1, beta 0.5 over 0.2; tests/analysis/conftest):
    every step lies on the law, so KL* = e**2 = 7.39 nats/sequence and the peak 0.2 + 0.5 e = 1.56, intervals
    included. Steps the live view was handed replace a trial's (lagging) result file in the fit. With three feasible
    trials the line says how many it waits for. A pipe gets the line once per finished trial, when the next trial
    starts (or the sweep ends), and only when it changed: not on a start with no trial finished before it."""
    from klsweep.analysis.frontier_fit import fit_frontier
    from tests.analysis.conftest import FRONTIER_OBJECTIVES, frontier_specs, make_sweep
    from tests.analysis.conftest import VAL as GAO_VAL

    specs = frontier_specs([1.0, 4.0, 9.0, 16.0, 25.0, 36.0])
    specs[5].update(state="RUNNING", steps=3)  # its first 3 of 5 steps so far: fitted with the others
    run_dir = make_sweep(tmp_path / "live", specs, objectives=FRONTIER_OBJECTIVES)
    progress = SweepProgress(6, [FRONTIER_OBJECTIVES[0]["metric"]], console=Console(file=io.StringIO()))
    progress.setup()
    assert "KL frontier" not in _render(progress)  # no trial ended yet: no line
    trial = _sweep_trial(run_dir, "t00004")
    trial.run_metadata.last_result = {"training_iteration": 5, "health": "healthy"}
    progress.on_trial_complete(1, [trial], trial)
    first = ("KL frontier (Gao RL form, 5 trials + 1 running): KL* = 7.39 nats/sequence [7.39, 7.39] (80 %), peak "
             "score 1.56 [1.56, 1.56]")
    assert f"{first}\n" in _render(progress)
    piped = progress._console.file
    # the finished trial by its Optuna number (the study's trial 4 holds Tune id t00004), as the summary names it;
    # [5/6]: the sweep's finished trials (0-4, the study holds 0-3 as finished) out of its budget
    assert piped.getvalue().startswith("[5/6] trial 4 (t00004) TERMINATED step=5 ")
    assert "KL frontier" not in piped.getvalue()  # not yet: the study may not have the trial that just ended
    progress.on_trial_start(2, [trial], trial)
    progress.on_trial_start(2, [trial], trial)  # no trial ended since: nothing new on the pipe
    assert piped.getvalue().splitlines()[-1] == first and piped.getvalue().count("KL frontier") == 1

    # the running trial's steps as Tune hands them to the live view (its result file in the sweep directory lags):
    # all 5, the last two 0.5 above the law; they replace the file's 3 steps in the fit
    law = specs[5]["metrics"]
    running = _sweep_trial(run_dir, "t00005")
    for step in range(1, 6):
        metrics = law({}, step)
        metrics[GAO_VAL] += 0.5 if step > 3 else 0.0
        progress.on_trial_result(step, [running], running, {**metrics, "training_iteration": step, "step": step})
    progress.on_trial_start(3, [running], running)
    d = np.sqrt([kl * s / 4 for kl in (1.0, 4.0, 9.0, 16.0, 25.0, 36.0) for s in range(5)])
    score = 0.2 + np.where(d > 0, d * (1 - 0.5 * np.log(np.where(d > 0, d, 1.0))), 0.0)
    score[-2:] += 0.5
    expected = fit_frontier(d**2, score, 0.2, trials=np.repeat(range(6), 5), n_boot=10).best.kl_star
    assert f"KL frontier (Gao RL form, 5 trials + 1 running): KL* = {expected:.3g} nats/sequence [" in _render(progress)
    assert f"{expected:.3g}" != "7.39"

    few = make_sweep(tmp_path / "few", frontier_specs([1.0, 4.0, 9.0]), objectives=FRONTIER_OBJECTIVES)
    trial = _sweep_trial(few, "t00003")  # a trial starting: the ones that ended before it are in the study now
    progress.on_trial_start(2, [trial], trial)
    waiting = "KL frontier: forecast once 4 trials are feasible (3 so far)"
    assert f"{waiting}\n" in _render(progress) and piped.getvalue().count("KL frontier") == 1  # no trial ended
    trial.run_metadata.last_result = {"training_iteration": 5, "health": "healthy"}
    progress.on_trial_complete(3, [trial], trial)
    progress.on_experiment_end([trial])  # the last trial: its line at the sweep's end
    assert piped.getvalue().splitlines()[-1] == waiting and piped.getvalue().count("KL frontier") == 2
    progress.on_trial_complete(4, [trial], trial)
    progress.on_experiment_end([trial])  # the same line again: not repeated
    assert piped.getvalue().count("KL frontier") == 2


def test_the_count_goes_on_across_a_resume_and_an_extension(tmp_path):
    """Interrupted with trials 0-1 finished and 2-5 in flight (RUNNING in the study), a 6-trial sweep's restored
    Tuner counts [3/6]..[6/6], not [1/4]..; extended to budget.trials=8, the next Tuner counts [7/8], [8/8]. The
    study is told of a trial after its line (as Tune tells the searcher after the callbacks) or before: the count is
    the same. A confirmation re-run counts in its own Tuner."""
    import json

    import optuna

    from klsweep.analysis.sweep_dir import study_of
    from tests.analysis.conftest import make_sweep, trial_spec

    specs = [trial_spec(i, 10) for i in range(8)]
    for spec in specs[2:]:
        spec["state"] = "RUNNING"
    specs.append({**trial_spec(8, 10), "params": {**trial_spec(0, 10)["params"], "data.seed": 1}, "confirm_of": 0,
                  "state": "RUNNING"})
    run_dir = make_sweep(tmp_path / "resumed", specs)
    record = json.loads((run_dir / "sweep.json").read_text())
    record["sweep"]["budget"]["trials"] = 6
    (run_dir / "sweep.json").write_text(json.dumps(record))
    study = study_of(run_dir)

    def tell(number: int) -> None:
        trial = study.get_trials(deepcopy=False)[number]
        study._storage.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.PRUNED)

    def finish(progress: SweepProgress, number: int, *, told_first: bool = False) -> str:
        trial = _sweep_trial(run_dir, f"t{number:05d}")
        trial.run_metadata.last_result = {"training_iteration": 10, "health": "healthy"}
        if told_first:
            tell(number)
        progress.on_trial_complete(number, [trial], trial)
        if not told_first:
            tell(number)
        return progress._console.file.getvalue().splitlines()[-1]

    restored = SweepProgress(4, [VAL], console=Console(file=io.StringIO()))  # the restored Tuner's 4 trials
    restored.setup()
    lines = [finish(restored, 3), finish(restored, 2, told_first=True), finish(restored, 5), finish(restored, 4)]
    assert [line.split(" (")[0] for line in lines] == ["[3/6] trial 3", "[4/6] trial 2", "[5/6] trial 5",
                                                        "[6/6] trial 4"]

    record["sweep"]["budget"]["trials"] = 8  # sweep resume DIR budget.trials=8
    (run_dir / "sweep.json").write_text(json.dumps(record))
    extension = SweepProgress(2, [VAL], console=Console(file=io.StringIO()))
    extension.setup()
    assert [finish(extension, 7).split(" (")[0], finish(extension, 6).split(" (")[0]] == ["[7/8] trial 7",
                                                                                           "[8/8] trial 6"]
    assert extension._progress.tasks[0].completed == 8 and extension._progress.tasks[0].total == 8

    confirm = SweepProgress(1, [VAL], console=Console(file=io.StringIO()))
    confirm.setup()
    assert finish(confirm, 8).startswith("[1/1] trial 8 (t00008) ")


def test_live_view_says_when_the_forecast_interval_is_too_wide(tmp_path):
    """Four trials whose scores sit 0.3 above or below the law, by trial: the bootstrap over trials spreads KL* far
    beyond its estimate, and the line says the interval is too wide to act on. The estimate is the least-squares
    fit through d = 0 of every step's gain over the trials' median first score, computed here with numpy."""
    from tests.analysis.conftest import FRONTIER_OBJECTIVES, frontier_specs, make_sweep
    from tests.analysis.conftest import VAL as GAO_VAL

    specs = frontier_specs([1.0, 4.0, 9.0, 16.0])
    shifts = [0.3, -0.3, 0.3, -0.3]
    for spec, shift in zip(specs, shifts):
        law = spec["metrics"]
        spec["metrics"] = lambda params, step, law=law, shift=shift: {
            **law(params, step), GAO_VAL: law(params, step)[GAO_VAL] + (shift if step > 1 else 0.0)}
    run_dir = make_sweep(tmp_path / "wide", specs, objectives=FRONTIER_OBJECTIVES)
    progress = SweepProgress(4, [GAO_VAL], console=Console(file=io.StringIO()))
    progress.setup()
    trial = _sweep_trial(run_dir, "t00003")
    progress.on_trial_complete(1, [trial], trial)
    # steps 1..5 of trial i: KL grows linearly to its final value; the score is the law (+ shift after step 1)
    d = np.sqrt([kl * s / 4 for kl in (1.0, 4.0, 9.0, 16.0) for s in range(5)])
    gain = np.array([(x * (1 - 0.5 * np.log(x)) if x else 0.0) + (shift if s else 0.0)
                     for x, s, shift in zip(d, [s for _ in range(4) for s in range(5)], np.repeat(shifts, 5))])
    x = np.column_stack([d, -d * np.log(np.where(d > 0, d, 1.0))])
    alpha, beta = np.linalg.lstsq(x, gain, rcond=None)[0]
    kl_star = math.exp(alpha / beta - 1) ** 2
    line = _render(progress)
    assert f"KL frontier (Gao RL form, 4 trials): KL* = {kl_star:.3g} nats/sequence [" in line
    assert "⚠ interval too wide to act on (relative width " in line


def test_a_remedied_trial_shows_its_proposed_parameters_and_whole_schedule():
    """Issue 17: after two kl_runaway restarts (kl_coef 0.002363 → 0.003545, 0.003788 → 0.005682) a trial's line
    printed 0.003545 (the live view's row began after restart 1, on a resumed sweep) and only the last remedy; it
    shows the proposed 0.002 and both restarts."""
    from klsweep.orchestrate.remedy import REMEDIES

    key = PARAMS[0]
    first = {"restart": 1, "step": 46, "rule": "kl_runaway", "from_step": 32, "key": key, "old": 0.0023633,
             "new": 0.0035449}
    second = {**first, "restart": 2, "old": 0.0037882, "new": 0.0056823}
    trial = Trial("run_trial", config={key: 0.0035449, REMEDIES: [first]}, trial_id="092898f5", stub=True,
                  evaluated_params={key: 0.002})
    out = io.StringIO()
    progress = SweepProgress(2, [VAL], params=[key], console=Console(file=out))
    progress.setup()
    progress.on_trial_result(1, [trial], trial, {"training_iteration": 40, "health": "healthy"})
    trial.set_config({key: 0.0056823, REMEDIES: [first, second]})  # as RemedyScheduler.on_trial_result does
    trial.run_metadata.last_result = {"training_iteration": 80, "step": 80, "total_steps": 80, VAL: 0.5,
                                      "health": "healthy", "stop_reason": "remedied: kl_runaway at step 46: ..."}
    progress.on_trial_complete(2, [trial], trial)
    schedule = ("2× kl_runaway@46 from 32 kl_coef 0.002363→0.003545; kl_runaway@46 from 32 kl_coef "
                "0.003788→0.005682")
    assert out.getvalue() == f"[1/2] 092898f5 TERMINATED kl_coef=0.002 step=80 {VAL}=0.5 (remedied {schedule})\n"
    wide = Console(file=io.StringIO(), width=300)
    wide.print(progress._table())
    header, _, row = wide.file.getvalue().splitlines()[:3]
    assert [c.strip() for c in header.split("┃")][-2:] == ["health", "remedies"]
    assert [c.strip() for c in row.split("│")][2] == "0.002"
    assert [c.strip() for c in row.split("│")][-1] == schedule


def test_a_replayed_log_from_step_0_shows_its_last_step_not_its_report_count():
    """verl's GRPO log holds steps 0 (the validation before training) to 105: 106 reports, 105 training steps. The
    finished trial's line says step=105, as trials.csv's steps does, not Tune's report count 106."""
    from klsweep.trainers.replay import ReplayTrainer
    from tests.conftest import GRPO, TRACES

    trainer = ReplayTrainer({"trainer.total_training_steps": 200}, trace=TRACES / GRPO)
    reports = 0
    while trainer.global_step < trainer.total_steps:  # as run_trial plays it
        metrics = trainer.train_step()
        reports += 1
    assert (reports, trainer.global_step, trainer.total_steps) == (106, 105, 105)
    trial = Trial("run_trial", config={PARAMS[0]: 0.002}, trial_id="a1b2c3d4", stub=True)
    trial.run_metadata.last_result = {**metrics, "training_iteration": reports, "step": 105, "total_steps": 105,
                                      "health": "healthy"}
    out = io.StringIO()
    progress = SweepProgress(1, ["val-core/openai/gsm8k/reward/mean@1"], params=PARAMS[:1], console=Console(file=out))
    progress.setup()
    progress.on_trial_complete(1, [trial], trial)
    assert out.getvalue().startswith("[1/1] a1b2c3d4 TERMINATED kl_coef=0.002 step=105 ")
