"""Extending a finished sweep (`sweep resume DIR budget.trials=N`) stops its new trials as one longer sweep would: the
new Tuner's median and fate stoppers hear the trials that ran before
(:meth:`klsweep.orchestrate.rule_stopper.StopperChain.replay`).

``sweeps/drgrpo_vs_grpo.yaml`` on its table, one trial at a time, is deterministic: 4 trials in one run give the seed
trial's health stop at step 40 and three fate stops at step 10 (``tests/data/equivalence/drgrpo_vs_grpo.json``)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from klsweep.cli import main
from tests.test_equivalence import _table_overrides

REPO = Path(__file__).resolve().parents[2]
SWEEP = REPO / "sweeps" / "drgrpo_vs_grpo.yaml"


def _rows(out: Path) -> list[tuple]:
    trials = pd.read_csv(out / "trials.csv").sort_values("number")
    return list(trials[["number", "state", "steps", "stop_reason"]].itertuples(index=False, name=None))


def test_an_extended_sweep_stops_its_new_trials_as_one_run_would(ray_local, tmp_path):
    args = [*_table_overrides("drgrpo_vs_grpo"), "seed=0", "budget.max_concurrent=1", "--quiet"]
    whole, split = tmp_path / "whole", tmp_path / "split"
    assert main(["run", str(SWEEP), *args, "budget.trials=4", "--out", str(whole)]) in (0, 1)
    assert main(["run", str(SWEEP), *args, "budget.trials=2", "--out", str(split)]) in (0, 1)
    assert main(["resume", str(split), "budget.trials=4", "--quiet"]) in (0, 1)
    expected = _rows(whole)
    assert [(n, state, steps) for n, state, steps, _ in expected] == [
        (0, "PRUNED", 40), (1, "PRUNED", 10), (2, "PRUNED", 10), (3, "PRUNED", 10)]
    assert _rows(split) == expected  # trials 2 and 3 fate-stopped at step 10 against trials 0 and 1, not at 20-40
