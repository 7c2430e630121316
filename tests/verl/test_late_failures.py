"""What fails a verl trial late, found by preflight: a rollout engine wider than the trial, max_model_len below
prompt + response, ~ and relative paths, trainer.total_epochs ending a trial before its steps, and a Megatron config
verl itself refuses. verl's defaults are read from its installed YAML files, not from klsweep."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from klsweep.errors import PreflightError
from klsweep.verl.config import compose, config_dir
from klsweep.verl.preflight import preflight
from klsweep.verl.presets import preset_overrides

from .test_preflight import REAL_VERL

pytestmark = pytest.mark.slow  # each call composes verl's config (~0.3 s)

A = "actor_rollout_ref."
R = A + "rollout."
ROLLOUT_YAML = yaml.safe_load(Path(config_dir(), "rollout", "rollout.yaml").read_text())
TRAINER_YAML = yaml.safe_load(Path(config_dir(), "ppo_trainer.yaml").read_text())


def _grpo(**changes) -> dict:
    return {**preset_overrides("grpo", "loss"), **REAL_VERL, **changes}


def _problems(overrides, **kw) -> list[str]:
    with pytest.raises(PreflightError) as e:
        preflight(overrides, runs_verl=True, has_flash_attn=True, **kw)
    return str(e.value).splitlines()


def test_verls_default_rollout_engine_gives_a_one_gpu_trial_no_vllm_server():
    default = ROLLOUT_YAML["tensor_model_parallel_size"]
    assert default == 2  # verl 0.9.1's rollout.yaml
    one_gpu = {k: v for k, v in _grpo(**{"trainer.n_gpus_per_node": 1}).items()
               if k != R + "tensor_model_parallel_size"}
    (problem,) = _problems(one_gpu, where={"trainer.n_gpus_per_node": "s.yaml:9"})
    assert problem.startswith(f"{R}tensor_model_parallel_size={default} (verl's default): each vLLM engine spans "
                              f"tensor × data × pipeline parallel = {default} × 1 × 1 = {default} GPUs but a trial "
                              "has 1 (trainer.nnodes × trainer.n_gpus_per_node = 1 × 1)"), problem
    assert "verl starts 1 // 2 = 0 vLLM servers (verl/workers/rollout/llm_server.py)" in problem
    assert problem.endswith(f"Set {R}tensor_model_parallel_size: 1 in overrides")
    # 4 GPUs hold two engines of 2 GPUs; the embedded trainer has no rollout engine
    assert preflight({**one_gpu, "trainer.n_gpus_per_node": 4}, runs_verl=True, has_flash_attn=True) == []
    assert not any("vLLM" in p for p in _problems_or_none({**one_gpu}, runs_verl=False))


def _problems_or_none(overrides, **kw) -> list[str]:
    try:
        preflight(overrides, **kw)
    except PreflightError as e:
        return str(e).splitlines()
    return []


def test_max_model_len_below_prompt_plus_response():
    assert ROLLOUT_YAML["max_model_len"] is None  # verl's default: the model's max_position_embeddings
    lengths = {"data.max_prompt_length": 512, "data.max_response_length": 1024}
    (problem,) = _problems(_grpo(**lengths, **{R + "max_model_len": 1500}), where={R + "max_model_len": "s.yaml:7"})
    assert problem.startswith(f"s.yaml:7: {R}max_model_len=1500 is below data.max_prompt_length + "
                              "data.max_response_length = 512 + 1024 = 1536: vLLM cuts a response"), problem
    assert "response_length/clip_ratio never counts as truncated" in problem
    assert problem.endswith(f"Set {R}max_model_len: 1536 or more, or remove it (verl then uses the model's "
                            "max_position_embeddings)")
    for fits in (1536, 4096, None):
        assert preflight(_grpo(**lengths, **{R + "max_model_len": fits}), runs_verl=True, has_flash_attn=True) == []


def test_tilde_and_relative_paths_fail_in_the_trials_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models" / "qwen").mkdir(parents=True)
    problems = _problems(_grpo(**{"data.train_files": "~/data/gsm8k/train.parquet",
                                  "data.val_files": "[data/test.parquet,hdfs://c/test.parquet]",
                                  A + "model.path": "models/qwen"}))
    home = Path("~").expanduser()
    assert problems == [
        "data.train_files: the data file path ~/data/gsm8k/train.parquet starts with ~, which verl does not expand "
        "(verl.utils.fs.copy_to_local reads the path as given): every trial fails when it loads it. Write the "
        f"absolute path (here: {home}/data/gsm8k/train.parquet)",
        "data.val_files: the data file path data/test.parquet is relative, and verl reads it from the trial's "
        "working directory (its own attempt-N/ folder under the sweep's results), where it is not: every trial "
        f"fails when it loads it. Write the absolute path (from here: {tmp_path}/data/test.parquet)",
        f"{A}model.path: the model path models/qwen is relative, and verl reads it from the trial's working "
        "directory (its own attempt-N/ folder under the sweep's results), where it is not: every trial fails when "
        f"it loads it. Write the absolute path (from here: {tmp_path}/models/qwen)",
    ]
    # a Hugging Face id is a model path that is neither; an OmegaConf interpolation is resolved by verl
    assert preflight(_grpo(**{A + "model.path": "Qwen/Qwen2.5-0.5B-Instruct"}), runs_verl=True,
                     has_flash_attn=True) == []
    assert not any("relative" in p for p in _problems_or_none(
        _grpo(**{"data.val_files": "${oc.env:HOME}/data/test.parquet"}), runs_verl=True, has_flash_attn=True))


def _rows(path: Path, n: int) -> str:
    pq.write_table(pa.table({"prompt": [f"q{i}" for i in range(n)]}), path)
    return str(path)


def test_total_epochs_ending_a_trial_before_its_steps(tmp_path):
    epochs = TRAINER_YAML["trainer"]["total_epochs"]
    assert epochs == 30  # verl 0.9.1's default
    train = _rows(tmp_path / "train.parquet", 100)  # 100 // 16 = 6 steps an epoch (verl drops the partial batch)
    run = _grpo(**{"data.train_files": train, "trainer.total_training_steps": 200})  # 30 × 6 = 180 < 200
    (problem,) = _problems(run, where={"trainer.total_training_steps": "s.yaml:3"})
    assert problem == (
        f"trainer.total_epochs={epochs} (verl's default) × 6 steps an epoch (100 rows of data.train_files // "
        "data.train_batch_size 16) = 180 steps, fewer than trainer.total_training_steps = budget.max_steps = 200: "
        "verl ends every trial at step 180, before its budget, and the trial is recorded as stopped early. Set "
        "trainer.total_epochs: 34 in overrides, or budget.max_steps: 180")
    assert preflight({**run, "trainer.total_epochs": 34}, runs_verl=True, has_flash_attn=True) == []
    # two files are counted together: 200 // 16 = 12 an epoch, 360 steps
    both = f"[{train},{_rows(tmp_path / 'more.parquet', 100)}]"
    assert preflight({**run, "data.train_files": both}, runs_verl=True, has_flash_attn=True) == []
    (small,) = _problems({**run, "data.train_files": _rows(tmp_path / "tiny.parquet", 10)})
    assert small.startswith("data.train_batch_size=16 is more than the 10 rows of data.train_files")


def test_total_epochs_not_checkable_without_the_data_is_a_warning(tmp_path):
    run = _grpo(**{"data.train_files": str(tmp_path / "elsewhere.parquet"), "trainer.total_training_steps": 200})
    warnings = preflight(run, runs_verl=True, has_flash_attn=True)
    assert warnings[0].startswith("trainer.total_epochs=30 could not be checked against "
                                  "trainer.total_training_steps (200): data.train_files")
    assert "is not on this machine" in warnings[0]
    (tmp_path / "empty.parquet").touch()
    (unread,) = preflight({**run, "data.train_files": str(tmp_path / "empty.parquet")}, runs_verl=True,
                          has_flash_attn=True)
    assert unread.startswith(f"trainer.total_epochs=30 could not be checked against trainer.total_training_steps "
                             f"(200): data.train_files ({tmp_path / 'empty.parquet'}) could not be read as parquet "
                             "here ("), unread


MEGATRON = {
    A + "actor.strategy": "megatron",
    A + "actor.megatron.tensor_model_parallel_size": 2,
    A + "actor.megatron.context_parallel_size": 2,
    "trainer.n_gpus_per_node": 8,
    "data.train_batch_size": 16,
    A + "rollout.n": 4,
    A + "actor.ppo_mini_batch_size": 8,
    A + "actor.ppo_micro_batch_size_per_gpu": 2,
}


def test_a_megatron_actor_is_composed_against_verls_megatron_config():
    cfg = compose(MEGATRON)
    for key in ("actor.strategy", "ref.strategy"):
        assert cfg.actor_rollout_ref[key.split(".")[0]][key.split(".")[1]] == "megatron"
    assert cfg.critic.strategy == "megatron" and cfg.actor_rollout_ref.actor.megatron.context_parallel_size == 2
    assert preflight({**preset_overrides("grpo", "loss"), **REAL_VERL, **MEGATRON}, runs_verl=True,
                     has_flash_attn=False) == []  # Megatron builds its own attention: no flash-attn check


@pytest.mark.parametrize(("changes", "key", "said"), [
    # verl.utils.config.validate_config: the GPUs split into tensor × pipeline × context parallel groups
    ({A + "actor.megatron.tensor_model_parallel_size": 3}, A + "actor.megatron.context_parallel_size",
     "n_gpus (8) must be divisible by model_parallel_size (3) times context_parallel_size (2)"),
    # McoreEngineConfig.__post_init__
    ({A + "actor.megatron.dtype": "float32"}, A + "actor.megatron", "dtype float32 not supported"),
    ({A + "actor.megatron.dynamic_context_parallel": True}, A + "actor.megatron",
     "max_seqlen_per_dp_cp_rank must be a positive integer when dynamic_context_parallel is enabled"),
])
def test_what_verl_refuses_in_a_megatron_config_is_refused(changes, key, said):
    (problem,) = _problems({**preset_overrides("grpo", "loss"), **REAL_VERL, **MEGATRON, **changes})
    assert problem.startswith("verl 0.9.1 refuses this Megatron config (verl.utils.config.validate_config, which "
                              "main_ppo runs first): "), problem
    assert said in problem and problem.endswith(f"Fix {key} in overrides"), problem


def test_megatron_keys_without_the_megatron_actor_name_the_switch():
    keys = {k: v for k, v in MEGATRON.items() if k != A + "actor.strategy"}
    (problem,) = _problems({**preset_overrides("grpo", "loss"), **REAL_VERL, **keys})
    assert problem.startswith(f"'{A}actor.megatron.tensor_model_parallel_size' is not a key of verl 0.9.1's "
                              f"ppo_trainer config: it is a key of verl's Megatron config: set {A}actor.strategy: "
                              "megatron (klsweep then composes, and runs, verl's ppo_trainer with "
                              "model_engine=megatron"), problem


def test_megatron_mini_batches_are_split_over_its_data_parallel_ranks():
    # 8 GPUs in tensor 2 × context 2 groups: 2 data-parallel ranks, each 8 × 4 / 2 = 16 sequences a mini-batch
    (problem,) = _problems({**preset_overrides("grpo", "loss"), **REAL_VERL, **MEGATRON,
                            A + "actor.ppo_micro_batch_size_per_gpu": 5})
    assert problem.startswith(f"{A}actor.ppo_micro_batch_size_per_gpu (5) does not divide the actor mini-batch per "
                              "GPU = ppo_mini_batch_size × rollout.n / data-parallel ranks = 8 × 4 / 2 = 16"), problem
