"""Every verl key klsweep writes into a trial's command: the sweep's own value is merged, kept, or refused with the
field that controls it, never replaced without a word."""

from __future__ import annotations

import pytest

from klsweep.errors import PreflightError, SweepFileError
from klsweep.launchers.process import trial_command
from klsweep.spec import load_sweep
from klsweep.spec.space import trial_overrides
from klsweep.verl.managed import checkpoint_cadence_warnings, managed_key_problems
from klsweep.verl.preflight import preflight
from klsweep.verl.presets import preset_overrides

from .test_preflight import REAL_VERL

#: A sweep that sets two keys klsweep also writes (trainer.project_name, trainer.logger) in its overrides.
SWEEP = """\
name: k34_overrides
algorithm: grpo
trainer: embedded
kl_placement: loss
overrides:
  trainer.project_name: team-kl-study
  trainer.logger: [console, file, tensorboard]
parameters:
  kl_coef: {values: [0.001, 0.01]}
objective: {metric: val-core/arith/acc/mean@1, mode: max}
budget: {trials: 2, max_concurrent: 1, max_steps: 5}
"""


def _arg(argv: list[str], key: str) -> list[str]:
    return [a.split("=", 1)[1] for a in argv if a.lstrip("+").startswith(key + "=")]


@pytest.fixture
def sweep_file(tmp_path):
    path = tmp_path / "k34.yaml"
    path.write_text(SWEEP)
    return path


def test_the_users_loggers_join_the_file_logger(sweep_file, tmp_path):
    """trainer.logger: merged, console and file first (the file logger is what the trial reads), then the user's."""
    sweep_file.write_text(SWEEP.replace("  trainer.project_name: team-kl-study\n", ""))
    sweep = load_sweep(sweep_file)
    overrides = trial_overrides(sweep, {"kl_coef": 0.01})
    assert overrides["trainer.logger"] == ["console", "file", "tensorboard"]
    argv, _ = trial_command(overrides, trainer="verl", trial_dir=tmp_path)
    assert _arg(argv, "trainer.logger") == ["[console,file,tensorboard]"]
    assert managed_key_problems({"trainer.logger": ["tensorboard"]}, {}, runs_verl=True) == []


def test_project_name_is_refused_with_the_field_that_sets_it(sweep_file):
    """trainer.project_name: klsweep writes wandb.project (else the sweep's name) over it, so the user's value is
    refused, naming wandb.project; with that field set, the trials get the user's project."""
    with pytest.raises(SweepFileError) as refused:
        load_sweep(sweep_file)  # sweep validate and sweep run refuse it at its line
    message = str(refused.value)
    assert "k34.yaml:6: overrides.trainer.project_name: trainer.project_name ('team-kl-study') is set by" in message
    assert "wandb: {project: VALUE}" in message
    (problem,) = managed_key_problems({"trainer.project_name": "team-kl-study"}, {}, runs_verl=False)
    assert problem[0] == "trainer.project_name"

    sweep_file.write_text(SWEEP.replace("  trainer.project_name: team-kl-study\n", ""))
    fixed = load_sweep(sweep_file, ["wandb.project=team-kl-study"])  # the fix the message gives
    assert trial_overrides(fixed, {})["trainer.project_name"] == "team-kl-study"


@pytest.mark.parametrize(("key", "field"),
                         [("trainer.total_training_steps", "budget.max_steps"), ("data.seed", "seed")])
def test_keys_of_sweep_fields_are_refused_at_load(sweep_file, key, field):
    with pytest.raises(SweepFileError, match=f"{key} is set by the sweep file's `{field}` field"):
        load_sweep(sweep_file, [f"overrides.{key}=7"])


@pytest.mark.parametrize(("key", "fix"), [
    ("trainer.experiment_name", "the sweep's `name` names the sweep"),
    ("trainer.default_local_dir", "sweep run --out DIR"),
    ("hydra.run.dir", "sweep run --out DIR"),
])
def test_per_trial_names_and_directories_are_refused_for_verl(tmp_path, key, fix):
    """Fixed or searched, for trainer verl: trial_command writes each trial's own value over them."""
    argv, _ = trial_command({key: "/mine"}, trainer="verl", trial_dir=tmp_path / "trial_7")
    assert _arg(argv, key) != ["/mine"]  # replaced, hence refused before the sweep starts
    (fixed,) = managed_key_problems({key: "/mine"}, {}, runs_verl=True)
    assert fixed[0] == key and f"{key} ('/mine') is set by klsweep" in fixed[1] and fix in fixed[1]
    (searched,) = managed_key_problems({}, {key: "where"}, runs_verl=True)
    assert searched[0] == "where" and f"{key} (searched)" in searched[1]
    assert managed_key_problems({key: "/mine"}, {}, runs_verl=False) == []  # the embedded trainer keeps it


@pytest.mark.parametrize(("key", "needed", "other"), [
    ("ray_kwargs.ray_init.address", "local", "auto"),
    ("trainer.resume_mode", "auto", "disable"),
])
def test_keys_with_one_workable_value_are_kept_or_refused(tmp_path, key, needed, other):
    for written in (key, "+" + key):
        assert managed_key_problems({written: needed}, {}, runs_verl=True) == []
        argv, _ = trial_command({written: needed}, trainer="verl", trial_dir=tmp_path)
        assert _arg(argv, key) == [needed]  # the user's, once
    (problem,) = managed_key_problems({"+" + key: other}, {}, runs_verl=True)
    assert f"{key} ('{other}') must be '{needed}' for trainer verl" in problem[1]


def test_save_freq_and_kl_coef_are_kept(tmp_path):
    """trainer.save_freq: the user's cadence is kept (warned when it saves nothing); algorithm.kl_ctrl.kl_coef: the
    user's value starts the trial (a resumed attempt passes the controller's value, see tests/launchers)."""
    argv, _ = trial_command({"trainer.save_freq": 5, "algorithm.kl_ctrl.kl_coef": 0.003}, trainer="verl",
                            trial_dir=tmp_path)
    assert _arg(argv, "trainer.save_freq") == ["5"] and _arg(argv, "algorithm.kl_ctrl.kl_coef") == ["0.003"]
    assert managed_key_problems({"trainer.save_freq": 5}, {}, runs_verl=True) == []
    assert checkpoint_cadence_warnings({"trainer.save_freq": 5}, runs_verl=True) == []
    assert checkpoint_cadence_warnings({}, runs_verl=True) == []  # klsweep chooses one
    (warning,) = checkpoint_cadence_warnings({"trainer.save_freq": -1}, runs_verl=True)
    assert warning[0] == "trainer.save_freq" and "starts again at step 1" in warning[1]
    assert checkpoint_cadence_warnings({"trainer.save_freq": -1}, runs_verl=False) == []


def test_sweep_validate_sees_them_through_preflight():
    """`sweep validate` (and `sweep run` before anything starts) preflights every trial config of a verl sweep: a
    per-trial key is refused at its line, a save_freq that saves nothing is a warning; trainer.project_name, which
    klsweep itself writes into every trial config, is not mistaken for the user's there."""
    grpo = {**preset_overrides("grpo", "loss"), **REAL_VERL, "trainer.project_name": "klsweep-sweep"}
    assert preflight(grpo, runs_verl=True, has_flash_attn=True) == []
    with pytest.raises(PreflightError) as refused:
        preflight(grpo | {"trainer.default_local_dir": "/ckpt"}, runs_verl=True, has_flash_attn=True,
                  where={"trainer.default_local_dir": "k34.yaml:9"})
    assert str(refused.value).startswith("k34.yaml:9: trainer.default_local_dir ('/ckpt') is set by klsweep")
    (warning,) = preflight(grpo | {"trainer.save_freq": -1}, runs_verl=True, has_flash_attn=True)
    assert warning.startswith("trainer.save_freq (-1) saves no checkpoint")
