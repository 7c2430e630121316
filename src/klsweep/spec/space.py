"""A sweep's parameters as an Optuna define-by-run search space, and each trial's full verl override dict.

Optuna parameter names are the resolved verl keys (``actor_rollout_ref.actor.kl_loss_coef``, never the alias), so
the study, Ray Tune's trial config and ``seed_trials`` all speak verl. Ray's OptunaSearch splits names only at ``/``,
so dotted keys stay flat in the Tune config.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from klsweep.errors import SweepFileError
from klsweep.spec.schema import Choice, Constant, Parameter, Range, Sweep
from klsweep.verl.config import with_engine
from klsweep.verl.presets import preset_overrides, resolve_key

#: The override that carries a trial's training seed (verl's ``data.seed``; the embedded trainer's too).
SEED_KEY = "data.seed"


def parameters(sweep: Sweep) -> dict[str, Parameter]:
    """The sweep's parameters keyed by resolved verl key, in file order (aliases resolved for its kl_placement).

    Assumes a sweep that passed :func:`klsweep.spec.load.load_sweep` (alias errors are reported there).
    """
    return {sweep.parameter_keys[name]: p for name, p in sweep.parameters.items()}


def condition(sweep: Sweep, when: Mapping[str, Any] | None) -> dict[str, list[Any]]:
    """A ``when`` mapping with resolved keys and list values: ``{verl_key: [allowed values]}``."""
    if not when:
        return {}
    return {resolve_key(k, sweep.placement): (v if isinstance(v, list) else [v]) for k, v in when.items()}


def fixed_overrides(sweep: Sweep) -> dict[str, Any]:
    """The overrides every trial shares (``trial_overrides`` with no parameters): the algorithm preset (every knob
    of :data:`klsweep.verl.presets.KNOBS`), the sweep's fixed ``overrides`` and the launcher keys."""
    return trial_overrides(sweep, {})


def _loggers(overrides: Mapping[str, Any]) -> list[Any]:
    asked = overrides.get("trainer.logger")
    return [] if asked is None else [asked] if isinstance(asked, str) else list(asked) \
        if isinstance(asked, (list, tuple)) else [asked]


def wandb_logger_problem(overrides: Mapping[str, Any]) -> str | None:
    """Why a sweep's ``trainer.logger`` override may not name ``wandb`` (:func:`launcher_overrides`), or None."""
    asked = _loggers(overrides)
    if not any(str(backend) in ("wandb", "tracking") for backend in asked):  # verl/utils/tracking.py: wandb.init
        return None
    return (f"{asked!r} includes wandb: verl would call wandb.init itself in every trial, without the sweep's "
            "WANDB_MODE and WANDB_DIR (an offline or keyless trial fails at start) and beside the sweep's own W&B run "
            "(two runs per trial). klsweep logs one W&B run per trial, grouped by the sweep, with the trial's verl "
            "overrides as its config: remove wandb from trainer.logger (console and file are always on) and set the "
            "sweep field `wandb: {mode: offline}` (or online, with project and entity)")


def launcher_overrides(sweep: Sweep) -> dict[str, Any]:
    """Trial-independent keys every trial needs: ``trainer.logger``, ``trainer.total_training_steps`` from
    budget.max_steps, ``trainer.project_name`` and ``data.seed``.

    ``trainer.logger`` is ``[console, file]``: verl's console line, and the file logger the launcher reads through
    ``$VERL_FILE_LOGGER_PATH``. Any other backend the sweep's ``overrides`` name follows, but never ``wandb``,
    whatever ``wandb.mode`` is. With ``wandb`` (or its deprecated name ``tracking``), verl's ``Tracking`` calls
    ``wandb.init`` itself in the trial (verl/utils/tracking.py). It does so without the sweep's ``WANDB_MODE`` and
    ``WANDB_DIR``, so an offline or keyless trial fails at start. It also runs beside the sweep's own W&B run: two
    runs per trial. The one W&B run of a trial is the sweep's Ray Tune callback
    (:mod:`klsweep.orchestrate.wandb_logging`), set by the sweep field ``wandb:``.

    Raises:
        SweepFileError: the sweep's ``overrides`` put ``wandb`` in ``trainer.logger``; the message names ``wandb:``.
    """
    logger = ["console", "file"]
    problem = wandb_logger_problem(sweep.overrides)
    if problem:
        where = sweep.where("overrides", "trainer.logger")
        raise SweepFileError([f"{where + ': ' if where else ''}overrides.trainer.logger: {problem}"])
    logger += [b for b in dict.fromkeys(map(str, _loggers(sweep.overrides))) if b not in logger]
    return {
        "trainer.logger": logger,
        "trainer.total_training_steps": sweep.budget.max_steps,
        "trainer.project_name": sweep.wandb.project or sweep.name,
        SEED_KEY: sweep.seed,
    }


def define_space(sweep: Sweep) -> SearchSpace:
    """The Optuna define-by-run function of ``sweep`` (a picklable :class:`SearchSpace`, as Ray Tune saves the
    searcher's state)."""
    params = parameters(sweep)
    return SearchSpace(params, fixed_overrides(sweep), {key: condition(sweep, p.when) for key, p in params.items()})


class SearchSpace:
    """``space(trial) -> dict`` of the constants (``value:`` parameters): a define-by-run function.

    Parameters are suggested in file order. A parameter with ``when`` is suggested only when each condition key's
    value is one of the allowed values; that value is an earlier suggested parameter's, else the fixed overrides'.
    Works with ``optuna.Trial`` and with Ray Tune's ``OptunaSearch(space=...)``.
    """

    def __init__(self, params: Mapping[str, Parameter], fixed: Mapping[str, Any],
                 conditions: Mapping[str, Mapping[str, list[Any]]]):
        self.params, self.fixed, self.conditions = dict(params), dict(fixed), dict(conditions)

    def __call__(self, trial) -> dict[str, Any]:
        chosen: dict[str, Any] = {}
        constants: dict[str, Any] = {}
        for key, p in self.params.items():
            current = {**self.fixed, **chosen}
            if any(current.get(k) not in allowed for k, allowed in self.conditions[key].items()):
                continue
            if isinstance(p, Constant):
                constants[key] = chosen[key] = p.value
            else:
                chosen[key] = suggest(trial, key, p)
        return constants


def suggest(trial, name: str, p: Choice | Range) -> Any:
    """One Optuna suggestion for a W&B-style parameter (log_uniform_values → ``suggest_float(log=True)``)."""
    if isinstance(p, Choice):
        return trial.suggest_categorical(name, p.values)
    if p.distribution == "int_uniform":
        return trial.suggest_int(name, int(p.min), int(p.max))
    if p.distribution == "log_uniform_values":
        return trial.suggest_float(name, p.min, p.max, log=True)
    if p.distribution == "q_uniform":
        return trial.suggest_float(name, p.min, p.max, step=p.q or 1.0)
    return trial.suggest_float(name, p.min, p.max)


def trial_overrides(sweep: Sweep, params: Mapping[str, Any]) -> dict[str, Any]:
    """The full flat verl override dict of one trial: preset, fixed overrides, launcher keys, then ``params``.

    Args:
        params: the trial's parameter values keyed by verl key or alias (Optuna's ``trial.params`` plus the
            constants :func:`define_space` returned, or a Ray Tune trial config).

    Every knob of :data:`klsweep.verl.presets.KNOBS` is present. Its value is the trial's, else the sweep's fixed
    override, else the trainer's default (``TrainerKind.defaults``), else the preset's, else verl's. Interpolated
    verl defaults follow the trial's values: ``critic.ppo_epochs`` follows ``actor_rollout_ref.actor.ppo_epochs``.
    A ``data.seed`` in ``params`` wins over the sweep's ``seed``; it is a confirmation run's new training seed
    (:mod:`klsweep.orchestrate.confirm_search`). A sweep that asks for verl's Megatron actor
    (``actor_rollout_ref.actor.strategy: megatron``) gets ``model_engine: megatron`` first
    (:func:`klsweep.verl.config.with_engine`): verl's Megatron keys exist only in that config group.
    """
    resolved = {resolve_key(k, sweep.placement): v for k, v in params.items()}
    user = {**sweep.overrides, **resolved}
    defaults = sweep.kind.defaults(user)
    preset = preset_overrides(sweep.algorithm, sweep.placement, base={**defaults, **user})
    seed = {SEED_KEY: resolved[SEED_KEY]} if SEED_KEY in resolved else {}
    return with_engine({**preset, **user, **launcher_overrides(sweep), **seed})


def seed_params(sweep: Sweep) -> list[dict[str, Any]]:
    """``seed_trials`` with keys resolved to verl keys, for ``study.enqueue_trial`` / ``points_to_evaluate``."""
    return [{resolve_key(k, sweep.placement): v for k, v in seed.items()} for seed in sweep.seed_trials]


def key_locations(sweep: Sweep) -> dict[str, str]:
    """verl key → ``FILE:LINE`` of the sweep-file entry that sets it (fixed override or parameter), for messages."""
    out = {key: sweep.where("overrides", key) for key in sweep.overrides}
    for name in sweep.parameters:
        out[sweep.parameter_keys[name]] = sweep.where("parameters", name)
    return {k: v for k, v in out.items() if v}
