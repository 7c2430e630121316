"""`sweep plan` / `sweep validate` and the shipped sweep files."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from klsweep.cli import main
from klsweep.orchestrate.plan import plan, planned_params, validate
from klsweep.spec import load_sweep

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted((REPO / "sweeps").glob("*.yaml"))

# the seed presets the issue asks for, as the first trial of each shipped sweep (verl keys)
SEEDS = {
    "conservative": {"algorithm.kl_ctrl.kl_coef": 0.002, "algorithm.kl_ctrl.target_kl": 0.03,
                     "algorithm.kl_ctrl.horizon": 5000},
    "aggressive": {"algorithm.kl_ctrl.kl_coef": 0.0005, "algorithm.kl_ctrl.target_kl": 0.1,
                   "algorithm.kl_ctrl.horizon": 20000},
    "grpo_kl": {"actor_rollout_ref.actor.kl_loss_coef": 0.001, "actor_rollout_ref.actor.kl_loss_type": "low_var_kl",
                "actor_rollout_ref.actor.loss_agg_mode": "token-mean"},
    "drgrpo_vs_grpo": {"algorithm.norm_adv_by_std_in_grpo": False,
                       "actor_rollout_ref.actor.loss_agg_mode": "seq-mean-token-sum-norm"},
    "verl_gsm8k_grpo": {"actor_rollout_ref.actor.kl_loss_coef": 0.001,
                        "actor_rollout_ref.actor.kl_loss_type": "low_var_kl"},
}


def test_every_shipped_sweep_is_covered():
    assert {p.stem for p in SHIPPED} == set(SEEDS)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_sweep_starts_with_its_seed_preset_and_fits_the_cpu_budget(path):
    sweep = load_sweep(path)
    first = planned_params(sweep, 1)[0]
    assert {k: first[k] for k in SEEDS[path.stem]} == SEEDS[path.stem]
    if sweep.trainer == "verl":  # the example for GPU nodes: real verl, no CPU budget
        return
    # ~10 embedded steps/s per trial: trials × steps / (10 × concurrent) must leave room under 5 minutes
    assert sweep.trainer == "embedded"
    assert sweep.budget.trials * sweep.budget.max_steps / (10 * sweep.budget.max_concurrent) <= 120


def test_conservative_and_aggressive_are_adaptive_kl_in_the_reward_with_their_health_presets():
    for name, preset in (("conservative", "conservative"), ("aggressive", "aggressive")):
        sweep = load_sweep(REPO / "sweeps" / f"{name}.yaml")
        assert (sweep.algorithm, sweep.placement, sweep.health.preset) == ("ppo", "reward", preset)
        assert sweep.overrides["algorithm.kl_ctrl.type"] == "adaptive"


@pytest.mark.slow
@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_sweeps_validate_against_verl(path):
    out = io.StringIO()
    assert validate(str(path), [], out=out) == 0, out.getvalue()
    assert "ok" in out.getvalue()


@pytest.mark.slow
def test_plan_prints_seed_first_then_sampler_trials_with_verl_commands():
    out = io.StringIO()
    assert plan(str(REPO / "sweeps" / "grpo_kl.yaml"), ["budget.trials=4"], n=3, out=out) == 0
    text = out.getvalue()
    headers = re.findall(r"^trial (\d) \((.*?)\): (.*)$", text, flags=re.M)
    # budget.trials=4: TPE starts with max(2, min(10, 4 // 16)) = 2 space-filling trials, seed trial included
    # (samplers.py)
    assert [(i, origin) for i, origin, _ in headers] == [
        ("0", "seed trial 1"), ("1", "tpe space-filling start, as sweep run draws it"),
        ("2", "tpe proposes it from results; shown: a random start-up draw")]
    assert "note: from trial 2 on, sweep run's tpe sampler proposes each trial from the results" in text
    commands = [line.strip() for line in text.splitlines() if line.startswith("  python3 -m verl.trainer.main_ppo")]
    assert len(commands) == 3
    # the commands sweep run and sweep status print: the embedded trainer's own, then verl's without the
    # embedded sizes (8-token responses, batch 16, 8 responses per prompt)
    embedded = [line for line in text.splitlines() if line.startswith("  python3 -m klsweep.trainers.embedded ")]
    assert len(embedded) == 3 and "data.max_response_length=8" in embedded[0]
    assert not any(size in c for c in commands for size in
                   ("data.max_response_length=", "data.train_batch_size=", "actor_rollout_ref.rollout.n="))
    assert "actor_rollout_ref.actor.kl_loss_coef=0.001 " in commands[0]
    assert "actor_rollout_ref.actor.use_kl_loss=true" in commands[0]
    assert "algorithm.use_kl_in_reward=false" in commands[0]


def test_plans_random_draws_are_the_ones_a_sweep_draws_before_results_guide_the_sampler():
    # sweep run asks the same sampler (build_sampler: seeded per trial number) and tells each result: the first
    # n_startup_trials trials (seed trial included) are the space-filling start, identical to the plan's; later ones
    # use results
    import optuna

    from klsweep.orchestrate.samplers import build_sampler
    from klsweep.spec.space import define_space, seed_params

    sweep = load_sweep(REPO / "sweeps" / "aggressive.yaml", ["budget.trials=12"])  # TPE start-up: 2 (seed + 1)
    study = optuna.create_study(sampler=build_sampler(sweep), direction="maximize")
    for seed in seed_params(sweep):
        study.enqueue_trial(seed)
    space, ran = define_space(sweep), []
    for _ in range(5):
        trial = study.ask()
        space(trial)
        ran.append(dict(trial.params))
        study.tell(trial, -trial.params["algorithm.kl_ctrl.kl_coef"])  # any result: TPE then prefers small kl_coef
    planned = planned_params(sweep, 5)
    assert planned[:2] == ran[:2]
    assert planned[2:] != ran[2:]


def test_the_plan_of_a_grid_sweep_runs_every_cell_once_the_seed_trials_cells_included():
    """drgrpo_vs_grpo's grid has 2 × 2 × 3 = 12 cells and budget.trials 12; its 2 seed trials are 2 of them."""
    sweep = load_sweep(REPO / "sweeps" / "drgrpo_vs_grpo.yaml")
    grid = [(std, agg, lr) for std in (False, True) for agg in ("seq-mean-token-sum-norm", "token-mean")
            for lr in (0.0003, 0.0001, 0.001)]
    keys = ("algorithm.norm_adv_by_std_in_grpo", "actor_rollout_ref.actor.loss_agg_mode",
            "actor_rollout_ref.actor.optim.lr")
    cells = [tuple(params[k] for k in keys) for params in planned_params(sweep, sweep.budget.trials)]
    assert cells[:2] == [(False, "seq-mean-token-sum-norm", 0.0003), (True, "token-mean", 0.0003)]
    assert sorted(cells, key=repr) == sorted(grid, key=repr)


def test_planned_trials_are_reproducible_from_the_sweep_seed():
    sweep = load_sweep(REPO / "sweeps" / "aggressive.yaml")
    a, b = planned_params(sweep, 4), planned_params(sweep, 4)
    assert a == b and len({repr(p) for p in a}) == 4


def _validate(path, text: str) -> tuple[int, str]:
    """``validate`` of a sweep file with ``text``: (exit code, what it printed)."""
    path.write_text(text)
    out = io.StringIO()
    return validate(str(path), [], out=out), out.getvalue()


def test_validate_reports_every_problem_and_exits_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    code, printed = _validate(bad, "name: bad\nalgorithm: grpo\nobjective: {metric: critic/score/mean, mode: max}\n"
                                   "parameters:\n  target_kl: {min: 0.01, max: 0.1}\n  kl_coef: {values: [-0.1]}\n")
    assert code == 2
    errors = [line for line in printed.splitlines() if line.startswith("  error: ")]
    assert len(errors) == 2 and all(f"{bad}:" in e for e in errors)


def test_cli_validate_exit_codes(tmp_path, capsys):
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert main(["validate", str(empty)]) == 2
    assert "the file is empty" in capsys.readouterr().out


def test_a_validation_objective_the_embedded_trainer_never_logs_is_refused(tmp_path):
    code, printed = _validate(tmp_path / "typo.yaml",
                              "name: typo\nalgorithm: grpo\nobjective: {metric: val-core/arith/acc/mean, mode: max}\n"
                              "parameters:\n  kl_coef: {values: [0.1, 1.0]}\n")
    assert code == 2
    assert "'val-core/arith/acc/mean' is not logged by the embedded trainer" in printed
    assert "'val-core/arith/acc/mean@1'" in printed  # the fix: the name it does log


@pytest.mark.parametrize(("algorithm", "alias", "name"), [
    ("grpo", "ref_kl", "actor/kl_loss"), ("ppo", "ref_kl", "actor/reward_kl_penalty"),
    ("ppo", "kl_coef", "actor/reward_kl_penalty_coeff"), ("grpo", "entropy", "actor/entropy"),
    ("grpo", "score", "critic/score/mean"), ("grpo", "val_score", "val-core/arith/acc/mean@1"),
])
def test_an_alias_as_objective_is_refused_with_the_name_trials_report(tmp_path, algorithm, alias, name):
    # trials report verl's own metric names: an objective 'ref_kl' would fail every trial after its whole budget
    code, printed = _validate(tmp_path / "alias.yaml",
                              f"name: alias\nalgorithm: {algorithm}\n"
                              f"objective: [{{metric: val-core/arith/acc/mean@1, mode: max}}, "
                              f"{{metric: {alias}, mode: min}}]\nparameters:\n  kl_coef: {{values: [0.01, 0.1]}}\n")
    assert code == 2
    # the file's line and the objective's index, as every other objective problem has them
    assert f"{tmp_path / 'alias.yaml'}:3: objective.1.metric: {alias!r} is an alias of the health rules" in printed
    assert f"use {name!r}" in printed


def test_the_verl_name_of_an_alias_is_a_valid_objective(tmp_path):
    code, printed = _validate(tmp_path / "ok.yaml",
                              "name: ok\nalgorithm: grpo\nobjective: [{metric: val-core/arith/acc/mean@1, mode: max},"
                              " {metric: actor/kl_loss, mode: min}]\nparameters:\n  kl_coef: {values: [0.01, 0.1]}\n")
    assert code == 0, printed


@pytest.mark.slow
def test_validate_runs_verls_adaptive_controller_at_every_value_the_space_can_propose(tmp_path):
    # verl's config accepts each value, verl's AdaptiveKLController breaks on it at the first update;
    # 256 prompts × 4 responses = 1,024 responses per step (verl's n_steps), so horizon must exceed 0.2 × 1024 = 204.8
    code, printed = _validate(tmp_path / "bounds.yaml", (
        "name: bounds\nalgorithm: ppo\nkl_placement: reward\noverrides:\n  algorithm.kl_ctrl.type: adaptive\n"
        "  data.train_batch_size: 256\n  actor_rollout_ref.rollout.n: 4\nparameters:\n"
        "  kl_coef: {values: [0.0, 0.002, 0.02]}\n"                       # line 9
        "  target_kl: {distribution: uniform, min: 0.0, max: 0.1}\n"      # line 10: the range end 0.0
        "  horizon: {values: [0, 200, 5000]}\n"                           # line 11
        "objective: {metric: val-core/arith/acc/mean@1, mode: max}\nbudget: {trials: 6, max_steps: 20}\n"))
    assert code == 2
    errors = [line.removeprefix("  error: ") for line in printed.splitlines() if line.startswith("  error: ")]
    where = {line.split(": ")[0].rsplit(":", 1)[1]: line for line in errors}
    assert sorted(where) == ["10", "11", "9"] and len(errors) == 4, printed
    assert "algorithm.kl_ctrl.kl_coef=0.0 with the adaptive controller" in where["9"]
    assert "algorithm.kl_ctrl.target_kl=0.0" in where["10"] and "ZeroDivisionError" in where["10"]
    horizon = [e for e in errors if ":11: " in e]
    assert "horizon=0: verl's get_kl_controller asserts horizon > 0" in horizon[0]
    assert "horizon=200 is too short" in horizon[1] and "= -0.024" in horizon[1] and "> 204.8" in horizon[1]


@pytest.mark.slow
def test_validate_lists_the_file_and_the_verl_problems_of_one_file_in_one_run(tmp_path):
    # schema, keys, inert knobs and verl's values are all reported by one run of validate
    code, printed = _validate(tmp_path / "four.yaml", (
        "name: four\nalgorithm: grpo\nobjective: {metric: val-core/arith/acc/mean@1, mode: max}\n"
        "budget: {trials: 4, max_concurent: 2}\n"                              # line 4: schema
        "parameters:\n  kl_loss_coef: {values: [0.01, 0.1]}\n"                 # line 6: a bare verl leaf name
        "  target_kl: {values: [0.1]}\n"                                       # line 7: inert under GRPO
        "  loss_agg_mode: {values: [token-mean, seq-sum]}\n"))                 # line 8: verl rejects seq-sum
    assert code == 2
    lines = [line.removeprefix("  error: ").split(": ")[0].rsplit(":", 1)[1]
             for line in printed.splitlines() if line.startswith("  error: ")]
    assert lines == ["4", "6", "7", "8"], printed
    assert "loss_agg_mode='seq-sum' is not valid" in printed


@pytest.mark.slow
def test_the_horizon_is_checked_at_the_largest_batch_the_space_can_propose(tmp_path):
    # verl's n_steps is data.train_batch_size × rollout.n of the trial; horizon 200 is safe for
    # 64 × 4 = 256 responses (0.2 × 256 = 51.2) but turns the coefficient negative for 512 × 4 = 2048 (> 409.6 needed)
    code, printed = _validate(tmp_path / "batch.yaml", (
        "name: batch\nalgorithm: ppo\nkl_placement: reward\noverrides:\n  algorithm.kl_ctrl.type: adaptive\n"
        "  actor_rollout_ref.rollout.n: 4\nparameters:\n  data.train_batch_size: {values: [64, 512]}\n"
        "  horizon: {values: [200, 5000]}\n"
        "objective: {metric: val-core/arith/acc/mean@1, mode: max}\nbudget: {trials: 4, max_steps: 20}\n"))
    assert code == 2, printed
    (error,) = [line for line in printed.splitlines() if line.startswith("  error: ")]
    assert "algorithm.kl_ctrl.horizon=200 is too short for 2048 responses per step" in error
    assert "1 - 0.2 × 2048 / 200 = -1.05" in error and "> 409.6" in error


def test_plan_prints_the_commands_as_run_status_and_the_report_print_them():
    # sweep run records a trial's overrides as JSON (the Optuna user attribute), status and the report read them back
    # into a trials.csv row and print reproduce_commands(overrides_of(row)): whole floats as ints, null left out
    import json

    import pandas as pd

    from klsweep.analysis.sweep_dir import overrides_of
    from klsweep.spec.space import trial_overrides
    from klsweep.trainers import reproduce_lines

    sweep = load_sweep(REPO / "sweeps" / "grpo_kl.yaml")
    recorded = json.loads(json.dumps(trial_overrides(sweep, planned_params(sweep, 1)[0])))
    row = pd.DataFrame([{f"config/{k}": v for k, v in recorded.items()}]).iloc[0]
    as_run = reproduce_lines(sweep.trainer, overrides_of(row))
    out = io.StringIO()
    plan(str(REPO / "sweeps" / "grpo_kl.yaml"), [], n=1, out=out)
    printed = [line.strip() for line in out.getvalue().splitlines() if line.startswith("  ")]
    assert printed == as_run
    verl = next(line for line in printed if line.startswith("python3 -m verl.trainer.main_ppo"))
    assert " algorithm.gamma=1 " in verl and " actor_rollout_ref.actor.clip_ratio_c=3 " in verl
    assert "=1.0 " not in verl and "loss_scale_factor" not in verl  # verl's default loss_scale_factor is null


def test_plan_states_the_checkpoint_cost_of_a_verl_sweep(tmp_path, monkeypatch):
    """58 steps: five saves (12, 24, ..., 58, none wasted just before the end); disk per save from the model's
    safetensors: 12 bytes per parameter (fp32 weights and AdamW's two moments), 2 on disk at once while verl saves."""
    import torch
    from safetensors.torch import save_file

    monkeypatch.delenv("KLSWEEP_KEEP_CHECKPOINTS", raising=False)
    model = tmp_path / "model"
    model.mkdir()
    save_file({"w": torch.zeros(1024, 1024, dtype=torch.bfloat16)}, str(model / "model.safetensors"))
    out = io.StringIO()
    assert plan(str(REPO / "sweeps" / "verl_gsm8k_grpo.yaml"),
                ["budget.max_steps=58", "overrides.trainer.test_freq=-1",
                 f"overrides.actor_rollout_ref.model.path={model}"], n=2, out=out) == 0
    lines = [line for line in out.getvalue().splitlines() if line.startswith("checkpoint")]
    assert lines[0] == (
        "checkpoints: 5 saves per trial, after steps 12, 24, 36, 48, 58 (trainer.save_freq=12; verl always saves after "
        "the last step too), each about 15 normal steps long: about 75 steps' time on top of the run's 58; "
        f"{1024 * 1024 * 12 / 2**20:.1f} MiB per save, at most 2 on disk at once while a trial runs")
    assert lines[1].startswith("checkpoint retention (KLSWEEP_KEEP_CHECKPOINTS=best): a trial that ran to its last "
                               "step keeps its checkpoint only while it is the best finished trial")
    assert len(lines) == 2

    out = io.StringIO()
    plan(str(REPO / "sweeps" / "verl_gsm8k_grpo.yaml"), ["budget.max_steps=105",
                                                         "overrides.trainer.save_freq=20"], n=1, out=out)
    assert "the save after step 100 protects only 5 steps: choose a trainer.save_freq that divides 105" in (
        out.getvalue())


def test_plan_shows_at_most_the_trials_the_sweep_runs_and_says_so(capsys):
    path = str(REPO / "sweeps" / "conservative.yaml")
    assert main(["plan", path, "-n", "100", "budget.trials=3"]) == 0
    text = capsys.readouterr().out
    assert re.findall(r"^trial (\d+) ", text, flags=re.M) == ["0", "1", "2"]
    assert text.splitlines()[0] == "note: the search runs 3 trials (budget.trials=3): all 3 are shown, not 100"

    assert main(["plan", path, "-n", "3", "budget.trials=3"]) == 0
    exact = capsys.readouterr().out
    assert "note: the search runs" not in exact and exact == text.split("\n", 1)[1]

    assert main(["plan", path, "budget.trials=2"]) == 0  # the default 4, capped without a note
    short = capsys.readouterr().out
    assert re.findall(r"^trial (\d+) ", short, flags=re.M) == ["0", "1"] and "note: the search runs" not in short


@pytest.mark.parametrize(("n", "why"), [
    ("0", "0 trials: give how many trials to show, at least 1, e.g. -n 4"),
    ("-3", "-3 trials: give how many trials to show, at least 1, e.g. -n 4"),
    ("abc", "'abc' is not a whole number: give how many trials to show, e.g. -n 4"),
])
def test_plan_refuses_a_trial_count_below_one(capsys, n, why):
    with pytest.raises(SystemExit) as e:
        main(["plan", str(REPO / "sweeps" / "conservative.yaml"), "-n", n])
    out = capsys.readouterr()
    assert e.value.code == 2 and out.out == ""
    assert out.err.splitlines()[-1] == f"sweep plan: error: argument -n: {why}"
