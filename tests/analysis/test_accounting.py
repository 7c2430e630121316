"""Compute accounting: trial-steps and GPU-hours used and saved, worked out by hand."""

from __future__ import annotations

import pandas as pd
import pytest

from klsweep.analysis.accounting import compute_accounting


def test_accounting_by_hand():
    df = pd.DataFrame({
        "state": ["COMPLETE", "COMPLETE", "PRUNED", "FAIL", "COMPLETE"],
        "health": ["healthy", "stopped", "healthy", "healthy", "warned"],
        "steps": [20, 5, 10, 0, 20],
        "wall_s": [400.0, 50.0, 300.0, 0.0, 200.0],
    })
    table = compute_accounting(df, max_steps=20, gpu=2.0).set_index("outcome")
    # health stop: trial 1 ran 5 steps at 10 s/step, 15 steps saved -> 150 s = 1/24 h, x2 GPUs
    assert table.loc["health stop", "steps_saved"] == 15
    assert table.loc["health stop", "gpu_h_saved"] == pytest.approx(150 * 2 / 3600)
    # scheduler stop: trial 2 ran 10 steps at 30 s/step, 10 saved -> 300 s
    assert table.loc["scheduler stop", "wall_h_saved"] == pytest.approx(300 / 3600)
    # failed at step 0: 20 steps not run, no seconds per step to cost them
    assert table.loc["failed", "steps_saved"] == 20 and table.loc["failed", "wall_h_saved"] == 0
    assert table.loc["full budget", "trials"] == 2 and table.loc["full budget", "steps_saved"] == 0
    assert table.loc["total", "steps_used"] == 55
    assert table.loc["total", "gpu_h_used"] == pytest.approx(950 * 2 / 3600)
    assert table.loc["total", "steps_saved"] == 45
    assert table.loc["total", "gpu_h_saved"] == pytest.approx((150 + 300) * 2 / 3600)

