"""Stopping on a run's fate: ``stopping: {fate: on}``. Stop a trial heading where the health rules stopped others.

A run that will reward-hack scores as well as a healthy one at its first validations; the health rules see it only
once its validation falls (steps 40-60 of 80 on the embedded task). Its reference KL and the gap between its training
(proxy) score and its gold score grow from the first steps, and on the same sweep seed they order runs by fate: the
runs that end healthy stay below the runs that end reward-hacked. So this rule compares paths, step by step, with
the trials whose fate the sweep already knows:

* a trial's *path* at step s is the mean of a signal over its last ``window`` steps: ``kl`` (the reference KL of the
  sweep's placement: ``actor/reward_kl_penalty`` or ``critic/kl`` for KL in the reward, ``actor/kl_loss`` for KL in
  the loss, per token under a token-sum ``loss_agg_mode``: :class:`klsweep.health.signals.TokenScale`) and
  ``proxy_gap`` (``critic/score/mean`` − ``embedded/gold_score/mean``, where the trainer logs both); a ``kl`` path
  is compared only with trials of the same KL estimator (``kl_loss_type``, ``kl_penalty``), whose values share a
  scale;
* a trial is stopped at step s when, on every signal it logs, its path is more than ``margin`` (a fraction) above
  the path of every trial that finished healthy and at or above the median path of the trials the health rules
  stopped, both at step s; while no trial has finished healthy, at or above that median. It needs a
  health-stopped trial that reached step s (and ``min_finished`` finished healthy ones, 0 by default), ``grace`` of
  the budget run and the trial's first validation (a stop is recorded with the trial's last objective value); a
  trial is never stopped at its last step (a finished trial is a result);
* leaders are never stopped: a trial whose last validation is at least the best finished healthy trial's at the
  same step, on any objective, runs on. So does a trial whose path stays within the margin of a finished healthy
  one: the finished trials bound the paths that end well.

With the seed trial a known failure (the presets reward-hack on the embedded task), this judges from the second or
third trial of a sweep. Calibrated on the tabular benchmark (``benchmarks/peers.py``, sweep seeds 0-19; figures on
held-out seeds in BENCHMARKS.md). :class:`FateRule` is the rule on plain numbers, :class:`FateStopper` its Ray Tune
stopper; a stop is recorded PRUNED with ``stop_kind`` ``objective``, as the other stoppers' are.
"""

from __future__ import annotations

import bisect
import functools
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from klsweep.health.signals import TokenScale, first_present
from klsweep.orchestrate.rule_stopper import RuleStopper, result_step
from klsweep.results import FATE_STOP_REASON, HEALTH, STOP_KIND, STOP_KIND_OBJECTIVE
from klsweep.spec.schema import FateStop
from klsweep.verl.metrics import KL_IN_LOSS_METRICS, KL_IN_REWARD_METRICS, PROXY_GAP

#: The verl keys of the KL estimator, in the loss and in the reward, and verl 0.9.1's defaults
#: (``trainer/config/_generated_ppo_trainer.yaml``): estimators put the same divergence on different scales.
_ESTIMATOR_KEYS = ("actor_rollout_ref.actor.kl_loss_type", "algorithm.kl_penalty")
_ESTIMATOR_DEFAULTS = {"actor_rollout_ref.actor.kl_loss_type": "low_var_kl", "algorithm.kl_penalty": "kl"}
PROXY, GOLD = PROXY_GAP
Reader = Callable[[Mapping[str, Any]], "tuple[str, float] | None"]


def signal_readers(names: Sequence[str], placement: str) -> dict[str, Reader]:
    """Each signal name's reader of one report: (what it read, value) or None when not logged.

    ``kl`` reads the reference KL of ``placement`` (``reward``, ``loss``, ``both``: the loss's first); with
    ``none`` the sweep has no reference KL and ``kl`` is left out.
    """
    keys = {"reward": KL_IN_REWARD_METRICS, "loss": KL_IN_LOSS_METRICS,
            "both": (*KL_IN_LOSS_METRICS, *KL_IN_REWARD_METRICS)}.get(placement)
    readers: dict[str, Reader] = {}
    for name in names:
        if name == "kl" and keys:
            readers[name] = functools.partial(first_present, keys=keys)
        elif name == "proxy_gap":
            readers[name] = _proxy_gap
    return readers


def _proxy_gap(metrics: Mapping[str, Any]) -> tuple[str, float] | None:
    proxy, gold = first_present(metrics, (PROXY,)), first_present(metrics, (GOLD,))
    return None if proxy is None or gold is None else (f"{PROXY} − {GOLD}", proxy[1] - gold[1])


class FateRule:
    """Decides at each step whether a trial's paths are past every finished healthy trial's and at a failed one's.

    Args:
        objectives: ``(metric, mode)`` pairs, mode ``max`` or ``min`` (for the leaders' guard).
        total_steps: a trial's step budget; a trial that reaches it is finished.
        readers: signal name → reader of a report (:func:`signal_readers`).
        settings: the sweep file's ``stopping.fate`` (:class:`~klsweep.spec.schema.FateStop`); default: its defaults.

    Raises:
        ValueError: no objective, a mode other than max/min, or no signal reader.
    """

    def __init__(self, objectives: Sequence[tuple[str, str]], total_steps: int, readers: Mapping[str, Reader],
                 settings: FateStop | None = None):
        if not objectives or any(mode not in ("max", "min") for _, mode in objectives):
            raise ValueError(f"objectives must be (metric, max|min) pairs, got {list(objectives)!r}")
        if not readers:
            raise ValueError("FateRule needs at least one signal: this sweep logs none of them (kl needs a KL "
                             "placement, proxy_gap a trainer that logs a gold score); turn stopping.fate off")
        self.objectives = [(metric, 1.0 if mode == "max" else -1.0) for metric, mode in objectives]
        self.total_steps = total_steps
        self.readers = dict(readers)
        self.settings = settings or FateStop()
        self.steps: dict[str, list[float]] = {}  # trial → its steps, ascending
        self.paths: dict[str, list[dict[str, float]]] = {}  # trial → per step of self.steps: signal → value
        self.scores: dict[str, dict[float, list[float]]] = {}  # trial → validation step → signed objectives
        self.keys: dict[str, str] = {}  # signal → the metric it read, for the stop reason
        self.estimators: dict[str, str] = {}  # trial → its KL estimator ("" when one for all), for the kl signal
        self.finished: list[str] = []
        self.failed: list[str] = []

    def record(self, trial_id: str, step: float, values: Mapping[str, Any], estimator: str = "") -> None:
        """Keep the trial's signals and objectives at ``step``; a step before its last (a restart) drops the later.
        ``estimator`` names the trial's KL estimator: its ``kl`` path is compared with those of the same one."""
        self.estimators[trial_id] = estimator
        steps, path = self.steps.setdefault(trial_id, []), self.paths.setdefault(trial_id, [])
        scores = self.scores.setdefault(trial_id, {})  # insertion order is step order: the last is the latest
        while steps and steps[-1] >= step:
            steps.pop()
            path.pop()
        while scores and next(reversed(scores)) > step:
            scores.popitem()
        steps.append(step)
        path.append({})
        for name, read in self.readers.items():
            hit = read(values)
            if hit is not None and math.isfinite(hit[1]):
                self.keys[name], path[-1][name] = hit
        signed = [values.get(metric) for metric, _ in self.objectives]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in signed):
            scores[step] = [sign * float(v) for (_, sign), v in zip(self.objectives, signed)]  # type: ignore[arg-type]

    def finish(self, trial_id: str) -> None:
        """The trial ran its budget and ended healthy: its paths bound the paths that end well."""
        if trial_id in self.paths and trial_id not in self.finished:
            self.finished.append(trial_id)

    def fail(self, trial_id: str) -> None:
        """The health rules stopped the trial: its paths up to its stop show where a failing run goes."""
        if trial_id in self.paths and trial_id not in self.failed:
            self.failed.append(trial_id)

    def forget(self, trial_id: str) -> None:
        """The trial ended otherwise (another stopper, an error): it is no evidence either way."""
        if trial_id not in self.finished and trial_id not in self.failed:
            self.steps.pop(trial_id, None)
            self.paths.pop(trial_id, None)
            self.scores.pop(trial_id, None)

    def _path(self, trial_id: str, signal: str, step: float) -> float | None:
        """The mean of the trial's ``signal`` over its steps in (step − window, step], if it reached ``step``."""
        steps = self.steps.get(trial_id)
        if not steps or steps[-1] < step:
            return None
        end = bisect.bisect_right(steps, step)
        start = bisect.bisect_right(steps, step - self.settings.window, hi=end)
        values = [v[signal] for v in self.paths[trial_id][start:end] if signal in v]
        return statistics.fmean(values) if values else None

    def update(self, trial_id: str, step: float, values: Mapping[str, Any], estimator: str = "") -> str | None:
        """Record the trial's report at ``step`` (:meth:`record`); the stop reason, or None."""
        self.record(trial_id, step, values, estimator)
        s = self.settings
        if step < s.grace * self.total_steps or step >= self.total_steps or not self.scores.get(trial_id):
            return None  # judged from its first validation on: the searcher records a stop with its last value
        if len([t for t in self.finished if self.steps[t][-1] >= step]) < s.min_finished or self._leads(trial_id):
            return None
        parts = []
        for name in self.readers:
            mine = self._path(trial_id, name, step)
            if mine is None:
                continue
            any_estimator = name != "kl"  # the kl path is compared only between trials of one estimator
            healthy = [v for t in self.finished if (any_estimator or self.estimators.get(t) == estimator)
                       and (v := self._path(t, name, step)) is not None]
            failed = {t: v for t in self.failed if (any_estimator or self.estimators.get(t) == estimator)
                      and (v := self._path(t, name, step)) is not None}
            if not failed or (s.min_finished and not healthy):
                return None
            low = statistics.median(failed.values())
            top = max(healthy, default=-math.inf)  # before any trial finished, the failed median alone bounds it
            if (healthy and mine <= top + s.margin * abs(top)) or mine < low:
                return None
            bound = (f"the {top:.4g} of the {len(healthy)} trials that finished healthy and at or above the median "
                     f"{low:.4g}" if healthy else f"the median {low:.4g}")
            past = f"is more than {s.margin:.0%} above {bound}" if healthy else f"is at or above {bound}"
            among = f" ({estimator})" if name == "kl" and estimator else ""
            parts.append(f"{self.keys[name]} {mine:.4g} {past} of the {len(failed)} trials{among} the health rules "
                         "stopped")
        if not parts:
            return None
        return (f"{FATE_STOP_REASON}{step:g} (mean of the last {s.window} steps): {'; '.join(parts)}: it is heading "
                "where the stopped trials went")

    def _leads(self, trial_id: str) -> bool:
        """Whether the trial's last validation is at least the best finished healthy one's at that step, on some
        objective."""
        scores = self.scores.get(trial_id)
        if not scores:
            return False
        step = next(reversed(scores))
        peers = [self.scores[t][step] for t in self.finished if step in self.scores.get(t, {})]
        if not peers:
            return self.settings.min_finished > 0  # no finished trial validated at that step: nothing shows it behind
        return any(mine >= max(p[i] for p in peers) for i, mine in enumerate(scores[step]))


class FateStopper(RuleStopper):
    """Ray Tune stopper of :class:`FateRule`; hears of the trials the health rules stop through :meth:`stopped`
    (:class:`~klsweep.orchestrate.rule_stopper.StopperChain`).

    Args:
        objectives: ``(metric, mode)`` pairs of the sweep.
        total_steps: the sweep's ``budget.max_steps``.
        placement: the sweep's KL placement (``Sweep.placement``).
        settings: the sweep file's ``stopping.fate``.
        run_config_of: maps a trial's Tune config to its flat verl overrides, for its KL estimator and
            ``loss_agg_mode``; None: every trial's KL is on one scale.
    """

    def __init__(self, objectives: Sequence[tuple[str, str]], total_steps: int, placement: str,
                 settings: FateStop | None = None, run_config_of: Callable[[dict], Mapping[str, Any]] | None = None):
        settings = settings or FateStop()
        self.rule = FateRule(objectives, total_steps, signal_readers(settings.signals, placement), settings)
        self.placement = placement
        self.run_config_of = run_config_of
        self._scales: dict[str, tuple[TokenScale, str]] = {}  # trial → its token scale and KL estimator

    def _on_scale(self, trial_id: str, result: dict) -> tuple[dict, str]:
        """The result with its KL in the loss per token, and the trial's KL estimator."""
        if self.run_config_of is None:
            return result, ""
        if trial_id not in self._scales:
            config = self.run_config_of(result.get("config") or {})
            keys = {"loss": _ESTIMATOR_KEYS[:1], "reward": _ESTIMATOR_KEYS[1:]}.get(self.placement, _ESTIMATOR_KEYS)
            estimator = ", ".join(f"{k.rsplit('.', 1)[1]}={config.get(k, _ESTIMATOR_DEFAULTS[k])}" for k in keys)
            self._scales[trial_id] = TokenScale(config), estimator
        scale, estimator = self._scales[trial_id]
        values = dict(result)
        for key in KL_IN_LOSS_METRICS:
            if isinstance(values.get(key), (int, float)):
                per_token = scale.per_token(key, float(values[key]), result)
                if per_token is None:
                    del values[key]
                else:
                    values[key] = per_token
        return values, estimator

    def judge(self, trial_id: str, step: float, result: dict) -> str | None:
        """Record the result; the stop reason or None. A result at the budget finishes the trial healthy."""
        values, estimator = self._on_scale(trial_id, result)
        reason = self.rule.update(trial_id, step, values, estimator)
        if step >= self.rule.total_steps:
            self.rule.finish(trial_id)
        return reason

    def stopped(self, trial_id: str, result: dict) -> None:
        """Another stopper stopped the trial on ``result``: a health stop makes it a known failure."""
        if result.get(HEALTH) == "stopped" and result.get(STOP_KIND) != STOP_KIND_OBJECTIVE:
            step = result_step(result)
            if step is not None:
                self.rule.record(trial_id, step, *self._on_scale(trial_id, result))
            self.rule.fail(trial_id)
        else:
            self.rule.forget(trial_id)
