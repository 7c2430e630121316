"""A trial that no node of the Ray cluster can hold is refused before it starts (`sweep run`, `sweep resume`), with one
line and exit 2: a `trainer: verl` sweep asking for a GPU on a machine without one used to wait silently for ever.
`sweep validate` only warns (a sweep is checked on a laptop and run on a cluster). So do the local data files and
model folders a verl sweep names: missing where the trials would run, the sweep is refused before Ray starts."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from klsweep.cli import main
from klsweep.orchestrate.capacity import capacity_problem
from klsweep.results import SweepRecord, default_storage
from klsweep.spec import load_sweep
from tests.orchestrate.conftest import sweep_file

NO_GPU = ("each trial asks for 1 GPU (budget.resources.gpu) but this Ray cluster has 0 GPUs: run on a GPU node, "
          "connect to a cluster with --address, or use trainer: embedded")


def test_the_largest_node_decides():
    laptop = [{"CPU": 8.0, "memory": 1e10}]
    assert capacity_problem({"cpu": 4, "gpu": 1}, laptop, trainer="verl") == NO_GPU
    assert capacity_problem({"cpu": 4, "gpu": 2}, laptop, trainer="embedded") == (
        "each trial asks for 2 GPUs (budget.resources.gpu) but this Ray cluster has 0 GPUs: run on a GPU node, "
        "connect to a cluster with --address, or set budget.resources.gpu: 0")
    two_4gpu_nodes = [{"CPU": 32.0, "GPU": 4.0}, {"CPU": 32.0, "GPU": 4.0}]
    assert capacity_problem({"cpu": 4, "gpu": 8}, two_4gpu_nodes, trainer="verl") == (  # 8 in all, 4 per node
        "each trial asks for 8 GPUs (budget.resources.gpu) but the largest node of this Ray cluster has 4 (8 in all) "
        "and a trial runs on one node: lower budget.resources.gpu (with trainer.n_gpus_per_node) to at most 4, or "
        "connect to a cluster with larger nodes with --address")
    assert capacity_problem({"cpu": 48, "gpu": 4}, two_4gpu_nodes, trainer="verl") == (
        "each trial asks for 48 CPUs (budget.resources.cpu) but the largest node of this Ray cluster has 32 (64 in "
        "all) and a trial runs on one node: lower budget.resources.cpu to at most 32, or connect to a cluster with "
        "larger nodes with --address")
    assert capacity_problem({"cpu": 32, "gpu": 4}, two_4gpu_nodes, trainer="verl") is None  # exactly one node
    assert capacity_problem({"cpu": 1, "gpu": 0.5}, [{"CPU": 2.0, "GPU": 1.0}], trainer="verl") is None  # a share
    assert capacity_problem({"cpu": 1, "gpu": 0}, laptop, trainer="embedded") is None  # a CPU sweep on a laptop


def _verl_sweep(tmp_path: Path) -> str:
    """The new user's verl2.yaml: GRPO on verl, 1 GPU per trial, with data files that exist."""
    for name in ("train.parquet", "test.parquet"):
        (tmp_path / name).touch()
    sweep = {
        "name": "verl_try2", "algorithm": "grpo", "trainer": "verl",
        "overrides": {
            "actor_rollout_ref.model.path": "Qwen/Qwen2.5-0.5B-Instruct",
            "data.train_files": str(tmp_path / "train.parquet"),
            "data.val_files": str(tmp_path / "test.parquet"),
            "trainer.n_gpus_per_node": 1,
            "+actor_rollout_ref.model.override_config.attn_implementation": "sdpa",
            "actor_rollout_ref.model.use_remove_padding": False,
            "actor_rollout_ref.rollout.name": "vllm",
            "actor_rollout_ref.rollout.tensor_model_parallel_size": 1,  # verl's 2 starts no vLLM server on 1 GPU
            "actor_rollout_ref.actor.use_dynamic_bsz": True,
        },
        "parameters": {"kl_coef": {"distribution": "log_uniform_values", "min": 0.001, "max": 0.1}},
        "objective": {"metric": "val-core/openai/gsm8k/acc/mean@1", "mode": "max"},
        "budget": {"trials": 2, "max_concurrent": 1, "max_steps": 20, "resources": {"cpu": 12, "gpu": 1}},
    }
    path = tmp_path / "verl2.yaml"
    path.write_text(yaml.safe_dump(sweep, sort_keys=False))
    return str(path)


@pytest.mark.slow  # composes verl's config for the preflight (~2 s)
def test_a_verl_sweep_on_a_ray_without_gpus_is_refused_before_any_trial(ray_local, tmp_path, capsys):
    assert sum(node["Resources"].get("GPU", 0) for node in ray_local.nodes()) == 0  # the tests' Ray: CPUs only
    out = tmp_path / "out"
    assert main(["run", _verl_sweep(tmp_path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == f"sweep run: error: {NO_GPU}"
    assert "Traceback" not in err
    assert not out.exists()  # nothing left that would block the retry
    assert ray_local.is_initialized()  # a Ray the caller started is left to it


@pytest.mark.slow  # composes verl's config for the preflight (~2 s)
def test_a_verl_sweep_whose_data_is_not_here_is_refused_before_ray(tmp_path, capsys):
    path = _verl_sweep(tmp_path)
    (tmp_path / "test.parquet").unlink()
    out = tmp_path / "out"
    assert main(["run", path, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"sweep run: error: {path}:7: data.val_files: the data file {tmp_path / 'test.parquet'} does not "
                   "exist on this machine: every trial would fail when verl loads it. Fix the path, or run the sweep "
                   "with --address on a cluster whose nodes have it"]
    assert not out.exists()


def test_resume_is_refused_before_it_changes_the_sweep_directory(ray_local, tmp_path, capsys):
    """An embedded sweep asking for a GPU, extended with budget.trials=5: refused, sweep.json as it was."""
    path = sweep_file(tmp_path, "gpu", budget={"trials": 1, "max_steps": 2, "resources": {"cpu": 1, "gpu": 1}})
    sweep = load_sweep(path)
    out = tmp_path / "out"
    out.mkdir()
    SweepRecord(name=sweep.name, sweep_file=path, study_name=sweep.name, storage=default_storage(),
                objectives=[o.model_dump() for o in sweep.objectives], sweep=sweep.model_dump(mode="json")).write(out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    assert main(["resume", str(out), "budget.trials=5"]) == 2

    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("sweep resume: error: each trial asks for 1 GPU (budget.resources.gpu) but this Ray cluster "
                       "has 0 GPUs: run on a GPU node, connect to a cluster with --address, or set "
                       "budget.resources.gpu: 0")
    after = {p.name: p.read_bytes() for p in out.iterdir() if p.name != "driver.lock"}
    assert after == before  # no study, no Tune folder, the budget not raised


@pytest.mark.slow  # composes verl's config for the preflight (~2 s)
def test_validate_passes_and_warns_only_where_no_gpu_shows(tmp_path, capsys):
    assert main(["validate", _verl_sweep(tmp_path)]) == 0
    out = capsys.readouterr().out
    gpu_here = any(shutil.which(tool) for tool in ("nvidia-smi", "rocm-smi")) or any(
        Path(device).exists() for device in ("/dev/nvidia0", "/dev/kfd"))
    warning = ("warning: budget.resources.gpu is 1 but this machine has no GPU: `sweep run` here would refuse to "
               "start. Run it on a GPU node, or with --address on a Ray cluster that has GPUs")
    assert (warning in out) is not gpu_here
    assert out.strip().endswith("ok (grpo, trainer verl, 1 parameters, 2 trials)")
