"""What a rule's ``metric`` means in one report: a number, an alias resolved per verl version, or a derived quantity.

Derived quantities (beyond :data:`klsweep.verl.metrics.ALIASES`):

- ``ref_kl``: the reference KL of the mechanism the run has on (``actor/kl_loss`` for KL in the loss,
  ``actor/reward_kl_penalty`` / old ``critic/kl`` for KL in the reward); with no run config, the first logged.
- ``kl_coef``: the logged coefficient (``actor/kl_coef``, ``actor/reward_kl_penalty_coeff``, ``critic/kl_coeff``), else
  the configured one of the active mechanism.
- ``kl_loss_share``: the KL term's share of the actor loss, ``Σ|kl_coef·kl_loss| / Σ|pg_loss − entropy_coeff·entropy +
  kl_coef·kl_loss|`` over the last :data:`SHARE_WINDOW` reports (the actor loss of verl's
  ``workers/utils/losses.py::ppo_loss``). Summed over a window because GRPO's ``pg_loss`` averages ~0, which makes a
  one-step ratio jump to 100 %. Only for KL in the loss; needs ``entropy_coeff`` (run config) when entropy is logged.
- ``val_score``: the first ``val-core/*/mean@N``, ``val/test_score/*`` or ``test_score/*`` key.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from numbers import Real
from typing import Any

from klsweep.verl.metrics import (
    ALIASES,
    KL_IN_LOSS_COEF_METRICS,
    KL_IN_LOSS_METRICS,
    KL_IN_REWARD_COEF_METRICS,
    KL_IN_REWARD_METRICS,
    VAL_SCORE,
    VAL_SCORE_PATTERNS,
    KlSetup,
)

SHARE_WINDOW = 10
DERIVED = ("ref_kl", "kl_coef", "kl_loss_share", VAL_SCORE)
_VAL_PREFIXES = ("val-core/", "val/test_score/", "test_score/")


def number(value: Any) -> float | None:
    """A report value as a float (NaN and ±inf kept); None for absent, bool, str, None or anything non-numeric."""
    if type(value) is float or isinstance(value, float):
        return value
    if isinstance(value, bool) or not isinstance(value, Real):
        return None
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return None


def first_present(metrics: Mapping[str, Any], keys: Iterable[str]) -> tuple[str, float] | None:
    """The first of ``keys`` logged in ``metrics`` with a numeric value, as (key, value)."""
    for key in keys:
        value = metrics.get(key)
        if value is None:
            continue
        if type(value) is float:  # the common case, kept fast: the engine reads ~20 signals per report
            return key, value
        value = number(value)
        if value is not None:
            return key, value
    return None


class Signals:
    """Reads the named signals from each report of one run (stateful only for ``kl_loss_share``'s window).

    Args:
        setup: the run's KL settings (unknown for log backtests).
        names: the signal names the rule set uses.
    """

    def __init__(self, setup: KlSetup, names: Iterable[str]):
        self.setup = setup
        self.names = tuple(dict.fromkeys(names))
        self._share_terms: deque[tuple[float, float]] = deque(maxlen=SHARE_WINDOW)
        self.keys_seen: dict[str, str] = {}  # signal -> the verl key it was last read from
        self._val_keys: tuple[Any, list[str]] = (None, [])  # (a report's key set, its validation keys, sorted)
        special = {"kl_coef": self._kl_coef, "kl_loss_share": self._kl_loss_share, VAL_SCORE: self._val_score}
        self._readers = [
            (name, self.ref_kl_keys() if name == "ref_kl" else ALIASES.get(name, (name,)), special.get(name))
            for name in self.names
        ]

    def read(self, metrics: Mapping[str, Any]) -> dict[str, tuple[str, float] | None]:
        """``{signal: (verl key, value) or None}`` for this report; values may be NaN/inf."""
        out: dict[str, tuple[str, float] | None] = {}
        for name, keys, special in self._readers:
            hit = first_present(metrics, keys) if special is None else special(metrics)
            out[name] = hit
            if hit is not None:
                self.keys_seen[name] = hit[0]
        return out

    def ref_kl_keys(self) -> tuple[str, ...]:
        """Metric names that hold the reference KL for this run, in preference order (empty: KL off by config)."""
        s = self.setup
        if not s.known:
            return ALIASES["ref_kl"]
        keys: tuple[str, ...] = ()
        if s.kl_in_loss:
            keys += KL_IN_LOSS_METRICS
        if s.kl_in_reward:
            keys += KL_IN_REWARD_METRICS
        return keys

    def _kl_coef(self, metrics: Mapping[str, Any]) -> tuple[str, float] | None:
        s = self.setup
        if not s.known:
            return first_present(metrics, ALIASES["kl_coef"])
        if s.kl_in_loss:
            return first_present(metrics, KL_IN_LOSS_COEF_METRICS) or _config("kl_loss_coef", s.kl_loss_coef)
        if s.kl_in_reward:
            return first_present(metrics, KL_IN_REWARD_COEF_METRICS) or _config("kl_ctrl.kl_coef", s.reward_kl_coef)
        return None

    def _kl_loss_share(self, metrics: Mapping[str, Any]) -> tuple[str, float] | None:
        s = self.setup
        if not s.known or not s.kl_in_loss:
            return None
        kl = first_present(metrics, KL_IN_LOSS_METRICS)
        pg = first_present(metrics, ("actor/pg_loss",))
        coef = first_present(metrics, KL_IN_LOSS_COEF_METRICS) or _config("kl_loss_coef", s.kl_loss_coef)
        if kl is None or pg is None or coef is None:
            return None
        entropy_term = 0.0
        if s.entropy_coeff:
            entropy = first_present(metrics, ALIASES["entropy"])
            if entropy is None:
                return None
            entropy_term = s.entropy_coeff * entropy[1]
        kl_term = coef[1] * kl[1]
        total = pg[1] - entropy_term + kl_term
        if not (math.isfinite(kl_term) and math.isfinite(total)):
            return None
        self._share_terms.append((abs(kl_term), abs(total)))
        denominator = sum(t for _, t in self._share_terms)
        if denominator == 0.0:
            return None
        return "kl_loss_share", sum(k for k, _ in self._share_terms) / denominator

    def _val_score(self, metrics: Mapping[str, Any]) -> tuple[str, float] | None:
        keys = metrics.keys()
        last_keys, hits = self._val_keys
        if last_keys is None or keys != last_keys:  # reports of one run mostly share a key set: scan it once
            candidates = [k for k in keys if k.startswith(_VAL_PREFIXES)]
            hits = []
            for pattern in VAL_SCORE_PATTERNS:
                hits = sorted(k for k in candidates if pattern.match(k))
                if hits:
                    break
            self._val_keys = (set(keys), hits)
        return first_present(metrics, hits)

    def why_absent(self, name: str) -> str:
        """Why a signal was never read in this run, for the "not applicable" list."""
        s = self.setup
        if name == "ref_kl" and s.kl_off:
            return "KL is off by config (use_kl_loss and use_kl_in_reward are both false)"
        if name == "kl_loss_share":
            if not s.known:
                return "needs the run config (kl_loss_coef, entropy_coeff); a log alone does not give them"
            if not s.kl_in_loss:
                return "KL is not in the loss (actor_rollout_ref.actor.use_kl_loss is false)"
            return "actor/kl_loss or actor/pg_loss never logged"
        if name == "kl_coef" and s.kl_off:
            return "KL is off by config"
        looked = {
            "ref_kl": self.ref_kl_keys(),
            "kl_coef": ALIASES["kl_coef"],
            VAL_SCORE: ("val-core/*/mean@N", "val/test_score/*", "test_score/*"),
        }.get(name, ALIASES.get(name, (name,)))
        return f"never logged (looked for {', '.join(looked)})"


def _config(key: str, value: float | None) -> tuple[str, float] | None:
    return None if value is None else (f"config:{key}", value)
