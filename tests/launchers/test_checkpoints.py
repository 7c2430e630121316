"""Checkpoint cost and retention of verl trials: the save steps verl makes, no wasted save, and which finished trial
keeps its checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from klsweep.launchers.checkpoints import (
    BYTES_PER_PARAMETER,
    KEPT_FILE,
    checkpoint_cost,
    checkpoint_steps,
    parameter_count,
    retain_finished,
    trial_save_freq,
    wasted_save,
)
from klsweep.launchers.failures import TrialFailed
from klsweep.launchers.process import run_process_trial
from klsweep.spec import load_sweep

#: The stand-in without its own Ray: these tests are about files.
NO_RAY = {"own_ray": 0, "interval": 0.005}


def _saved_steps(trial_dir):
    return sorted(int(p.name.rsplit("_", 1)[1]) for p in (trial_dir / "checkpoints").glob("global_step_*"))


def test_verls_save_steps_as_its_reference_run_made_them():
    """verl's GRPO reference log (tests/data/README.md, grpo_qwen7b_gsm8k): save_freq 20 over 105 steps saved after
    steps 20, 40, ..., 100 and 105; the save after 100 protects 5 steps and costs about 15."""
    assert checkpoint_steps(105, 20) == [20, 40, 60, 80, 100, 105]
    assert wasted_save(105, 20) == 100
    assert wasted_save(100, 20) is None and wasted_save(105, 21) is None
    assert checkpoint_steps(10, -1) == []


def test_klsweeps_cadence_makes_no_wasted_save(verl_standin, tmp_path):
    """58 steps: a fifth is 11, whose saves would be 11, 22, 33, 44, 55 and 58 (55 protects 3 steps). The stand-in
    saves as verl does (every multiple and the last step), so the folders it leaves are the saves made."""
    run_process_trial({**NO_RAY, "trainer.total_training_steps": 58}, trainer="verl", trial_dir=tmp_path,
                      report=lambda m: None)
    assert _saved_steps(tmp_path) == [12, 24, 36, 48, 58]


def test_a_cadence_the_sweep_sets_is_kept():
    assert trial_save_freq({"trainer.total_training_steps": 58, "trainer.save_freq": 11}) == 11
    assert trial_save_freq({"trainer.total_training_steps": 58, "trainer.test_freq": 11}) == 11
    assert trial_save_freq({"trainer.total_training_steps": 1001}) == 201  # 200 would save after 1000


def test_the_size_of_a_save_comes_from_the_models_safetensors(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    save_file({"embed": torch.zeros(300, 40, dtype=torch.bfloat16), "norm": torch.zeros(40)},
              str(model / "model-00001-of-00002.safetensors"))
    save_file({"head": torch.zeros(40, 7, dtype=torch.float16)}, str(model / "model-00002-of-00002.safetensors"))
    params = 300 * 40 + 40 + 40 * 7
    assert parameter_count(model) == params

    cost = checkpoint_cost({"actor_rollout_ref.model.path": str(model), "trainer.total_training_steps": 100})
    assert cost.steps == [20, 40, 60, 80, 100] and cost.bytes_per_save == params * BYTES_PER_PARAMETER
    assert cost.kept_while_running == 1
    gae = checkpoint_cost({"actor_rollout_ref.model.path": str(model), "algorithm.adv_estimator": "gae"})
    assert gae.bytes_per_save == 2 * params * BYTES_PER_PARAMETER  # the critic's too
    assert parameter_count(tmp_path / "missing") is None


#: The example verl sweep (objective: max val-core/openai/gsm8k/acc/mean@1), whose trials the stand-in runs.
SWEEP = Path(__file__).resolve().parents[2] / "sweeps" / "verl_gsm8k_grpo.yaml"


def _finish(trial_dir, score, keep="best", **knobs):
    sweep = load_sweep(str(SWEEP), [])
    run_process_trial({**NO_RAY, "trainer.total_training_steps": 4, "score": score,
                       "score_metric": sweep.objectives[0].metric, **knobs},
                      sweep=sweep, trainer="verl", trial_dir=trial_dir, report=lambda m: None, keep_checkpoints=keep,
                      retries=0)
    return (trial_dir / "checkpoints").exists()


def test_only_the_best_finished_trial_keeps_its_checkpoint(verl_standin, tmp_path):
    """The sweep's objective as the trials logged it decides; a worse trial's checkpoint goes at its end."""
    a, b = tmp_path / "runs" / "a", tmp_path / "runs" / "b"
    assert _finish(a, 0.5)
    assert not _finish(b, 0.4)
    assert _saved_steps(a) == [1, 2, 3, 4]  # verl's folders of every save, the last one's actor/ kept
    assert json.loads((tmp_path / "runs" / KEPT_FILE).read_text()) == {"a": [0.5]}

    with pytest.raises(TrialFailed):  # a trial that did not finish keeps its checkpoint, for a retry or a remedy
        _finish(tmp_path / "runs" / "c", 0.1, crash=1, crash_after_step=2)
    assert _saved_steps(tmp_path / "runs" / "c") == [1, 2]


def _logged(trial_dir, **final):
    """A finished trial's files as verl leaves them: a checkpoint folder and a file-logger line."""
    (trial_dir / "checkpoints" / "global_step_4").mkdir(parents=True)
    (trial_dir / "attempt-1").mkdir()
    (trial_dir / "attempt-1" / "metrics.jsonl").write_text(json.dumps({"step": 4, "data": final}) + "\n")
    return trial_dir


def test_a_better_trial_takes_the_place_and_the_policies_all_and_none(tmp_path):
    objective = [("critic/score/mean", "max")]
    assert retain_finished(_logged(tmp_path / "a", **{"critic/score/mean": 0.5}), objective)
    assert retain_finished(_logged(tmp_path / "b", **{"critic/score/mean": 0.7}), objective)
    assert not (tmp_path / "a" / "checkpoints").exists()
    assert not retain_finished(_logged(tmp_path / "c", **{"actor/entropy": 0.7}), objective)  # no objective value
    assert retain_finished(_logged(tmp_path / "d", **{"critic/score/mean": 0.1}), objective, "all")
    assert not retain_finished(_logged(tmp_path / "e", **{"critic/score/mean": 0.9}), objective, "none")
    assert {p.parent.name for p in tmp_path.glob("*/checkpoints")} == {"b", "d"}


def test_with_two_objectives_the_pareto_front_keeps_its_checkpoints(tmp_path):
    objectives = [("val-core/acc", "max"), ("actor/kl_loss", "min")]
    kept = {name: retain_finished(_logged(tmp_path / name, **{"val-core/acc": acc, "actor/kl_loss": kl}), objectives)
            for name, acc, kl in [("a", 0.5, 0.10), ("b", 0.6, 0.20), ("c", 0.4, 0.30), ("d", 0.7, 0.05)]}
    assert kept == {"a": True, "b": True, "c": False, "d": True}
    assert {p.parent.name for p in tmp_path.glob("*/checkpoints")} == {"d"}  # d dominates a and b
    with pytest.raises(ValueError, match="KLSWEEP_KEEP_CHECKPOINTS='newest' is not a checkpoint retention policy"):
        retain_finished(tmp_path / "d", objectives, "newest")
