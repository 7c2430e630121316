"""The analysis on a real small sweep (``pareto_run``: embedded trainer, real Ray Tune + Optuna, 3 trials, one
stopped by a health rule): ``sweep report`` and the notebook. Here rather than in tests/analysis/ because the
session-scoped ``pareto_run`` fixture lives in tests/orchestrate/conftest.py (one sweep for the whole suite)."""

from __future__ import annotations

import json

import optuna
import pytest

from klsweep.analysis.report import write_report
from tests.analysis.test_notebook import run_notebook, text_of
from tests.orchestrate.conftest import VAL

pytestmark = pytest.mark.slow


def _study(out):
    info = json.loads((out / "sweep.json").read_text())
    return optuna.load_study(study_name=info["study_name"], storage=f"sqlite:///{out / 'study.db'}"), info


def test_report_of_a_real_sweep(pareto_run, tmp_path):
    study, info = _study(pareto_run)
    assert write_report(pareto_run, tmp_path, pngs=False) == 0
    page = (tmp_path / "report.html").read_text()
    stopped = [t for t in study.trials if t.user_attrs["health"] == "stopped"]
    assert len(stopped) == 1 and "beta_high" in page
    # compute accounting from the study's own records: steps run, and steps not run by the stopped trial
    max_steps = info["sweep"]["budget"]["max_steps"]
    used = sum(t.user_attrs["steps"] for t in study.trials)
    saved = sum(max_steps - t.user_attrs["steps"] for t in stopped)
    assert f"{used} trial-steps" in page and f"saved {saved} trial-steps" in page
    # the front's KL is the in-reward KL of these PPO trials, and the page says so
    assert "KL plotted: actor/reward_kl_penalty (kl, per-sequence token mean)" in page
    for t in study.best_trials:
        assert f"<p>trial {t.number}:</p>" in page  # each front trial with its verl command


def test_notebook_on_a_real_sweep(pareto_run):
    study, _ = _study(pareto_run)
    nb = run_notebook(pareto_run)
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert errors == []
    # the notebook picks the front trial with the best validation accuracy: Optuna's own front decides which
    best = min(study.best_trials, key=lambda t: (-t.values[0], t.number))  # ties: the lowest number
    assert f"trial {best.number}: value/{VAL}" in text_of(nb)
    assert "python3 -m verl.trainer.main_ppo" in text_of(nb)
