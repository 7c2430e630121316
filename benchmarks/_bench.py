"""Helpers of the benchmark scripts: the machine line, ``sweep run`` as a timed subprocess, a sweep's trials table."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]


def machine() -> str:
    """``N cores, load a/b/c, CPU model, Python x.y`` of this machine, right now."""
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    load = "/".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{os.cpu_count()} cores, load {load}, {model}, Python {platform.python_version()}"


def sweep_run(sweep_file: str, overrides: list[str], out: Path) -> float:
    """Run ``python -m klsweep.cli run SWEEP OVERRIDES --out OUT --quiet`` from the repo root; returns its wall
    seconds (the whole command: Python start, imports, Ray start, trials, summary).

    Raises:
        RuntimeError: the command exited with 2 (bad input) or was killed; its stderr tail is in the message.
    """
    command = [sys.executable, "-m", "klsweep.cli", "run", sweep_file, *overrides, "--out", str(out), "--quiet"]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode not in (0, 1):
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return wall


def trials(out: Path) -> pd.DataFrame:
    """The sweep's ``trials.csv`` (columns of :func:`klsweep.analysis.load`)."""
    return pd.read_csv(out / "trials.csv")
