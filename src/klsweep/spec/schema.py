"""The sweep file's schema: pydantic v2 models, one per section, unknown fields refused.

A sweep file is YAML; :func:`klsweep.spec.load.load_sweep` reads it, applies command-line overrides and validates it
against :class:`Sweep`. Parameters follow W&B sweeps (``values``, ``value``, ``distribution`` + ``min``/``max``), keyed
by full verl keys (``actor_rollout_ref.actor.kl_loss_coef``) or by the aliases of :mod:`klsweep.verl.presets`
(``kl_coef``, ``target_kl``, ``horizon``, ``kl_loss_type``, ``loss_agg_mode``, ``entropy_coeff``).

Conditional parameters carry ``when: {KEY: VALUE}`` (or ``{KEY: [V1, V2]}``): the parameter is sampled only in trials
where every KEY has one of the given values. KEY is a verl key or alias that is fixed by the preset/overrides or that
is a parameter defined *earlier* in the file.
"""

from __future__ import annotations

import functools
import math
from typing import Annotated, Any, Literal, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    field_validator,
    model_validator,
)

from klsweep.health import HealthConfig, RuleSet, load_ruleset
from klsweep.trainers import TrainerKind, TrainerName, trainer_kind
from klsweep.verl.presets import resolve_key


def _scalar(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{value} is not a finite number: verl takes no NaN or infinite setting (Hydra cannot pass "
                         "one); give a finite number")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise ValueError(f"must be a number, a string, true/false or null, not a {type(value).__name__}: give one value")


def _override_value(value: Any) -> Any:
    if isinstance(value, list):
        return [_scalar(v) for v in value]
    if isinstance(value, dict):
        raise ValueError("must be a number, string, true/false, null or a list of them, not a mapping: write each "
                         "nested key as its own flat dotted key (a.b.c: value)")
    return _scalar(value)


Scalar = Annotated[Any, AfterValidator(_scalar)]
"""A value a parameter can take: a number, string, bool or null (a verl override's scalar)."""

OverrideValue = Annotated[Any, AfterValidator(_override_value)]
"""A fixed override's value: a scalar or a list of scalars."""

_MODEL = ConfigDict(extra="forbid", frozen=True)

#: What each trainer's own section (``TrainerKind.section``) holds, for the error that names it missing.
_SECTION_HINT = {
    "replay": "the log to play back: add `replay: {trace: PATH}` (a verl jsonl, console log, W&B CSV or Tune "
              "progress.csv)",
    "tabular": "the table to serve: add `tabular: {table: PATH}` (a file written by benchmarks/tabular/generate.py)",
}

Condition = dict[str, OverrideValue]


class _Param(BaseModel):
    model_config = _MODEL

    when: Condition | None = Field(
        None,
        description="sample this parameter only in trials where each key (verl key, alias, or an earlier parameter) "
        "has the given value (or one of the given list of values)",
    )


class Choice(_Param):
    """``{values: [a, b, c]}``: a categorical choice (Optuna ``suggest_categorical``)."""

    values: list[Scalar] = Field(min_length=1, description="the values to choose from (W&B `values`)")

    @field_validator("values")
    @classmethod
    def _distinct(cls, values: list[Scalar]) -> list[Scalar]:
        seen = [repr(v) for v in values]
        if len(set(seen)) != len(seen):
            raise ValueError(f"values {values} repeat an entry: list each value once")
        return values


class Constant(_Param):
    """``{value: x}``: one value for every trial (W&B `value`), recorded in each trial's parameters."""

    value: Scalar = Field(description="the value every trial gets")


DISTRIBUTIONS = ("uniform", "log_uniform_values", "int_uniform", "q_uniform")


class Range(_Param):
    """``{distribution: D, min: a, max: b}``: a numeric range (W&B distributions, in real units).

    ``log_uniform`` is refused. W&B reads its min/max as natural-log exponents (``e^min`` to ``e^max``). Users of
    Optuna (``suggest_float(log=True)``) or Ray Tune (``tune.loguniform``) expect real units. The error gives both
    fixes: ``log_uniform_values`` with these bounds, or with ``exp`` of them. Without ``distribution``, W&B's rule
    applies: ``int_uniform`` when min and max are both integers, else ``uniform``.
    """

    distribution: Literal["uniform", "log_uniform_values", "int_uniform", "q_uniform"] = Field(
        "uniform",
        description="uniform | log_uniform_values (log scale, min/max in real units, as W&B's log_uniform_values "
        "and Optuna's log=True) | int_uniform | q_uniform (uniform on a grid of step q)",
    )
    min: float = Field(allow_inf_nan=False, description="lower bound, inclusive (a finite number)")
    max: float = Field(allow_inf_nan=False, description="upper bound, inclusive (a finite number)")
    q: float | None = Field(None, gt=0, allow_inf_nan=False, description="grid step of q_uniform (default 1)")

    @model_validator(mode="before")
    @classmethod
    def _w_and_b_names(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if data.get("distribution") == "log_uniform":
            raise ValueError(_log_uniform_fix(data.get("min"), data.get("max")))
        if "distribution" not in data:
            both_int = all(type(data.get(k)) is int for k in ("min", "max"))
            data["distribution"] = "int_uniform" if both_int else "uniform"
        return data

    @model_validator(mode="after")
    def _bounds(self) -> Range:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must be below max ({self.max}): swap them: min: {self.max}, "
                             f"max: {self.min}")
        if self.min == self.max:
            raise ValueError(f"min and max are both {self.min}: a range needs min below max; for one value "
                             f"write {{value: {self.min}}}")
        if self.distribution == "log_uniform_values" and self.min <= 0:
            raise ValueError(
                f"log_uniform_values needs min > 0 but got min={self.min}: klsweep reads min/max in real units "
                f"(W&B's log_uniform_values), e.g. min: 0.0001, max: 0.01"
            )
        if self.distribution == "int_uniform" and not (self.min.is_integer() and self.max.is_integer()):
            raise ValueError(f"int_uniform needs integer bounds but got min={self.min}, max={self.max}: use whole "
                             "numbers, or distribution: uniform")
        if self.q is not None and self.distribution != "q_uniform":
            raise ValueError(f"q is only used by distribution q_uniform, not {self.distribution}: remove q")
        return self


def _log_uniform_fix(low: Any, high: Any) -> str:
    """The refusal of W&B's ambiguous ``log_uniform``, with both readings of the bounds the user wrote."""
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (low, high))
    exponents = ""
    if numbers and max(abs(low), abs(high)) < 700:  # exp() of larger numbers overflows a float
        exponents = f" (min: {math.exp(low):.4g}, max: {math.exp(high):.4g} for these bounds)"
    return ("distribution log_uniform is ambiguous: W&B reads its min/max as natural-log exponents (e^min to e^max), "
            "Optuna's log=True and Ray Tune's loguniform as real values. Write `distribution: log_uniform_values` "
            "with min/max in real units (e.g. min: 0.0001, max: 0.01 for a KL coefficient); if you meant W&B's "
            f"exponents, log_uniform_values with min: exp(min), max: exp(max){exponents}")


def _param_kind(data: Any) -> str | None:
    if isinstance(data, dict):
        for key, kind in (("values", "values"), ("value", "value"), ("distribution", "range"), ("min", "range")):
            if key in data:
                return kind
        return "range" if "max" in data else None
    kinds: dict[type, str] = {Choice: "values", Constant: "value", Range: "range"}
    return kinds.get(type(data))


Parameter = Annotated[
    Union[Annotated[Choice, Tag("values")], Annotated[Constant, Tag("value")], Annotated[Range, Tag("range")]],
    Discriminator(
        _param_kind,
        custom_error_type="parameter_kind",
        custom_error_message="a parameter is a mapping with `values: [...]`, `value: x`, or `distribution` with "
        "`min` and `max`",
    ),
]


class Objective(BaseModel):
    """One metric to optimise, with verl's metric name (e.g. ``val-core/arith/acc/mean@1``)."""

    model_config = _MODEL

    metric: str = Field(min_length=1, description="verl metric name reported by every trial")
    mode: Literal["max", "min"] = Field(description="max or min (Ray Tune's names; Optuna's maximize and minimize "
                                        "are read as them)")

    @field_validator("mode", mode="before")
    @classmethod
    def _optuna_direction(cls, value: Any) -> Any:
        return {"maximize": "max", "minimize": "min"}.get(value, value) if isinstance(value, str) else value


SAMPLERS = ("tpe", "gp", "nsga2", "random", "grid", "cmaes")


class Sampler(BaseModel):
    """Optuna sampler choice; the orchestrator builds it (seeded with the sweep seed)."""

    model_config = _MODEL

    name: Literal["tpe", "gp", "nsga2", "random", "grid", "cmaes"] = Field(
        "tpe", description="tpe | gp | nsga2 | random | grid | cmaes (Optuna's TPESampler, GPSampler, ...)"
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="keyword arguments of the Optuna sampler, e.g. {n_startup_trials: 4}"
    )

    @model_validator(mode="before")
    @classmethod
    def _short_form(cls, data: Any) -> Any:
        return {"name": data} if isinstance(data, str) else data


class Scheduler(BaseModel):
    """Ray Tune trial scheduler: none (FIFO) or ASHA (single objective only)."""

    model_config = _MODEL

    type: Literal["none", "asha"] = Field("none", description="none | asha")
    grace_period: int = Field(10, ge=1, description="ASHA: steps every trial runs before it can be stopped")
    reduction_factor: float = Field(3.0, gt=1, description="ASHA: keep 1/reduction_factor of trials per rung")

    @model_validator(mode="before")
    @classmethod
    def _short_form(cls, data: Any) -> Any:
        return {"type": data} if isinstance(data, str) else data


class ObjectiveStop(BaseModel):
    """``stopping.objective``: stop a trial its peers beat by more than the noise (the rule and its sources:
    :mod:`klsweep.orchestrate.objective_stop`). ``objective: on`` takes every default."""

    model_config = _MODEL

    min_peers: int = Field(3, ge=1, description="other trials that must have reached a step before a trial is "
                           "judged at it")
    dominated_by: int = Field(3, ge=1, description="how many of them must beat the trial by the margin on every "
                              "objective to stop it")
    margin: float = Field(4.0, gt=0, allow_inf_nan=False, description="the margin, in noise standard deviations of "
                          "a difference of two values (the noise is estimated from the curves seen)")
    grace: float = Field(0.2, ge=0, lt=1, description="fraction of budget.max_steps every trial runs")
    window: int = Field(2, ge=1, description="a trial's last values averaged into its value at a step (1: raw)")
    min_diffs: int = Field(8, ge=2, description="step-to-step differences of the curves needed before the noise "
                           "is estimated and any trial stopped")

    @model_validator(mode="after")
    def _peers(self) -> ObjectiveStop:
        if self.dominated_by > self.min_peers:
            raise ValueError(f"stopping.objective.dominated_by ({self.dominated_by}) exceeds min_peers "
                             f"({self.min_peers}): no trial could ever be stopped; lower dominated_by or raise "
                             "min_peers")
        return self


class MedianStop(BaseModel):
    """``stopping.median``: stop a trial below the median of the trials that finished healthy, at the same step (the
    rule and its calibration: :mod:`klsweep.orchestrate.median_stop`). ``median: on`` takes every default."""

    model_config = _MODEL

    margin: float = Field(0.08, ge=0, allow_inf_nan=False, description="how far below that median a trial must be "
                          "on every objective, as a fraction of the median's magnitude")
    min_finished: int = Field(3, ge=1, description="trials that must have finished healthy before any is stopped")


class FateStop(BaseModel):
    """``stopping.fate``: stop a trial whose path is past every trial that finished healthy and at least as far as the
    trials the health rules stopped, before its validation shows it (the rule and its calibration:
    :mod:`klsweep.orchestrate.fate_stop`). ``fate: on`` takes every default."""

    model_config = _MODEL

    signals: list[Literal["kl", "proxy_gap"]] = Field(
        ["kl", "proxy_gap"], min_length=1, description="paths compared, each where a trial logs it, every one past "
        "to stop: kl (the reference KL of the sweep's KL placement), proxy_gap (training score − gold score)")
    margin: float = Field(0.1, ge=0, allow_inf_nan=False, description="how far above the highest path of the trials "
                          "that finished healthy a trial's path must be, as a fraction of that value (before any "
                          "did, at or above the stopped trials' median path is enough)")
    grace: float = Field(0.1, ge=0, lt=1, description="fraction of budget.max_steps every trial runs")
    window: int = Field(3, ge=1, description="steps averaged into a path's value at a step")
    min_finished: int = Field(0, ge=0, description="trials that must have finished healthy before any is stopped")


#: The stoppers of ``stopping:`` by their field name.
_STOPPERS: dict[str, type[BaseModel]] = {"objective": ObjectiveStop, "median": MedianStop, "fate": FateStop}


class Stopping(BaseModel):
    """Early stopping besides the health rules (``health:``): ``objective``, ``median`` and ``fate`` (each off unless
    given)."""

    model_config = _MODEL

    objective: ObjectiveStop | None = Field(
        None, description="stop trials that cannot become competitive: on | off | {min_peers, dominated_by, margin, "
        "grace, window, min_diffs}")
    median: MedianStop | None = Field(
        None, description="stop trials below the median of the trials that finished healthy: on | off | {margin, "
        "min_finished}")
    fate: FateStop | None = Field(
        None, description="stop trials heading where the health rules stopped others: on | off | {signals, margin, "
        "grace, window, min_finished}")

    @field_validator("objective", "median", "fate", mode="before")
    @classmethod
    def _switch(cls, value: Any) -> Any:
        if value is True or value == "on":
            return {}
        if value is False or value == "off":
            return None
        return value

    @model_validator(mode="before")
    @classmethod
    def _nested(cls, data: Any) -> Any:
        """A stopper's setting given flat under ``stopping:`` is an error that names every stopper taking it. Its
        example nests it under the stoppers the file turns on that take it (else under every one that does)."""
        flat = sorted(k for k in data if any(k in m.model_fields for m in _STOPPERS.values())) \
            if isinstance(data, dict) else []
        if not flat:
            return data
        takers = {k: [name for name, model in _STOPPERS.items() if k in model.model_fields] for k in flat}
        taking = [name for name in _STOPPERS if any(name in names for names in takers.values())]
        shown = [name for name in taking if data.get(name) not in (None, False, "off")] or taking
        nested = ", ".join(f"{name}: {{{', '.join(f'{k}: {v}' for k, v in _settings(data, name, flat).items())}}}"
                           for name in shown)
        if len(flat) == 1:
            names = takers[flat[0]]
            head = f"{flat[0]} is a setting of the {_and(names)} stopper{'s' * (len(names) > 1)}"
            nest = "nest it under the stopper it is for"
        else:
            head = (f"{', '.join(flat)} are settings of the stoppers ("
                    f"{'; '.join(f'{k}: {_and(names)}' for k, names in takers.items())})")
            nest = "nest each under the stopper it is for"
        own = ", each with its own" if any(len(names) > 1 for names in takers.values()) else ""
        raise ValueError(f"{head}{own}: {nest}, e.g. stopping: {{{nested}}}{_defaults(takers)}")


def _defaults(takers: dict[str, list[str]]) -> str:
    """Each stopper's default of a flat setting that differs among the stoppers taking it (``margin``: noise
    standard deviations for the objective stopper, a fraction for median and fate), so that one value copied into
    every stopper of the example is not taken for right in each."""
    parts = []
    for key, names in takers.items():
        defaults = {name: _STOPPERS[name].model_fields[key].default for name in names}
        if len(set(map(repr, defaults.values()))) > 1:
            parts.append(f"{key}: " + ", ".join(f"{name} {value}" for name, value in defaults.items()))
    return f" (defaults differ, so choose each: {'; '.join(parts)})" if parts else ""


def _settings(data: dict, name: str, flat: list[str]) -> dict[str, Any]:
    """The settings of stopper ``name`` with the ``flat`` ones it takes nested in: what the fix of a flat setting
    shows."""
    own = data.get(name)
    return {**(own if isinstance(own, dict) else {}), **{k: data[k] for k in flat if k in _STOPPERS[name].model_fields}}


def _and(names: list[str]) -> str:
    """``["a"]`` → ``a``; ``["a", "b", "c"]`` → ``a, b and c``."""
    return " and ".join([", ".join(names[:-1]), names[-1]]) if len(names) > 1 else names[0]


class Resources(BaseModel):
    """What Ray reserves for one trial."""

    model_config = _MODEL

    cpu: float = Field(1.0, ge=0, description="CPUs per trial (verl's own Ray reserves 3 per GPU + 9)")
    gpu: float = Field(0.0, ge=0, description="GPUs per trial (should equal trainer.nnodes × n_gpus_per_node)")


class Confirm(BaseModel):
    """``budget.confirm``: after the search, re-run its leaders with new training seeds (``data.seed``) and rank
    them by the mean over seeds (:mod:`klsweep.orchestrate.confirm_search`). Off unless given."""

    model_config = _MODEL

    top: int = Field(3, ge=1, description="leaders to re-run: the best healthy trials by the (first) objective; "
                     "in a Pareto sweep the front's trials first")
    seeds: int = Field(2, ge=1, description="new training seeds per leader (data.seed = the sweep's seed + 1, + 2, "
                       "...); with the search run each leader has seeds + 1 runs")
    preset: bool = Field(True, description="also re-run the seed trial (the preset, trial 0), when it ended healthy, "
                         "so the winner is compared with it over the same seeds")


class Budget(BaseModel):
    """How much the sweep may run."""

    model_config = _MODEL

    trials: int = Field(16, ge=1, description="number of trials (seed trials included)")
    max_concurrent: int = Field(2, ge=1, description="trials running at once")
    max_steps: int = Field(80, ge=1, description="training steps per trial (verl trainer.total_training_steps)")
    resources: Resources = Field(default_factory=Resources, description="resources per trial")
    trial_timeout_s: float | None = Field(
        None, gt=0, allow_inf_nan=False,
        description="wall-clock limit of one trial in seconds (None: no limit); for process trainers (trainer: verl), "
        "whose start-up can hang and hold the trial's GPUs for good. A trial past it ends with its whole process tree "
        "and is recorded FAIL, its error saying 'timed out after N s'. Size it for the whole run, start-up included: "
        "verl's checkpoint steps take ~10x a normal step (~2,500 s against ~170 s in verl's GRPO reference log)",
    )
    confirm: Confirm | None = Field(
        None, description="re-run the leaders with new training seeds after the search, e.g. {top: 3, seeds: 2} "
        "(None: off); the runs are trials of the same study, marked confirm_of",
    )


class Wandb(BaseModel):
    """Weights & Biases logging, one W&B run per trial; off by default, and never blocks a sweep (Search-R1#141)."""

    model_config = _MODEL

    project: str | None = Field(None, description="W&B project (default: the sweep name)")
    entity: str | None = Field(None, description="W&B entity (team or user)")
    mode: Literal["disabled", "offline", "online"] = Field("disabled", description="disabled | offline | online")


class Replay(BaseModel):
    """``trainer: replay``: the recorded training log every trial plays back, one Tune report per logged step
    (:class:`klsweep.trainers.replay.ReplayTrainer`), to try health rules and the orchestrator on a real run."""

    model_config = _MODEL

    trace: str = Field(
        min_length=1,
        description="the log to play back: verl file-logger jsonl, verl console log, W&B CSV export, Ray Tune "
        "progress.csv or result.json (a relative path: from the sweep file's folder, else the working directory)",
    )
    speed: float = Field(
        0.0, ge=0, allow_inf_nan=False,
        description="training steps per second of playback (gaps between logged steps included); "
        "0 plays as fast as possible",
    )
    run: str | None = Field(
        None, min_length=1,
        description="the run to play back when the log holds several (a W&B CSV export of a sweep): its name as in "
        "the export's column headers",
    )


class Tabular(BaseModel):
    """``trainer: tabular``: the tabular benchmark table each trial is served from, the recorded embedded run of the
    nearest grid point and the trial's ``data.seed`` (:class:`klsweep.trainers.tabular.TabularTrainer`)."""

    model_config = _MODEL

    table: str = Field(
        min_length=1,
        description="the table file written by benchmarks/tabular/generate.py (benchmarks/tabular/<sweep>.jsonl.gz; "
        "a relative path: from the sweep file's folder, else the working directory)",
    )


class Sweep(BaseModel):
    """A whole sweep file."""

    model_config = _MODEL

    name: str = Field(
        min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$", description="sweep name, used for runs/<name>/"
    )
    algorithm: Literal["ppo", "grpo", "drgrpo"] = Field(
        description="ppo (GAE + critic, KL in reward) | grpo (KL in the loss) | drgrpo (grpo, no std norm, "
        "seq-mean-token-sum-norm, no KL)"
    )
    trainer: TrainerName = Field(
        "embedded", description="embedded (CPU trainer in klsweep) | verl (verl.trainer.main_ppo on GPU nodes) | "
        "replay (plays back the log in `replay`) | tabular (serves the table in `tabular`)"
    )
    replay: Replay | None = Field(None, description="trainer replay: {trace: PATH, speed: steps per second}")
    tabular: Tabular | None = Field(None, description="trainer tabular: {table: PATH} (a recorded benchmark table)")
    kl_placement: Literal["loss", "reward", "none", "both"] | None = Field(
        None,
        description="where the KL to the reference acts: loss (actor.use_kl_loss) | reward (algorithm."
        "use_kl_in_reward) | none | both (explicit opt-in). Default: reward for ppo, loss for grpo, none for drgrpo",
    )
    allow_negative_kl: bool = Field(False, description="allow negative KL coefficients (refused by default)")
    overrides: dict[str, OverrideValue] = Field(
        default_factory=dict, description="fixed verl overrides for every trial, flat dotted keys"
    )
    search_space: str | None = Field(
        None, description="a search space (name, with or without .yaml, or path) whose `parameters` are included; "
        "this file's win. Looked for next to the sweep file, in the working directory, then in search_spaces/"
    )
    parameters: dict[str, Parameter] = Field(
        default_factory=dict, description="searched parameters, W&B style, keyed by verl key or alias"
    )
    seed_trials: list[dict[str, Scalar]] = Field(
        default_factory=list, description="parameter values enqueued before sampling (the seed preset first)"
    )
    objective: list[Objective] = Field(
        min_length=1, description="metric + mode, or a list of them for a multi-objective (Pareto) sweep"
    )
    sampler: Sampler = Field(default_factory=Sampler, description="Optuna sampler")
    scheduler: Scheduler = Field(default_factory=Scheduler, description="Ray Tune scheduler")
    budget: Budget = Field(default_factory=Budget, description="trials, concurrency, steps and resources")
    stopping: Stopping = Field(default_factory=Stopping, description="early stopping besides the health rules: "
                               "{objective, median, fate}, each on | off | its settings")
    health: HealthConfig = Field(
        default_factory=HealthConfig, description="health rules: a preset name or {preset, rules, builtin}"
    )
    seed: int = Field(0, ge=0, description="seed of the sampler and of every trial (verl data.seed)")
    wandb: Wandb = Field(default_factory=Wandb, description="W&B logging (default disabled)")
    launcher: Literal["local", "ray-cluster", "kuberay", "slurm"] = Field(
        "local", description="launch profile: local | ray-cluster | kuberay | slurm"
    )

    _source: str | None = PrivateAttr(None)
    _where: dict[tuple[str, ...], str] = PrivateAttr(default_factory=dict)
    _warnings: tuple[str, ...] = PrivateAttr(())

    @property
    def objectives(self) -> list[Objective]:
        """The objective(s) as a list (one entry for a single-objective sweep)."""
        return self.objective

    @property
    def source(self) -> str | None:
        """Path of the sweep file it was loaded from (None when built in code)."""
        return self._source

    @property
    def warnings(self) -> tuple[str, ...]:
        """Warnings found when loading (one line each, with file and line)."""
        return self._warnings

    def where(self, *path: Any) -> str | None:
        """``FILE:LINE`` (or ``command line 'k=v'``) of the field at ``path`` or its nearest parent, if known."""
        parts = tuple(str(p) for p in path)
        for n in range(len(parts), 0, -1):
            if parts[:n] in self._where:
                return self._where[parts[:n]]
        return self._source

    @property
    def placement(self) -> str:
        """kl_placement with the algorithm's default filled in."""
        return self.kl_placement or {"ppo": "reward", "grpo": "loss", "drgrpo": "none"}[self.algorithm]

    @functools.cached_property
    def parameter_keys(self) -> dict[str, str]:
        """Each parameter's name → its verl key, aliases resolved for :attr:`placement`, in file order.

        Raises:
            ValueError: an alias has no live key under the placement (a loaded sweep has none).
        """
        return {name: resolve_key(name, self.placement) for name in self.parameters}

    @property
    def kind(self) -> TrainerKind:
        """The trainer's row of :data:`klsweep.trainers.TRAINERS` (how its trials run, restart and resume)."""
        return trainer_kind(self.trainer)

    @functools.cached_property
    def ruleset(self) -> RuleSet:
        """The health rule set ``health`` names (its preset, rules and built-in settings), loaded once."""
        return load_ruleset(self.health)

    @field_validator("objective", mode="before")
    @classmethod
    def _one_objective(cls, value: Any) -> Any:
        return [value] if isinstance(value, dict) else value

    @field_validator("objective")
    @classmethod
    def _distinct_objectives(cls, value: list[Objective]) -> list[Objective]:
        names = [o.metric for o in value]
        if len(set(names)) != len(names):
            raise ValueError(f"objective metrics repeat ({', '.join(names)}): list each metric once")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Sweep:
        if len(self.objectives) > 1 and self.scheduler.type == "asha":
            raise ValueError(
                "scheduler asha needs a single objective but the sweep has "
                f"{len(self.objectives)} (multi-objective studies cannot prune: optuna#5260). "
                "Use scheduler: none; health rules still stop sick trials"
            )
        if self.scheduler.type == "asha" and self.scheduler.grace_period > self.budget.max_steps:
            raise ValueError(
                f"scheduler.grace_period {self.scheduler.grace_period} is above budget.max_steps "
                f"{self.budget.max_steps}: ASHA's first rung would come after a trial's last step (Ray's ASHA "
                "refuses grace_period > max_t). Lower scheduler.grace_period or raise budget.max_steps"
            )
        needed = self.kind.section
        if needed is not None and getattr(self, needed) is None:
            raise ValueError(f"trainer {self.trainer} needs {_SECTION_HINT[needed]}")
        for section in _SECTION_HINT:
            if section != needed and getattr(self, section) is not None:
                raise ValueError(f"{section} is only read by trainer: {section}, but trainer is {self.trainer}: set "
                                 f"trainer: {section} or remove the {section} section")
        if len(self.seed_trials) > self.budget.trials:
            raise ValueError(
                f"seed_trials has {len(self.seed_trials)} entries but budget.trials is {self.budget.trials}: "
                "raise budget.trials or drop seed trials"
            )
        return self
