"""trainer: verl sweeps reserve exactly the GPUs verl asks for: budget.resources.gpu = trainer.nnodes ×
trainer.n_gpus_per_node (verl's default n_gpus_per_node is 8), on one node per trial."""

from __future__ import annotations

from pathlib import Path

import pytest

from klsweep.errors import SweepFileError
from klsweep.spec import load_sweep

REPO = Path(__file__).resolve().parents[2]


def _problems(path, *cli) -> list[str]:
    with pytest.raises(SweepFileError) as e:
        load_sweep(path, list(cli))
    return e.value.problems


def test_verls_default_eight_gpus_per_node_against_one_reserved_gpu(sweep_file):
    path = sweep_file("trainer: verl\nbudget: {trials: 2, resources: {cpu: 10, gpu: 1}}\n")
    (problem,) = _problems(path)
    assert problem.startswith(f"{path}:5: budget.resources.gpu: budget.resources.gpu is 1 but each verl trial uses "
                              "trainer.nnodes × trainer.n_gpus_per_node = 1 × 8 = 8 GPUs (n_gpus_per_node 8 is "
                              "verl's default)")
    assert "Total available GPUs 1 is less than total desired GPUs 8" in problem
    assert problem.endswith("Set budget.resources.gpu: 8, or trainer.n_gpus_per_node: 1 in overrides")


def test_no_gpu_reserved_for_a_verl_trial(sweep_file):
    (problem,) = _problems(sweep_file("trainer: verl\noverrides:\n  trainer.n_gpus_per_node: 2\n"))
    assert "budget.resources.gpu is 0 but each verl trial uses" in problem and "1 × 2 = 2 GPUs" in problem
    assert "(n_gpus_per_node 2 is set in overrides)" in problem and "Set budget.resources.gpu: 2" in problem


def test_more_gpus_reserved_than_verl_uses(sweep_file):
    path = sweep_file("trainer: verl\noverrides:\n  trainer.n_gpus_per_node: 4\n")
    (problem,) = _problems(path, "budget.resources.gpu=8")
    assert "4 of the reserved GPUs would sit idle in every trial" in problem


@pytest.mark.parametrize("gpus, per_node", [(1, 1), (4, 4), (0.5, 1), (8, None)])
def test_matching_gpus_pass(sweep_file, gpus, per_node):
    text = "trainer: verl\n" + (f"overrides:\n  trainer.n_gpus_per_node: {per_node}\n" if per_node else "")
    sweep = load_sweep(sweep_file(text), [f"budget.resources.gpu={gpus}"])
    assert sweep.budget.resources.gpu == gpus


def test_multi_node_trials_are_refused(sweep_file):
    path = sweep_file("trainer: verl\noverrides:\n  trainer.nnodes: 2\n  trainer.n_gpus_per_node: 8\n")
    (problem,) = _problems(path, "budget.resources.gpu=16")
    assert problem.startswith(f"{path}:6: overrides.trainer.nnodes: trainer.nnodes=2: klsweep runs each verl trial "
                              "as one process with its own local Ray on one node")
    assert "Set trainer.nnodes: 1" in problem


def test_gpu_count_is_not_a_hyperparameter(sweep_file):
    path = sweep_file("trainer: verl\nparameters:\n  trainer.n_gpus_per_node: {values: [1, 2]}\n")
    (problem,) = _problems(path, "budget.resources.gpu=1")
    assert "parameters.trainer.n_gpus_per_node: trainer.n_gpus_per_node is searched" in problem


def test_the_embedded_trainer_reserves_no_gpu(sweep_file):
    assert load_sweep(sweep_file("budget: {trials: 2, resources: {cpu: 1, gpu: 0}}\n")).budget.resources.gpu == 0


def test_gpu_smoke_sweep_validates():
    """benchmarks/gpu_smoke.yaml: one GPU per trial and verl's attention without flash-attn (klsweep[gpu] does not
    install it), so `sweep validate` passes on any machine with the placeholders as they are."""
    import io

    from klsweep.orchestrate.plan import validate

    out = io.StringIO()
    assert validate(str(REPO / "benchmarks" / "gpu_smoke.yaml"), [], out=out) == 0, out.getvalue()
