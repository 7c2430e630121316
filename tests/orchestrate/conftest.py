"""Tiny sweep files for the orchestration tests: 4-prompt × 2-sample PPO batches on the embedded trainer, validation
every 2 steps, explicit mini-batch sizes (the way to make a real sweep take seconds, see test_sweep_run.tiny_sweep)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from klsweep.cli import main

VAL = "val-core/arith/acc/mean@1"
KL = "actor/reward_kl_penalty"  # PPO keeps the KL in the reward: the reference KL verl logs there

#: A stop rule only trials with a large kl_coef trip: PPO's fixed controller reports β = kl_coef as
#: actor/reward_kl_penalty_coeff. ``after: 1`` judges from step 2, the first validation step, so a stopped trial
#: has a value for every objective.
BETA_HIGH = {"name": "beta_high", "metric": "actor/reward_kl_penalty_coeff", "above": 0.01, "after": 1,
             "action": "stop", "kind": "diverged", "advice": "lower kl_coef"}


def sweep_file(tmp_path: Path, name: str = "tiny", **fields: Any) -> str:
    """Write a tiny sweep file; ``fields`` replace top-level entries (``budget`` is merged)."""
    sweep: dict[str, Any] = {
        "name": name,
        "algorithm": "ppo",
        "overrides": {
            "algorithm.kl_ctrl.type": "fixed",
            "data.train_batch_size": 4,
            "actor_rollout_ref.actor.ppo_mini_batch_size": 4,
            "critic.ppo_mini_batch_size": 4,
            "actor_rollout_ref.rollout.n": 2,
            "trainer.test_freq": 2,
        },
        "parameters": {"kl_coef": {"values": [0.001, 0.002, 0.05]}},
        "objective": {"metric": VAL, "mode": "max"},
        "sampler": "random",
        "budget": {"trials": 3, "max_concurrent": 2, "max_steps": 4},
        "health": {"preset": "default", "rules": [BETA_HIGH]},
    }
    budget = {**sweep["budget"], **fields.pop("budget", {})}
    sweep.update(copy.deepcopy(fields), budget=budget)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(sweep, sort_keys=False))
    return str(path)


PARETO_SEEDS = [{"kl_coef": 0.001}, {"kl_coef": 0.05}, {"kl_coef": 0.002}]


@pytest.fixture(scope="session")
def pareto_run(ray_local, tmp_path_factory) -> Path:
    """A finished 2-objective sweep (max validation accuracy, min reference KL), NSGA-II, where the health rule
    stops the kl_coef=0.05 trial at step 2 (infeasible) and the two small-β trials run their 4 steps."""
    tmp_path = tmp_path_factory.mktemp("pareto")
    out = tmp_path / "out"
    path = sweep_file(tmp_path, "pareto", objective=[{"metric": VAL, "mode": "max"}, {"metric": KL, "mode": "min"}],
                      sampler="nsga2", seed_trials=PARETO_SEEDS)
    assert main(["run", path, "--out", str(out), "--quiet"]) == 0
    return out


def started_sweep_dir(tmp_path: Path, path: str) -> Path:
    """``tmp_path/out`` as `sweep run` leaves it for the sweep file at ``path`` before its first trial: sweep.json
    only."""
    from klsweep.results import SweepRecord, default_storage
    from klsweep.spec import load_sweep

    sweep = load_sweep(path)
    out = tmp_path / "out"
    out.mkdir()
    SweepRecord(name=sweep.name, sweep_file=path, study_name=sweep.name, storage=default_storage(),
                objectives=[o.model_dump() for o in sweep.objectives], sweep=sweep.model_dump(mode="json")).write(out)
    return out
