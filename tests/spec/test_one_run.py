"""`sweep validate` reports every independent problem of a file in one run: schema errors, verl keys, the checks of a
schema-valid sweep and verl's preflight together; and a non-finite number names its field."""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from klsweep.errors import SweepFileError
from klsweep.orchestrate.plan import validate
from klsweep.spec.load import load_partial, load_sweep
from klsweep.verl.config import config_dir


def _validate(path) -> tuple[int, list[str]]:
    out = io.StringIO()
    code = validate(str(path), [], out=out)
    return code, out.getvalue().splitlines()


#: one mistake per stage: the schema (a typo'd field, a NaN bound), a verl key, a knob with no effect (the checks of a
#: schema-valid sweep), the batch arithmetic (verl's preflight)
FOUR_STAGES = """\
overrides:
  actor_rollout_ref.actor.kl_los_type: low_var_kl
  algorithm.kl_ctrl.target_kl: 0.1
  data.train_batch_size: 10
  actor_rollout_ref.actor.ppo_mini_batch_size: 4
parameters:
  kl_coef: {min: .nan, max: 0.1}
budget: {trials: 4, max_concurent: 2}
"""


@pytest.mark.slow
def test_schema_key_knob_and_preflight_errors_are_reported_in_one_run(sweep_file):
    code, lines = _validate(sweep_file(FOUR_STAGES))
    errors = [line for line in lines if line.startswith("  error: ")]
    assert code == 2
    expected = ["parameters.kl_coef.min", "budget.max_concurent", "overrides.actor_rollout_ref.actor.kl_los_type",
                "overrides.algorithm.kl_ctrl.target_kl", "data.train_batch_size (10) is not a multiple of "
                "actor_rollout_ref.actor.ppo_mini_batch_size (4)"]
    for field in expected:
        assert sum(field in line for line in errors) == 1, (field, errors)
    assert len(errors) == len(expected), errors


@pytest.mark.slow
def test_a_problem_the_preflight_also_checks_is_reported_once(sweep_file):
    # a negative KL coefficient is refused by the sweep's checks and by the preflight's check_values: one line, and
    # the batch problem of the same file is still found in that run
    path = sweep_file("""\
        overrides:
          actor_rollout_ref.actor.kl_loss_coef: -0.1
          algorithm.kl_ctrl.target_kl: 0.1
          data.train_batch_size: 10
          actor_rollout_ref.actor.ppo_mini_batch_size: 4
        """)
    code, lines = _validate(path)
    errors = [line for line in lines if line.startswith("  error: ")]
    assert code == 2
    assert sum("kl_loss_coef" in line for line in errors) == 1, errors
    assert sum("is not a multiple of" in line for line in errors) == 1, errors
    assert sum("target_kl" in line for line in errors) == 1, errors


@pytest.mark.parametrize(("text", "field", "shown"), [
    ("parameters:\n  kl_coef: {min: .nan, max: 0.1}\n", "parameters.kl_coef.min", "nan"),
    ("parameters:\n  kl_coef: {min: 0.001, max: .inf}\n", "parameters.kl_coef.max", "inf"),
    ("parameters:\n  kl_coef: {values: [0.001, .nan]}\n", "parameters.kl_coef.values.1", "nan"),
    ("parameters:\n  kl_coef: {value: -.inf}\n", "parameters.kl_coef.value", "-inf"),
    ("overrides:\n  actor_rollout_ref.actor.clip_ratio: .nan\n", "overrides.actor_rollout_ref.actor.clip_ratio", "nan"),
])
def test_a_non_finite_number_names_its_field_and_value(sweep_file, text, field, shown):
    with pytest.raises(SweepFileError) as e:
        load_sweep(sweep_file(text))
    [problem] = e.value.problems
    assert problem.split(": ")[1] == field, problem
    assert f"(got {shown})" in problem and "finite number" in problem, problem


def test_a_nan_bound_leaves_the_rest_of_the_file_checked(sweep_file):
    _, problems = load_partial(sweep_file("parameters:\n  kl_coef: {min: .nan, max: 0.1}\n"
                                          "  kl_loss_typ: {values: [kl, k4]}\n"))
    assert [p.split(": ")[1] for p in problems] == ["parameters.kl_coef.min", "parameters.kl_loss_typ"], problems


EXAMPLE = Path(__file__).resolve().parents[2] / "sweeps" / "verl_gsm8k_grpo.yaml"


@pytest.mark.slow
def test_the_example_verl_sweep_on_one_gpu_two_at_once_names_every_late_failure(tmp_path):
    """sweeps/verl_gsm8k_grpo.yaml with 2 trials at once on 1 GPU, verl's own rollout defaults (read from its YAML)
    in place of the example's, a 4-CPU budget, a ~ data path, a relative model folder and a 500-prompt training file:
    one `sweep validate` run names each late failure, with its fix."""
    rollout = yaml.safe_load(Path(config_dir(), "rollout", "rollout.yaml").read_text())
    train = tmp_path / "train.parquet"
    pq.write_table(pa.table({"prompt": [f"q{i}" for i in range(500)]}), train)  # 500 // 256 = 1 step an epoch
    r = "overrides.actor_rollout_ref.rollout."
    cli = ["budget.resources.gpu=0.5", "budget.max_concurrent=2", "budget.resources.cpu=4",
           f"{r}gpu_memory_utilization={rollout['gpu_memory_utilization']}",
           f"{r}tensor_model_parallel_size={rollout['tensor_model_parallel_size']}",
           f"overrides.data.train_files={train}", "overrides.data.val_files=~/data/gsm8k/test.parquet",
           "overrides.actor_rollout_ref.model.path=./models/Qwen2.5-0.5B-Instruct"]
    out = io.StringIO()
    assert validate(str(EXAMPLE), cli, out=out) == 2
    errors = [line for line in out.getvalue().splitlines() if line.startswith("  error: ")]
    named = {
        "vLLM memory": "gpu_memory_utilization is 0.5 and budget.resources.gpu is 0.5: up to 2 trials share one GPU",
        "engine width": "so verl starts 1 // 2 = 0 vLLM servers",
        "~ path": "data.val_files: the data file path ~/data/gsm8k/test.parquet starts with ~, which verl does not "
                  "expand",
        "relative path": "actor_rollout_ref.model.path: the model path ./models/Qwen2.5-0.5B-Instruct is relative",
        "CPUs": "budget.resources.cpu is 4 but each verl trial's own Ray reserves 12 CPUs",
        "epochs": "trainer.total_epochs=30 (verl's default) × 1 steps an epoch (500 rows of data.train_files // "
                  "data.train_batch_size 256) = 30 steps, fewer than trainer.total_training_steps = "
                  "budget.max_steps = 100",
    }
    for what, text in named.items():
        assert sum(text in line for line in errors) == 1, (what, errors)
    assert len(errors) == len(named), errors
    fixes = ["Set actor_rollout_ref.rollout.gpu_memory_utilization: 0.4 in overrides",
             "Set actor_rollout_ref.rollout.tensor_model_parallel_size: 1 in overrides", "Write the absolute path",
             "Set budget.resources.cpu: 12", "Set trainer.total_epochs: 100 in overrides"]
    assert all(any(fix in line for line in errors) for fix in fixes), errors


@pytest.mark.slow
def test_wandb_in_the_logger_no_longer_hides_the_rest_of_the_file(sweep_file):
    # wandb in trainer.logger was raised when the first trial config was built: nothing else of the file was checked
    path = sweep_file("""\
        overrides:
          trainer.logger: [console, wandb]
          algorithm.kl_ctrl.target_kl: 0.1
          data.train_batch_size: 10
          actor_rollout_ref.actor.ppo_mini_batch_size: 4
        parameters:
          kl_coef: {min: 0.001, max: 0.1}
        seed_trials:
          - {kl_coef: 0.5}
        """)
    code, lines = _validate(path)
    errors = [line for line in lines if line.startswith("  error: ")]
    assert code == 2
    assert errors[0].startswith(f"  error: {path}:5: overrides.trainer.logger: ['console', 'wandb'] includes wandb")
    for field in ("seed_trials.0.kl_coef", "overrides.algorithm.kl_ctrl.target_kl", "is not a multiple of"):
        assert sum(field in line for line in errors) == 1, (field, errors)
    assert len(errors) == 4, errors


def test_an_unreadable_table_is_one_problem_among_the_others(sweep_file, tmp_path):
    # a tabular table that is not a table was raised out of the checks: the file's other problems went unseen
    (tmp_path / "bad.jsonl.gz").write_text("not gzip\n")
    path = sweep_file("trainer: tabular\ntabular: {table: bad.jsonl.gz}\n"
                      "overrides:\n  algorithm.kl_ctrl.target_kl: 0.1\n")
    _, problems = load_partial(path)
    assert [p.split(": ")[1] for p in problems] == ["overrides.algorithm.kl_ctrl.target_kl", "tabular.table"], problems
    assert f"{tmp_path / 'bad.jsonl.gz'}: cannot read the tabular benchmark table" in problems[1]
