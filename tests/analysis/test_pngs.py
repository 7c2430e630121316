"""PNG renderers (matplotlib, no browser): they draw the data of klsweep.analysis.figures that the plotly figures
show, at the width asked, without leaving pyplot figures or Optuna's style behind."""

from __future__ import annotations

import matplotlib
import optuna
import pandas as pd
import pytest
from matplotlib.image import imread

from klsweep.analysis.figures import SliceData, front_data, table_data
from klsweep.analysis.load import load
from klsweep.analysis.plots import front_figure
from klsweep.analysis.pngs import render, write_pngs

OBJECTIVES = [("critic/score/mean", "max"), ("actor/kl_loss", "min")]


def test_front_png_draws_the_points_of_the_plotly_front(synthetic_sweep):
    df = load(synthetic_sweep(8))  # trials 3 and 7 stopped: drawn grey, at their last values
    ax = render(front_data(df, OBJECTIVES)).axes[0]
    drawn = sorted((float(x), float(y)) for c in ax.collections for x, y in c.get_offsets())
    shown = sorted((x, y) for t in front_figure(df, OBJECTIVES).data if t.mode == "markers" for x, y in zip(t.x, t.y))
    assert len(drawn) == 8 and drawn == shown  # the same numbers: both renderers draw front_data
    [front] = [line for line in ax.lines if line.get_label().startswith("Pareto front")]
    assert front.get_drawstyle() == "steps-post"  # plotly's shape "hv"


def test_slice_png_leaves_no_pyplot_figure_and_no_global_style(synthetic_sweep, tmp_path):
    import matplotlib.pyplot as plt

    run_dir = synthetic_sweep(6)
    study = optuna.load_study(study_name=run_dir.name, storage=f"sqlite:///{run_dir / 'study.db'}")
    before = dict(matplotlib.rcParams)
    [path] = write_pngs({"slice": SliceData(study, 1, "actor/kl_loss")}, tmp_path, width=800)
    assert imread(path).shape[1] == 800
    assert plt.get_fignums() == []
    assert dict(matplotlib.rcParams) == before  # Optuna switches to ggplot inside, not for the rest of the process


def test_slice_png_of_a_sweep_that_searches_one_parameter(tmp_path):
    """The first sweep most users write searches kl_coef alone: Optuna's slice plot is then one Axes and its colorbar,
    which constrained layout divided by zero on (sweep report crashed with a ZeroDivisionError traceback)."""
    kl = optuna.distributions.CategoricalDistribution((0.001, 0.002, 0.004))
    study = optuna.create_study(direction="maximize")
    for coef, value in ((0.002, 0.4765625), (0.004, 0.48046875), (0.004, 0.48046875)):
        study.add_trial(optuna.trial.create_trial(params={"algorithm.kl_ctrl.kl_coef": coef},
                                                  distributions={"algorithm.kl_ctrl.kl_coef": kl}, value=value))
    [path] = write_pngs({"slice": SliceData(study, 0, "val-core/arith/acc/mean@1")}, tmp_path, width=800)
    image = imread(path)
    assert image.shape[1] == 800 and image.std() > 0  # decoded and drawn


def test_long_tables_are_cut_to_a_readable_height_and_say_so(tmp_path):
    table = pd.DataFrame({"number": range(300), "stop_reason": ["entropy_collapse: entropy < 0.02 " * 8] * 300})
    fig = render(table_data(table, "Stop reasons"))
    assert fig.get_figheight() <= 20.5
    assert "(first " in fig.texts[0].get_text() and " of 300 rows)" in fig.texts[0].get_text()


def test_unknown_data_is_refused_with_the_valid_kinds():
    with pytest.raises(TypeError, match="no PNG renderer for dict; valid: FrontData, CurvesData"):
        render({})
