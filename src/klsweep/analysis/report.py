"""``sweep report runs/<name>``: a self-contained ``report.html`` (plotly.js inlined, no network needed) and PNGs.

Sections:

* summary; the Pareto front, with the verl command of each front trial;
* the KL frontier (:func:`klsweep.analysis.frontier.sweep_frontier`);
* curves of the objectives, with the reference policy's score (:mod:`klsweep.analysis.baseline`);
* curves of KL, entropy and score, with health bands;
* parameter importance, with a caveat when it rests on few trials; KL knobs;
* stop reasons, remedies per health rule, compute accounting.

PNGs (``summary``, ``front``, ``frontier``, ``curves``, ``importance``, ``knobs``, ``slice``, ``stop_reasons``,
``accounting``) are drawn by matplotlib from the same data as the page's interactive figures.
"""

from __future__ import annotations

import html
import os
import sys
import tempfile
import warnings
from pathlib import Path

import pandas as pd
from plotly.offline import get_plotlyjs

from klsweep._format import arg
from klsweep.analysis.accounting import compute_accounting, remedy_outcomes
from klsweep.analysis.baseline import reference_scores
from klsweep.analysis.confirm import is_search, ranking
from klsweep.analysis.curves import curves_data
from klsweep.analysis.figures import SliceData, front_data, front_objectives, importance_data, knobs_data, table_data
from klsweep.analysis.frontier import sweep_frontier
from klsweep.analysis.frontier_figure import frontier_data
from klsweep.analysis.pareto import feasible, pareto_front, remedied_trials
from klsweep.analysis.plots import plotly_figure
from klsweep.analysis.pngs import write_pngs
from klsweep.analysis.summary import best_remedied, best_rescued, best_trials, winner_line
from klsweep.analysis.sweep_dir import load, load_history, overrides_of, study_of
from klsweep.errors import KlsweepError, ResultsError
from klsweep.health import load_ruleset
from klsweep.results import REPORT_DIR, SweepRecord
from klsweep.spec.schema import Sweep
from klsweep.spec.space import parameters
from klsweep.trainers import reproduce_commands

REPORT = "report.html"


def write_report(run_dir: str | Path, out: str | Path | None = None, *, pngs: bool = True) -> int:
    """Write ``report.html`` and the PNGs of the sweep in ``run_dir`` to ``out`` (default ``<run_dir>/report``).

    Every file is written to a temporary name and moved into place (``os.replace``). ``pngs=False`` writes only
    the HTML.

    Returns:
        0 (the report and, unless ``pngs=False``, every PNG were written).

    Raises:
        ResultsError: ``run_dir`` is not a sweep directory, or its study holds no trial yet, or ``out`` cannot be
            written (a read-only sweep directory: the message says to pass ``--out``).
    """
    run_dir = Path(run_dir)
    record = SweepRecord.read(run_dir)
    info = record.model_dump()
    df = load(run_dir)
    if df.empty:
        raise ResultsError(f"{run_dir}: the study {info['study_name']!r} holds no trial yet; nothing to report")
    out_dir = Path(out) if out is not None else run_dir / REPORT_DIR
    _writable(out_dir, run_dir, given=out is not None)
    sweep = info.get("sweep", {})
    budget = sweep.get("budget", {})
    max_steps = int(budget.get("max_steps") or pd.to_numeric(df.get("steps"), errors="coerce").max() or 0)
    gpu = float(budget.get("resources", {}).get("gpu", 0.0))
    objectives = [(o["metric"], o["mode"]) for o in info["objectives"]]
    axes = front_objectives(df, objectives)
    search = df[is_search(df)]  # the front is of search trials: a confirmation re-run is no config of its own
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        front = pareto_front(search, axes)
    front.attrs["notes"] = _front_notes(search, front)  # the page and the front figure say them
    ruleset = _ruleset(sweep.get("health"))
    study = study_of(run_dir)

    counts = (df.assign(health=df.get("health", pd.Series(index=df.index, dtype=object)).fillna("—"),
                        phase=is_search(df).map({True: "search", False: "confirmation"}))
              .groupby(["phase", "state", "health"]).size().rename("trials").reset_index())
    confirmed = ranking(df, objectives, seed_trials=bool(sweep.get("seed_trials")))
    stops = df[df.get("stop_reason", pd.Series("", index=df.index)).fillna("").astype(str) != ""]
    stops = stops[[c for c in ("number", "trial_id", "state", "health", "steps", "stop_reason") if c in df]]
    accounting = compute_accounting(df, max_steps, gpu, by="reason")
    remedies = remedy_outcomes(df)
    value_cols = [c for c, _ in axes]
    front_table = front[[c for c in ("number", "trial_id", *value_cols, "kl_metric", "steps") if c in front]]
    history = load_history(run_dir)
    baselines = reference_scores(sweep.get("trainer", ""), [m for m, _ in objectives], df, cache_dir=run_dir)
    frontier = sweep_frontier((df, history, record), references=baselines)

    # what each figure shows, drawn twice: plotly for the page, matplotlib for the PNGs
    views = {
        "summary": table_data(counts, f"{info.get('name', run_dir.name)}: {_trial_counts(df)}"),
        "front": front_data(search, axes, front),
        "frontier": frontier_data(frontier),
        "curves": curves_data(history, df, ruleset, objectives=objectives, baselines=baselines),
        "importance": importance_data(study, info["objectives"]),
        "knobs": knobs_data(df, objectives),
        "slice": SliceData(study, 0, info["objectives"][0]["metric"]),
        "stop_reasons": table_data(stops if len(stops) else pd.DataFrame({"stop_reason": ["no trial was stopped"]}),
                                   "Stop reasons"),
        "accounting": table_data(_compute_table(accounting), _accounting_title(accounting, max_steps, gpu)),
    }
    figures = {name: plotly_figure(views[name])
               for name in ("front", "frontier", "curves", "importance", "knobs", "slice")}
    page = _page(info, df, front, front_table, counts, stops, accounting, figures, max_steps, gpu, ruleset,
                 frontier.summary(), remedies, confirmed, views["front"].scales,
                 _winner_block(Sweep.model_validate(record.sweep), df))
    try:
        _atomic_write(out_dir / REPORT, page)
        if pngs:
            write_pngs(views, out_dir)
    except OSError as e:  # the disk filled up, or the folder was taken away meanwhile
        raise ResultsError(f"cannot write the report to {out_dir}: {e.strerror or e} ({e.filename}). Free space "
                           "there or pass --out DIR") from None
    print(f"report: {out_dir / REPORT}" + ("" if not pngs else f" and {len(views)} PNGs"))
    return 0


def _writable(out_dir: Path, run_dir: Path, *, given: bool) -> None:
    """Create ``out_dir`` and write a probe file in it: a read-only sweep directory (a copy from a cluster, a
    read-only mount) is said in one line before any figure is drawn.

    Raises:
        ResultsError: the folder cannot be created or written; the fix is another folder (``--out``)."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out_dir, prefix=".write-probe-"):
            pass
    except OSError as e:
        where = "" if given else " (the sweep directory's report/ folder)"
        raise ResultsError(f"cannot write the report to {out_dir}{where}: {e.strerror or e} ({e.filename}). "
                           f"Pass a folder you can write: sweep report {arg(run_dir)} --out DIR") from None


def _winner_block(sweep: Sweep, df: pd.DataFrame) -> str:
    """The report's first section: the best trial's searched knobs on one line (each a setting that ran unchanged,
    :func:`klsweep.analysis.summary.best_trials`), and a better remedied run apart (a restart schedule)."""
    best = best_trials(sweep, df)
    # the searched parameters, else (a study written by another tool) the config keys that differ between trials
    keys = list(parameters(sweep)) or [c[len("config/"):] for c in df.columns if c.startswith("config/")
                                       and df[c].astype(str).nunique() > 1]
    lines = [f"<p><b>{html.escape(winner_line(sweep, row, keys))}</b></p>" for _, row in best.iterrows()]
    if not lines:
        lines = ["<p>No setting completed unchanged and healthy yet.</p>"]
    rescued = best_rescued(sweep, df, best)
    schedule = best_remedied(sweep, df, best)
    if rescued and schedule is not None:  # rerun as the restart schedule it was, one command per segment
        lines.append(f"<p class='warn'>{html.escape(rescued)}</p>")
        lines += _commands(sweep.trainer, schedule)
    return "<h2 id=\"winner\">Winner</h2>" + "".join(lines) + "\n"


def _commands(trainer: str, row: pd.Series) -> list[str]:
    """The HTML of the commands that rerun a trial (:func:`klsweep.trainers.reproduce_commands`; a remedied trial's
    are its restart schedule, one per segment), each under its label."""
    return [(f"<p>{html.escape(label)}</p>" if label else "") + f"<pre>{html.escape(command)}</pre>"
            for label, command in reproduce_commands(trainer, overrides_of(row), row.get("remedies"))]


def _front_notes(search: pd.DataFrame, front: pd.DataFrame) -> list[str]:
    """The notes on the Pareto front of the search trials: :func:`klsweep.analysis.pareto.pareto_front`'s, except that
    an empty front with remedied trials (:func:`klsweep.analysis.pareto.remedied_trials`) says they are restart
    schedules that ran to the end, not trials a health rule stopped."""
    notes = list(front.attrs.get("notes", []))
    remedied = remedied_trials(search)
    if not front.empty or not remedied.any():
        return notes
    n, total = int(remedied.sum()), len(search)
    note = (f"no feasible trial: {n} of {total} search trial{'s' * (total != 1)} {'were' if n != 1 else 'was'} "
            f"remedied, restart schedule{'s' * (n != 1)} that ran to the end, PRUNED in the study so that none is "
            "called a setting (the Winner section gives the best one and its commands)")
    if total > n:
        note += (f"; the other {total - n} {'were' if total - n != 1 else 'was'} stopped by a health rule, pruned, "
                 "failed or did not report every objective")
    return [note + "; the Pareto front is empty"]


def _ruleset(health):
    if health is None:
        return None
    try:
        return load_ruleset(health)
    except KlsweepError as e:  # a report still helps without bands
        print(f"report: health rules not drawn: {e}", file=sys.stderr)
        return None


def _accounting_title(accounting: pd.DataFrame, max_steps: int, gpu: float) -> str:
    total = accounting.set_index("reason").loc["total"]
    hours, unit = ("gpu_h", "GPU-h") if gpu > 0 else ("wall_h", "trial-h")
    return (f"Compute: {int(total['steps_used'])} trial-steps and {total[f'{hours}_used']:.3g} {unit} used; "
            f"{int(total['steps_saved'])} steps and {total[f'{hours}_saved']:.3g} {unit} saved vs every trial to "
            f"{max_steps} steps ({gpu:g} GPU per trial)")


#: Column labels of the compute table (:func:`klsweep.analysis.accounting.compute_accounting` columns).
_COMPUTE_LABELS = {"reason": "stop reason", "trials": "trials", "steps_used": "trial-steps used",
                   "steps_saved": "trial-steps saved", "saved_share": "steps saved", "wall_h_used": "trial-hours used",
                   "wall_h_saved": "trial-hours saved", "gpu_h_used": "GPU-hours used",
                   "gpu_h_saved": "GPU-hours saved", "gpu_h_saved_share": "GPU-hours saved (share)",
                   "steps_rerun": "steps run again after remedies"}


def _compute_table(accounting: pd.DataFrame) -> pd.DataFrame:
    """The compute table as the report shows it: labelled columns (:data:`_COMPUTE_LABELS`), the shares saved as
    percentages of the whole sweep (``24.3 %``), and no GPU-hour columns when every one is 0 (a CPU sweep)."""
    gpu = [c for c in accounting.columns if c.startswith("gpu_h_")]
    shown = accounting.drop(columns=gpu) if not accounting[gpu].astype(float).to_numpy().any() else accounting.copy()
    for column in ("saved_share", "gpu_h_saved_share"):
        if column in shown:
            shown[column] = [f"{v * 100:.1f} %" for v in shown[column]]
    return shown.rename(columns=_COMPUTE_LABELS)


def _trial_counts(df: pd.DataFrame) -> str:
    """``N search trials, F feasible`` plus ``, M remedied (...)`` when some search trials were remedied (restart
    schedules, :func:`klsweep.analysis.pareto.remedied_trials`) and ``; R confirmation re-runs, G feasible`` when
    the sweep has re-runs."""
    search = is_search(df)
    line = f"{int(search.sum())} search trials, {int(feasible(df[search]).sum())} feasible"
    remedied = int(remedied_trials(df[search]).sum())
    if remedied:
        line += f", {remedied} remedied (restart schedules that ran to the end, not feasible settings)"
    if (~search).any():
        line += f"; {int((~search).sum())} confirmation re-runs, {int(feasible(df[~search]).sum())} feasible"
    return line


def _confirmation_block(table: pd.DataFrame) -> str:
    """The report's confirmation section: the ranking by mean over seeds
    (:func:`klsweep.analysis.confirm.ranking`), or a line when no search trial was re-run."""
    if table.empty:
        return "<p>No confirmation re-runs (budget.confirm off or not reached).</p>"
    return ("<p>The confirmed search trials by their mean over seeds (the search run counts as one seed): runs in"
            " the study, finished, ok (finished and healthy), their data.seed, the mean of each objective and the"
            " first one's sample sd, min and max. A trial with a run stopped by a health rule or failed ranks after"
            " the others.</p>" + _table(table))


def _remedies_block(remedies: pd.DataFrame) -> str:
    """The report's per-rule remedy counts (:func:`klsweep.analysis.accounting.remedy_outcomes`), or a line."""
    if remedies.empty:
        return "<p>No health rule fired.</p>"
    return ("<p>Per health rule: trials it fired on (flagged), restarted with its remedy (remedied), of those the ones"
            " that ended healthy (rescued), stopped with its max_remedies used up (stopped_at_cap) and stopped"
            " without a remedy (stopped_unremedied: no checkpoint before the finding, a knob without effect, remedies"
            " off; the stop reason says which).</p>" + _table(remedies))


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _table(df: pd.DataFrame) -> str:
    return df.to_html(index=False, escape=True, na_rep="", float_format=lambda v: f"{v:.4g}", border=0,
                      classes="t")


def _page(info, df, front, front_table, counts, stops, accounting, figures, max_steps, gpu, ruleset,
          frontier: str, remedies: pd.DataFrame, confirmed: pd.DataFrame, kl_plotted: list[str], winner: str) -> str:
    def fig(name: str) -> str:
        return figures[name].to_html(full_html=False, include_plotlyjs=False, div_id=f"fig-{name}")

    name = html.escape(str(info.get("name", "")))
    objectives = ", ".join(f"{html.escape(o['metric'])} ({o['mode']})" for o in info["objectives"])
    notes = "".join(f"<p class='warn'>⚠ {html.escape(n)}</p>" for n in front.attrs.get("notes", []))
    kl = "; ".join(kl_plotted) or "n/a"
    commands = []
    for _, row in front.iterrows():
        commands.append(f"<p>trial {row['number']}:</p>")
        commands += _commands(info["sweep"].get("trainer", "verl"), row)
    remedied = [int(n) for n in df.loc[remedied_trials(df) & is_search(df), "number"]] if "number" in df else []
    others = [n for n in front.attrs.get("least_infeasible", []) if n not in remedied]
    if front.empty and front.attrs.get("least_infeasible"):
        front_block = ("<p>No feasible trial." + (" Remedied, restart schedules that ran to the end: " + html.escape(
            ", ".join(f"trial {n}" for n in remedied[:10])) + "." if remedied else "")
            + (" The least infeasible, by steps survived: " + html.escape(", ".join(f"trial {n}" for n in others[:10]))
               + "." if others else "") + "</p>")
    else:
        front_block = _table(front_table) + "".join(commands)
    total = accounting.set_index("reason").loc["total"]
    preset = html.escape(ruleset.name) if ruleset is not None else "none"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>klsweep report: {name}</title>
<script type="text/javascript">{get_plotlyjs()}</script>
<style>body{{font-family:sans-serif;max-width:1200px;margin:auto;padding:1em}} .warn{{color:#a15c00}}
table.t{{border-collapse:collapse;font-size:13px}} table.t td,table.t th{{padding:3px 8px;border-bottom:1px solid #ddd;
text-align:left}} pre{{white-space:pre-wrap;background:#f4f4f4;padding:6px;font-size:12px}}</style></head>
<body>
<h1>klsweep report: {name}</h1>
<p>Algorithm {html.escape(str(info.get('sweep', {}).get('algorithm', '?')))}; objectives {objectives};
health rules {preset}; {_trial_counts(df)} (feasible: COMPLETE and not stopped by a health
rule); budget {max_steps} steps per trial, {gpu:g} GPU per trial.</p>
{winner}<h2 id="summary">Summary</h2>{_table(counts)}
<h2 id="front">Pareto front</h2><p>Search trials only (confirmation re-runs are in the next section).
KL plotted: {html.escape(kl)}.</p>{notes}{fig('front')}
<h3>Front trials and the command that reruns each</h3>{front_block}
<h2 id="confirmation">Confirmation: ranking by mean over seeds</h2>{_confirmation_block(confirmed)}
<h2 id="frontier">KL frontier</h2><p>{html.escape(frontier).replace(chr(10), "<br>")}</p>{fig('frontier')}
<h2 id="curves">Curves</h2>{fig('curves')}
<h2 id="importance">Parameter importance</h2>{fig('importance')}
<h2 id="knobs">KL knobs</h2>{fig('knobs')}{fig('slice')}
<h2 id="stops">Stop reasons</h2>{_table(stops) if len(stops) else '<p>No trial was stopped.</p>'}
<h2 id="remedies">Remedies</h2>{_remedies_block(remedies)}
<h2 id="compute">Compute</h2>
<p>{int(total['steps_used'])} trial-steps ({int(total['steps_rerun'])} of them run again after remedies restarted
their trials from a checkpoint), {total['wall_h_used']:.3g} trial-hours and {total['gpu_h_used']:.3g}
GPU-hours used; stopping early saved {int(total['steps_saved'])} trial-steps, {total['wall_h_saved']:.3g} trial-hours
and {total['gpu_h_saved']:.3g} GPU-hours compared with running every trial to {max_steps} steps (saved steps are costed
at each trial's own seconds per step, its start-up left out), per stop reason: a health rule, median stopping, fate
stopping, the objective stopper, the scheduler. A run that ended before {max_steps} steps on its own (a replayed log
ending there) saved nothing.</p>{_table(_compute_table(accounting))}
</body></html>
"""
