"""klsweep.analysis.frontier on a sweep across KL estimators: one frontier per KL scale group, on the recorded runs
of the shipped sweeps/grpo_kl.yaml (benchmarks/tabular/grpo_kl.jsonl.gz, the embedded trainer's own metrics)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import curve_fit

from klsweep.analysis.frontier import sweep_frontier
from klsweep.analysis.frontier_figure import frontier_data
from klsweep.trainers.tabular import decode_run, read_table_records

from .conftest import AGG, KL_COEF, KL_TYPE

TABLE = Path(__file__).resolve().parents[2] / "benchmarks" / "tabular" / "grpo_kl.jsonl.gz"
VAL = "val-core/arith/acc/mean@1"
OBJECTIVES = [{"metric": VAL, "mode": "max"}, {"metric": "actor/kl_loss", "mode": "min"}]
#: Seed 0's runs with kl_loss_coef <= 0.1 (conftest's distribution): low_var_kl and its straight-through low_var_kl+
#: (one scale), kl (k1), and two abs runs: too few for a frontier.
PICK = {"low_var_kl": None, "low_var_kl+": {0.01, 0.1}, "kl": None, "abs": {0.001, 0.1}}


def _runs() -> list[tuple[dict, list[tuple[int, dict[str, float]]]]]:
    _, records = read_table_records(TABLE)
    out = []
    for r in records:
        kind, coef = r["params"][KL_TYPE], r["params"][KL_COEF]
        if r["seed"] == 0 and kind in PICK and coef <= 0.1 and (PICK[kind] is None or round(coef, 6) in PICK[kind]):
            out.append((r["params"], decode_run(r)))
    return out


def _spec(params: dict, history: list[tuple[int, dict[str, float]]]) -> dict:
    steps = dict(history)
    return {"params": {KL_COEF: params[KL_COEF], KL_TYPE: params[KL_TYPE], AGG: params[AGG]}, "steps": len(history),
            "health": "healthy", "stop_reason": "", "metrics": lambda _p, step: steps[step]}


def _rl(d: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    return np.where(d > 0, d * (alpha - beta * np.log(np.where(d > 0, d, 1.0))), 0.0)


def _independent_fit(runs) -> tuple[float, float, float]:
    """(alpha, beta, reference) of the Gao RL form fitted by scipy to every validation step of ``runs``."""
    firsts, d, y = [], [], []
    for _, history in runs:
        scored = [(s, m) for s, m in history if math.isfinite(m.get(VAL, math.nan))]
        firsts.append(scored[0])
        for _, m in scored:
            kl = m.get("actor/kl_loss", math.nan) * m.get("response_length/mean", math.nan)
            if math.isfinite(kl) and kl >= 0:
                d.append(math.sqrt(kl))
                y.append(m[VAL])
    earliest = min(s for s, _ in firsts)
    reference = float(np.median([m[VAL] for s, m in firsts if s == earliest]))
    (alpha, beta), _ = curve_fit(_rl, np.array(d), np.array(y) - reference, p0=(0.1, 0.01))
    return float(alpha), float(beta), reference


def test_a_grpo_kl_sweep_across_estimators_gets_one_frontier_per_scale(synthetic_sweep):
    runs = _runs()
    result = sweep_frontier(synthetic_sweep([_spec(p, h) for p, h in runs], objectives=OBJECTIVES, max_steps=80),
                            n_boot=50, references={})
    assert [(g.scale, g.n_configs, g.frontier is not None) for g in result.groups] == [
        ("actor/kl_loss (low_var_kl, token-mean)", 7, True), ("actor/kl_loss (kl, token-mean)", 5, True),
        ("actor/kl_loss (abs, token-mean)", 2, False)]
    for group, kinds in zip(result.groups[:2], [("low_var_kl", "low_var_kl+"), ("kl",)]):
        mine = [(p, h) for p, h in runs if p[KL_TYPE] in kinds]
        alpha, beta, reference = _independent_fit(mine)
        fit = group.frontier.fits["rl"]
        assert group.frontier.reference == pytest.approx(reference)
        assert (fit.alpha, fit.beta) == pytest.approx((alpha, beta), rel=1e-5)
        assert fit.kl_star == pytest.approx(math.exp(2 * (alpha / beta - 1)), rel=1e-4)
    lines = result.summary().splitlines()
    assert lines[0].startswith("KL frontiers, one per KL scale (2 of 3 fitted")
    assert lines[-1] == "  no frontier for actor/kl_loss (abs, token-mean): 2 feasible trials, needs 4"
    assert all(len(line) <= 80 for line in lines)
    data = frontier_data(result)
    assert data.title.startswith("KL frontier of actor/kl_loss (low_var_kl, token-mean): ")
    assert len(data.feasible.x) == 7 and lines[-1] in data.notes


def test_one_scale_of_the_grpo_kl_sweep_is_fitted_as_before(synthetic_sweep):
    runs = [(p, h) for p, h in _runs() if p[KL_TYPE] == "kl"]
    alone = sweep_frontier(synthetic_sweep([_spec(p, h) for p, h in runs], name="kl", objectives=OBJECTIVES,
                                           max_steps=80), n_boot=50, references={})
    alpha, beta, _ = _independent_fit(runs)
    assert alone.groups == () and alone.scale == "actor/kl_loss (kl, token-mean)" and alone.frontier is not None
    assert (alone.frontier.fits["rl"].alpha, alone.frontier.fits["rl"].beta) == pytest.approx((alpha, beta), rel=1e-5)
    assert alone.summary().startswith("KL frontier (Gao RL form, 5 trials): KL* = ")
    assert "\n" not in alone.summary()


def test_status_and_report_name_each_scale_group_in_80_columns(synthetic_sweep, capsys):
    from klsweep.analysis.report import write_report
    from klsweep.cli import main

    from .conftest import FRONTIER_OBJECTIVES, frontier_specs

    specs = frontier_specs([1.0, 4.0, 9.0, 16.0, 25.0, 2.0])
    specs[5]["params"][KL_TYPE] = "kl"  # k1: another estimator, another scale
    run_dir = synthetic_sweep(specs, objectives=FRONTIER_OBJECTIVES)
    expected = ["KL frontiers, one per KL scale (1 of 2 fitted; trials compared within a scale):",
                "  actor/kl_loss (low_var_kl, token-mean) (Gao RL form, 5 trials): KL* = 7.39",
                "  no frontier for actor/kl_loss (kl, token-mean): 1 feasible trial, needs 4"]
    assert main(["status", str(run_dir)]) == 0
    out = capsys.readouterr().out.splitlines()
    head = out.index(expected[0])
    assert out[head + 1].startswith(expected[1]) and expected[2] in out[head + 1:]
    assert all(len(line) <= 80 for line in out[head:out.index(expected[2]) + 1])
    assert write_report(run_dir, run_dir / "out", pngs=False) == 0
    page = (run_dir / "out" / "report.html").read_text()
    assert f'<h2 id="frontier">KL frontier</h2><p>{expected[0]}<br>{expected[1]}' in page
    assert f"<br>{expected[2]}</p>" in page
