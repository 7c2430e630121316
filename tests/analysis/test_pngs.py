"""PNG renderers (matplotlib, no browser): they draw the data of klsweep.analysis.figures that the plotly figures
show, at the width asked, without leaving pyplot figures or Optuna's style behind."""

from __future__ import annotations

import matplotlib
import optuna
import pandas as pd
import pytest
from matplotlib.image import imread

from klsweep.analysis.figures import SliceData, front_data, table_data
from klsweep.analysis.plots import front_figure
from klsweep.analysis.pngs import render, write_pngs
from klsweep.analysis.sweep_dir import load

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


def test_frontier_png_and_plotly_draw_the_same_fit_points_and_stops(synthetic_sweep, tmp_path):
    import math

    import numpy as np

    from klsweep.analysis.frontier import sweep_frontier
    from klsweep.analysis.frontier_figure import frontier_data
    from klsweep.analysis.plots import frontier_figure

    from .conftest import FRONTIER_OBJECTIVES, GAO_REFERENCE, frontier_specs

    result = sweep_frontier(synthetic_sweep(frontier_specs([1.0, 4.0, 9.0, 16.0, 25.0, 9.0], stopped={5: 3.0}),
                                            objectives=FRONTIER_OBJECTIVES), n_boot=20, references={})
    data = frontier_data(result)
    assert data.x_max == pytest.approx(1.3 * 25.0) and data.peak == pytest.approx((math.e ** 2, 0.2 + 0.5 * math.e))
    assert data.reference == pytest.approx(GAO_REFERENCE) and data.stopped.x == [9.0] and data.stopped.y == [3.0]
    assert "stopped: kl_runaway: actor/kl_loss > 0.5" in data.stopped.hover[0]
    assert "verl's per-token KL × response_length/mean" in data.x_label
    [best, other] = data.curves
    assert best[0].startswith("Gao RL form (best)") and not best[3] and other[3]  # best solid, the other dashed
    # the RL law itself on the drawn grid: 0.2 + d (1 - 0.5 log d), d = sqrt(KL)
    d = np.sqrt(np.array(best[1][1:]))
    assert np.allclose(best[2][1:], 0.2 + d * (1 - 0.5 * np.log(d)), atol=1e-9)

    ax = render(data).axes[0]
    drawn = sorted((float(x), float(y)) for c in ax.collections for x, y in c.get_offsets())
    shown = sorted((x, y) for t in frontier_figure(result).data if t.mode == "markers" for x, y in zip(t.x, t.y))
    assert drawn == shown and len(drawn) == 8  # 5 feasible, 1 stopped, the reference at d = 0 and the peak
    # the report's figure: KL*'s label hangs inside the plot (it overlapped the subtitle above it), the legend
    # under the plot (it covered the plot)
    layout = frontier_figure(result).layout
    [kl_star] = [a for a in layout.annotations if a.text.startswith("KL* = ")]
    assert kl_star.yanchor == "top" and layout.legend.orientation == "h" and layout.legend.y < 0
    [path] = write_pngs({"frontier": data}, tmp_path, width=900)
    pixels = imread(path)
    assert pixels.shape[1] == 900 and 0.005 < (pixels[..., :3].mean(axis=2) < 0.9).mean() < 0.9  # decoded, drawn


def test_frontier_draws_attainment_surfaces_over_seeds(synthetic_sweep):
    import numpy as np

    from klsweep.analysis.frontier import sweep_frontier
    from klsweep.analysis.frontier_figure import frontier_data

    from .conftest import FRONTIER_OBJECTIVES, frontier_specs

    specs = frontier_specs([1.0, 4.0, 9.0, 2.0, 3.0, 16.0], seeds={i: i // 3 for i in range(6)})
    data = frontier_data(sweep_frontier(synthetic_sweep(specs, objectives=FRONTIER_OBJECTIVES), n_boot=10,
                                        references={}))
    assert [p.name for p in data.surfaces] == [f"{level} attainment over 2 seeds" for level in ("25%", "50%", "75%")]
    # score - 0.2 = d (1 - 0.5 ln d): KL 1 → 1.0, 2 → 1.169, 3 → 1.256, 4 → 1.307, 9 → 1.352, 16 → 1.227.
    # Two seeds: the 25 % and 50 % surfaces are the better seed's best-so-far (k = 1): rises at 1, 2, 3, 4, 9 (16 is
    # below 9); the 75 % one the worse (k = 2): at KL 2 min(1.0, 1.169) = 1.0, at 4 min(1.307, 1.256) = 1.256
    assert data.surfaces[0].x == data.surfaces[1].x == [1.0, 2.0, 3.0, 4.0, 9.0]
    assert data.surfaces[2].x == [2.0, 4.0]
    assert data.surfaces[2].y == pytest.approx([1.2, 0.2 + 3 ** 0.5 * (1 - 0.25 * np.log(3))])
    lines = [line for line in render(data).axes[0].lines if "attainment" in line.get_label()]
    assert len(lines) == 3 and all(line.get_drawstyle() == "steps-post" for line in lines)


def test_front_png_marks_remedied_trials_as_the_plotly_front_does(synthetic_sweep):
    from .test_report import remedied_specs

    df = load(synthetic_sweep(remedied_specs()))
    data = front_data(df, OBJECTIVES)
    ax = render(data).axes[0]
    [ring] = [c for c in ax.collections if c.get_label() == "remedied (2)"]
    assert [tuple(map(float, p)) for p in ring.get_offsets()] == list(zip(data.remedied.x, data.remedied.y))
    assert sorted(t.get_text() for t in ax.texts) == ["R1", "R2"]


def test_front_png_caption_names_every_plotted_kl_scale_and_warns_when_they_mix():
    """front.png said 'KL plotted: actor/kl_loss (low_var_kl, token-mean)' (the front's scale) while it drew
    seq-mean-token-sum trials on the same axis: it names the scale of every trial drawn and carries the warning."""
    from .test_pareto import AGG, HAND, KL_TYPE

    df = HAND.assign(**{KL_TYPE: "low_var_kl", AGG: "token-mean"})
    df.loc[df["number"] == 7, AGG] = "seq-mean-token-sum"
    data = front_data(df, [("score", "max"), ("kl", "min")])
    assert data.scales == ["actor/kl_loss (low_var_kl, seq-mean-token-sum)", "actor/kl_loss (low_var_kl, token-mean)"]
    caption = " ".join(render(data).axes[0].get_title(loc="left").split())
    assert caption.startswith("KL plotted: actor/kl_loss (low_var_kl, seq-mean-token-sum); actor/kl_loss "
                              "(low_var_kl, token-mean) ⚠ the trials compared mix KL scales")


def test_curves_png_and_plotly_give_each_of_12_trials_its_own_colour_and_line_style(synthetic_sweep):
    """curves.png drew trial 10 in trial 0's colour (plotly's palette has 10): trials 10 and 11 are dashed, so every
    trial of a 12-trial sweep has its own colour-and-style pair, in the PNG and on the report's plotly figure."""
    from klsweep.analysis.curves import curves_data
    from klsweep.analysis.plots import curves_figure
    from klsweep.analysis.sweep_dir import load_history

    run_dir = synthetic_sweep(12)
    df, history = load(run_dir), load_history(run_dir)
    ax = render(curves_data(history, df, None)).axes[0]
    styles = [(line.get_color(), line.get_linestyle()) for line in ax.lines if line.get_label().startswith("trial")]
    assert len(styles) == 12 and len(set(styles)) == 12
    assert [style for _, style in styles].count("--") == 2
    traces = [t for t in curves_figure(history, df, None).data if t.mode == "lines" and t.showlegend is not False]
    pairs = [(t.line.color, t.line.dash) for t in traces]
    assert len(pairs) == 12 and len(set(pairs)) == 12 and [dash for _, dash in pairs].count("dash") == 2


def test_the_frontier_legend_states_the_kl_star_interval_the_summary_states():
    """The recorded conservative sweep (tests/analysis/test_frontier.py): KL* [0.00754, unbounded] in the summary,
    while the legend named the band cut at the axis end, [0.00754, 0.671]. An interval the axis cannot hold is not
    drawn, and a note says so in the summary's words; a finite one within 3 × the largest KL widens the axis and
    the legend names it whole."""
    from dataclasses import replace

    from klsweep.analysis.frontier_figure import frontier_data

    from .test_frontier import conservative_frontier

    def legend(data) -> list[str]:
        figure = render(data)
        return [t.get_text() for t in figure.axes[0].get_legend().get_texts()]

    result = conservative_frontier()
    summary = result.summary()
    assert "KL* = 0.0404 nats/sequence [0.00754, unbounded] (80 %)" in summary
    data = frontier_data(result)
    assert data.kl_star is None and data.x_max == pytest.approx(1.3 * 0.5163)
    assert ("KL* interval [0.00754, unbounded] not drawn: it reaches beyond 3 × the largest KL drawn (0.516 "
            "nats/sequence)") in data.notes
    assert summary in data.notes and not [t for t in legend(data) if t.startswith("KL*")]

    best = result.frontier.best
    finite = replace(result, frontier=replace(result.frontier, best=replace(
        best, intervals={**best.intervals, "kl_star": (best.intervals["kl_star"][0], 1.2)})))
    assert "KL* = 0.0404 nats/sequence [0.00754, 1.2] (80 %)" in finite.summary()
    data = frontier_data(finite)
    assert data.kl_star == pytest.approx((best.kl_star, best.intervals["kl_star"][0], 1.2))
    assert data.x_max == pytest.approx(1.32)
    assert "KL* interval [0.00754, 1.2]" in legend(data) and "KL* = 0.0404" in legend(data)
