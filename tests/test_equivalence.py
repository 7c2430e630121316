"""Restructuring changes no behaviour: every shipped sweep file, run on the tabular trainer (the recorded embedded
runs of ``benchmarks/tabular/``) with the same seed, gives the same trials, verdicts and ``trials.csv`` columns as
the commit recorded in ``tests/data/equivalence/`` (``python -m tests.test_equivalence --record`` rewrites them;
``tests/data/README.md`` names the commit).

The tabular trainer makes a run deterministic and fast: each trial replays the recorded run of its nearest grid
point, and ``budget.max_concurrent=1`` fixes the order in which Optuna sees the trials.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
from pathlib import Path

import pandas as pd
import pytest
import yaml

from klsweep.cli import main

REPO = Path(__file__).resolve().parents[1]
RECORDED = REPO / "tests" / "data" / "equivalence"
# The shipped embedded sweeps: those with a recorded table (a `trainer: verl` example has none).
TABLES = REPO / "benchmarks" / "tabular"
SWEEPS = sorted(p for p in (REPO / "sweeps").glob("*.yaml") if (TABLES / f"{p.stem}.jsonl.gz").exists())
TRIALS = 4


def _table_overrides(name: str) -> list[str]:
    """The overrides that run sweep file ``name`` on its table: trainer, table and the categories it recorded."""
    table = REPO / "benchmarks" / "tabular" / f"{name}.jsonl.gz"
    with gzip.open(table, "rt") as f:
        header = json.loads(f.readline())
    spec = yaml.safe_load((REPO / "sweeps" / f"{name}.yaml").read_text())
    if "search_space" in spec:
        spec = yaml.safe_load((REPO / "search_spaces" / f"{spec['search_space']}.yaml").read_text())
    names = spec["parameters"]
    out = ["trainer=tabular", f"tabular.table={table}"]
    for key, axis in header["header"]["parameters"].items():
        grid = axis.get("grid")
        if axis.get("scale") == "categorical" and grid is not None and grid != axis.get("values"):
            name = next(n for n in names if key == n or key.endswith("." + n))  # a full key or its alias
            out.append(f"parameters.{name}={{values: [{', '.join(map(str, grid))}]}}")
    return out


def _rounded(value):
    """Floats to 10 significant digits (the CSV round trip); NaN as None."""
    if isinstance(value, float):
        return None if math.isnan(value) else float(f"{value:.10g}")
    return value


def capture(sweep_file: Path, out: Path) -> dict:
    """Run ``sweep_file`` for :data:`TRIALS` trials on its table into ``out``; returns what must not change."""
    overrides = [*_table_overrides(sweep_file.stem), f"budget.trials={TRIALS}", "budget.max_concurrent=1"]
    code = main(["run", str(sweep_file), *overrides, "--out", str(out), "--quiet"])
    frame = pd.read_csv(out / "trials.csv")
    kept = [c for c in frame.columns if c not in ("trial_id", "wall_s")]
    rows = [{c: _rounded(v) for c, v in row.items()} for row in frame[kept].to_dict("records")]
    return {"exit": code, "columns": list(frame.columns), "trials": rows}


@pytest.mark.slow
@pytest.mark.parametrize("sweep_file", SWEEPS, ids=[p.stem for p in SWEEPS])
def test_shipped_sweep_gives_the_recorded_trials(ray_local, sweep_file, tmp_path, capsys):
    expected = json.loads((RECORDED / f"{sweep_file.stem}.json").read_text())
    got = capture(sweep_file, tmp_path / "run")
    assert got["exit"] == expected["exit"]
    assert got["columns"] == expected["columns"]
    for g, e in zip(got["trials"], expected["trials"], strict=True):
        assert g == e


if __name__ == "__main__":
    import tempfile

    parser = argparse.ArgumentParser(description="record what each shipped sweep file gives on its table")
    parser.add_argument("--record", action="store_true", required=True)
    parser.parse_args()
    RECORDED.mkdir(parents=True, exist_ok=True)
    for path in SWEEPS:
        with tempfile.TemporaryDirectory() as tmp:
            (RECORDED / f"{path.stem}.json").write_text(json.dumps(capture(path, Path(tmp) / "run"), indent=1) + "\n")
        print(f"recorded {path.stem}")
