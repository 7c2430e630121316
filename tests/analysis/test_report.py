"""``sweep report``: report.html (self-contained: plotly.js inlined, every figure's data in the page) and PNGs that
matplotlib draws without a browser."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.image import imread

from klsweep.analysis.report import write_report
from klsweep.cli import main
from klsweep.errors import ResultsError

from .conftest import curve, make_sweep, trial_spec

PNGS = ("summary", "front", "frontier", "curves", "importance", "knobs", "slice", "stop_reasons", "accounting")
FIGURES = ("front", "frontier", "curves", "importance", "knobs", "slice")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    run_dir = make_sweep(tmp_path_factory.mktemp("report") / "s8", 8)
    assert main(["report", str(run_dir)]) == 0
    return run_dir / "report"


class Page(HTMLParser):
    """What a browser would load from report.html: ids of elements, scripts (inline text or src), linked URLs."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: dict[str, str] = {}  # id -> class
        self.scripts: list[dict] = []
        self.urls: list[str] = []
        self._script: dict | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "id" in attrs:
            self.ids[attrs["id"]] = attrs.get("class") or ""
        self.urls += [v for k, v in attrs.items() if k in ("src", "href", "data") and v]
        if tag == "script":
            self._script = {"src": attrs.get("src"), "text": ""}
            self.scripts.append(self._script)

    def handle_endtag(self, tag):
        if tag == "script":
            self._script = None

    def handle_data(self, data):
        if self._script is not None:
            self._script["text"] += data


def plotted(script: str, div: str) -> tuple[list, dict]:
    """The data and layout a ``Plotly.newPlot("<div>", data, layout, config)`` call in ``script`` draws."""
    call = re.search(r'Plotly\.newPlot\(\s*"' + re.escape(div) + r'",\s*', script)
    assert call, div
    decoder = json.JSONDecoder()
    data, end = decoder.raw_decode(script, call.end())
    layout, _ = decoder.raw_decode(script, script.index("{", end))
    return data, layout


@pytest.mark.slow
def test_report_pngs_are_valid_and_drawn(report):
    assert not list(report.glob(".*tmp"))  # atomic writes leave no temporary file
    assert sorted(p.stem for p in report.glob("*.png")) == sorted(PNGS)
    for name in PNGS:
        path = report / f"{name}.png"
        assert path.read_bytes()[:8] == PNG_MAGIC, name
        pixels = imread(path)  # decodes the whole file: (height, width, RGBA) floats in 0..1
        assert pixels.ndim == 3 and pixels.shape[1] == 1100 and pixels.shape[0] >= 100, (name, pixels.shape)
        gray = pixels[..., :3].mean(axis=2)
        inked = (gray < 0.9).mean()  # share of pixels with something drawn on them (text, lines, markers, cells)
        assert 0.005 < inked < 0.9, (name, inked)
        colours = len(np.unique((pixels[..., :3] * 255).astype(np.uint8).reshape(-1, 3), axis=0))
        assert colours > 20, (name, colours)  # antialiased text and coloured marks, not a flat image


@pytest.mark.slow
def test_report_html_is_self_contained_and_draws_every_figure(report):
    text = (report / "report.html").read_text()
    page = Page()
    page.feed(text)
    assert page.urls == []  # no script, stylesheet, image or frame is fetched: the page works offline
    assert all(s["src"] is None for s in page.scripts)
    bundle = max(page.scripts, key=lambda s: len(s["text"]))["text"]
    assert len(bundle) > 3_000_000 and "plotly.js" in bundle[:2000]  # plotly.min.js (~3.5 MB) inlined, licence first
    code = "".join(s["text"] for s in page.scripts)
    for name in FIGURES:
        assert page.ids.get(f"fig-{name}") == "plotly-graph-div", name
        data, layout = plotted(code, f"fig-{name}")
        assert (data or name == "frontier") and layout, name
    # the generated trials log no response_length/mean: the frontier figure and section say why there is no fit
    _, layout = plotted(code, "fig-frontier")
    reason = ("no trial logged a reference KL, response_length/mean and critic/score/mean at the same step")
    assert layout["annotations"][0]["text"].replace("<br>", " ") == reason
    assert f"KL frontier: not fitted: {reason}" in text
    front, _ = plotted(code, "fig-front")
    assert any(t["name"].startswith("Pareto front") for t in front)
    curves, layout = plotted(code, "fig-curves")
    assert sum(t.get("showlegend", True) for t in curves) == 8  # one legend entry per trial
    assert "health bands: conservative" in layout["title"]["text"]
    # the generated sweep mixes kl_loss_type and loss_agg_mode on its front: the report must warn
    assert "the front mixes KL scales" in text
    # trials 3 and 7 were stopped at step 5 of 10 (2 s/step, 1 GPU): 10 steps, 20 s saved
    assert "saved 10 trial-steps" in text
    # per stop reason: the two health stops (their reasons name no rule, so their verdict) and the full-budget trials
    compute = text.split('<h2 id="compute">')[1]
    reasons = re.findall(r"<tr>\s*<td>([^<]*)</td>", compute)
    assert reasons == ["health: stopped", "full budget", "total"], reasons
    assert "python3 -m verl.trainer.main_ppo" in text


def test_pngs_of_an_all_infeasible_sweep(tmp_path):
    """No feasible trial: every PNG is still drawn, the front with the least infeasible trials, the importance with
    the reason it has none."""
    specs = [dict(trial_spec(i, 10), health="stopped", stop_reason="kl_blowup", steps=2 + 3 * i, state="PRUNED")
             for i in range(3)]
    run_dir = make_sweep(tmp_path / "inf", specs)
    assert write_report(run_dir, tmp_path / "out") == 0
    for name in PNGS:
        assert imread(tmp_path / "out" / f"{name}.png").shape[1] == 1100, name


def test_report_of_an_all_infeasible_sweep(tmp_path):
    """The report says no trial is feasible and names the least infeasible instead of an empty plot."""
    specs = [dict(trial_spec(i, 10), health="stopped", stop_reason="entropy_collapse", steps=3 + i) for i in range(3)]
    run_dir = make_sweep(tmp_path / "inf", specs)
    assert write_report(run_dir, tmp_path / "out", pngs=False) == 0
    page = (tmp_path / "out" / "report.html").read_text()
    assert "no feasible trial: all 3 trials" in page
    assert "least infeasible, by steps survived: trial 2, trial 1, trial 0" in page


def test_report_on_a_directory_that_is_not_a_sweep(tmp_path):
    with pytest.raises(ResultsError, match="sweep.json is missing"):
        write_report(tmp_path)
    assert main(["report", str(tmp_path)]) == 2


def remedied_specs() -> list[dict]:
    """Four trials of a sweep that remedies: 0 rescued by one kl_runaway remedy; 1 remedied twice, then
    stopped at the cap; 2 stopped by reward_hacking without a checkpoint to restart from; 3 never flagged."""
    kl = "algorithm.kl_ctrl.kl_coef"

    def remedy(restart, step, from_step, old, new):
        return {"restart": restart, "step": step, "rule": "kl_runaway", "from_step": from_step, "key": kl,
                "old": old, "new": new}

    specs = [trial_spec(i, 10) for i in (0, 1, 2, 4)]
    specs[0].update(remedies=[remedy(1, 6, 4, 0.01, 0.015)])
    specs[1].update(remedies=[remedy(1, 5, 4, 0.01, 0.015), remedy(2, 7, 4, 0.015, 0.0225)], health="stopped",
                    steps=9, state="PRUNED", stop_reason="diverged at step 9 by kl_runaway: KL 2 > 1 (not remedied: "
                                                         "max_remedies 2 of kl_runaway reached)")
    specs[2].update(health="stopped", steps=5, state="PRUNED",
                    stop_reason="hacked at step 5 by reward_hacking: score up, KL up (not remedied: no checkpoint "
                                "before step 2, where the finding began)")
    return specs


def test_report_counts_remedies_per_rule_and_marks_remedied_points_on_the_front(tmp_path):
    from klsweep.analysis.accounting import remedy_outcomes
    from klsweep.analysis.figures import front_data
    from klsweep.analysis.sweep_dir import load

    run_dir = make_sweep(tmp_path / "rem", remedied_specs())
    df = load(run_dir)
    table = remedy_outcomes(df).set_index("rule")
    assert table.to_dict("index") == {
        "kl_runaway": {"flagged": 2, "remedied": 2, "rescued": 1, "stopped_at_cap": 1, "stopped_unremedied": 0},
        "reward_hacking": {"flagged": 1, "remedied": 0, "rescued": 0, "stopped_at_cap": 0, "stopped_unremedied": 1},
    }
    front = front_data(df, [("critic/score/mean", "max"), ("actor/kl_loss", "min")])
    assert front.remedied is not None and front.remedied.name == "remedied (2)"
    assert front.remedied.text == ["R1", "R2"]  # trial 0 restarted once, trial 1 twice
    rows = df.set_index("number")
    assert front.remedied.y == [rows.loc[0, "value/critic/score/mean"], rows.loc[1, "last/critic/score/mean"]]
    assert "kl_runaway at step 6 → from step 4, algorithm.kl_ctrl.kl_coef 0.01 → 0.015" in front.remedied.hover[0]

    assert write_report(run_dir, tmp_path / "out", pngs=False) == 0
    html_text = (tmp_path / "out" / "report.html").read_text()
    page = Page()
    page.feed(html_text)
    assert "remedies" in page.ids
    cells = re.findall(r"<td>([^<]*)</td>", html_text.split('id="remedies"')[1].split("<h2")[0])
    assert cells == ["kl_runaway", "2", "2", "1", "1", "0", "reward_hacking", "1", "0", "0", "0", "1"]
    data, _ = plotted(next(s["text"] for s in page.scripts if "fig-front" in s["text"]), "fig-front")
    marked = [t for t in data if t["name"] == "remedied (2)"]
    assert len(marked) == 1 and marked[0]["text"] == ["R1", "R2"] and marked[0]["marker"]["symbol"] == "diamond-open"


def confirmed_specs() -> list[dict]:
    """Four search trials (seed 0) and two confirmation re-runs of trial 0 (seeds 1, 2) whose score is the search
    run's plus 0.1 per seed: trial 0's mean over seeds is its search score + 0.1."""
    def shifted(seed):
        def metrics(params, step):
            out = curve(params, step)
            return {**out, "critic/score/mean": out["critic/score/mean"] + 0.1 * seed}
        return metrics

    specs = [trial_spec(i, 10) for i in (0, 1, 2, 4)]
    for spec in specs:
        spec["params"] = {**spec["params"], "data.seed": 0}
    for seed in (1, 2):
        specs.append({**specs[0], "params": {**specs[0]["params"], "data.seed": seed}, "confirm_of": 0,
                      "metrics": shifted(seed)})
    return specs


def test_report_counts_re_runs_apart_keeps_them_off_the_front_and_ranks_by_mean(tmp_path):
    run_dir = make_sweep(tmp_path / "conf", confirmed_specs())
    assert write_report(run_dir, tmp_path / "out", pngs=False) == 0
    html_text = (tmp_path / "out" / "report.html").read_text()
    assert "4 search trials, 4 feasible; 2 confirmation re-runs, 2 feasible" in html_text
    front_cells = html_text.split('id="front"')[1].split("<h3")[1].split("<h2")[0]
    numbers = {int(n) for n in re.findall(r"<tr>\s*<td>(\d+)</td>", front_cells)}
    assert numbers and numbers <= {0, 1, 2, 3}  # the re-runs are trials 4 and 5
    search_score = curve(confirmed_specs()[0]["params"], 10)["critic/score/mean"]
    section = html_text.split('id="confirmation"')[1].split("<h2")[0]
    cells = re.findall(r"<td>([^<]*)</td>", section)
    assert cells[:6] == ["0", "False", "3", "3", "3", "[0, 1, 2]"]
    assert float(cells[6]) == pytest.approx(search_score + 0.1, abs=1e-3)  # mean of s, s + 0.1, s + 0.2
    assert float(cells[8]) == pytest.approx(0.1, abs=1e-3)  # sample sd of 0, 0.1, 0.2


def test_report_compute_table_has_labels_percentages_and_no_all_zero_gpu_columns():
    """The compute table showed compute_accounting's raw columns (steps_saved, saved_share 0.25) and, on a CPU sweep,
    three GPU-hour columns of zeros. Two trials of a 10-step budget, 2 s per step: one stopped at step 5 by
    kl_runaway, one ran 10 steps; 5 of 20 trial-steps saved = 25.0 %, 10 s = 0.00278 h saved."""
    from klsweep.analysis.accounting import compute_accounting
    from klsweep.analysis.report import _compute_table

    df = pd.DataFrame({"number": [0, 1], "state": ["PRUNED", "COMPLETE"], "health": ["stopped", "healthy"],
                       "steps": [5, 10], "wall_s": [10.0, 20.0],
                       "stop_reason": ["diverged at step 5 by kl_runaway: KL 2 > 1", ""]})
    cpu = _compute_table(compute_accounting(df, 10, 0.0, by="reason"))
    assert list(cpu.columns) == ["stop reason", "trials", "trial-steps used", "trial-steps saved", "steps saved",
                                 "trial-hours used", "trial-hours saved", "steps run again after remedies"]
    assert list(cpu["steps saved"]) == ["25.0 %", "0.0 %", "25.0 %"]
    assert cpu["trial-hours saved"].iloc[0] == pytest.approx(10 / 3600)
    gpu = _compute_table(compute_accounting(df, 10, 2.0, by="reason"))
    assert {"GPU-hours used", "GPU-hours saved", "GPU-hours saved (share)"} <= set(gpu.columns)
    assert gpu["GPU-hours saved (share)"].iloc[-1] == "25.0 %"  # 2 GPUs × 10 s of 2 × 40 GPU-s


@pytest.mark.slow
def test_report_opens_with_the_winner(report):
    """The report's first section names what won: the searched knob values of each best trial (here the Pareto
    front of feasible trials: COMPLETE and not stopped, read from trials.csv-equivalent ``load``) on one line each."""
    from klsweep.analysis import load

    text = (report / "report.html").read_text()
    assert text.index('<h2 id="winner">') < text.index('<h2 id="summary">')
    winner = text.split('<h2 id="winner">')[1].split("<h2")[0]
    df = load(report.parent)
    feasible = df[(df["state"] == "COMPLETE") & (df["health"].fillna("healthy") != "stopped")]
    shown = [int(n) for n in re.findall(r"\(trial (\d+), ", winner)]
    assert shown and set(shown) <= set(feasible["number"])
    for number in shown:  # each line starts with the knob values: key=value
        line = next(line for line in winner.split("<p>") if f"(trial {number}, " in line)
        assert re.match(r"<b>\w+=\S+", line), line
