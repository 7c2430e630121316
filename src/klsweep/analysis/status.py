"""``sweep status runs/<name>``: what ran, what is running, what is left and the best so far, from stored state.

Reads the Optuna study and the Tune result files (:func:`klsweep.analysis.load`); needs no Ray. Once enough trials
are feasible, a forecast of the KL frontier (:func:`klsweep.analysis.frontier.sweep_frontier`): where the score peaks
and how sure that is.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table

from klsweep._format import UNWRAPPED_WIDTH, arg, fit_table, param_labels, short
from klsweep._format import console as plain_console
from klsweep.analysis.baseline import reference_scores
from klsweep.analysis.frontier import sweep_frontier
from klsweep.analysis.frontier_fit import MIN_POINTS
from klsweep.analysis.pareto import DEFAULT_LOSS_AGG_MODE, SAME_AGGREGATION, feasible, kl_scale
from klsweep.analysis.summary import counts_line, print_summary
from klsweep.analysis.sweep_dir import load, load_history
from klsweep.results import SweepRecord, remedy_records, schedule_line
from klsweep.spec.schema import Sweep
from klsweep.spec.space import SEED_KEY, parameters


def status(run_dir: str, console: Console | None = None, *, every_command: bool = False) -> int:
    """Print the state of the sweep in ``run_dir``. Returns 0. ``every_command``: each reproduce command (the
    embedded trainer's own too), not only verl's.

    Raises:
        ResultsError: ``run_dir`` is not a sweep directory.
    """
    console = console or plain_console()
    record = SweepRecord.read(run_dir)
    sweep = Sweep.model_validate(record.sweep)
    df = load(run_dir)
    console.print(counts_line(sweep, df), highlight=False)
    if len(df):
        console.print(trials_table(sweep, df, console.width))
        line = frontier_line(run_dir, df, record)
        if line:
            console.print(line, highlight=False, markup=False)
    running = bool(len(df) and (df["state"] == "RUNNING").any())
    if running:
        console.print(f"if its `sweep run` is no longer running, continue it with: sweep resume {arg(run_dir)}",
                      highlight=False)
    print_summary(sweep, df, Path(run_dir), console=console, ended=not running, every_command=every_command)
    return 0


def frontier_line(run_dir: str, df: pd.DataFrame, record: SweepRecord,
                  history: pd.DataFrame | None = None) -> str | None:
    """The KL frontier forecast line from the trials finished so far; ``None`` below ``MIN_POINTS`` feasible trials.

    Takes the trials frame ``df``, the sweep's ``record`` and optionally the trials' steps ``history`` (default:
    read from ``run_dir``). ``d = 0`` is the reference policy's score where klsweep can compute it, as in
    ``sweep report``; elsewhere the median first logged score.
    """
    if int(feasible(df).sum()) < MIN_POINTS:
        return None
    references = reference_scores(record.sweep.get("trainer", ""), [o.metric for o in record.objectives], df,
                                  cache_dir=run_dir)
    history = load_history(run_dir) if history is None else history
    return sweep_frontier((df, history, record), references=references).summary()


def trials_table(sweep: Sweep, df: pd.DataFrame, width: int = UNWRAPPED_WIDTH) -> Table:
    """The table ``sweep status`` prints: one row per trial of a :func:`klsweep.analysis.load` frame.

    Columns: trial, state, the searched parameters (with confirmation runs also ``confirms`` and ``seed``), the last
    step, reference KL, entropy, training score, each objective's last value, the health verdict, and for remedied
    trials their schedule (:func:`klsweep.results.schedule_line`). Parameters are the proposed ones; a cell a remedy
    changed also shows the last restart's value (``0.002→0.0347``), said in the caption.

    KL and entropy on another scale than most rows' are marked (``267.4†``) and the caption names each scale: KL by
    :func:`klsweep.analysis.pareto.kl_scale`, entropy by the actor's ``loss_agg_mode``. Under
    ``seq-mean-token-sum`` both are sums over a sequence's tokens, not per-token means.

    ``width``: the terminal's columns. No number is cut: where the table would not fit, the columns least needed
    (score, entropy, step, ...) are left out and the caption says which (:func:`klsweep._format.fit_table`).
    """
    keys = list(parameters(sweep))
    objectives = [o.metric for o in sweep.objectives]
    confirmation = {"confirm_of": "confirms", f"config/{SEED_KEY}": "seed"} if "confirm_of" in df else {}
    columns = {"number": "trial", "state": "state", **confirmation,
               **{f"config/{k}": label for k, label in param_labels(keys).items()},
               "steps": "step", "last/ref_kl": "KL", "last/entropy": "entropy", "last/score": "score",
               **{f"last/{m}": m for m in objectives}, "health": "health"}
    schedules = df["remedies"].map(schedule_line) if "remedies" in df else pd.Series("", index=df.index)
    # per row, the value each remedied key was last restarted with (a later record of a key replaces an earlier one)
    finals = (df["remedies"].map(lambda r: {f"config/{x['key']}": x["new"] for x in remedy_records(r)})
              if "remedies" in df else pd.Series([{}] * len(df), index=df.index))
    remedied = schedules.astype(bool).any()
    if remedied:
        columns["remedies"] = "remedies"
    captions = ["a→b: a, the value the search proposed; b, the one the trial's last remedy restarted it with (the "
                "remedies column lists every restart)"] if any(set(f) & set(columns) for f in finals) else []
    marks = {}
    for column, label, scales in (("last/ref_kl", "KL", kl_scale(df)),
                                  ("last/entropy", "entropy", _aggregation(df))):
        has_value = df[column].notna() if column in df else pd.Series(False, index=df.index)
        marks[column], caption = _scale_marks(scales[has_value], label)
        captions += [caption] if caption else []
    rows = []
    for schedule, final, (i, row) in zip(schedules, finals, df.iterrows()):
        cells = [schedule if column == "remedies" else short(_cell(row.get(column))) for column in columns]
        cells = [f"{cell}→{short(final[column])}" if column in final else cell for cell, column in zip(cells, columns)]
        rows.append([cell + marks[column].get(i, "") if column in marks and cell else cell
                     for cell, column in zip(cells, columns)])
    return fit_table(list(columns.values()), rows, width, drop=_DROP, wrap=("health", "remedies"),
                     caption="\n".join(captions) or None)


#: The columns a narrow terminal leaves out first: what the objective, KL and health already say.
_DROP = ("score", "entropy", "step", "confirms", "seed", "state")


#: Marks of the scales other than the most common one, in :func:`_scale_marks` order.
_MARKS = "†‡§¶"


def _scale_marks(scales: pd.Series, label: str) -> tuple[pd.Series, str]:
    """Per row of ``scales``, its mark, and the caption naming the marks.

    ``scales`` holds the scale each trial's ``label`` value is on. The most common scale gets no mark; each other
    gets one of :data:`_MARKS`, and a fifth and later share the last. Among scales as common, a per-token mean (verl's
    default ``token-mean``) goes first, so KL and entropy leave the same rows unmarked. The caption is empty when every
    row is on one scale."""
    counts = scales.value_counts()
    if len(counts) < 2:
        return pd.Series("", index=scales.index, dtype=str), ""
    order = sorted(counts.index, key=lambda scale: (-counts[scale], "token-mean" not in scale, scale))
    mark = {scale: "" if n == 0 else _MARKS[min(n, len(_MARKS)) - 1] for n, scale in enumerate(order)}
    others = "; ".join(f"{label}{mark[scale]}: {scale}" for scale in order[1:])
    caption = (f"{label} on different scales, not comparable across them: unmarked {order[0]}; {others}")
    return scales.map(mark), caption


def _aggregation(df: pd.DataFrame) -> pd.Series:
    """Per trial, the ``loss_agg_mode`` its ``actor/entropy`` is aggregated with (verl's default ``token-mean`` when
    its row does not say; ``seq-mean-token-mean``, a per-token mean too, is named ``token-mean``), with a set
    ``loss_scale_factor`` under ``seq-mean-token-sum-norm``."""
    key = "config/actor_rollout_ref.actor.loss_agg_mode"
    modes = df[key].fillna(DEFAULT_LOSS_AGG_MODE) if key in df else pd.Series(DEFAULT_LOSS_AGG_MODE, index=df.index)
    modes = modes.map(lambda mode: SAME_AGGREGATION.get(mode, mode))  # per-token means share token-mean's scale
    factor = df.get("config/actor_rollout_ref.actor.loss_scale_factor", pd.Series(None, index=df.index))
    return pd.Series([f"loss_agg_mode {m}" + (f", loss_scale_factor={f}" if m == "seq-mean-token-sum-norm"
                                              and _cell(f) is not None else "") for m, f in zip(modes, factor)],
                     index=df.index, dtype=str)


def _cell(value):
    """A frame cell as the console shows it.

    A missing value (None, NaN, ``pd.NA`` as in the ``confirms`` column of a search trial) is empty. numpy numbers
    become Python numbers. A whole float, such as a trial number in a column with empty cells, becomes an int."""
    if value is None or value is pd.NA or (isinstance(value, float) and value != value):
        return None
    value = value.item() if hasattr(value, "item") else value
    return int(value) if isinstance(value, float) and value.is_integer() and abs(value) < 2**53 else value
