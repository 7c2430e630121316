"""The health rule language: pydantic models for rules, conditions, built-in checks and the sweep file's ``health:``.

A rule (YAML, validated here; never evaluated as code)::

    - name: kl_blowup
      metric: ref_kl              # a verl metric name or an alias (klsweep.verl.metrics.ALIASES, val_score,
      stat: mean                  #   kl_coef, kl_loss_share)
      window: 5                   # the last 5 training steps (the reports that cover them, at least two)
      above: 1.0
      for: 3                      # training steps the conditions must have held for
      after: 10                   # warm-up: reports at step <= 10 are not judged
      action: stop                # stop | warn | advise
      kind: diverged
      advice: lower the learning rate or raise kl_coef
      advice_without_kl: lower the learning rate, or add a KL term   # optional: the advice when the run has none
      source: our calibration (verl's PPO baseline peaks at 0.227)
      remedy: {kl_coef: "*1.5"}   # optional, stop rules only: restart from the last checkpoint before the onset
      max_remedies: 2             #   with kl_coef × 1.5, at most twice per trial; then stop
      on_same_finding: stop       #   optional: flagged again at or before the step it answered: stop (repeat,
                                  #   the default: the remedy again; escalate: the remedy applied twice)

Several conditions combine with ``all: [...]`` or ``any: [...]`` (each item: metric, stat, window, above/below).
``window``, ``for`` and ``after`` are training steps, not reports, so a log with one row every 25 steps is judged like
the full log (within 25 steps): a window of W steps ending at step s reads every report from the last one at or before
step s − W + 1 (it is judged once the run covers W steps, so with at least two reports); a streak (``for``) starts
right after the last report at which the conditions did not hold (:mod:`klsweep.health.streak`).
Statistics: ``value`` (the report's value), window ``mean``/``std``/``var``/``min``/``max``/``slope`` (least squares,
per step), ``drop_from_max`` ((max − value)/max, max over ``window`` steps or the whole run), ``ratio_to_first``, and
the scale-free ``ratio_to_early`` (to the median of the run's first ``early`` steps) and ``ratio_to_median`` (to the
median of the last ``window`` steps).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from klsweep.health.conditions import CONDITION_KEYS, Condition

Action = Literal["stop", "warn", "advise"]
Kind = Literal["diverged", "no_signal", "collapsed", "misconfigured", "nonfinite", "unhealthy"]
PRESETS = ("default", "seed", "conservative", "aggressive")

_MODEL = ConfigDict(extra="forbid", frozen=True)
#: Keys a remedy may not change: the seed (``data.seed``; ``seed`` in a sweep file) makes a trial what it is.
UNPRESCRIBABLE = ("seed", "data.seed")
#: A remedy's operations on a knob's value: ``*1.5`` multiplies, ``/2`` divides, ``+0.01`` adds, ``-0.01``
#: subtracts, ``=0.005`` sets.
OPERATORS = ("*", "/", "+", "-", "=")
#: What a rule does when the trial its remedy restarted is flagged again by it at or before the step of the finding
#: that remedy answered: ``repeat`` the remedy (the default), ``stop`` the trial, or ``escalate`` (the remedy applied
#: twice over).
SameFinding = Literal["repeat", "stop", "escalate"]
_OPERATION = re.compile(r"^\s*([*/+\-=])\s*([0-9.eE+\-]+)\s*$")


def parse_operation(key: str, operation: Any) -> tuple[str, float]:
    """``"*1.5"`` → ``("*", 1.5)``: one of :data:`OPERATORS` and a finite number (not 0 after ``/``).

    Raises:
        ValueError: the operation is not a string of that form (the message names ``key``, the value and the fix).
    """
    match = _OPERATION.match(operation) if isinstance(operation, str) else None
    number = None
    if match:
        try:
            number = float(match.group(2))
        except ValueError:
            number = None
    if match is None or number is None or not math.isfinite(number) or (match.group(1) == "/" and number == 0):
        raise ValueError(f"remedy {key}: {_not_an_operation(operation)}")
    return match.group(1), number


def _not_an_operation(operation: Any) -> str:
    return (f"{operation!r} is not an operation on the knob's value: write an operator ({', '.join(OPERATORS)}) "
            "and a finite number as a quoted string, e.g. '*1.5' (raise by 50 %), '*0.7', '/2' or '=0.005'")


def _prescribable(key: str) -> str:
    """A remedy's knob (a dict key of ``Rule.remedy``): anything but the seed."""
    if key in UNPRESCRIBABLE:
        raise ValueError(f"remedy {key}: the seed cannot be prescribed (a trial restarted with another seed is another "
                         "trial, not a remedied one); prescribe a KL or learning-rate knob, e.g. kl_coef: '*1.5'")
    return key


def _operation(operation: str) -> str:
    """A remedy's operation (a dict value of ``Rule.remedy``), checked by :func:`parse_operation`."""
    try:
        parse_operation("", operation)
    except ValueError:
        raise ValueError(_not_an_operation(operation)) from None
    return operation


#: Each entry of a remedy is validated on its own, so that pydantic reports every bad entry at once (its key in the
#: error's location), not the first one only.
_Knob = Annotated[str, AfterValidator(_prescribable)]
_Operation = Annotated[str, AfterValidator(_operation)]


class Rule(BaseModel):
    """One health rule: conditions on metrics, how long they must hold, and what to do.

    Written either with a single condition inline (``metric``, ``stat``, ``window``, ``above``/``below``) or with
    ``all: [...]`` / ``any: [...]`` lists of conditions. Reports where a condition's metric is absent (or not
    finite) are skipped: they neither end a streak (``for``) nor start one. A report where the conditions do not hold,
    or a window does not cover its steps yet, ends it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: str = Field(min_length=1, description="unique name, shown in verdicts")
    conditions: tuple[Condition, ...] = Field(min_length=1, description="from 'metric: ...' or 'all:'/'any:'")
    match: Literal["all", "any"] = Field("all", description="all conditions must hold, or any one")
    for_: int = Field(
        1,
        alias="for",
        ge=1,
        description="training steps the conditions must have held for: since the step after the last report where "
        "they did not",
    )
    after: int = Field(0, ge=0, description="warm-up: reports at step <= after are not judged")
    action: Action = Field(description="stop the trial, warn, or advise (informational, verdict stays healthy)")
    kind: Kind = Field("unhealthy", description="what a stop means: diverged, no_signal, collapsed, ...")
    advice: str = Field("", description="the remedy shown with the verdict")
    advice_without_kl: str = Field(
        "",
        description="the remedy shown instead of advice for a run with no KL term (the run config sets "
        "actor_rollout_ref.actor.use_kl_loss and algorithm.use_kl_in_reward false: kl_placement none), where a KL "
        "coefficient does nothing; empty: advice",
    )
    source: str = Field("", description="where the threshold comes from (seed table, public log, calibration)")
    remedy: dict[_Knob, _Operation] = Field(
        default_factory=dict,
        description="stop rules only: the knobs to change (verl key or alias → '*1.5', '/2', '+0.01', '-0.01', "
        "'=0.005') when the trial restarts from its last checkpoint before the onset instead of stopping",
    )
    max_remedies: int = Field(2, ge=0, description="remedies of this rule per trial; the next firing stops the trial")
    on_same_finding: SameFinding = Field(
        "repeat",
        description="a remedied trial this rule flags again at or before the step of the finding its last remedy "
        "answered (the dose changed nothing): repeat the remedy, stop the trial, or escalate (the prescription "
        "applied twice: '*4' multiplies by 16, '/2' divides by 4, '+0.01' adds 0.02)",
    )

    @model_validator(mode="after")
    def _remedy_replaces_a_stop(self) -> Rule:
        if self.remedy and self.action != "stop":
            raise ValueError(
                f"rule {self.name!r} has a remedy but action {self.action!r}: a remedy is tried instead of a stop. "
                "Set action: stop, or remove remedy"
            )
        if self.on_same_finding != "repeat" and not self.remedy:
            raise ValueError(
                f"rule {self.name!r} sets on_same_finding: {self.on_same_finding} but has no remedy: it says what "
                "happens when a remedy changed nothing. Add a remedy (e.g. remedy: {kl_coef: '*4'}), or remove "
                "on_same_finding"
            )
        if self.on_same_finding == "escalate" and all(op.strip().startswith("=") for op in self.remedy.values()):
            raise ValueError(
                f"rule {self.name!r}: on_same_finding: escalate applies the remedy twice, and its remedy only sets "
                f"values ({', '.join(f'{k}: {v!r}' for k, v in self.remedy.items())}), which twice is the same. "
                "Use an operation that escalates ('*4', '/2', '+0.01'), or on_same_finding: stop"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _conditions_from_user_syntax(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        data = dict(data)
        forms = [f for f in ("metric", "all", "any") if f in data]
        if "conditions" in data:
            forms.append("conditions")
        if len(forms) != 1:
            name = data.get("name", "<unnamed>")
            found = f"found {', '.join(forms)}" if forms else "found none"
            raise ValueError(
                f"rule {name!r} needs exactly one of 'metric' (one condition), 'all' or 'any' (lists of conditions); "
                f"{found}"
            )
        form = forms[0]
        if form == "metric":
            data["conditions"] = [{k: data.pop(k) for k in CONDITION_KEYS if k in data}]
        elif form in ("all", "any"):
            items = data.pop(form)
            if not isinstance(items, list):
                raise ValueError(f"rule {data.get('name', '<unnamed>')!r}: '{form}' must be a list of conditions")
            data["conditions"] = items
            data["match"] = form
        return data

    def describe(self) -> str:
        """``"mean5(ref_kl) > 1 for 3 steps after step 10"``."""
        joined = f" {'and' if self.match == 'all' else 'or'} ".join(c.describe() for c in self.conditions)
        text = joined + (f" for {self.for_} steps" if self.for_ > 1 else "")
        return text + (f" after step {self.after}" if self.after else "")

    @property
    def metrics(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c.metric for c in self.conditions))


class BuiltinConfig(BaseModel):
    """Checks that need no rule: each one stops (or warns) on something no healthy run shows.

    Set a number to 0 to turn its check off.
    """

    model_config = _MODEL

    nonfinite_loss: bool = Field(
        True, description="stop when actor/pg_loss, actor/kl_loss, critic/vf_loss or the in-reward KL is NaN/inf"
    )
    nonfinite_grad_norm_streak: int = Field(
        3, ge=0, description="warn on each non-finite grad_norm with finite losses; stop once it lasts this many steps"
    )
    no_signal_for: int = Field(
        2, ge=0, description="stop as no_signal once all advantages (or scores) have been 0 for this many steps"
    )
    uniform_groups_for: int = Field(
        5,
        ge=0,
        description="stop as no_signal once all advantages have been 0 for this many steps while the batch's scores "
        "differ (critic/score/max > min): each group scored its answers alike, its prompts solved or out of reach. "
        "Healthy runs near their ceiling show it for a step or two (verl's 72B GRPO-LoRA baseline: steps 38-39); "
        "0: warn only",
    )
    no_update_for: int = Field(
        3,
        ge=0,
        description="stop as misconfigured once actor/grad_norm (or actor/lr) has been exactly 0 with a flat policy "
        "(reference KL ~0, or entropy unchanged) for this many steps",
    )
    kl_dead_after: int = Field(10, ge=0, description="warm-up steps before reference KL == 0 counts as dead")
    kl_dead_for: int = Field(
        3, ge=0, description="stop as misconfigured once reference KL has been exactly 0 with KL on for this many steps"
    )
    kl_explosion: float = Field(
        9.0, ge=0, description="stop when the reference KL mean reaches this (k3/low_var_kl clamps each token at 10)"
    )
    negative_kl_tolerance: float = Field(
        1e-4, ge=0, description="stop when an abs/k2/k3 estimator's mean is below -tolerance (a bug: they are >= 0)"
    )


class HealthConfig(BaseModel):
    """The sweep file's ``health:`` field (and ``sweep health check --rules FILE``).

    Forms::

        health: default                      # a preset name: default, seed, conservative, aggressive, none
        health:
          preset: conservative                # base rules (default: default; 'none' for only yours)
          rules: [...]                        # added; a rule with a preset rule's name replaces it
          builtin: {no_signal_for: 5}         # overrides of the built-in checks' settings
          remedies: false                     # rules with a remedy stop instead of restarting (kill-only)
          validation: val-core/openai/gsm8k/reward/mean@1   # the one set rules on val_score judge (default: each)
    """

    model_config = _MODEL

    preset: str = Field("default", description=f"base preset: one of {', '.join(PRESETS)}, or none")
    rules: tuple[Rule, ...] = Field((), description="rules added to the preset (same name: replaces it)")
    builtin: dict[str, Any] = Field(default_factory=dict, description="overrides of BuiltinConfig fields")
    remedies: bool = Field(True, description="false: rules with a remedy stop their trial (kill-only)")
    validation: str | None = Field(
        None,
        min_length=1,
        description="the validation key the rules on val_score judge (e.g. val-core/openai/gsm8k/reward/mean@1); "
        "default: every validation set, one key per data source, a dip on some sets only is a warning",
    )

    @model_validator(mode="before")
    @classmethod
    def _short_forms(cls, data: Any) -> Any:
        if isinstance(data, str):
            return {"preset": data}
        if isinstance(data, list):
            return {"rules": data}
        return data

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, value: str) -> str:
        if value not in (*PRESETS, "none"):
            raise ValueError(f"unknown health preset {value!r}: valid presets are {', '.join(PRESETS)}, none")
        return value

    @field_validator("rules")
    @classmethod
    def _unique_names(cls, rules: tuple[Rule, ...]) -> tuple[Rule, ...]:
        seen: set[str] = set()
        for rule in rules:
            if rule.name in seen:
                raise ValueError(f"two rules are named {rule.name!r}: rule names must be unique")
            seen.add(rule.name)
        return rules

    @field_validator("builtin")
    @classmethod
    def _known_builtin(cls, value: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(value) - set(BuiltinConfig.model_fields))
        if unknown:
            raise ValueError(
                f"unknown built-in check setting(s) {', '.join(unknown)}: valid are "
                f"{', '.join(BuiltinConfig.model_fields)}"
            )
        BuiltinConfig.model_validate(value)  # type and range errors, named by field
        return value


class PresetFile(BaseModel):
    """A preset YAML file shipped in klsweep/health/presets/."""

    model_config = _MODEL

    description: str
    builtin: BuiltinConfig = BuiltinConfig()
    rules: tuple[Rule, ...] = ()


@dataclass(frozen=True)
class RuleSet:
    """Rules and built-in check settings, ready for :class:`~klsweep.health.engine.HealthEngine`.

    Attributes:
        name: the preset name, or ``"<preset>+custom"`` when rules were added, or a file name.
        rules: the rules in evaluation order.
        builtin: settings of the built-in checks.
        description: one paragraph on what the rule set is for.
        validation: the one validation key the rules on ``val_score`` judge, or None for every set.
    """

    name: str
    rules: tuple[Rule, ...]
    builtin: BuiltinConfig
    description: str = ""
    validation: str | None = None
