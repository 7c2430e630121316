"""The report's curves: a panel per objective the KL/entropy/score panels do not show, with the reference policy's
score as a baseline, which for the embedded trainer is a trial's own step-0 validation (verl's
trainer.val_before_train)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from matplotlib.image import imread

from klsweep.analysis.baseline import reference_scores
from klsweep.analysis.curves import curves_data
from klsweep.analysis.plots import plotly_figure
from klsweep.analysis.pngs import write_pngs
from klsweep.results import REFERENCE_FILE
from klsweep.spec import load_sweep
from klsweep.spec.space import trial_overrides
from klsweep.trainers.embedded.trainer import run
from tests.orchestrate.conftest import VAL, sweep_file


@pytest.mark.slow
def test_the_embedded_reference_score_is_a_trials_step_0_validation(tmp_path):
    sweep = load_sweep(sweep_file(tmp_path))
    overrides = trial_overrides(sweep, {"kl_coef": 0.002})
    df = pd.DataFrame([{"number": 0, **{f"config/{k}": v for k, v in overrides.items()}}])
    step_0 = run({**overrides, "trainer.total_training_steps": 1})[0]
    assert step_0["step"] == 0  # validation before training, as verl logs it
    assert reference_scores("embedded", [VAL], df) == {VAL: step_0[VAL]}
    assert reference_scores("verl", [VAL], df) == {}  # verl's step 0 is merged into step 1: not told apart
    assert reference_scores("embedded", ["critic/score/mean"], df) == {}
    assert reference_scores("embedded", [VAL], df.iloc[0:0]) == {}

    # kept in the sweep directory with the overrides it was computed under: built once per sweep
    assert reference_scores("embedded", [VAL], df, cache_dir=tmp_path) == {VAL: step_0[VAL]}
    cache = tmp_path / REFERENCE_FILE
    saved = json.loads(cache.read_text())
    assert saved["scores"] == {VAL: step_0[VAL]}
    cache.write_text(json.dumps({**saved, "scores": {VAL: 0.125}}))  # a value only the cache holds
    assert reference_scores("embedded", [VAL], df, cache_dir=tmp_path) == {VAL: 0.125}
    other = df.assign(**{"config/data.max_response_length": 6})  # other overrides: computed again, not the cache's
    assert reference_scores("embedded", [VAL], other, cache_dir=tmp_path)[VAL] != 0.125


def test_an_objective_gets_a_panel_with_the_baseline(tmp_path):
    history = pd.DataFrame(
        [("a", step, metric, value) for step, score, val in ((1, 0.2, None), (2, 0.4, 0.5), (3, 0.6, None),
                                                             (4, 0.8, 0.45))
         for metric, value in (("critic/score/mean", score), (VAL, val)) if value is not None],
        columns=["trial_id", "step", "metric", "value"])
    df = pd.DataFrame([{"number": 0, "trial_id": "a", "health": "healthy"}])
    objectives = [(VAL, "max"), ("critic/score/mean", "max")]
    data = curves_data(history, df, objectives=objectives, baselines={VAL: 0.58203125})
    # the validation objective first; critic/score/mean has its panel already (score): not twice
    assert [p.alias for p in data.panels] == [VAL, "ref_kl", "entropy", "score"]
    gold, score = data.panels[0], data.panels[3]
    assert gold.title == f"{VAL} (objective, max)" and gold.baseline == 0.58203125
    assert (gold.lines[0].steps, gold.lines[0].values) == ([2, 4], [0.5, 0.45])  # gold down ...
    assert score.lines[0].values == [0.2, 0.4, 0.6, 0.8] and score.baseline is None  # ... while the proxy rises
    pad = 0.08 * (0.58203125 - 0.45)
    assert gold.ylim == pytest.approx((0.45 - pad, 0.58203125 + pad))  # the baseline is in view

    fig = plotly_figure(data)
    assert [a.text for a in fig.layout.annotations if a.text.startswith("reference policy")] == [
        "reference policy (0.582)"]
    [png] = write_pngs({"curves": data}, tmp_path, width=600)
    assert imread(png).shape[1] == 600
