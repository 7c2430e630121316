"""Keys of a sweep checked against the verl config its trials run: verl's Megatron worker's keys under
``actor_rollout_ref.actor.strategy: megatron`` (verl's ``model_engine: megatron`` config group)."""

from __future__ import annotations

import io

import pytest
from omegaconf import OmegaConf

from klsweep.errors import SweepFileError
from klsweep.orchestrate.plan import validate
from klsweep.spec import load_sweep
from klsweep.spec.space import fixed_overrides
from klsweep.verl.config import config_dir, format_overrides

A = "actor_rollout_ref.actor."
MEGATRON = f"""\
trainer: verl
overrides:
  {A}strategy: megatron
  {A}megatron.tensor_model_parallel_size: 2
  {A}megatron.context_parallel_size: 2
  trainer.n_gpus_per_node: 8
  data.train_files: /data/gsm8k/train.parquet
  data.val_files: /data/gsm8k/test.parquet
  data.train_batch_size: 16
  actor_rollout_ref.model.path: Qwen/Qwen2.5-0.5B-Instruct
  {A}ppo_mini_batch_size: 8
  {A}ppo_micro_batch_size_per_gpu: 2
  actor_rollout_ref.rollout.name: vllm
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu: 4
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu: 4
budget: {{trials: 2, max_concurrent: 1, resources: {{cpu: 33, gpu: 8}}}}
"""


def test_verls_megatron_config_has_the_keys_its_default_config_lacks():
    """What the sweep below relies on, read in verl's own YAML: the Megatron keys live in the megatron actor config
    that `model_engine: megatron` selects (ppo_megatron_trainer.yaml does exactly that)."""
    megatron = OmegaConf.load(f"{config_dir()}/ppo_megatron_trainer.yaml")
    assert {"override model_engine": "megatron"} in OmegaConf.to_container(megatron.defaults)
    assert "megatron" not in OmegaConf.load(f"{config_dir()}/actor/dp_actor.yaml")
    assert "context_parallel_size" in OmegaConf.load(f"{config_dir()}/engine/megatron.yaml")


@pytest.mark.slow
def test_a_megatron_sweep_validates_and_its_trials_run_the_megatron_config(sweep_file):
    path = sweep_file(MEGATRON)
    out = io.StringIO()
    assert validate(str(path), [], out=out) == 0, out.getvalue()
    fixed = fixed_overrides(load_sweep(path))
    assert format_overrides(fixed)[0] == "model_engine=megatron"  # main_ppo composes the config checked here


@pytest.mark.slow
def test_megatron_keys_without_the_megatron_actor_name_the_switch(sweep_file):
    path = sweep_file(MEGATRON.replace(f"  {A}strategy: megatron\n", ""))
    with pytest.raises(SweepFileError) as e:
        load_sweep(path)
    assert [p.split(": ")[1] for p in e.value.problems] == [
        f"overrides.{A}megatron.tensor_model_parallel_size", f"overrides.{A}megatron.context_parallel_size"]
    assert all(f"it is a key of verl's Megatron config: set {A}strategy: megatron" in p for p in e.value.problems)


@pytest.mark.slow
def test_a_megatron_config_verl_refuses_is_refused_in_the_same_run(sweep_file):
    path = sweep_file(MEGATRON.replace("tensor_model_parallel_size: 2", "tensor_model_parallel_size: 3"))
    out = io.StringIO()
    assert validate(str(path), [], out=out) == 2
    (error,) = [line for line in out.getvalue().splitlines() if line.startswith("  error: ")]
    assert "verl 0.9.1 refuses this Megatron config" in error
    assert "n_gpus (8) must be divisible by model_parallel_size (3) times context_parallel_size (2)" in error
