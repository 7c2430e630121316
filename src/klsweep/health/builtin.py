"""Built-in checks: findings that need no rule and no threshold tuning (settings in :class:`BuiltinConfig`).

- ``builtin.nonfinite_loss``: a NaN/inf actor or critic loss → stop (nonfinite). The update is already broken.
- ``builtin.nonfinite_grad_norm``: a NaN/inf ``grad_norm`` with finite losses → warn. Stop only once it lasts a
  number of steps. verl-omni#539, verl#870 and #751 show single NaN grad norms in runs that recover; the optimizer
  skips them.
- ``builtin.nonfinite_metric``: any other metric a rule or check reads (score, entropy, response length, validation
  score, ...) NaN/inf → warn, never stop. A ``null`` in verl's file-logger jsonl is one. The rules reading it skip
  that report, so without this finding a run whose score went NaN would look healthy. The coverage lines of those
  rules count such reports as non-finite, not as missing.
- ``builtin.no_signal``: every advantage 0 (or, when no advantage is logged, every score 0) → stop as no_signal
  (rllm#54), not as divergence. A batch scoring 0 with non-zero advantages (a critic's baseline) still trains.
  Every advantage is 0 when ``critic/advantages/max`` and ``/min`` are 0: verl whitens or group-normalises
  advantages to mean 0, so max == 0 means all 0. When the batch's scores differ (``critic/score/max`` > ``/min``),
  zero advantages mean each group scored its answers alike: its prompts are solved or out of reach. A healthy run
  near its ceiling shows that for a step or two, so it warns, and stops only after ``uniform_groups_for`` steps.
- ``builtin.no_update``: ``actor/grad_norm`` or ``actor/lr`` exactly 0 while the policy is flat → misconfigured:
  the policy never moves (ms-swift#5890). Flat means the reference KL ~0, or, with no KL logged, the entropy
  unchanged. Checked before ``kl_dead``: a KL of 0 with a frozen policy is a symptom, not the cause.
- ``builtin.kl_dead``: reference KL exactly 0 after warm-up, while a KL mechanism is on with a non-zero coefficient
  and the actor updates → misconfigured (verl#1573, #2060). Never read from ``actor/ppo_kl``, the KL to the
  rollout policy, which is ~0 by design. Not judged on logs printed with 3 decimals, where 0.000 only means
  < 0.0005.
- ``builtin.kl_negative``: a negative batch mean from an estimator that is >= 0 per token (abs, k2/mse, k3/low_var_kl)
  → misconfigured (verl#2928). ``kl``/``k1`` means may be slightly negative: normal.
- ``builtin.kl_explosion``: reference KL mean at or above ``kl_explosion`` → diverged. The default is 9: k3 clamps
  each token to [-10, 10] in verl's ``core_algos.kl_penalty``, so a mean near 10 means most tokens are at the
  clamp. Judged per token: token-sum aggregations are divided by the tokens summed (:mod:`klsweep.health.signals`).

Only a finite value counts as a judgement. A check that saw its metrics only as NaN/inf is listed "not applicable"
with that reason; the non-finite checks report them.

Every "for N" of these checks counts training steps, not reports (:class:`~klsweep.health.streak.Streak`): a log
with one report every 25 steps is judged like the full log within 25 steps.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from klsweep.health.rules import BuiltinConfig
from klsweep.health.signals import Signals, number
from klsweep.health.streak import Streak, steps_text
from klsweep.health.verdict import Event
from klsweep.verl.metrics import (
    ADVANTAGE_METRICS,
    CLAMPED_ESTIMATORS,
    GRAD_NORM_METRICS,
    K3_CLAMP,
    KL_IN_LOSS_METRICS,
    LOSS_METRICS,
    NONNEGATIVE_ESTIMATORS,
    SCORE_RANGE_METRICS,
    base_estimator,
)

#: Half of the last digit verl's console logger prints (3 decimals): "0.000" is any |x| < 5e-4.
ZERO = 5e-4
#: The actor's update size: either exactly 0 means no parameter moved (grad_norm: verl's norm before clipping).
UPDATE_METRICS = ("actor/grad_norm", "actor/lr")
#: "Entropy unchanged" for ``builtin.no_update`` when no KL is logged: within 5 % of its value when the streak began
#: (a frozen policy's entropy still varies a little from batch to batch: new prompts, new samples).
ENTROPY_FLAT = 0.05

Values = Mapping[str, tuple[str, float] | None]


class BuiltinCheck:
    """One built-in check. ``check`` returns a finding or None; ``judged`` says whether it could ever judge;
    ``action`` is the strongest finding it can give (``stop``, or ``warn`` for a check that never stops a run)."""

    name = "builtin"
    action = "stop"

    def __init__(self) -> None:
        self.judged = False
        self.nonfinite_seen = False  # its metrics were logged, but only as NaN/inf

    def _finite(self, metrics: Mapping[str, Any], keys: tuple[str, ...]) -> dict[str, float]:
        """The finite values of ``keys`` in this report; notes a NaN/inf one for :meth:`_never`."""
        out = {}
        for key in keys:
            value = number(metrics.get(key))
            if value is not None:
                if math.isfinite(value):
                    out[key] = value
                else:
                    self.nonfinite_seen = True
        return out

    def _never(self, keys: tuple[str, ...], more: str = "") -> str:
        """Why the check never judged: its metrics were never logged, or only as NaN/inf."""
        said = "logged, but never finite" if self.nonfinite_seen else "never logged"
        return f"{said} (looked for {', '.join(keys)}{more})"

    def _finding(self, step: int, kind: str, values: dict[str, float], advice: str, message: str,
                 action: str = "stop") -> Event:
        """This check's finding at ``step``."""
        return Event(rule=self.name, kind=kind, step=step, values=values, advice=advice, message=message,
                     action=action)

    def _nonfinite(self, step: int, bad: dict[str, float], advice: str, note: str = "") -> Event:
        """The finding of this check at ``step`` for its NaN/inf values ``bad`` (``key = value, ...`` + ``note``),
        with the check's ``action``."""
        return self._finding(step, "nonfinite", bad, advice, ", ".join(f"{k} = {v}" for k, v in bad.items()) + note,
                             self.action)

    def check(self, step: int, metrics: Mapping[str, Any], values: Values) -> Event | None:
        raise NotImplementedError

    def why_not_applicable(self) -> str:
        return "its metrics were never logged"


class NonfiniteLoss(BuiltinCheck):
    name = "builtin.nonfinite_loss"
    _keys = (*LOSS_METRICS, "actor/reward_kl_penalty", "critic/kl")

    def check(self, step, metrics, values):
        bad = {}
        for key in self._keys:
            value = number(metrics.get(key))
            if value is not None:
                self.judged = True
                if not math.isfinite(value):
                    bad[key] = value
        if not bad:
            return None
        return self._nonfinite(step, bad, advice="lower the learning rate or grad_clip; check for micro-batches "
                               "larger than the per-GPU share (verl#2505)")

    def why_not_applicable(self):
        return f"never logged (looked for {', '.join(self._keys)})"


class NonfiniteGradNorm(BuiltinCheck):
    name = "builtin.nonfinite_grad_norm"

    def __init__(self, steps_to_stop: int):
        super().__init__()
        self.steps_to_stop = steps_to_stop
        self.streak = Streak()
        self.count = 0

    def check(self, step, metrics, values):
        norms = {k: v for k in GRAD_NORM_METRICS if (v := number(metrics.get(k))) is not None}
        if not norms:
            return None
        self.judged = True
        bad = {k: v for k, v in norms.items() if not math.isfinite(v)}
        losses = [v for k in LOSS_METRICS if (v := number(metrics.get(k))) is not None]
        # a non-finite loss is builtin.nonfinite_loss's finding
        held = self.streak.update(step, bool(bad) and all(math.isfinite(v) for v in losses))
        if not held:
            return None
        self.count += 1
        stop = 0 < self.steps_to_stop <= held
        what = ", ".join(f"{k} = {v}" for k, v in bad.items())
        return self._finding(
            step, "nonfinite", {**bad, "streak": float(held), "count": float(self.count)},
            advice="lower the learning rate or grad_clip" if stop else "",
            message=f"{what} with finite losses for {held} steps ({steps_text(self.streak.start or step, step)}; "
            f"{self.count} reports in the run)",
            action="stop" if stop else "warn",
        )


class NonfiniteMetric(BuiltinCheck):
    """A NaN/inf value of any signal the rule set reads, other than the ``skip`` keys (the losses and grad norms the
    other non-finite checks judge) → warn. Never stops: a NaN score or entropy is a broken metric or reward, but
    not by itself a broken update (the losses say that)."""

    name = "builtin.nonfinite_metric"
    action = "warn"

    def __init__(self, skip: tuple[str, ...]):
        super().__init__()
        self.skip = frozenset(skip)

    def check(self, step, metrics, values):
        bad: dict[str, float] = {}
        for hit in values.values():
            if hit is None or hit[0].removesuffix(" per token") in self.skip or hit[0].startswith("config:"):
                continue
            self.judged = True
            if not math.isfinite(hit[1]):
                bad[hit[0]] = hit[1]
        if not bad:
            return None
        return self._nonfinite(step, bad, advice="find where the metric turns NaN/inf (a reward function returning "
                               "NaN or inf, an empty batch, a division by 0); rules that read it skip these reports",
                               note=" (non-finite: NaN or ±inf, null in verl's file-logger jsonl); no rule can judge "
                               "it here")

    def why_not_applicable(self):
        return "no metric a rule or check reads was logged (besides the losses and grad norms)"


class NoSignal(BuiltinCheck):
    name = "builtin.no_signal"

    def __init__(self, steps: int, uniform_groups_steps: int):
        super().__init__()
        self.steps = steps
        self.uniform_groups_steps = uniform_groups_steps
        self.streak = Streak()  # every advantage (or score) 0, the batch's scores alike
        self.uniform = Streak()  # every advantage 0, whatever the scores

    def check(self, step, metrics, values):
        adv = self._finite(metrics, ADVANTAGE_METRICS)
        score = self._finite(metrics, SCORE_RANGE_METRICS)
        if not adv and not score:
            return None
        self.judged = True
        adv_zero = bool(adv) and all(abs(v) < ZERO for v in adv.values())
        spread = len(score) == 2 and score["critic/score/max"] - score["critic/score/min"] >= ZERO
        # scores of 0 with non-zero advantages still move the policy (PPO's critic baseline, KL in the reward: verl's
        # 0.5B PPO baseline has batches scoring 0 at steps 7, 11 and 12): the scores judge only without advantages
        score_zero = not adv and "critic/score/max" in score and all(abs(v) < ZERO for v in score.values())
        held = self.streak.update(step, (adv_zero and not spread) or score_zero)
        groups = self.uniform.update(step, adv_zero)
        seen = {**adv, **score}
        values_text = ", ".join(f"{k} = {v:g}" for k, v in seen.items())
        if held >= self.steps:
            what = "every advantage is 0" if adv_zero else "every score is 0"
            return self._finding(
                step, "no_signal", seen,
                advice="check the reward function and data; use an easier task or a larger rollout.n (more chances "
                "of a non-zero group)",
                message=f"{what} ({values_text}) for {held} steps ({steps_text(self.streak.start or step, step)}): "
                "the policy gradient is 0",
            )
        if groups < self.steps or not adv_zero:
            return None
        stop = 0 < self.uniform_groups_steps <= groups
        return self._finding(
            step, "no_signal", seen,
            advice="use harder or more varied prompts, or a larger rollout.n" if stop else "",
            message=f"every advantage is 0 while the batch's scores differ ({values_text}) for {groups} steps "
            f"({steps_text(self.uniform.start or step, step)}): each group scored its answers alike, its prompts "
            "solved or out of reach, so the policy gradient is 0"
            + ("" if stop else f"; a stop once it lasts {self.uniform_groups_steps} steps"),
            action="stop" if stop else "warn",
        )

    def why_not_applicable(self):
        return self._never((*ADVANTAGE_METRICS, *SCORE_RANGE_METRICS))


def _not_updating(metrics: Mapping[str, Any]) -> tuple[str, float] | None:
    """The first of :data:`UPDATE_METRICS` logged exactly 0 in this report, as (key, 0.0), else None."""
    for key in UPDATE_METRICS:
        if number(metrics.get(key)) == 0.0:
            return key, 0.0
    return None


def _estimator(signals: Signals, key: str) -> str | None:
    """The base estimator of the KL that metric ``key`` logs (in the loss or in the reward), from the run config."""
    s = signals.setup
    return base_estimator(s.loss_estimator if key in KL_IN_LOSS_METRICS else s.reward_estimator)


class NoUpdate(BuiltinCheck):
    """``actor/grad_norm`` (or ``actor/lr``) exactly 0 with a flat policy for ``steps`` steps: the actor never moves.

    Flat: the reference KL (whichever mechanism is logged) below :data:`ZERO`; with no KL logged, the entropy within
    :data:`ENTROPY_FLAT` of its value when the streak began. With neither logged the check does not judge. Off on
    logs printed with 3 decimals (a learning rate of 1e-6 prints as 0.000).
    """

    name = "builtin.no_update"

    def __init__(self, signals: Signals, steps: int, rounded: bool):
        super().__init__()
        self.signals, self.steps, self.rounded = signals, steps, rounded
        self.streak = Streak()
        self.entropy_start: float | None = None

    def _flat(self, values: Values) -> tuple[bool, str] | None:
        kl = values.get("ref_kl")
        if kl is not None and math.isfinite(kl[1]):
            return abs(kl[1]) < ZERO, f"{kl[0]} = {kl[1]:g}"
        entropy = values.get("entropy")
        if entropy is None or not math.isfinite(entropy[1]):
            return None
        if self.streak.start is None:
            self.entropy_start = entropy[1]
        start = entropy[1] if self.entropy_start is None else self.entropy_start
        return abs(entropy[1] - start) <= ENTROPY_FLAT * abs(start), f"{entropy[0]} unchanged at {entropy[1]:g}"

    def check(self, step, metrics, values):
        if self.rounded:
            return None
        idle = _not_updating(metrics)
        if idle is None:  # updating (a non-zero grad norm), or nothing to judge by
            self.judged = self.judged or bool(self._finite(metrics, UPDATE_METRICS))
            self.streak.reset(step)
            return None
        flat = self._flat(values)
        if flat is None:  # neither KL nor entropy says whether the policy moved
            self.streak.reset(step)
            return None
        self.judged = True
        held = self.streak.update(step, flat[0])
        if held < self.steps:
            return None
        return self._finding(
            step, "misconfigured", {idle[0]: idle[1]},
            advice="the actor never changes: check actor_rollout_ref.actor.optim.lr (> 0), that the advantages are "
            "not all 0 (critic/advantages/max and /min), that the actor's parameters are trainable (not frozen; LoRA "
            "adapters attached) and that the optimizer steps (no skipped or overflowing steps)",
            message=f"no update: {idle[0]} is 0 for {held} steps ({steps_text(self.streak.start or step, step)}) "
            f"while the policy is flat ({flat[1]})",
        )

    def why_not_applicable(self):
        if self.rounded:
            return "the log prints rounded values (3 decimals): 0.000 is not exactly 0"
        return self._never(UPDATE_METRICS, " with a KL or entropy metric")


class KlDead(BuiltinCheck):
    name = "builtin.kl_dead"

    def __init__(self, signals: Signals, after: int, steps: int, rounded: bool):
        super().__init__()
        self.signals, self.after, self.steps, self.rounded = signals, after, steps, rounded
        self.streak = Streak(after)
        self.zero_coef = False
        self.frozen = False

    def check(self, step, metrics, values):
        if self.rounded or self.signals.setup.kl_off:
            return None
        kl, coef = values.get("ref_kl"), values.get("kl_coef")
        if kl is None or not math.isfinite(kl[1]):  # NaN/inf: builtin.nonfinite_loss's finding
            return None
        if step <= self.after:
            self.streak.reset(step)
            return None
        if coef is not None and coef[1] == 0.0:
            self.zero_coef = True  # KL on with coefficient 0 is a config warning (verl#6519), not a dead KL path
            return None
        if _not_updating(metrics):
            self.frozen = True  # a frozen policy has KL 0 as a symptom: builtin.no_update's finding
            return None
        self.judged = True
        held = self.streak.update(step, kl[1] == 0.0)
        if held < self.steps:
            return None
        return self._finding(
            step, "misconfigured", {kl[0]: kl[1]},
            advice="the reference policy equals the actor or the KL term is not computed: check that the KL "
            "mechanism you sweep is the one that is on (use_kl_loss vs use_kl_in_reward) and the reference model loads",
            message=f"{kl[0]} is exactly 0 for {held} steps ({steps_text(self.streak.start or step, step)}, after the "
            f"warm-up of {self.after}) while KL is on and the actor updates",
        )

    def why_not_applicable(self):
        if self.rounded:
            return "the log prints rounded values (3 decimals): 0.000 is not exactly 0"
        if self.signals.setup.kl_off:
            return self.signals.why_absent("ref_kl")
        if self.zero_coef:
            return "the KL coefficient is 0: KL is on but weighs nothing (a config warning, not a dead KL path)"
        if self.frozen:
            return "the actor never updated (actor/grad_norm or actor/lr exactly 0): see builtin.no_update"
        if "ref_kl" in self.signals.finite:
            return f"no report after the warm-up (step {self.after})"
        return self.signals.why_absent("ref_kl")


class KlNegative(BuiltinCheck):
    name = "builtin.kl_negative"

    def __init__(self, signals: Signals, tolerance: float):
        super().__init__()
        self.signals, self.tolerance = signals, tolerance

    def check(self, step, metrics, values):
        kl = values.get("ref_kl")
        if kl is None or not self.signals.setup.known or not math.isfinite(kl[1]):
            return None
        self.judged = True
        estimator = _estimator(self.signals, kl[0])
        if estimator not in NONNEGATIVE_ESTIMATORS or kl[1] >= -self.tolerance:
            return None
        return self._finding(
            step, "misconfigured", {kl[0]: kl[1]},
            advice="the estimator is >= 0 per token, so a negative mean is a bug: check the reference log-probs "
            "(same tokenizer and padding) and the loss aggregation",
            message=f"{kl[0]} = {kl[1]:g} < 0 with estimator {estimator} (abs, k2, k3 are never negative)",
        )

    def why_not_applicable(self):
        if not self.signals.setup.known:
            return "needs the run config (kl_loss_type / kl_penalty) to know the estimator"
        return self.signals.why_absent("ref_kl")


class KlExplosion(BuiltinCheck):
    name = "builtin.kl_explosion"

    def __init__(self, signals: Signals, threshold: float):
        super().__init__()
        self.signals, self.threshold = signals, threshold

    def check(self, step, metrics, values):
        kl = values.get("ref_kl")
        if kl is None or not math.isfinite(kl[1]):
            return None
        self.judged = True
        if kl[1] < self.threshold:
            return None
        clamp = ""
        if _estimator(self.signals, kl[0]) in CLAMPED_ESTIMATORS:
            clamp = f" (k3 clamps each token at {K3_CLAMP:g}: most tokens are at the clamp)"
        return self._finding(step, "diverged", {kl[0]: kl[1]},
                             advice="lower the learning rate, raise the KL coefficient, or lower target_kl",
                             message=f"{kl[0]} = {kl[1]:g} >= {self.threshold:g}{clamp}")

    def why_not_applicable(self):
        return self.signals.why_absent("ref_kl")


def builtin_checks(config: BuiltinConfig, signals: Signals, rounded: bool) -> list[BuiltinCheck]:
    """The enabled built-in checks, most fundamental first (the first stop in this order is the run's reason)."""
    checks: list[BuiltinCheck] = []
    if config.nonfinite_loss:
        checks.append(NonfiniteLoss())
    checks.append(NonfiniteGradNorm(config.nonfinite_grad_norm_streak))
    checks.append(NonfiniteMetric((*(NonfiniteLoss._keys if config.nonfinite_loss else ()), *GRAD_NORM_METRICS)))
    if config.kl_explosion > 0:
        checks.append(KlExplosion(signals, config.kl_explosion))
    checks.append(KlNegative(signals, config.negative_kl_tolerance))
    if config.no_signal_for > 0:
        checks.append(NoSignal(config.no_signal_for, config.uniform_groups_for))
    if config.no_update_for > 0:  # before kl_dead: a frozen policy's KL of 0 is a symptom, not a KL misconfiguration
        checks.append(NoUpdate(signals, config.no_update_for, rounded))
    if config.kl_dead_for > 0:
        checks.append(KlDead(signals, config.kl_dead_after, config.kl_dead_for, rounded))
    return checks
