"""The end of ``sweep run`` and of ``sweep status``: what the sweep did and its best trial(s).

Counts by state, the stop reasons, the compute used and saved per stop reason, the confirmed leaders ranked by their
mean over seeds (``budget.confirm``), then the winner block (:mod:`klsweep.analysis.winner`): the best trial, its
score and knob values, the runner-up and whether the gap is noise, and verl's command that reproduces it; last,
where the files are. The best trial is always one setting that ran unchanged: a remedied trial is PRUNED (its score
is its restart schedule's) and is shown apart when its run scored better (:func:`best_rescued`).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
from rich.console import Console
from rich.table import Table
from rich.text import Text

from klsweep._format import UNWRAPPED_WIDTH, arg, short
from klsweep._format import console as plain_console
from klsweep.analysis import leaders
from klsweep.analysis.accounting import compute_accounting
from klsweep.analysis.confirm import is_search
from klsweep.analysis.pareto import feasible, pareto_front, remedied_trials
from klsweep.analysis.sweep_dir import overrides_of
from klsweep.analysis.winner import INDENT, knob_values, reproduce, runner_up, shell_lines, wrapped
from klsweep.errors import ResultsError
from klsweep.results import (
    REMEDIED,
    STUDY_DB,
    SWEEP_FILE,
    TRIALS_CSV,
    TUNE_DIR,
    SweepRecord,
    failure_reason,
    restarts,
    storage_file,
)

if TYPE_CHECKING:
    from klsweep.spec.schema import Sweep

#: Console.print options for text that must come out verbatim ("[console,file]" is not rich markup).
_PLAIN = {"markup": False, "highlight": False, "soft_wrap": True}


def best_trials(sweep: Sweep, df: pd.DataFrame) -> pd.DataFrame:
    """The best COMPLETE, healthy search trial (single objective) or the Pareto front of them (several objectives).

    Uses the values told to Optuna (``value/<metric>``: each objective's last reported value); confirmation runs
    (``confirm_of``) are left out: they re-run a search trial with another seed. A tie goes to the lower trial
    number, as in ``study.best_trial``. The front is
    :func:`klsweep.analysis.pareto.pareto_front` (Optuna's non-dominated sort); its ``attrs["notes"]`` say when it
    is empty or mixes KL scales.
    """
    value_cols = [f"value/{o.metric}" for o in sweep.objectives]
    if df.empty or any(c not in df for c in value_cols):
        return df.iloc[0:0]
    df = df[is_search(df)]
    if len(value_cols) == 1:
        done = df[feasible(df)].dropna(subset=value_cols)
        o = sweep.objectives[0]
        return done.sort_values([value_cols[0], "number"], ascending=[o.mode == "min", True]).head(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # print_summary shows the front's notes
        return pareto_front(df, [(c, o.mode) for c, o in zip(value_cols, sweep.objectives)])


def counts_line(sweep: Sweep, df: pd.DataFrame) -> str:
    """``tiny: 1 finished, 1 running (or interrupted), 1 not started (budget 3 trials × 4 steps)``.

    Read from a :func:`klsweep.analysis.load` frame; a RUNNING study trial may belong to a driver that is gone. The
    counts are of search trials. With ``budget.confirm``, once runs are planned, the line says so
    (``tiny: search 3 finished, ...``). The confirmation runs' counts follow:
    ``; confirmation: 2 of 6 runs finished, 1 running (or interrupted)``."""
    search = df[is_search(df)] if len(df) else df
    counts = search["state"].value_counts().to_dict() if len(search) else {}
    finished = sum(n for s, n in counts.items() if s in ("COMPLETE", "PRUNED", "FAIL"))
    left = max(0, sweep.budget.trials - len(search))
    progress = leaders.progress(sweep, df)
    line = (f"{sweep.name}: {'search ' if progress else ''}{finished} finished, {counts.get('RUNNING', 0)} running "
            f"(or interrupted), {left} not started (budget {sweep.budget.trials} trials × {sweep.budget.max_steps} "
            "steps)")
    return f"{line}; {progress}" if progress else line


def print_summary(sweep: Sweep, df: pd.DataFrame, out_dir: Path, console: Console | None = None, *,
                  ended: bool = True, every_command: bool = False) -> int:
    """Print what the sweep did and its best trial(s); returns 0 if a trial completed healthy (or only remedied
    ones ran to their end: they are shown as restart schedules), else 1.

    It ends with the winner block (:mod:`klsweep.analysis.winner`): the best trial, its score and knob values, the
    runner-up and whether the gap is noise, verl's reproduce command, then where the files are. On a terminal every
    line of it fits the terminal's width. ``every_command``: each trainer's own command too (the embedded one).

    ``ended=False``: the sweep is still running or was interrupted (Ctrl-C) before its budget; no healthy trial yet
    is then no failure and is not reported as one.
    """
    console = console or plain_console()
    width = console.width if console.is_terminal else UNWRAPPED_WIDTH
    counts = df["state"].value_counts().to_dict() if len(df) else {}
    console.print(f"\n[bold]{sweep.name}[/bold]: {len(df)} trials — "
                  + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())), highlight=False)
    reasons = df.get("stop_reason", pd.Series("", index=df.index)).fillna("").astype(str)
    # a running trial is not stopped, nor is one a remedy restarted ("remedied: ..." in sweeps recorded before the
    # note had its own field, klsweep.health.stopper.REMEDY_NOTE)
    running = df.get("state", pd.Series("", index=df.index)) == "RUNNING"
    stopped = df[(reasons != "") & ~reasons.str.startswith("remedied:") & ~running]
    if len(stopped):
        table = Table(title="stopped trials", show_edge=False)
        for col in ("number", "state", "steps", "stop_reason"):
            table.add_column(col, overflow="fold")
        for _, row in stopped.iterrows():
            reason = str(failure_reason(out_dir, row.get("state"), row.get("trial_id"), row.get("stop_reason")))
            table.add_row(*(Text(short(v)) for v in (row.get("number"), row.get("state"), row.get("steps"), reason)))
        console.print(table)
    _print_savings(sweep, df, console)
    ranking = leaders.ranking(sweep, df)
    best = best_trials(sweep, df)
    done, planned = leaders.run_counts(sweep, df)
    by_mean = len(sweep.objectives) == 1 and len(ranking) > 0 and bool(ranking["ok"].iloc[0]) and done == planned
    verdicts = leaders.verdicts(sweep, ranking, df) if len(ranking) else []
    _print_confirmation(sweep, ranking, [] if by_mean else verdicts, console)
    if by_mean:  # every re-run finished: the best trial is the leader by mean over seeds
        best = df[(df["number"] == ranking["trial"].iloc[0]) & is_search(df)]
    results = results_line(out_dir)
    if best.empty and not sum(n for s, n in counts.items() if s != "RUNNING"):
        console.print("no trial has finished yet", highlight=False)
        return 1
    if best.empty and not ended:
        console.print("no trial has completed healthy yet", highlight=False)
        return 1
    rescued = best_rescued(sweep, df, best)
    if best.empty and rescued:  # only restart schedules ran to the end: the best one, and how to rerun it
        console.print("\nno setting completed unchanged; the best remedied run:", highlight=False)
        _print_lines(console, wrapped(rescued, width))
        schedule = best_remedied(sweep, df, best)
        if schedule is not None:
            _print_commands(console, sweep, schedule, every_command, width)
            if not every_command and _has_own_command(sweep, schedule):
                _print_lines(console, wrapped(f"the {sweep.trainer} trainer's own commands: sweep status "
                                              f"{arg(out_dir)} --commands", width))
        _print_lines(console, wrapped(results, width))
        return 0
    schedules = _remedied(df)
    if best.empty and len(schedules):  # several objectives: only restart schedules ran to the end, none scored
        n = len(schedules)
        names = ", ".join(f"trial {number}" for number in schedules["number"])
        _print_lines(console, [""] + wrapped(
            f"no setting completed unchanged; {n} remedied trial{'s' * (n != 1)} ran to the end as restart "
            f"schedule{'s' * (n != 1)}, not settings: {names}", width))
        for _, schedule in schedules.iterrows():
            if every_command:
                _print_lines(console, wrapped(f"trial {schedule['number']}, a restart schedule:", width))
                _print_commands(console, sweep, schedule, True, width)
        if not every_command and any(reproduce(sweep.trainer, row, overrides_of(row))
                                     for _, row in schedules.iterrows()):
            _print_lines(console, wrapped(f"the commands that rerun each, one per restart segment: sweep status "
                                          f"{arg(out_dir)} --commands", width))
        _print_lines(console, wrapped(results, width))
        return 0
    if best.empty:
        console.print("no trial completed healthy: see trials.csv for the stop reasons", style="red")
        console.print(f"results: {out_dir}", **_PLAIN)
        return 1
    for note in best.attrs.get("notes", []):
        console.print(f"note: {note}", style="yellow", **_PLAIN)
    console.print()
    if len(sweep.objectives) == 1:
        row = best.iloc[0]
        _print_lines(console, _winner_block(sweep, df, row, by_mean, verdicts, rescued, width))
        _print_commands(console, sweep, row, every_command, width)
        schedule = best_remedied(sweep, df, best) if every_command else None
        if schedule is not None:  # the better run beside the winner, rerun as the restart schedule it was
            _print_lines(console, wrapped(f"trial {schedule['number']}, a restart schedule:", width))
            _print_commands(console, sweep, schedule, True, width)
    else:
        console.print(f"[bold]Pareto front ({len(best)} trial{'s' * (len(best) != 1)})[/bold]: none is better on "
                      "every objective")
        for _, row in best.iterrows():
            values = ", ".join(f"{o.metric}={short(row[f'value/{o.metric}'])}" for o in sweep.objectives)
            _print_lines(console, wrapped(f"trial {row['number']} ({row['trial_id']}): {values}", width))
            _print_lines(console, wrapped(knob_values(sweep, row), width, INDENT))
            if every_command:
                _print_commands(console, sweep, row, True, width)
        if not every_command and any(reproduce(sweep.trainer, row, overrides_of(row)) for _, row in best.iterrows()):
            _print_lines(console, wrapped(f"verl commands that reproduce them: sweep status {arg(out_dir)} --commands",
                                          width))
    if every_command or len(sweep.objectives) > 1 or not _has_own_command(sweep, best.iloc[0]):
        _print_lines(console, wrapped(results, width))
        return 0
    _print_lines(console, wrapped(f"the {sweep.trainer} trainer's own command: sweep status {arg(out_dir)} --commands",
                                  width))
    _print_lines(console, wrapped(results, width))
    return 0


def results_line(out_dir: Path) -> str:
    """``results: OUT (trials.csv, study.db, tune/)``: where the sweep's files are, its Optuna study included.

    The study is where ``sweep.json`` records its storage. A SQLite or journal file inside ``out_dir`` is named
    relative to it; any other storage follows as ``; study: URL`` (a database server's password hidden). Without a
    readable ``sweep.json``: the default storage, ``study.db``.
    """
    try:
        record = SweepRecord.read(out_dir) if (Path(out_dir) / SWEEP_FILE).is_file() else None
    except ResultsError:
        record = None
    url = record.storage_url(out_dir) if record else None
    file = storage_file(url) if url else None
    file = file.resolve() if file else None
    here = Path(out_dir).resolve()
    if url is None or (file is not None and file.is_relative_to(here)):
        study = str(file.relative_to(here)) if file is not None else STUDY_DB
        return f"results: {out_dir} ({TRIALS_CSV}, {study}, {TUNE_DIR}/)"
    return f"results: {out_dir} ({TRIALS_CSV}, {TUNE_DIR}/; study: {_shown_url(url)})"


def _shown_url(url: str) -> str:
    """A storage URL to print: a database server's password as ``***``."""
    if storage_file(url) is not None:
        return url
    try:
        from sqlalchemy.engine import make_url  # optuna's RDB storage dependency

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL sqlalchemy parses: as recorded
        return url


def _winner_block(sweep: Sweep, df: pd.DataFrame, row: pd.Series, by_mean: bool, verdicts: list[str],
                  rescued: str | None, width: int) -> list[str]:
    """The lines that name the winner of a one-objective sweep (see :mod:`klsweep.analysis.winner`)."""
    o = sweep.objectives[0]
    how = " (the leader by mean over seeds)" if by_mean else ""
    lines = wrapped(f"winner{how}: trial {row['number']} ({row['trial_id']}), {o.metric} = "
                    f"{short(row[f'value/{o.metric}'])} ({o.mode})", width)
    lines += wrapped(knob_values(sweep, row), width, INDENT)
    if isinstance(row.get("kl_metric"), str):
        lines += wrapped(f"KL at the end: {row['kl_metric']} = {short(row.get('last/ref_kl'))}", width, INDENT)
    if by_mean:
        lines += [line for verdict in verdicts for line in wrapped(verdict, width, INDENT)]
    else:
        second = runner_up(sweep, df, row)
        lines += wrapped(second, width, INDENT) if second else []
    if rescued:  # evidence beside the winner, not a setting
        lines += wrapped(rescued, width)
    return lines


def _print_commands(console: Console, sweep: Sweep, row: pd.Series, every: bool, width: int) -> None:
    """The command(s) that rerun ``row``, each under its label, broken to ``width`` (:func:`winner.shell_lines`)."""
    for label, command in reproduce(sweep.trainer, row, overrides_of(row), every=every):
        if label:
            _print_lines(console, wrapped(label, width))
        _print_lines(console, shell_lines(command, width))


def _has_own_command(sweep: Sweep, row: pd.Series) -> bool:
    """Whether the trainer has a command of its own besides verl's (the embedded trainer), printed on request."""
    return len(reproduce(sweep.trainer, row, overrides_of(row), every=True)) > len(
        reproduce(sweep.trainer, row, overrides_of(row)))


def _remedied(df: pd.DataFrame) -> pd.DataFrame:
    """The remedied search trials that ended: restart schedules that ran to their end (PRUNED in the study, so that
    none is called a setting), by trial number."""
    if df.empty:
        return df.iloc[0:0]
    return df[remedied_trials(df) & is_search(df)].sort_values("number")


def _print_lines(console: Console, lines: list[str]) -> None:
    for line in lines:
        console.print(line, **_PLAIN)


def winner_line(sweep: Sweep, row: pd.Series, keys: list[str] | None = None) -> str:
    """The searched knob values of a trial on one line, as ``key=value`` (each key its last dotted component):
    ``kl_coef=0.002 entropy_coeff=0 (trial 3, val-core/arith/acc/mean@1=0.6758)``.

    ``keys``: the verl keys to show; default the sweep's searched parameters."""
    values = ", ".join(f"{o.metric}={short(row.get(f'value/{o.metric}'))}" for o in sweep.objectives)
    return f"{knob_values(sweep, row, keys)} (trial {row['number']}, {values})"


def best_remedied(sweep: Sweep, df: pd.DataFrame, best: pd.DataFrame) -> pd.Series | None:
    """The row of the best remedied search trial when its run scored better than the best setting in ``best``
    (one objective), or None. Its reproduce commands are its restart schedule
    (:func:`klsweep.trainers.reproduce_commands`)."""
    if len(sweep.objectives) != 1 or "stop_reason" not in df:
        return None
    metric, mode = sweep.objectives[0].metric, sweep.objectives[0].mode
    column = f"value/{metric}"
    if column not in df:
        return None
    reasons = df["stop_reason"].fillna("").astype(str)
    remedied = df[reasons.str.startswith(REMEDIED) & df[column].notna() & is_search(df)]
    if remedied.empty:
        return None
    top = remedied.sort_values([column, "number"], ascending=[mode == "min", True]).iloc[0]
    if not best.empty:
        setting = best[column].iloc[0]
        if (top[column] <= setting) if mode == "max" else (top[column] >= setting):
            return None
    return top


def best_rescued(sweep: Sweep, df: pd.DataFrame, best: pd.DataFrame) -> str | None:
    """A line on the best remedied trial (:func:`best_remedied`) when its run scored better than the best setting
    (one objective), or None.

    A remedied trial ran as a restart schedule: its params, run unchanged, are the setting a health rule found sick
    (:data:`klsweep.results.ATTR_RESCUED_VALUES`). The line names what had to change, and when:
    ``best run (a restart schedule, not a setting): trial 0 scored val=0.6758 only because kl_coef 0.002 needed
    raising to 0.14 at step 32 (restarted from step 32's checkpoint)``."""
    top = best_remedied(sweep, df, best)
    if top is None:
        return None
    metric = sweep.objectives[0].metric
    column = f"value/{metric}"
    changes = "; ".join(
        f"{key.rsplit('.', 1)[-1]} {old:.4g} needed {'raising' if new > old else 'lowering'} to {new:.4g} at step "
        f"{run.step} (restarted from step {run.from_step}'s checkpoint)"
        for run in restarts(top.get("remedies")) for key, (old, new) in run.changes.items())
    return (f"best run (a restart schedule, not a setting): trial {top['number']} scored {metric}="
            f"{short(top[column])} only because {changes or 'remedies restarted it'}")


def _print_savings(sweep: Sweep, df: pd.DataFrame, console: Console) -> None:
    """Trial-steps and GPU-hours (wall hours of the trials on a CPU sweep) used and saved per stop reason
    (:func:`klsweep.analysis.accounting.compute_accounting` ``by="reason"``, at the trials' step rates in
    ``df.attrs``: :func:`klsweep.analysis.sweep_dir.step_seconds`); one line when nothing was saved."""
    if df.empty:
        return
    gpu = float(sweep.budget.resources.gpu)
    table = compute_accounting(df, sweep.budget.max_steps, gpu, by="reason")
    total = table.set_index("reason").loc["total"]
    used, saved = int(total["steps_used"]), int(total["steps_saved"])
    rerun = int(total["steps_rerun"])
    rerun_note = f" (of which {rerun} run again after remedies)" if rerun else ""
    hours, unit = ("gpu_h", "GPU-h") if gpu > 0 else ("wall_h", "trial-h")
    if not saved:
        console.print(f"compute: {used} trial-steps used{rerun_note}, none saved (no trial stopped early)",
                      highlight=False)
        return
    console.print(f"compute: {used} trial-steps used{rerun_note}, {saved} saved ({total['saved_share']:.1%} of "
                  f"{used + saved}); "
                  f"{total[f'{hours}_used']:.3g} {unit} used, {total[f'{hours}_saved']:.3g} saved"
                  + (f" ({total['gpu_h_saved_share']:.1%})" if gpu > 0 else " (a CPU sweep: no GPU-hours)"),
                  highlight=False)
    out = Table(title="saved by stop reason (a stopped trial saves its remaining steps)", show_edge=False)
    for column in ("stop reason", "trials", "steps used", "steps saved", "saved", f"{unit} used", f"{unit} saved"):
        out.add_column(column, overflow="fold")
    for _, row in table.iterrows():
        out.add_row(str(row["reason"]), str(row["trials"]), str(row["steps_used"]), str(row["steps_saved"]),
                    f"{row['saved_share']:.1%}", f"{row[f'{hours}_used']:.3g}", f"{row[f'{hours}_saved']:.3g}")
    console.print(out)


def _print_confirmation(sweep: Sweep, ranking: pd.DataFrame, verdicts: list[str], console: Console) -> None:
    """The confirmed leaders by mean over seeds (:func:`klsweep.analysis.leaders.ranking`), then ``verdicts``: what
    the noise allows to say (:func:`klsweep.analysis.leaders.verdicts`; the winner block says it once every run
    finished)."""
    if ranking.empty:
        return
    metrics = [o.metric for o in sweep.objectives]
    table = Table(title=f"confirmation: the leaders re-run with new training seeds, by mean of {metrics[0]} "
                        "(the search run counts as one seed)", show_edge=False)
    for column in ("confirmed", "runs ok", "seeds", f"mean {metrics[0]}", "sd", "range", *(f"mean {m}" for m in
                                                                                           metrics[1:])):
        table.add_column(column, overflow="fold")
    for _, row in ranking.iterrows():
        name = f"{row['trial']} (seed preset)" if row["preset"] else str(row["trial"])
        table.add_row(name, f"{row['ok']} of {row['runs']}", ", ".join(str(s) for s in row["seeds"]),
                      short(row[f"mean/{metrics[0]}"]), short(row["sd"]), f"{short(row['min'])} .. {short(row['max'])}",
                      *(short(row[f"mean/{m}"]) for m in metrics[1:]))
    console.print(table)
    for line in verdicts:
        console.print(line, **_PLAIN)
