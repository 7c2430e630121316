"""What a rule's ``metric`` means in one report: a number, an alias resolved per verl version, or a derived quantity.

Derived quantities (beyond :data:`klsweep.verl.metrics.ALIASES`):

- ``ref_kl``: the reference KL of the mechanism the run has on (``actor/kl_loss`` for KL in the loss,
  ``actor/reward_kl_penalty`` / old ``critic/kl`` for KL in the reward); with no run config, the first logged.
- ``kl_coef``: the logged coefficient (``actor/kl_coef``, ``actor/reward_kl_penalty_coeff``, ``critic/kl_coeff``), else
  the configured one of the active mechanism.
- ``kl_loss_share``: the KL term's share of the actor loss, ``Σ|kl_coef·kl_loss| / Σ|pg_loss − entropy_coeff·entropy +
  kl_coef·kl_loss|`` over the last :data:`SHARE_WINDOW` steps (the actor loss of verl's
  ``workers/utils/losses.py::ppo_loss``). Summed over a window because GRPO's ``pg_loss`` averages ~0, which makes a
  one-step ratio jump to 100 %. Only for KL in the loss; needs ``entropy_coeff`` (run config) when entropy is logged.
- ``val_score``: the first ``val-core/*/mean@N``, ``val/test_score/*`` or ``test_score/*`` key.

Per token: verl aggregates ``actor/kl_loss``, ``actor/entropy`` (and ``actor/pg_loss``) with the run's
``actor_rollout_ref.actor.loss_agg_mode`` (``core_algos.agg_loss``). Under ``token-sum``, ``seq-mean-token-sum`` and
``seq-mean-token-sum-norm`` they are sums over tokens, not per-token means. Every threshold (k3's clamp at 10,
``kl_blowup``'s 1.0, ``entropy_collapse``'s 0.02) would then judge a number hundreds of times too large or too small.
:class:`TokenScale` divides them by the tokens they sum over; the thresholds stay per token, as calibrated. The
signal's key then reads ``"actor/kl_loss per token"``. It needs ``response_length/mean`` in the same report. Without
it, the signal is not read, and the rule is not applicable, with that reason. A log without its run config is
read as per-token (``token-mean``, verl's default).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from numbers import Real
from typing import Any

from klsweep.health.streak import steps_text
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
#: verl's mean valid response tokens of the step's batch (``compute_data_metrics``): the length :class:`TokenScale`
#: divides by.
RESPONSE_LENGTH = "response_length/mean"
#: Metrics verl aggregates with ``loss_agg_mode``, and the batch each sums over under ``token-sum``: the PPO
#: mini-batch for the loss terms (``workers/utils/losses.py::ppo_loss``, a SUM over micro-batches, averaged over
#: mini-batches), the whole step batch for ``actor/entropy`` (``trainer/ppo/v1/trainer_base.py``).
SUMMED_METRICS = {
    "actor/kl_loss": "mini-batch",
    "actor/pg_loss": "mini-batch",
    "actor/entropy_loss": "mini-batch",
    "actor/entropy": "batch",
}
#: verl 0.9.1 defaults of the keys that size the sums (``trainer/config/_generated_ppo_trainer.yaml``).
_SIZE_DEFAULTS = {
    "actor_rollout_ref.actor.loss_agg_mode": "token-mean",
    "data.train_batch_size": 1024,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 256,
    "actor_rollout_ref.rollout.n": 1,
    "data.max_response_length": 512,
    "actor_rollout_ref.actor.loss_scale_factor": None,
}
DERIVED = ("ref_kl", "kl_coef", "kl_loss_share", VAL_SCORE)
_VAL_PREFIXES = ("val-core/", "val/test_score/", "test_score/")


#: Non-finite values as strings: JSON has no NaN, so some writers spell it ``"nan"`` (Python's ``str(float)``,
#: pandas' ``to_json`` of object columns) or ``"NaN"``/``"Infinity"`` (JavaScript's spelling).
NONFINITE_STRINGS = {"nan": math.nan, "+nan": math.nan, "-nan": math.nan, "inf": math.inf, "+inf": math.inf,
                     "-inf": -math.inf, "infinity": math.inf, "+infinity": math.inf, "-infinity": -math.inf}


def number(value: Any) -> float | None:
    """A report value as a float (NaN and ±inf kept, also when written as a string: ``"nan"``, ``"NaN"``, ``"inf"``,
    ``"-Infinity"``, any case); None for absent, bool, any other str, None or anything non-numeric."""
    if type(value) is float or isinstance(value, float):
        return value
    if isinstance(value, str):
        return NONFINITE_STRINGS.get(value.strip().lower())
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


class TokenScale:
    """Turns a metric that ``loss_agg_mode`` made a sum over tokens back into a per-token value.

    With L = ``response_length/mean`` (the step's mean valid response tokens), verl's ``core_algos.agg_loss`` gives,
    for a per-token matrix x:

    - ``token-mean``, ``seq-mean-token-mean``: the per-token mean (divisor 1);
    - ``seq-mean-token-sum``: the mean over sequences of each sequence's sum = L × token-mean (divisor L);
    - ``seq-mean-token-sum-norm``: that divided by ``loss_scale_factor`` (default: the padded response width,
      ``data.max_response_length``): divisor L / factor;
    - ``token-sum``: the sum over the batch's tokens = N × L × token-mean (divisor N × L), N the sequences summed:
      ``ppo_mini_batch_size × rollout.n`` for the loss terms, ``train_batch_size × rollout.n`` for
      ``actor/entropy`` (:data:`SUMMED_METRICS`).

    The division is exact for the batch L is measured on and close for a mini-batch of it.

    Args:
        run_config: the trial's flat verl overrides (missing keys: verl 0.9.1's defaults); None or {}: unknown, read
            as ``token-mean``.
    """

    def __init__(self, run_config: Mapping[str, Any] | None):
        config = {**_SIZE_DEFAULTS, **(run_config or {})}
        self.mode = str(config["actor_rollout_ref.actor.loss_agg_mode"])
        self.summed = self.mode in ("token-sum", "seq-mean-token-sum", "seq-mean-token-sum-norm")
        n = _positive(config["actor_rollout_ref.rollout.n"])
        prompts = {
            "mini-batch": _positive(config["actor_rollout_ref.actor.ppo_mini_batch_size"]),
            "batch": _positive(config["data.train_batch_size"]),
        }
        factor = config["actor_rollout_ref.actor.loss_scale_factor"]
        factor = _positive(config["data.max_response_length"] if factor is None else factor)
        self._per_length: dict[str, float | None] = {}  # metric -> divisor per response token (None: unknown)
        for key, summed_over in SUMMED_METRICS.items():
            size = prompts[summed_over]
            if self.mode == "token-sum":
                self._per_length[key] = size * n if size and n else None
            elif self.mode == "seq-mean-token-sum-norm":
                self._per_length[key] = 1.0 / factor if factor else None
            else:
                self._per_length[key] = 1.0

    def per_token(self, key: str, value: float, metrics: Mapping[str, Any]) -> float | None:
        """``value`` of metric ``key`` per token.

        Unchanged for metrics or modes that are already per token. None when it is a sum and this report has no
        positive ``response_length/mean``, or when the config's sizes are not positive numbers."""
        if not self.summed or key not in SUMMED_METRICS:
            return value
        length = number(metrics.get(RESPONSE_LENGTH))
        per_length = self._per_length[key]
        if length is None or not length > 0 or per_length is None or not math.isfinite(length):
            return None
        return value / (length * per_length)

    def describe(self, key: str) -> str:
        """What :meth:`per_token` divides ``key`` by, in words (for messages and the docs)."""
        if not self.summed or key not in SUMMED_METRICS:
            return f"{key} is per token (loss_agg_mode={self.mode})"
        per_length = self._per_length[key]
        if per_length is None:
            by = "nothing: the config's batch sizes are not positive numbers"
        elif self.mode == "token-sum":
            by = f"{RESPONSE_LENGTH} × {per_length:g} sequences (its {SUMMED_METRICS[key]})"
        elif self.mode == "seq-mean-token-sum":
            by = RESPONSE_LENGTH
        else:
            by = f"{RESPONSE_LENGTH} / {1 / per_length:g} (loss_scale_factor)"
        return f"{key} is a sum over tokens under loss_agg_mode={self.mode}: divided by {by}"


class Signals:
    """Reads the named signals from each report of one run (stateful only for ``kl_loss_share``'s window).

    Args:
        setup: the run's KL settings (unknown for log backtests).
        names: the signal names the rule set uses.
        scale: how to put token sums per token (default: everything is per token).
    """

    def __init__(self, setup: KlSetup, names: Iterable[str], scale: TokenScale | None = None):
        self.setup = setup
        self.scale = scale or TokenScale(None)
        self.unscaled: dict[str, str] = {}  # signal -> why a logged sum could not be put per token
        self._step = 0  # the step of the report being read
        self.names = tuple(dict.fromkeys(names))
        self._share_terms: deque[tuple[int, float, float]] = deque()  # (step, |KL term|, |actor loss|)
        self.keys_seen: dict[str, str] = {}  # signal -> the verl key it was last read from
        self.finite: set[str] = set()  # signals read with a finite value at least once
        self.nonfinite: dict[str, list[Any]] = {}  # signal -> [verl key, reports, first step, last step] of NaN/inf
        self._val_keys: tuple[Any, list[str]] = (None, [])  # (a report's key set, its validation keys, sorted)
        special = {"kl_coef": self._kl_coef, "kl_loss_share": self._kl_loss_share, VAL_SCORE: self._val_score}
        self._readers = [
            (name, self.ref_kl_keys() if name == "ref_kl" else ALIASES.get(name, (name,)), special.get(name))
            for name in self.names
        ]

    def read(self, metrics: Mapping[str, Any], step: int = 0) -> dict[str, tuple[str, float] | None]:
        """``{signal: (verl key, value) or None}`` for this report at training ``step``; values may be NaN/inf."""
        out: dict[str, tuple[str, float] | None] = {}
        self._step = step
        for name, keys, special in self._readers:
            hit = first_present(metrics, keys) if special is None else special(metrics)
            if hit is not None and self.scale.summed and hit[0] in SUMMED_METRICS:
                hit = self._per_token(name, hit, metrics)
            out[name] = hit
            if hit is not None:
                self.keys_seen[name] = hit[0]
                if math.isfinite(hit[1]):
                    self.finite.add(name)
                else:
                    self._note_nonfinite(name, hit[0], step)
        return out

    def _note_nonfinite(self, name: str, key: str, step: int) -> None:
        seen = self.nonfinite.get(name)
        if seen is None:
            self.nonfinite[name] = [key, 1, step, step]
        else:
            seen[0], seen[1], seen[3] = key, seen[1] + 1, step

    def nonfinite_text(self, name: str) -> str:
        """``"critic/score/mean non-finite in 21 reports (steps 10-30)"``: the reports where signal ``name`` was
        logged NaN or ±inf (a ``null`` in verl's file-logger jsonl), which no rule can judge; "" when none."""
        seen = self.nonfinite.get(name)
        if seen is None:
            return ""
        key, count, first, last = seen
        return f"{key} non-finite in {count} report{'s' if count > 1 else ''} ({steps_text(first, last)})"

    def _per_token(self, name: str, hit: tuple[str, float], metrics: Mapping[str, Any]) -> tuple[str, float] | None:
        value = self.scale.per_token(hit[0], hit[1], metrics)
        if value is None:
            self.unscaled[name] = (
                f"{self.scale.describe(hit[0])}, and {RESPONSE_LENGTH} was not logged with it: the value cannot be "
                f"put per token, where the thresholds apply (log {RESPONSE_LENGTH}, as verl's compute_data_metrics "
                "does)"
            )
            return None
        return f"{hit[0]} per token", value

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
        kl = self._read_per_token(metrics, KL_IN_LOSS_METRICS)
        pg = self._read_per_token(metrics, ("actor/pg_loss",))
        coef = first_present(metrics, KL_IN_LOSS_COEF_METRICS) or _config("kl_loss_coef", s.kl_loss_coef)
        if kl is None or pg is None or coef is None:
            return None
        entropy_term = 0.0
        if s.entropy_coeff:
            entropy = self._read_per_token(metrics, ALIASES["entropy"])
            if entropy is None:
                return None
            entropy_term = s.entropy_coeff * entropy
        kl_term = coef[1] * kl
        total = pg - entropy_term + kl_term
        if not (math.isfinite(kl_term) and math.isfinite(total)):
            return None
        terms, step = self._share_terms, self._step
        if terms and step < terms[-1][0]:
            terms.clear()  # a log that restarts its step count
        terms.append((step, abs(kl_term), abs(total)))
        while len(terms) > 1 and terms[1][0] <= step - SHARE_WINDOW + 1:  # keep the report covering the first step
            terms.popleft()
        denominator = sum(t for _, _, t in terms)
        if denominator == 0.0:
            return None
        return "kl_loss_share", sum(k for _, k, _ in terms) / denominator

    def _read_per_token(self, metrics: Mapping[str, Any], keys: Iterable[str]) -> float | None:
        """The first of ``keys`` logged, per token (terms of one loss on one scale: ``actor/entropy`` sums over the
        whole batch under token-sum, the loss terms over a mini-batch)."""
        hit = first_present(metrics, keys)
        return None if hit is None else self.scale.per_token(hit[0], hit[1], metrics)

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
        """Why a signal was never read with a finite value in this run, for the "not applicable" list."""
        s = self.setup
        if name in self.nonfinite and name not in self.finite:
            key, count, first, last = self.nonfinite[name]
            return (
                f"{key} logged in {count} report{'s' if count > 1 else ''} ({steps_text(first, last)}), non-finite at "
                "every one (NaN or ±inf; null in verl's file logger): no value to judge"
            )
        if name in self.unscaled and name not in self.keys_seen:
            return self.unscaled[name]
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
        return f"never logged (looked for {', '.join(self.looked_for(name))})"

    def looked_for(self, name: str) -> tuple[str, ...]:
        """The metric names (or patterns) signal ``name`` is read from; () for ``kl_loss_share`` (computed from
        several metrics and the run config) and for a KL signal of a run whose config turns the KL off."""
        if name == "kl_loss_share" or name in ("ref_kl", "kl_coef") and self.setup.kl_off:
            return ()
        return {
            "ref_kl": self.ref_kl_keys(),
            "kl_coef": ALIASES["kl_coef"],
            VAL_SCORE: ("val-core/*/mean@N", "val/test_score/*", "test_score/*"),
        }.get(name, ALIASES.get(name, (name,)))


def _positive(value: Any) -> float | None:
    """A config size as a positive float, else None (a missing or non-numeric size cannot scale a sum)."""
    size = number(value)
    return size if size is not None and math.isfinite(size) and size > 0 else None


def _config(key: str, value: float | None) -> tuple[str, float] | None:
    return None if value is None else (f"config:{key}", value)
