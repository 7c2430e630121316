"""Verdicts on real verl logs: every shipped preset over the corpus of ``tests/data/verdicts/corpus.yaml``.

Each run of the corpus is a public verl log with the verdict a correct engine reaches: healthy, or a stop of a
named kind with the step window it must fall in (``not_before`` .. ``by``). Each run is replayed report by report
through :class:`klsweep.health.HealthEngine` (:func:`klsweep.health.check.backtest`, as ``sweep health check``
does) under each preset, twice:

- **shipped**: the preset as shipped;
- **left out**: the preset with its scale-free thresholds (:data:`CALIBRATED`) calibrated on the runs of the other
  groups only (leave-one-source-out), so that the figure says how the rules do on a run whose source they have
  not seen.

Calibration of one threshold: the worst value the healthy stretches of the calibration runs show (a healthy run
whole; a failing run before its ``not_before``), after the rule's warm-up, beyond which the threshold is set by the
preset's margin (:data:`MARGINS`): ``above`` thresholds at worst × margin, ``below`` thresholds at worst ÷ margin.

Per preset it prints: false stops on healthy runs (and on failing runs before their window), failures caught in
their window with the right kind, the steps from the window's start to the stop, with Wilson 95 % intervals, and
per run the stop (step, rule). The healthy-stretch statistics of every run come first (``--stats``).

    python benchmarks/verdicts.py [--stats] [--markdown]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from klsweep.health.check import backtest
from klsweep.health.conditions import RelativeCondition
from klsweep.health.load import load_ruleset
from klsweep.health.readers import Trace, read_trace
from klsweep.health.rules import RuleSet
from klsweep.health.series import Series, statistic
from klsweep.health.signals import first_present
from klsweep.verl.metrics import ALIASES

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"
CORPUS = DATA / "verdicts" / "corpus.yaml"
PRESETS = ("default", "conservative", "aggressive", "seed")
#: How far beyond the worst healthy value each preset sets a calibrated threshold (× for above, ÷ for below).
MARGINS = {"default": 1.25, "conservative": 1.1, "aggressive": 1.5}
#: The thresholds calibrated on the corpus: (rule, condition index) → the statistic that condition reads.
CALIBRATED = {
    ("length_blowup", 0): "length ratio to its last 50 steps' median",
    ("length_blowup", 1): "share of responses at the length cap",
    ("entropy_rise", 0): "10-step mean entropy ÷ median of the first 20 steps",
}
#: Floors of the calibrated thresholds: a truncation share below 2 % (one response in 50) is noise, not a signal.
FLOORS = {("length_blowup", 1): 0.02}


@dataclass
class Run:
    """One run of the corpus, its log read."""

    id: str
    group: str
    verdict: str
    kind: str | None
    not_before: int | None
    by: int | None
    reports: list[tuple[int | None, dict[str, Any]]]
    rounded: bool
    entry: dict[str, Any]

    def healthy_until(self) -> float:
        """The last step of the run's healthy stretch (inf for a healthy run)."""
        return math.inf if self.verdict == "healthy" else (self.not_before or 1) - 1


def load_corpus(path: Path = CORPUS) -> list[Run]:
    """Every run of the corpus manifest, its log read with :func:`klsweep.health.readers.read_trace`."""
    runs = []
    for entry in yaml.safe_load(path.read_text())["runs"]:
        trace = read_trace(path.parent.parent / entry["file"])
        runs.append(Run(entry["id"], entry["group"], entry["verdict"], entry.get("kind"), entry.get("not_before"),
                        entry.get("by"), trace.reports, trace.rounded, entry))
    return runs


def worst_healthy(runs: list[Run], ruleset: RuleSet) -> dict[tuple[str, int], float]:
    """For each calibrated condition of ``ruleset``: its worst value over the healthy stretches of ``runs``, after
    the rule's warm-up (the max for an ``above`` bound, the min for a ``below`` one); absent when no run logs it."""
    out: dict[tuple[str, int], float] = {}
    rules = {r.name: r for r in ruleset.rules}
    for (name, index) in CALIBRATED:
        rule = rules.get(name)
        if rule is None:
            continue
        c = rule.conditions[index]
        early = c.early if isinstance(c, RelativeCondition) else 0
        seen: list[float] = []
        for run in runs:
            series = Series(getattr(c, "window", None) or 1, early)
            for step, metrics in run.reports:
                hit = first_present(metrics, ALIASES.get(c.metric, (c.metric,)))
                if step is None or hit is None or not math.isfinite(hit[1]):
                    continue
                value = hit[1]
                if step > run.healthy_until():
                    break
                series.push(step, value)
                if step <= rule.after:
                    continue
                stat = statistic(c.stat, getattr(c, "window", None), getattr(c, "peak_above", 0.0), series, early)
                if stat is not None and math.isfinite(stat[0]):
                    seen.append(stat[0])
        if seen:
            out[(name, index)] = max(seen) if c.above is not None else min(seen)
    return out


def calibrated(ruleset: RuleSet, worst: dict[tuple[str, int], float], margin: float) -> RuleSet:
    """``ruleset`` with each calibrated threshold set ``margin`` beyond ``worst`` (2 significant digits, rounded
    away from the healthy side; not below :data:`FLOORS`)."""
    rules = []
    for rule in ruleset.rules:
        conditions = list(rule.conditions)
        for index, c in enumerate(conditions):
            key = (rule.name, index)
            if key not in worst:
                continue
            if c.above is not None:
                bound = max(_round_up(worst[key] * margin), FLOORS.get(key, 0.0))
                conditions[index] = c.model_copy(update={"above": bound})
            else:
                conditions[index] = c.model_copy(update={"below": _round_down(worst[key] / margin)})
        rules.append(rule.model_copy(update={"conditions": tuple(conditions)}))
    return RuleSet(ruleset.name, tuple(rules), ruleset.builtin, ruleset.description, ruleset.validation)


def _round_up(x: float) -> float:
    scale = 10 ** (math.floor(math.log10(abs(x))) - 1) if x else 1.0
    return math.ceil(x / scale) * scale


def _round_down(x: float) -> float:
    scale = 10 ** (math.floor(math.log10(abs(x))) - 1) if x else 1.0
    return math.floor(x / scale) * scale


def judge(run: Run, ruleset: RuleSet) -> dict[str, Any]:
    """The run's first stop under ``ruleset`` and how it scores against the run's verdict.

    Returns:
        ``{"step", "rule", "kind", "outcome", "delay"}``; outcome: ``ok`` (healthy, not stopped), ``false stop``
        (a healthy run stopped, or a failing one before ``not_before``), ``caught`` (in the window, right kind),
        ``wrong kind`` (in the window, another kind), ``late`` (after ``by``), ``missed`` (never stopped); delay:
        steps from ``not_before`` to the stop (caught or wrong kind only).
    """
    trace = Trace(Path(run.id), "corpus", run.reports, run.rounded)
    _, summary = backtest(trace, ruleset)
    step, reason = summary["stop_step"], summary["reason"]
    out = {"step": step, "rule": reason["rule"] if reason else None, "kind": summary["stop_kind"], "delay": None}
    if run.verdict == "healthy":
        out["outcome"] = "false stop" if step is not None else "ok"
    elif step is None:
        out["outcome"] = "missed"
    elif step < (run.not_before or 0):
        out["outcome"] = "false stop"
    elif run.by is not None and step > run.by:
        out["outcome"] = "late"
    else:
        out["outcome"] = "caught" if summary["stop_kind"] == run.kind else "wrong kind"
        out["delay"] = step - (run.not_before or 0)
    return out


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score 95 % interval of a proportion k/n (Wilson 1927)."""
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def evaluate(runs: list[Run], preset: str, left_out: bool) -> list[dict[str, Any]]:
    """Every run judged under ``preset``: as shipped, or calibrated without the run's own group."""
    base = load_ruleset(preset)
    results = []
    for run in runs:
        ruleset = base
        if left_out and preset in MARGINS:
            others = [r for r in runs if r.group != run.group]
            ruleset = calibrated(base, worst_healthy(others, base), MARGINS[preset])
        results.append({"run": run, **judge(run, ruleset)})
    return results


def summarise(results: list[dict[str, Any]]) -> dict[str, Any]:
    """False stops, caught failures and delays of one preset's results."""
    healthy = [r for r in results if r["run"].verdict == "healthy"]
    failing = [r for r in results if r["run"].verdict != "healthy"]
    false = sum(r["outcome"] == "false stop" for r in results)
    caught = [r for r in failing if r["outcome"] == "caught"]
    delays = [r["delay"] for r in caught]
    return {
        "false": false, "judged": len(results), "false_ci": wilson(false, len(results)),
        "healthy_stopped": sum(r["outcome"] == "false stop" for r in healthy), "healthy": len(healthy),
        "caught": len(caught), "failing": len(failing), "caught_ci": wilson(len(caught), len(failing)),
        "delay_median": statistics.median(delays) if delays else None, "delay_max": max(delays) if delays else None,
    }


def kl_trend(run: Run) -> dict[str, Any] | None:
    """The reference KL of ``run``'s healthy stretch against three references: absolute (its peak), against its own
    start (the 10-step mean ÷ the median of its first 20 steps, after step 20) and against its own trend (each value ÷
    the median of its last 50 steps); the largest of each. None when the run logs no KL."""
    early = Series(10, 20)
    trend = Series(50, 0)
    peak, to_early, to_trend, key = -math.inf, -math.inf, -math.inf, None
    for step, metrics in run.reports:
        hit = first_present(metrics, ALIASES["ref_kl"])
        if step is None or step > run.healthy_until() or hit is None or not math.isfinite(hit[1]):
            continue
        key, value = hit
        early.push(step, value)
        trend.push(step, value)
        peak = max(peak, value)
        if step > 20:
            a = statistic("ratio_to_early", 10, 0.0, early, 20)
            b = statistic("ratio_to_median", 50, 0.0, trend, 0)
            to_early = max(to_early, a[0]) if a else to_early
            to_trend = max(to_trend, b[0]) if b else to_trend
    if key is None:
        return None
    return {"metric": key, "peak": peak, "to_early": to_early, "to_trend": to_trend}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stats", action="store_true", help="print the worst healthy value of each calibrated "
                        "statistic per group, and the thresholds the whole corpus calibrates")
    parser.add_argument("--markdown", action="store_true", help="print the tables as markdown")
    parser.add_argument("--kl", action="store_true", help="print each run's KL against an absolute, a start-relative "
                        "and a trend-relative reference, and the spread of each over the healthy runs")
    args = parser.parse_args(argv)
    runs = load_corpus()
    print(f"corpus: {len(runs)} runs, {len({r.group for r in runs})} groups "
          f"({sum(r.verdict == 'healthy' for r in runs)} healthy, {sum(r.verdict != 'healthy' for r in runs)} failing)")
    if args.kl:
        trends = {r.id: t for r in runs if (t := kl_trend(r)) is not None}
        for rid, t in trends.items():
            print(f"  {rid} ({t['metric']}): peak {t['peak']:.3f}, 10-step mean / first 20 steps at most "
                  f"{t['to_early']:.1f}x, value / median of its last 50 steps at most {t['to_trend']:.2f}x")
        for what in ("peak", "to_early", "to_trend"):
            values = [t[what] for t in trends.values()]
            print(f"  {what}: {min(values):.3g} .. {max(values):.3g} over {len(values)} runs with KL "
                  f"(max / min {max(values) / min(values):.1f})")
    if args.stats:
        base = load_ruleset("default")
        for group in sorted({r.group for r in runs}):
            worst = worst_healthy([r for r in runs if r.group == group], base)
            print(f"  {group}: " + ", ".join(f"{CALIBRATED[k]} {v:.3g}" for k, v in worst.items()))
        for preset, margin in MARGINS.items():
            worst = worst_healthy(runs, load_ruleset(preset))
            full = calibrated(load_ruleset(preset), worst, margin)
            bounds = {k: rule.conditions[k[1]] for k in worst for rule in full.rules if rule.name == k[0]}
            print(f"  {preset} (x{margin}) calibrated on all: "
                  + ", ".join(f"{k[0]}[{k[1]}] {'>' if c.above is not None else '<'} "
                              f"{c.above if c.above is not None else c.below:g}" for k, c in bounds.items()))
    header = "| preset | thresholds | false stops | healthy runs stopped | failures caught in their window | " \
             "steps after the window's start (median, max) |"
    rows = [header, "|---|---|---|---|---|---|"]
    per_run: dict[str, dict[str, str]] = {}
    for preset in PRESETS:
        for left_out in ((False, True) if preset in MARGINS else (False,)):
            results = evaluate(runs, preset, left_out)
            s = summarise(results)
            how = "left-out calibration" if left_out else "shipped"
            rows.append(
                f"| `{preset}` | {how} | {s['false']} of {s['judged']} [{s['false_ci'][0]:.2f}, {s['false_ci'][1]:.2f}]"
                f" | {s['healthy_stopped']} of {s['healthy']} | {s['caught']} of {s['failing']} "
                f"[{s['caught_ci'][0]:.2f}, {s['caught_ci'][1]:.2f}] | "
                + (f"{s['delay_median']:g}, {s['delay_max']}" if s["delay_median"] is not None else "-") + " |")
            for r in results:
                shown = f"{r['outcome']}" + (f" at {r['step']} ({r['rule']})" if r["step"] is not None else "")
                per_run.setdefault(r["run"].id, {})[f"{preset} {how}"] = shown
    print("\n".join(rows) if args.markdown else "\n".join(rows).replace("|", " ").strip())
    columns = list(next(iter(per_run.values())))
    print()
    print("| run | verdict | " + " | ".join(columns) + " |")
    print("|---|---|" + "---|" * len(columns))
    for run in runs:
        window = "" if run.verdict == "healthy" else f" {run.kind}, steps {run.not_before}-{run.by}"
        print(f"| `{run.id}` | {run.verdict}{window} | " + " | ".join(per_run[run.id][c] for c in columns) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
