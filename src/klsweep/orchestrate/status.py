"""``sweep status runs/<name>``: what ran, what is running, what is left and the best so far, from stored state.

Reads the Optuna study and the Tune result files (:func:`klsweep.analysis.load`); needs no Ray.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console


def status(run_dir: str, console: Console | None = None) -> int:
    """Print the state of the sweep in ``run_dir``. Returns 0.

    Raises:
        ResultsError: ``run_dir`` is not a sweep directory.
    """
    from klsweep.analysis.load import load
    from klsweep.orchestrate.summary import print_summary
    from klsweep.results import SweepRecord
    from klsweep.spec.schema import Sweep

    console = console or Console()
    sweep = Sweep.model_validate(SweepRecord.read(run_dir).sweep)
    df = load(run_dir)
    counts = df["state"].value_counts().to_dict() if len(df) else {}
    finished = sum(n for s, n in counts.items() if s in ("COMPLETE", "PRUNED", "FAIL"))
    running = counts.get("RUNNING", 0)
    left = max(0, sweep.budget.trials - len(df))
    console.print(
        f"{sweep.name}: {finished} finished, {running} running (or interrupted), {left} not started "
        f"(budget {sweep.budget.trials} trials × {sweep.budget.max_steps} steps)",
        highlight=False,
    )
    if running:
        console.print(f"if its `sweep run` is no longer running, continue it with: sweep resume {run_dir}",
                      highlight=False)
    print_summary(sweep, df, Path(run_dir), console=console)
    return 0
