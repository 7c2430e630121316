"""Preflight of raw verl override dicts: batch arithmetic (verl#2505), required keys and micro-batch sizes as verl's
own validate_config requires them, flash-attn for verl's default attention, each value of the type of verl's default,
the warning for a KL mechanism on with coefficient 0 (verl#6519)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from klsweep.errors import PreflightError
from klsweep.verl.preflight import preflight
from klsweep.verl.presets import preset_overrides

pytestmark = pytest.mark.slow  # each call composes verl's config (~0.3 s)

A = "actor_rollout_ref."

def _prompts(name: str, rows: int) -> str:
    """The absolute path of a parquet file of ``rows`` prompts in this machine's temp folder (written once)."""
    folder = Path(tempfile.gettempdir()) / "klsweep-tests-verl"
    folder.mkdir(exist_ok=True)
    path = folder / name
    if not path.exists():
        partial = folder / f".{name}.{os.getpid()}"
        pq.write_table(pa.table({"prompt": [f"What is {i} + {i}?" for i in range(rows)]}), partial)
        partial.replace(path)
    return str(path)


REAL_VERL = {
    A + "rollout.name": "vllm",
    A + "model.path": "Qwen/Qwen2.5-0.5B-Instruct",
    "data.train_files": _prompts("train-64.parquet", 64),
    "data.val_files": _prompts("test-16.parquet", 16),
    A + "rollout.tensor_model_parallel_size": 1,
    A + "rollout.log_prob_micro_batch_size_per_gpu": 4,
    A + "ref.log_prob_micro_batch_size_per_gpu": 4,
    A + "actor.ppo_micro_batch_size_per_gpu": 2,
    "data.train_batch_size": 16,
    A + "actor.ppo_mini_batch_size": 8,
    "trainer.n_gpus_per_node": 4,
}


#: verl's default attention (flash_attention_2) is not installed: the fallback, as preflight's message gives it
SDPA = {"+" + A + "model.override_config.attn_implementation": "sdpa", A + "model.use_remove_padding": False}


def _problems(overrides, runs_verl=True, **kw) -> list[str]:
    kw.setdefault("has_flash_attn", True)
    with pytest.raises(PreflightError) as e:
        preflight(overrides, runs_verl=runs_verl, **kw)
    return str(e.value).splitlines()


def test_a_complete_grpo_config_passes():
    grpo = {**preset_overrides("grpo", "loss"), **REAL_VERL}
    # 16 prompts × 5 samples = 80 over 4 GPUs; mini-batch share 8 × 5 / 4 = 10, micro 2 divides it
    assert preflight(grpo, runs_verl=True, has_flash_attn=True) == []


def test_micro_batch_larger_than_the_per_gpu_share_shows_the_arithmetic():
    # verl#2505: a micro-batch larger than the per-GPU share of the mini-batch trains into NaN
    share_2_micro_4 = {
        "data.train_batch_size": 8,
        A + "actor.ppo_mini_batch_size": 4,
        A + "rollout.n": 2,
        "trainer.n_gpus_per_node": 4,
        A + "actor.ppo_micro_batch_size_per_gpu": 4,
    }
    (line,) = [p for p in _problems(share_2_micro_4, where={A + "actor.ppo_micro_batch_size_per_gpu": "s.yaml:7"})
               if "mini-batch per GPU" in p]
    assert line.startswith("s.yaml:7: ")
    assert "4 × 2 / 4 = 2" in line and "Use at most 2" in line


def test_batch_that_does_not_split_over_gpus():
    lines = _problems({**REAL_VERL, "data.train_batch_size": 6, A + "actor.ppo_mini_batch_size": 6,
                       "trainer.n_gpus_per_node": 4})
    assert any("6 × 1 = 6 sequences do not split evenly over 4 GPUs" in p for p in lines)


def test_mini_batch_larger_than_the_batch_and_not_dividing_it():
    assert any("(32) is larger than data.train_batch_size (16)" in p
               for p in _problems({**REAL_VERL, A + "actor.ppo_mini_batch_size": 32}))
    assert any("(20) is not a multiple of actor_rollout_ref.actor.ppo_mini_batch_size (8)" in p
               for p in _problems({**REAL_VERL, "data.train_batch_size": 20, A + "actor.ppo_mini_batch_size": 8,
                                   "trainer.n_gpus_per_node": 2}))


def test_required_keys_for_real_verl():
    lines = _problems(preset_overrides("ppo", "reward"))
    required = {p.split(" is required")[0] for p in lines if "is required with trainer: verl" in p}
    assert required >= {A + "rollout.name", "critic.model.path", A + "ref.log_prob_micro_batch_size_per_gpu",
                        A + "model.path", A + "actor.ppo_micro_batch_size_per_gpu"}
    # the embedded trainer needs none of them
    assert preflight(preset_overrides("ppo", "reward", base={"data.train_batch_size": 16,
                                                             A + "actor.ppo_mini_batch_size": 16}),
                     runs_verl=False) == []


def test_ref_micro_batch_only_when_a_reference_is_needed():
    no_kl = {**preset_overrides("drgrpo", "none"), **REAL_VERL}
    del no_kl[A + "ref.log_prob_micro_batch_size_per_gpu"]
    assert preflight(no_kl, runs_verl=True, has_flash_attn=True) == []


def test_a_string_where_verl_has_a_bool_is_refused():
    lines = _problems({A + "actor.use_dynamic_bsz": "off"}, runs_verl=False)
    assert any("use_dynamic_bsz='off' is not true/false" in p for p in lines)


_FAILS = "so every trial would fail when verl reads it"
#: id → (override, value, the whole message): a value of another type than verl's default for the key.
MISTYPED = {
    "a word for an int": ("algorithm.kl_ctrl.horizon", "xyz", "algorithm.kl_ctrl.horizon='xyz' is not a number but "
                          f"verl computes with it (its default is 10000), {_FAILS}: write a number without quotes, "
                          "e.g. 10000"),
    "a word for a float": ("algorithm.kl_ctrl.kl_coef", "high", "algorithm.kl_ctrl.kl_coef='high' is not a number "
                           f"but verl computes with it (its default is 0.001), {_FAILS}: write a number without "
                           "quotes, e.g. 0.001"),
    "a quoted number": ("data.train_batch_size", "16", "data.train_batch_size='16' is not a number but verl computes "
                        f"with it (its default is 1024), {_FAILS}: write a number without quotes, e.g. 1024"),
    "true for a float": ("algorithm.kl_ctrl.target_kl", True, "algorithm.kl_ctrl.target_kl=True is not a number but "
                         f"verl computes with it (its default is 0.1), {_FAILS}: write a number, not true/false, "
                         "e.g. 0.1"),
    "a number for a string": ("trainer.experiment_name", 7, "trainer.experiment_name=7 is a number but verl reads it "
                              "as a string (its default is 'gsm8k'): write the text in quotes, e.g. '7'"),
    "a bool for a string": (A + "actor.kl_loss_type", False, A + "actor.kl_loss_type=False is a bool but verl reads "
                            "it as a string (its default is 'low_var_kl'): write the text in quotes, e.g. 'False'"),
}


@pytest.mark.parametrize(("key", "value", "message"), MISTYPED.values(), ids=MISTYPED)
def test_a_value_of_another_type_than_verls_default_is_one_problem_with_its_line(key, value, message):
    overrides = {**preset_overrides("ppo", "reward", base={"data.train_batch_size": 16,
                                                          A + "actor.ppo_mini_batch_size": 16}), key: value}
    assert _problems(overrides, runs_verl=False, where={key: "s.yaml:7"}) == [f"s.yaml:7: {message}"]


def test_numbers_of_either_kind_pass_for_a_number_and_null_for_anything():
    overrides = {**preset_overrides("ppo", "reward", base={"data.train_batch_size": 16,
                                                          A + "actor.ppo_mini_batch_size": 16}),
                 "algorithm.kl_ctrl.kl_coef": 1,  # an int where verl's default is the float 0.001
                 A + "actor.entropy_coeff": 0.001,  # a float where verl's yaml writes 0
                 "algorithm.kl_ctrl.horizon": 500.0,
                 "trainer.total_training_steps": None, "data.seed": "any"}  # null defaults take anything
    assert preflight(overrides, runs_verl=False) == []


def test_a_typo_gets_its_line_and_the_closest_key():
    (line,) = _problems({A + "actor.kl_los_type": "kl"}, where={A + "actor.kl_los_type": "s.yaml:9"})
    assert line.startswith("s.yaml:9: ") and "did you mean 'actor_rollout_ref.actor.kl_loss_type'?" in line


def test_a_zero_coefficient_warns():
    overrides = {**preset_overrides("grpo", "loss", base={"data.train_batch_size": 10}), A + "actor.kl_loss_coef": 0}
    overrides[A + "actor.ppo_mini_batch_size"] = 10
    (warning,) = preflight(overrides, runs_verl=False)
    assert "kl_loss_coef=0" in warning


def test_a_negative_coefficient_needs_the_opt_in():
    overrides = {**preset_overrides("grpo", "loss", base={"data.train_batch_size": 10}),
                 A + "actor.ppo_mini_batch_size": 10, A + "actor.kl_loss_coef": -0.01}
    assert any("is negative" in p for p in _problems(overrides, runs_verl=False))
    assert preflight(overrides, runs_verl=False, allow_negative_kl=True) == []


def test_dynamic_batch_sizes_need_no_micro_batch_sizes():
    """verl's validate_config asks for the log-prob micro-batches (and ActorConfig for the actor's) only without
    actor.use_dynamic_bsz; the critic's follows critic.use_dynamic_bsz, which defaults to the actor's."""
    micro = [A + "rollout.log_prob_micro_batch_size_per_gpu", A + "ref.log_prob_micro_batch_size_per_gpu",
             A + "actor.ppo_micro_batch_size_per_gpu"]
    dynamic = {k: v for k, v in REAL_VERL.items() if k not in micro}
    dynamic[A + "actor.use_dynamic_bsz"] = True
    assert preflight({**preset_overrides("grpo", "loss"), **dynamic}, runs_verl=True, has_flash_attn=True) == []
    ppo = {**preset_overrides("ppo", "reward"), **dynamic, "critic.model.path": "Qwen/Qwen2.5-0.5B-Instruct",
           "critic.ppo_mini_batch_size": 8}
    assert preflight(ppo, runs_verl=True, has_flash_attn=True) == []
    # without dynamic batch sizes each one is required, the critic's included
    lines = _problems({**ppo, A + "actor.use_dynamic_bsz": False})
    required = {p.split(" is required")[0] for p in lines if "is required with trainer: verl" in p}
    assert required == {*micro, "critic.ppo_micro_batch_size_per_gpu"}
    assert all("unless" in p and "use_dynamic_bsz=true" in p for p in lines)


def test_micro_batch_sizes_follow_verl_deprecated_form_accepted_both_refused():
    grpo = {**preset_overrides("grpo", "loss"), **REAL_VERL}
    del grpo[A + "rollout.log_prob_micro_batch_size_per_gpu"]
    # verl accepts the deprecated global size in place of the per-GPU one ...
    assert preflight({**grpo, A + "rollout.log_prob_micro_batch_size": 16}, runs_verl=True,
                     has_flash_attn=True) == []
    # ... but not both
    (line,) = _problems({**grpo, A + "rollout.log_prob_micro_batch_size": 16,
                         A + "rollout.log_prob_micro_batch_size_per_gpu": 4})
    assert "are both set" in line and f"Remove {A}rollout.log_prob_micro_batch_size " in line


def test_flash_attention_missing_is_refused_with_the_sdpa_fallback():
    grpo = {**preset_overrides("grpo", "loss"), **REAL_VERL}
    (line,) = _problems(grpo, has_flash_attn=False)
    assert line.startswith(A + "model.override_config.attn_implementation is flash_attention_2 (verl's default) "
                           "but flash-attn is not installed")
    assert "pip install flash-attn" in line
    assert f"+{A}model.override_config.attn_implementation=sdpa and {A}model.use_remove_padding=false" in line
    explicit = {**grpo, "+" + A + "model.override_config.attn_implementation": "flash_attention_2"}
    (line,) = _problems(explicit, has_flash_attn=False,
                        where={"+" + A + "model.override_config.attn_implementation": "s.yaml:3"})
    assert line.startswith(f"s.yaml:3: {A}model.override_config.attn_implementation is flash_attention_2 but")
    # the fallback the message gives composes and passes
    assert preflight({**grpo, **SDPA}, runs_verl=True, has_flash_attn=False) == []
    # sdpa alone keeps verl's padding-free path, which packs sequences for flash-attn
    (line,) = _problems({**grpo, **SDPA, A + "model.use_remove_padding": True}, has_flash_attn=False,
                        where={A + "model.use_remove_padding": "s.yaml:4"})
    assert line.startswith(f"s.yaml:4: {A}model.use_remove_padding=true but flash-attn is not installed")
    # with flash-attn installed, verl's defaults are fine; the embedded trainer never asks
    assert preflight(grpo, runs_verl=True, has_flash_attn=True) == []
    assert preflight(preset_overrides("grpo", "loss", base={"data.train_batch_size": 10,
                                                            A + "actor.ppo_mini_batch_size": 10}),
                     runs_verl=False, has_flash_attn=False) == []


def test_the_critic_needs_flash_attention_whatever_its_override_config():
    """verl 0.9.1 loads the value model with attn_implementation="flash_attention_2" hard-coded
    (verl/utils/model.py load_valuehead_model): there is no sdpa fallback for PPO's critic."""
    ppo = {**preset_overrides("ppo", "reward"), **REAL_VERL, **SDPA, "critic.model.path": "Qwen/Qwen2.5-0.5B-Instruct",
           "critic.ppo_micro_batch_size_per_gpu": 2, "critic.ppo_mini_batch_size": 8,
           "+critic.model.override_config.attn_implementation": "sdpa", "critic.model.use_remove_padding": False}
    (line,) = _problems(ppo, has_flash_attn=False)
    assert line.startswith("the critic (algorithm.adv_estimator=gae, or critic.enable) needs flash-attn")
    assert "load_valuehead_model" in line and "pip install flash-attn" in line
    assert preflight(ppo, runs_verl=True, has_flash_attn=True) == []


def test_flash_attention_presence_defaults_to_this_python(monkeypatch):
    import importlib.util

    grpo = {**preset_overrides("grpo", "loss"), **REAL_VERL}
    real = importlib.util.find_spec
    for installed in (False, True):
        def find_spec(name, *args, installed=installed):
            if name == "flash_attn":
                return importlib.machinery.ModuleSpec("flash_attn", None) if installed else None
            return real(name, *args)

        monkeypatch.setattr(importlib.util, "find_spec", find_spec)
        if installed:
            assert preflight(grpo, runs_verl=True) == []
        else:
            with pytest.raises(PreflightError, match="flash-attn is not installed"):
                preflight(grpo, runs_verl=True)


#: Batch-arithmetic refusals of ``preflight`` no other test reaches: id → (changes to a complete GRPO
#: config, the line).
#: The complete config: 16 prompts × rollout.n 5 = 80 sequences, mini-batch 8, micro-batch 2, 4 GPUs.
PREFLIGHT_REFUSALS = {
    # 8 × 5 = 40 sequences per mini-batch over 3 GPUs: 40 / 3 = 13.33
    "a mini-batch that does not split over the GPUs": (
        {"trainer.n_gpus_per_node": 3},
        "actor mini-batch per GPU = ppo_mini_batch_size × rollout.n / GPUs = 8 × 5 / 3 is not a whole number "
        "(trainer.nnodes × trainer.n_gpus_per_node = 1 × 3): make 40 a multiple of 3"),
    # share 8 × 5 / 4 = 10; 10 % 4 = 2
    "a micro-batch that does not divide the per-GPU share": (
        {A + "actor.ppo_micro_batch_size_per_gpu": 4},
        f"{A}actor.ppo_micro_batch_size_per_gpu (4) does not divide the actor mini-batch per GPU = "
        "ppo_mini_batch_size × rollout.n / GPUs = 8 × 5 / 4 = 10: a remainder would leave one micro-batch short; use a "
        "divisor"),
}


@pytest.mark.parametrize(("changes", "line"), PREFLIGHT_REFUSALS.values(), ids=PREFLIGHT_REFUSALS)
def test_each_preflight_refusal_names_the_key_the_value_and_the_fix(changes, line):
    grpo = {**preset_overrides("grpo", "loss"), **REAL_VERL, **changes}
    assert line in _problems(grpo)


def test_missing_local_data_files_and_model_folders(tmp_path):
    """Absolute paths are checked where the sweep starts; a Hugging Face id and a URL are not (``~`` and relative
    paths: test_late_failures). Trials on this machine: refused; elsewhere: a warning."""
    (tmp_path / "train.parquet").touch()
    (tmp_path / "model").mkdir()
    gone = tmp_path / "gone"
    grpo = {**preset_overrides("grpo", "loss"), **REAL_VERL,
            "data.train_files": f"[{tmp_path / 'train.parquet'},{gone / 'extra.parquet'}]",  # Hydra's list form
            "data.val_files": [str(gone / "test.parquet"), "hdfs://cluster/test.parquet"],
            A + "model.path": str(tmp_path / "model")}
    missing = [
        f"data.train_files: the data file {gone / 'extra.parquet'} does not exist on this machine: ",
        f"data.val_files: the data file {gone / 'test.parquet'} does not exist on this machine: ",
    ]
    here = ("every trial would fail when verl loads it. Fix the path, or run the sweep with --address on a cluster "
            "whose nodes have it")
    elsewhere = "the nodes that run the trials must have it, or every trial fails when verl loads it"
    assert preflight(grpo, runs_verl=True, has_flash_attn=True) == [line + elsewhere for line in missing]
    assert _problems(grpo, files_here=True) == [line + here for line in missing]
    assert _problems({**grpo, A + "model.path": str(gone / "qwen")}, files_here=True, where={
        A + "model.path": "s.yaml:4"}) == [line + here for line in missing] + [
            f"s.yaml:4: {A}model.path: the model {gone / 'qwen'} does not exist on this machine: {here}"]
    # a Hugging Face id is not a local path
    assert preflight({**grpo, A + "model.path": "Qwen/Qwen2.5-0.5B-Instruct", "data.val_files": str(gone / "v.pq"),
                      "data.train_files": REAL_VERL["data.train_files"]}, runs_verl=True, has_flash_attn=True) == [
        f"data.val_files: the data file {gone / 'v.pq'} does not exist on this machine: " + elsewhere]
