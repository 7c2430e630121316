"""``sweep health check TRACE``: replay a training log through a rule set and show when each rule would have fired."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from klsweep.health.engine import HealthEngine
from klsweep.health.load import load_ruleset
from klsweep.health.readers import Trace, read_trace


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


def _steps(first: Any, last: Any) -> str:
    return f"step {first}" if first == last else f"steps {first}-{last}"


def health_check(
    trace: str | Path, preset: str | None = None, rules: str | Path | None = None, as_json: bool = False
) -> int:
    """Print the timeline and final verdict of a log under a rule set.

    Args:
        trace: verl jsonl, verl console log, W&B CSV export, or Ray Tune progress.csv/result.json.
        preset: a preset name (default ``default``); ignored when ``rules`` is given.
        rules: a YAML rules file (a ``health:`` value).
        as_json: print one JSON object instead of text.

    Returns:
        0 when the run would have been left alone (healthy or warned), 1 when a rule would have stopped it.

    Raises:
        TraceReadError: the log cannot be read (the CLI exits 2).
        SweepFileError: unknown preset or invalid rules file (the CLI exits 2).
    """
    ruleset = load_ruleset(rules if rules is not None else (preset or "default"))
    t = read_trace(trace)
    timeline, summary = backtest(t, ruleset)
    if as_json:
        out = {
            "trace": str(t.path),
            "format": t.format,
            "rounded": t.rounded,
            "run_config": t.config,
            "ruleset": ruleset.name,
            "skipped_lines": t.skipped,
            "timeline": timeline,
            **summary,
        }
        print(json.dumps(out, indent=1, default=str))
    else:
        print(_text(t, ruleset, timeline, summary))
    return 1 if summary["verdict"] == "stopped" else 0


def _text(t: Trace, ruleset, timeline: list[dict[str, Any]], summary: dict[str, Any]) -> str:
    s = summary
    lines = [
        f"{t.path.name}: {t.format}, {s['reports']} reports ({_steps(s['first_step'], s['last_step'])})"
        + (", values rounded to 3 decimals" if t.rounded else "")
        + (", run config from the log" if t.config else ", no run config (rules that need it are not applicable)"),
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
    lines.append("")
    if s["verdict"] == "stopped":
        lines.append(f"verdict: STOPPED: {s['stop_reason']}")
    elif s["verdict"] == "warned":
        warned = [name for name, fired in s["fired"].items() if fired["action"] == "warn"]
        lines.append("verdict: WARNED (not stopped): " + ", ".join(warned))
    else:
        lines.append("verdict: HEALTHY")
    if s["best"] and s["verdict"] == "stopped" and s["collapsed_at"] is None:  # collapse texts include it
        b = s["best"]
        lines.append(f"best report before the stop: step {b['step']} ({b['metric']} = {b['value']:g})")
    return "\n".join(lines)
