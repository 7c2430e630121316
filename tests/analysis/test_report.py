"""``sweep report``: report.html (self-contained, renders in headless Chromium without errors) and non-blank PNGs."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from .conftest import make_sweep, trial_spec
from klsweep.analysis.report import write_report
from klsweep.cli import main
from klsweep.errors import ResultsError

PNGS = ("summary", "front", "curves", "importance", "knobs", "slice", "stop_reasons", "accounting")


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    if shutil.which("chromium") is None:
        pytest.skip("needs chromium (apt-get install -y chromium) for the report's PNGs")
    run_dir = make_sweep(tmp_path_factory.mktemp("report") / "s8", 8)
    assert main(["report", str(run_dir)]) == 0
    return run_dir / "report"


@pytest.mark.slow
def test_report_files_and_pngs_are_not_blank(report):
    assert (report / "report.html").is_file()
    assert not list(report.glob(".*tmp"))  # atomic writes leave no temporary file
    for name in PNGS:
        pixels = np.asarray(Image.open(report / f"{name}.png").convert("L"), dtype=float)
        assert pixels.shape[1] == 1100 and pixels.var() > 0, name


@pytest.mark.slow
def test_report_html_is_self_contained_and_says_what_it_plots(report):
    page = (report / "report.html").read_text()
    assert not re.search(r"<script[^>]+src=", page)  # plotly.js inlined, nothing fetched
    assert "Plotly.newPlot" in page and len(page) > 3_000_000  # plotly.min.js is ~3.5 MB
    for fig in ("front", "curves", "importance", "knobs", "slice"):
        assert f'id="fig-{fig}"' in page
    # the generated sweep mixes kl_loss_type and loss_agg_mode on its front: the report must warn
    assert "the front mixes KL scales" in page
    # trials 3 and 7 were stopped at step 5 of 10 (2 s/step, 1 GPU): 10 steps, 20 s saved
    assert "saved 10 trial-steps" in page
    assert "python3 -m verl.trainer.main_ppo" in page


@pytest.mark.slow
def test_report_renders_in_headless_chromium_without_errors(report):
    run = subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
         "--virtual-time-budget=3000", "--dump-dom", (report / "report.html").as_uri()],
        capture_output=True, text=True, timeout=120,
    )
    # every figure was drawn by plotly.js (it adds a plot-container to each figure's div)
    for fig in ("front", "curves", "importance", "knobs", "slice"):
        assert re.search(rf'id="fig-{fig}"[^>]*>\s*<div class="plot-container', run.stdout), fig
    console = [line for line in run.stderr.splitlines() if ":CONSOLE" in line]
    errors = [line for line in console if re.search(r"Uncaught|Error|error|Failed", line)]
    assert errors == []


def test_report_of_an_all_infeasible_sweep(tmp_path):
    """Card K25: the report says no trial is feasible and names the least infeasible instead of an empty plot."""
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
