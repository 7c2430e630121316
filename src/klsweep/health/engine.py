"""The health engine: one per trial, fed one report at a time, O(window) work per report.

    engine = HealthEngine(load_ruleset("default"), trial_overrides)
    for step, metrics in stream:
        verdict = engine.update(step, metrics)
        if verdict.stop:
            break
    engine.summary()   # {"verdict": "stopped", "stop_reason": "no_signal at step 7 by builtin.no_signal: ...", ...}

Anything in a report that is not a number (None, strings, missing keys) is ignored; NaN/inf reach only the
non-finite checks. A rule whose metrics never appear is listed under ``not_applicable`` with the reason.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from klsweep.health.builtin import builtin_checks
from klsweep.health.coef import KlCoefJump
from klsweep.health.rules import Rule, RuleSet
from klsweep.health.series import Series, statistic
from klsweep.health.signals import Signals, TokenScale
from klsweep.health.streak import Streak, steps_text
from klsweep.health.validation import combine, validation_sets
from klsweep.health.verdict import Event, StopReason, Verdict
from klsweep.verl.metrics import VAL_SCORE, KlSetup

_BEST_SIGNALS = (VAL_SCORE, "score")
SCALED = ("actor/kl_loss", "actor/entropy")  # the token sums the summary explains
_UNSET = object()


@dataclass
class _RuleState:
    """A rule, prepared once per engine, and the steps its conditions have held for."""

    rule: Rule
    describe: str
    conditions: tuple[tuple[Any, tuple[str, str, int | None, float, int]], ...]  # (condition, statistic cache key)
    streak: Streak
    judged: bool = False

    @classmethod
    def of(cls, rule: Rule) -> _RuleState:
        conditions = tuple(
            (c, (c.metric, c.stat, getattr(c, "window", None), getattr(c, "peak_above", 0.0), getattr(c, "early", 0)))
            for c in rule.conditions
        )
        return cls(rule, rule.describe(), conditions, Streak(rule.after))


class HealthEngine:
    """Judges one run's metric stream against a rule set, report by report.

    Args:
        ruleset: from :func:`~klsweep.health.load_ruleset`.
        run_config: the trial's flat verl override dict (``{"actor_rollout_ref.actor.use_kl_loss": True, ...}``);
            missing keys mean verl 0.9.1's defaults. None or {} for a log backtest. The KL mechanism is then inferred
            from which metrics are logged. Rules that need the config are reported not applicable.
        rounded: the values were printed rounded (verl's console logger: 3 decimals); "exactly 0" checks are off.
    """

    def __init__(self, ruleset: RuleSet, run_config: Mapping[str, Any] | None = None, *, rounded: bool = False):
        self.ruleset = ruleset
        self.setup = KlSetup.from_overrides(run_config)
        names = [m for rule in ruleset.rules for m in rule.metrics]
        self.scale = TokenScale(run_config)
        self._signals = Signals(self.setup, [*names, "ref_kl", "kl_coef", "entropy", *_BEST_SIGNALS], self.scale)
        self._series: dict[str, Series] = {}
        for name in self._signals.names:
            self._series[name] = Series(_window_need(ruleset.rules, name), _early_need(ruleset.rules, name))
        self._builtins = builtin_checks(ruleset.builtin, self._signals, rounded)
        self._coef_jump = KlCoefJump(run_config, rounded)
        self._states = [_RuleState.of(rule) for rule in ruleset.rules]
        self._validation = ruleset.validation
        self._val_need = (_window_need(ruleset.rules, VAL_SCORE), _early_need(ruleset.rules, VAL_SCORE))
        self._val_keys: dict[str, None] = {}  # every validation key seen, in order
        self._set_states: dict[str, dict[str, _RuleState]] = {}  # rule name -> validation key -> its state
        self._fired: dict[str, dict[str, Any]] = {}  # rule or check -> action, kind, count, first/last step
        self._reason: StopReason | None = None
        self._warned = False
        self._reports = 0
        self._first_step: int | None = None
        self._last_step: int | None = None
        self._best: dict[str, tuple[int, float, str]] = {}  # signal -> (step, value, verl key), before the stop

    # ------------------------------------------------------------------ feeding
    def update(self, step: int | None, metrics: Mapping[str, Any]) -> Verdict:
        """Judge one report.

        Args:
            step: the training step (verl counts from 1); None or a non-integer uses the report's position.
            metrics: verl metric names → values; anything non-numeric is ignored.

        Returns:
            the :class:`Verdict` for the run so far (``stop`` stays True once set).
        """
        self._reports += 1
        step = _as_step(step, self._reports)
        if self._first_step is None:
            self._first_step = step
        self._last_step = step
        if type(metrics) is not dict and not isinstance(metrics, Mapping):
            metrics = {}
        values = self._signals.read(metrics, step)
        for key, value in validation_sets(metrics, self._validation).items():
            if key not in self._val_keys:
                self._val_keys[key] = None
                self._series[key] = Series(*self._val_need)
            values[key] = (key, value)
        for name, series in self._series.items():
            hit = values.get(name)
            series.fresh = False
            if hit is not None and math.isfinite(hit[1]):
                series.push(step, hit[1])

        events: list[Event] = []
        for check in self._builtins:
            event = check.check(step, metrics, values)
            if event is not None:
                events.append(event)
        jump = self._coef_jump.check(step, metrics, values)
        if jump is not None:
            events.append(jump)
        stats: dict[tuple[str, str, int | None, float, int], tuple[float, int] | None] = {}
        for state in self._states:
            if step > state.rule.after:
                if (self._val_keys or self._validation) and VAL_SCORE in state.rule.metrics:
                    event = self._judge_sets(state, step, values, stats)
                else:
                    event = self._judge(state, step, values, stats)
                if event is not None:
                    events.append(event)
            else:
                state.streak.reset(step)  # the warm-up: a streak starts after it

        for event in events:
            self._record(event)
            if event.action == "warn":
                self._warned = True
            elif event.action == "stop" and self._reason is None:
                e = event
                self._reason = StopReason(e.rule, e.kind, e.step, e.values, e.advice, e.message)
        if self._reason is None:
            self._track_best(step, values)
        return Verdict(step, self._reason is not None, self._reason, tuple(events), self.health)

    def _judge(self, state: _RuleState, step: int, values, stats) -> Event | None:
        rule = state.rule
        need_all = rule.match == "all"
        judged = true = uncovered = 0
        for condition, cache_key in state.conditions:
            series = self._series.get(condition.metric)
            if series is None:
                return None
            if not series.fresh:  # absent from this report: neither counts towards `for` nor resets it
                if need_all:
                    return None
                continue
            stat = stats.get(cache_key, _UNSET)
            if stat is _UNSET:
                stat = stats[cache_key] = statistic(*cache_key[1:4], series, early=cache_key[4])
            if stat is None:  # a window whose steps are not covered yet
                uncovered += 1
                if need_all:
                    break
                continue
            judged += 1
            true += condition.holds(stat[0])
        if uncovered and need_all or not judged:
            if uncovered:
                state.streak.reset(step)
            return None
        state.judged = True
        if state.streak.update(step, true == judged if need_all else true > 0) < rule.for_:
            return None
        seen: dict[str, float] = {}
        first = state.streak.start if rule.for_ > 1 and state.streak.start is not None else step
        for condition, cache_key in state.conditions:
            stat = stats.get(cache_key)
            if stat is not None and self._series[condition.metric].fresh:
                key = values[condition.metric][0]
                seen[condition.label().replace(condition.metric, key)] = stat[0]
                first = min(first, stat[1])
        bounds = f" {'and' if rule.match == 'all' else 'or'} ".join(f"{label} = {seen[label]:.4g}" for label in seen)
        return Event(
            rule=rule.name,
            kind=rule.kind,
            step=step,
            values=seen,
            advice=rule.advice_without_kl if self.setup.kl_off and rule.advice_without_kl else rule.advice,
            message=f"{bounds} over {steps_text(first, step)} ({state.describe})",
            action=rule.action,
        )

    def _judge_sets(self, state: _RuleState, step: int, values, stats) -> Event | None:
        """A rule on ``val_score``, judged on each validation set (:mod:`klsweep.health.validation`)."""
        states = self._set_states.setdefault(state.rule.name, {})
        fired: dict[str, Event] = {}
        for key in self._val_keys:
            sub = states.get(key)
            if sub is None:
                conditions = tuple(c.model_copy(update={"metric": key}) if c.metric == VAL_SCORE else c
                                   for c in state.rule.conditions)
                sub = states[key] = _RuleState.of(state.rule.model_copy(update={"conditions": conditions}))
                sub.describe = state.describe  # the rule as written (val_score); the values name the key
            event = self._judge(sub, step, values, stats)
            state.judged = state.judged or sub.judged
            if event is not None:
                fired[key] = event
        reporting = [k for k in self._val_keys if self._series[k].fresh]
        others = {k: (self._series[k].values[-1], self._series[k].run_max) for k in reporting if k not in fired}
        return combine(state.rule.action, fired, reporting, others)

    def _record(self, event: Event) -> None:
        fired = self._fired.get(event.rule)
        if fired is None:
            self._fired[event.rule] = {
                "action": event.action,
                "kind": event.kind,
                "count": 1,
                "first_step": event.step,
                "last_step": event.step,
            }
            return
        fired["count"] += 1
        fired["last_step"] = event.step
        if event.action == "stop":
            fired["action"] = "stop"  # a warn that escalated (builtin.nonfinite_grad_norm)

    def _track_best(self, step: int, values) -> None:
        for name in _BEST_SIGNALS:
            hit = values.get(name)
            if hit is not None and math.isfinite(hit[1]):
                best = self._best.get(name)
                if best is None or hit[1] > best[1]:
                    self._best[name] = (step, hit[1], hit[0])

    # ------------------------------------------------------------------ reading
    @property
    def health(self) -> str:
        """healthy | warned | stopped for the run so far."""
        return "stopped" if self._reason is not None else "warned" if self._warned else "healthy"

    @property
    def reason(self) -> StopReason | None:
        """The run's first stop finding, or None."""
        return self._reason

    def not_applicable(self) -> dict[str, str]:
        """Rules and built-in checks that never judged a report, with the reason."""
        out: dict[str, str] = {}
        for check in self._builtins:
            if not check.judged and check.name not in self._fired:
                out[check.name] = check.why_not_applicable()
        for state in self._states:
            if not state.judged:
                out[state.rule.name] = self._why_not_judged(state.rule)
        return out

    def _why_not_judged(self, rule: Rule) -> str:
        if self._validation and VAL_SCORE in rule.metrics and not self._val_keys:
            return (f"health.validation is {self._validation!r}, and the log never reported that key: name one of "
                    "the run's val-core/<data_source>/.../mean@N keys")
        for condition in rule.conditions:
            series = self._series[condition.metric]
            if series.count == 0:
                return f"{condition.metric}: {self._signals.why_absent(condition.metric)}"
        for condition in rule.conditions:
            need = getattr(condition, "window", None) or 1
            series = self._series[condition.metric]
            covered = series.steps[-1] - series.first_step + 1 if series.steps else 0
            if covered < need:
                nonfinite = self._signals.nonfinite_text(condition.metric)
                return (
                    f"{condition.label()} needs {need} steps covered (at least two reports), the run covered "
                    f"{covered}{' with finite values' if nonfinite else ''} (steps {series.first_step}-"
                    f"{series.steps[-1]}, {series.count} reports)"
                    + (f"; {nonfinite}: see builtin.nonfinite_metric" if nonfinite else "")
                )
            floor = getattr(condition, "peak_above", 0.0)
            if floor and self._series[condition.metric].run_max <= floor:
                best = self._series[condition.metric].run_max
                return f"{condition.label()} waits for a maximum above {floor:g}; the run's best was {best:.4g}"
        if self._last_step is not None and self._last_step <= rule.after:
            return f"no report after the warm-up (after: {rule.after})"
        nonfinite = "; ".join(text for m in rule.metrics if (text := self._signals.nonfinite_text(m)))
        if nonfinite:
            return f"{', '.join(rule.metrics)} were never finite in the same report ({nonfinite})"
        return f"{', '.join(rule.metrics)} were never logged in the same report"

    def summary(self) -> dict[str, Any]:
        """The run's verdict, JSON-ready.

        Keys: ``verdict`` (healthy|warned|stopped), ``stop_reason`` (text, "" when none), ``stop_kind``,
        ``stop_step``, ``reason`` (structured, or None), ``collapsed_at`` (step or None), ``best`` (the best
        pre-stop ``val_score`` report, else the best ``critic/score/mean``: ``{"metric", "step", "value"}`` or None),
        ``reports``, ``first_step``, ``last_step``, ``fired`` (per rule: action, kind, count, first_step, last_step),
        ``not_applicable`` (rule → reason), ``judges`` (every built-in check and rule → its action: a built-in check
        stops, but ``builtin.nonfinite_metric`` only warns; what could judge the log is ``judges`` less
        ``not_applicable``), ``scale`` (how token sums were put per token: ``{metric: text}``, empty when the run's
        ``loss_agg_mode`` logs per-token values).
        """
        reason = self._reason
        best_signal = next((n for n in _BEST_SIGNALS if n in self._best), None)
        best = None
        if best_signal is not None:
            step, value, key = self._best[best_signal]
            best = {"metric": key, "step": step, "value": value}
        stop_reason = reason.text() if reason else ""
        collapsed_at = reason.step if reason is not None and reason.kind == "collapsed" else None
        if collapsed_at is not None and best is not None:
            stop_reason += f"; best pre-collapse step {best['step']} ({best['metric']} = {best['value']:g})"
        return {
            "verdict": self.health,
            "stop_reason": stop_reason,
            "stop_kind": reason.kind if reason else None,
            "stop_step": reason.step if reason else None,
            "reason": reason.as_dict() if reason else None,
            "collapsed_at": collapsed_at,
            "best": best,
            "reports": self._reports,
            "first_step": self._first_step,
            "last_step": self._last_step,
            "fired": {name: dict(record) for name, record in self._fired.items()},
            "not_applicable": self.not_applicable(),
            "judges": {**{c.name: c.action for c in self._builtins}, **{r.name: r.action for r in self.ruleset.rules}},
            "scale": {k: self.scale.describe(k) for k in SCALED} if self.scale.summed else {},
            "validation": self.validation(),
        }

    def validation(self) -> dict[str, dict[str, float]]:
        """The validation sets the rules on ``val_score`` judged: ``{key: {"first", "best", "last"}}`` (values over
        the reports read), in the order they first appeared."""
        out = {}
        for key in self._val_keys:
            series = self._series[key]
            if series.count and series.first is not None:
                out[key] = {"first": series.first, "best": series.run_max, "last": series.values[-1]}
        return out


def _window_need(rules, name: str) -> int:
    """The longest window (steps) of any condition on signal ``name``: what its series must cover."""
    need = 1
    for rule in rules:
        for c in rule.conditions:
            if c.metric == name and getattr(c, "window", None):
                need = max(need, c.window)
    return need


def _early_need(rules, name: str) -> int:
    """The longest ``early`` (steps) of any ``ratio_to_early`` condition on signal ``name``: the run's first steps
    its series keeps."""
    return max((c.early for r in rules for c in r.conditions if c.metric == name and c.stat == "ratio_to_early"),
               default=0)


def _as_step(step: Any, position: int) -> int:
    if isinstance(step, bool):
        return position
    if isinstance(step, int):
        return step
    if isinstance(step, float) and step.is_integer():
        return int(step)
    return position
