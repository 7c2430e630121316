"""notebooks/pareto_analysis.ipynb runs end to end (nbclient, the python3 kernel of this environment)."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "pareto_analysis.ipynb"


def run_notebook(run_dir: Path) -> nbformat.NotebookNode:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    old = os.environ.get("KLSWEEP_RUN_DIR")
    os.environ["KLSWEEP_RUN_DIR"] = str(run_dir)  # the kernel inherits this process's environment
    try:
        NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(run_dir)}}).execute()
    finally:
        if old is None:
            os.environ.pop("KLSWEEP_RUN_DIR")
        else:
            os.environ["KLSWEEP_RUN_DIR"] = old
    return nb


def text_of(nb: nbformat.NotebookNode) -> str:
    out = []
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            out.append(output.get("text", "") or "".join(output.get("data", {}).get("text/plain", "")))
    return "\n".join(out)


@pytest.mark.slow
def test_notebook_runs_on_a_sweep(synthetic_sweep):
    nb = run_notebook(synthetic_sweep(8))
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert errors == []
    text = text_of(nb)
    # the chosen point is the front trial with the best score: trial 0 (smallest kl_loss_coef, most drift)
    assert "trial 0: value/critic/score/mean" in text
    assert "python3 -m verl.trainer.main_ppo" in text and "actor_rollout_ref.actor.kl_loss_coef=0.0001" in text
    # the reproduce lines sweep run prints for an embedded sweep, the embedded trainer's command first
    assert "reproduce on the embedded trainer:\npython3 -m klsweep.trainers.embedded " in text
    figures = [o for c in nb.cells for o in c.get("outputs", [])
               if "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert len(figures) == 6  # front, KL frontier, curves, importance, knobs, slice
    # the frontier cell calls sweep_frontier: these generated trials log no response length, and it says so
    assert ("KL frontier: not fitted: no trial logged a reference KL, response_length/mean and critic/score/mean at "
            "the same step") in text


@pytest.mark.slow
def test_notebook_reproduces_a_remedied_trial_as_its_segment_schedule(synthetic_sweep):
    """The reproduce cell left the trial's remedies out: trial 0, rescued by a kl_runaway remedy at step 6 that
    restarted it from step 4's checkpoint with kl_coef 0.015 (was 0.01), printed one command that runs as proposed
    to the end. It prints the two segments, as trials.csv, sweep status and the report do."""
    from klsweep.analysis.sweep_dir import load, overrides_of
    from klsweep.trainers import reproduce_lines

    from .test_report import remedied_specs

    run_dir = synthetic_sweep(remedied_specs(), name="remedied")
    text = text_of(run_notebook(run_dir))
    chosen = load(run_dir).set_index("number").loc[0]
    expected = reproduce_lines("embedded", overrides_of(chosen), chosen["remedies"])
    assert "trial 0: value/critic/score/mean" in text and "\n".join(expected) in text
    assert expected[0].startswith("segment 1 of 2: steps 1-6 (kl_runaway fired at step 6)")
    assert any(line.startswith("segment 2 of 2: steps 5 to the end from the checkpoint of step 4 with "
                               "algorithm.kl_ctrl.kl_coef=0.015") for line in expected)
