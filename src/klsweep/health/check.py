"""``sweep health check TRACE``: replay a training log through a rule set and show when each rule would have fired.

Verdicts and exit codes (``docs/health-rules.md``):

- STOPPED: 1.
- HEALTHY or WARNED: 0.
- INCONCLUSIVE: 3. No rule or built-in check that can stop a run could judge the log: none of their metrics is
  logged. "Healthy" would claim a check that never ran.
- A log that cannot be read, or a W&B export of several runs without ``--run``: 2 (the CLI).

Every verdict says how many rules and checks judged the log. It also says whether the run's config turns on a KL
mechanism that the log has no KL metric for. A log whose step goes back (a restart from a checkpoint) is judged as
the run that continued, as the trial's ``result.json`` holds it, and says so (:func:`continued`).

A Ray Tune ``progress.csv`` lacks the metrics a trial first reported after its first report
(:func:`klsweep.health.readers.tune_progress`). With the trial's ``result.json`` beside it, that file is judged
instead, and stderr says so. Without one, stderr warns, naming what the rules read that the file lacks
(:func:`absent_signals`).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from klsweep.health.coef import KlCoefJump
from klsweep.health.engine import HealthEngine
from klsweep.health.load import load_ruleset
from klsweep.health.readers import TUNE_RESULT, FullConfig, Trace, read_trace, tune_progress
from klsweep.health.signals import Signals
from klsweep.verl.metrics import KL_IN_LOSS_METRICS, KL_IN_REWARD_METRICS, KlSetup

#: Exit codes of ``sweep health check`` per verdict (2 is a log that cannot be read: the CLI's input errors).
EXIT_CODES = {"healthy": 0, "warned": 0, "stopped": 1, "inconclusive": 3}


def backtest(trace: Trace, ruleset) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Feed every report of ``trace`` to a fresh engine, past the first stop.

    Returns:
        (timeline, summary): timeline spans, one per run of consecutive reports where a rule fired
        (``rule, action, kind, first_step, last_step, reports, message, advice, values`` of the span's first
        report), in order of first step; and :meth:`HealthEngine.summary` (its stop is the first one).
    """
    engine = HealthEngine(ruleset, trace.config, rounded=trace.rounded)
    spans: list[dict[str, Any]] = []
    open_spans: dict[str, dict[str, Any]] = {}
    for step, metrics in trace.reports:
        verdict = engine.update(step, metrics)
        fired = set()
        for e in verdict.events:
            fired.add(e.rule)
            span = open_spans.get(e.rule)
            if span is None or span["action"] != e.action:
                span = {**e.as_dict(), "first_step": e.step, "last_step": e.step, "reports": 0}
                del span["step"]
                open_spans[e.rule] = span
                spans.append(span)
            span["last_step"] = e.step
            span["reports"] += 1
        for rule in list(open_spans):
            if rule not in fired:
                del open_spans[rule]
    return spans, engine.summary()


def coverage(trace: Trace, summary: dict[str, Any]) -> dict[str, Any]:
    """How much of the rule set (``summary["judges"]`` of :meth:`HealthEngine.summary`) could judge the log, and
    the verdict that follows.

    A rule or built-in check judged the log unless the engine lists it under ``not_applicable`` (its metrics never
    appeared or were never finite, its window was never covered, ...). A check or rule can stop a run when its action
    in ``judges`` is ``stop`` (every built-in check but ``builtin.nonfinite_metric``, which warns).

    Returns:
        ``{"verdict", "judged", "total", "stop_judged", "stop_total", "kl_not_logged"}``: ``verdict`` is the
        engine's (healthy|warned|stopped), or ``inconclusive`` when no rule or check that can stop judged the log;
        ``kl_not_logged`` names each KL mechanism the run's config turns on (``trace.config``: a Tune log's config)
        with no KL metric of it in the log, as sentences.
    """
    setup = KlSetup.from_overrides(trace.config)
    names = list(summary["judges"])
    stoppers = [name for name, action in summary["judges"].items() if action == "stop"]
    idle = summary["not_applicable"]
    judged = [n for n in names if n not in idle]
    stop_judged = [n for n in stoppers if n not in idle]
    verdict = summary["verdict"]
    if verdict != "stopped" and not stop_judged:
        verdict = "inconclusive"
    logged = {k for _, metrics in trace.reports for k in metrics}
    kl_not_logged = []
    for on, key, metric_names in (
        (setup.kl_in_loss, "actor_rollout_ref.actor.use_kl_loss", KL_IN_LOSS_METRICS),
        (setup.kl_in_reward, "algorithm.use_kl_in_reward", KL_IN_REWARD_METRICS),
    ):
        if on and not logged.intersection(metric_names):
            kl_not_logged.append(
                f"the run's config sets {key}=True but the log has no {' or '.join(metric_names)}: the KL rules "
                "could not judge it; log it (verl logs it when the mechanism is on) or check the config"
            )
    return {
        "verdict": verdict,
        "judged": len(judged),
        "total": len(names),
        "stop_judged": len(stop_judged),
        "stop_total": len(stoppers),
        "kl_not_logged": kl_not_logged,
    }


def absent_signals(trace: Trace, ruleset) -> dict[str, tuple[str, ...]]:
    """The signals the rules of ``ruleset`` read that no report of ``trace`` holds under any of their names:
    ``{signal: the metric names looked for}`` (:meth:`klsweep.health.signals.Signals.looked_for`), in rule order.
    Signals computed from the run config, or of a KL the config turns off, are never absent."""
    signals = Signals(KlSetup.from_overrides(trace.config), [m for rule in ruleset.rules for m in rule.metrics])
    for _, metrics in trace.reports:
        signals.read(metrics)
    return {name: looked for name in signals.names
            if name not in signals.keys_seen and (looked := signals.looked_for(name))}


def _tune_progress_note(path: Path) -> tuple[Path, bool]:
    """The log to judge for ``path``, and whether it is a Tune progress.csv without its result.json; prints on
    stderr when it judges the result.json instead."""
    if not tune_progress(path):
        return path, False
    result = path.with_name(TUNE_RESULT)
    if not result.is_file():
        return path, True
    print(f"note: {path} is a Ray Tune progress.csv, whose columns are the keys of the trial's first report: reading "
          f"{result} beside it, which holds every key of every report", file=sys.stderr)
    return result, False


def continued(trace: Trace) -> tuple[Trace, list[str]]:
    """The run as it continued, and a sentence per restart that dropped reports.

    A log whose step goes back holds reports a restart abandoned: a remedy restarted the trial from an earlier
    checkpoint, or a resumed run repeated the steps after its last checkpoint. Tune's ``progress.csv`` keeps them;
    ``result.json`` keeps only the run that continued (:class:`klsweep.orchestrate.result_json.ResultsFromCheckpoint`).
    Where a report's step is lower than the one before it, the earlier reports from that step on are dropped, so
    both files of a trial get one verdict. Reports without a step are kept as they are."""
    kept: list[tuple[int | None, dict[str, Any]]] = []
    notes = []
    last: int | None = None
    for step, metrics in trace.reports:
        if step is not None and last is not None and step < last:
            dropped = sum(1 for s, _ in kept if s is not None and s >= step)
            kept = [(s, m) for s, m in kept if s is None or s < step]
            notes.append(f"the log goes back to step {step} after step {last} (a restart from a checkpoint: a "
                         f"remedy's, or a resumed run's): its {dropped} abandoned reports of steps {step}-{last} are "
                         "left out, as in the trial's result.json; judged is the run that continued")
        kept.append((step, metrics))
        last = step if step is not None else last
    if not notes:
        return trace, []
    return dataclasses.replace(trace, reports=kept), notes


def _steps(first: Any, last: Any) -> str:
    return f"step {first}" if first == last else f"steps {first}-{last}"


def health_check(
    trace: str | Path,
    preset: str | None = None,
    rules: str | Path | None = None,
    as_json: bool = False,
    run: str | None = None,
    full_config: FullConfig | None = None,
) -> int:
    """Print the timeline and final verdict of a log under a rule set.

    Args:
        trace: verl jsonl, verl console log, W&B CSV export, or Ray Tune progress.csv/result.json (a progress.csv
            with a result.json beside it is judged from the result.json).
        preset: a preset name (default ``default``); ignored when ``rules`` is given.
        rules: a YAML rules file (a ``health:`` value).
        as_json: print one JSON object instead of text (the engine's summary, with ``verdict`` as below, the
            counts of :func:`coverage` and ``restarts``: :func:`continued`'s sentences).
        run: the run to judge in a W&B export holding several.
        full_config: completes the log's own config (:func:`klsweep.health.readers.read_trace`).

    Returns:
        :data:`EXIT_CODES`: 0 when the run would have been left alone (healthy or warned), 1 when a rule would have
        stopped it, 3 when no rule or check that can stop a run could judge the log (inconclusive).

    Raises:
        TraceReadError: the log cannot be read, or it is a W&B export of several runs and ``run`` names none of them
            (the CLI exits 2; the message lists the runs).
        SweepFileError: unknown preset or invalid rules file (the CLI exits 2).
    """
    ruleset = load_ruleset(rules if rules is not None else (preset or "default"))
    path, lone_progress = _tune_progress_note(Path(trace))
    t, restarts = continued(read_trace(path, run=run, full_config=full_config))
    if lone_progress:
        absent = "; ".join(f"{name} ({', '.join(looked)})" for name, looked in absent_signals(t, ruleset).items())
        print(f"warning: {path} is a Ray Tune progress.csv with no {TUNE_RESULT} beside it: Tune writes its header "
              "from the trial's first report, so a metric first reported later (validation, every "
              "trainer.test_freq steps) has no column. "
              + (f"The rules of {ruleset.name} read these, absent here: {absent}. " if absent else "")
              + f"Judge the trial's {TUNE_RESULT} where you have it", file=sys.stderr)
    timeline, summary = backtest(t, ruleset)
    summary = {**summary, **coverage(t, summary), "restarts": restarts}
    if as_json:
        out = {
            "trace": str(t.path),
            "run": t.run,
            "format": t.format,
            "rounded": t.rounded,
            "run_config": t.config,
            "ruleset": ruleset.name,
            "skipped_lines": t.skipped,
            "skipped": [{"line": number, "why": why} for number, why in t.skipped_lines],
            "timeline": timeline,
            **summary,
        }
        print(json.dumps(out, indent=1, default=str))
    else:
        print(_text(t, ruleset, timeline, summary))
    return EXIT_CODES[summary["verdict"]]


#: Skipped lines the text output names one by one; the rest are counted (``--json`` lists them all).
SKIPPED_SHOWN = 5


def _skipped_text(t: Trace) -> list[str]:
    """``skipped 2 lines, not read as reports: line 11 (not JSON), line 32 (truncated last line: ...)``, or nothing."""
    if not t.skipped_lines:
        return []
    shown = [f"line {number} ({why})" for number, why in t.skipped_lines[:SKIPPED_SHOWN]]
    more = t.skipped - len(shown)
    s = "s" if t.skipped > 1 else ""
    return [
        f"skipped {t.skipped} line{s}, not read as reports: {', '.join(shown)}"
        + (f" and {more} more (--json lists them all)" if more else "")
    ]


def _text(t: Trace, ruleset, timeline: list[dict[str, Any]], summary: dict[str, Any]) -> str:
    s = summary
    lines = [
        f"{t.path.name}{f' (run {t.run})' if t.run else ''}: {t.format}, {s['reports']} reports "
        f"({_steps(s['first_step'], s['last_step'])})"
        + (", values rounded to 3 decimals" if t.rounded else "")
        + (", run config from the log" if t.config else ", no run config (rules that need it are not applicable)"),
        *_skipped_text(t),
        *(f"note: {text}" for text in s["restarts"]),
        f"rule set: {ruleset.name} ({len(ruleset.rules)} rules + built-in checks)",
        "",
        "timeline:" if timeline else "timeline: no rule fired",
    ]
    for span in timeline:
        count = f" x{span['reports']}" if span["reports"] > 1 else ""
        lines.append(
            f"  {_steps(span['first_step'], span['last_step']):<16} {span['action'].upper():<6} {span['rule']}"
            f" ({span['kind']}){count}: {span['message']}"
        )
    if s["not_applicable"]:
        lines += ["", "not applicable:"]
        lines += [f"  {name}: {why}" for name, why in s["not_applicable"].items()]
    lines += ["", *(f"note: {text}" for text in s["kl_not_logged"])]
    lines += [f"note: {span['message']} ({_steps(span['first_step'], span['last_step'])}, {span['rule']})"
              for span in timeline if span["rule"] == KlCoefJump.name]
    lines.append(
        f"judged by {s['judged']} of {s['total']} rules and built-in checks "
        f"({s['stop_judged']} of the {s['stop_total']} that can stop a run)"
    )
    sets = s.get("validation") or {}
    if sets:
        judged = "; ".join(f"{key} (first {v['first']:.4g}, best {v['best']:.4g}, last {v['last']:.4g})"
                           for key, v in sets.items())
        lines.append(f"validation judged: {judged}")
    warned = [name for name, fired in s["fired"].items() if fired["action"] == "warn"]
    if s["verdict"] == "stopped":
        lines.append(f"verdict: STOPPED: {s['stop_reason']}")
    elif s["verdict"] == "inconclusive":
        lines.append(
            "verdict: INCONCLUSIVE: no rule or check that can stop a run found its metrics in this log, so nothing "
            "says it is healthy"
            + (f" (warned: {', '.join(warned)})" if warned else "")
            + "; see 'not applicable' for what each one needs"
        )
    elif s["verdict"] == "warned":
        lines.append("verdict: WARNED (not stopped): " + ", ".join(warned))
    else:
        lines.append("verdict: HEALTHY")
    if s["best"] and s["verdict"] == "stopped" and s["collapsed_at"] is None:  # collapse texts include it
        b = s["best"]
        lines.append(f"best report before the stop: step {b['step']} ({b['metric']} = {b['value']:g})")
    return "\n".join(lines)
