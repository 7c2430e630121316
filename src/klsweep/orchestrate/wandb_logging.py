"""W&B: one run per trial, grouped by sweep, with the trial's verl overrides as its config.

Each run is named ``<sweep> #<Optuna trial number> <parameter>=<value> ...`` (its id stays the Ray Tune trial id),
tagged with the sweep name, algorithm and trainer, and its config carries ``trial_number``, the searched parameters
(``searched``) and, updated with every result, the health verdict (``health``), the stop reason (``stop_reason``)
and kind (``stop_kind``) the health stopper writes: W&B keeps only numbers in a run's history, so these strings would
otherwise never reach it.

Ray Tune's ``WandbLoggerCallback`` does the logging from its own actor, so W&B never blocks a trial; offline mode is
the default when W&B is on (wandb#2812: several trials in one W&B run; Search-R1#141: offline W&B on many nodes).
``WANDB_API_KEY`` is read from the environment by wandb itself and never written to any klsweep file.

This callback is the one W&B run of a trial. verl's own W&B logger stays off in every trial (``trainer.logger`` is
``[console, file]``, :func:`klsweep.space.launcher_overrides`, which refuses ``wandb`` in a sweep's ``overrides``):
with it, verl's ``Tracking`` calls ``wandb.init`` in the trial process (verl/utils/tracking.py) without this
callback's mode and directory, so an offline or keyless trial fails at start and an online one makes a second run.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

from ray.air.integrations.wandb import WandbLoggerCallback, _WandbLoggingActor

from klsweep._format import param_labels, short
from klsweep.results import ATTR_RAY_TRIAL_ID, HEALTH, STOP_KIND, STOP_REASON


class _FlushingWandbLoggingActor(_WandbLoggingActor):
    """Ray's W&B logging actor, which also waits for W&B's service process to write the run file before it returns.

    ``wandb.finish`` returns before wandb-core has flushed the run (ray/air/integrations/wandb.py ends the actor
    right after it): on a loaded machine an offline run file was left with its 7-byte header only.
    ``wandb.teardown`` waits for the service to finish every stream.
    """

    def run(self):
        try:
            super().run()
        finally:
            self._wandb.teardown()


class VerlWandbCallback(WandbLoggerCallback):
    """``WandbLoggerCallback`` whose run config is the trial's full verl override dict (not Optuna's params), its
    trial number and searched parameters, with a readable run name and the health verdict and stop reason.

    Args:
        overrides_of: params → verl overrides (:func:`klsweep.space.trial_overrides` bound to the sweep).
        params: the searched verl keys (:func:`klsweep.space.parameters`), named in the run name by their leaf.
        **kwargs: ``WandbLoggerCallback`` arguments (project, group, entity, mode, tags, ...).
    """

    _logger_actor_cls = _FlushingWandbLoggingActor
    #: result keys W&B gets as config (updated with every result), not as history: strings are dropped there
    AUTO_CONFIG_KEYS = [*WandbLoggerCallback.AUTO_CONFIG_KEYS, HEALTH, STOP_REASON, STOP_KIND]

    def __init__(self, overrides_of, params: list[str] | None = None, **kwargs):
        super().__init__(**kwargs)
        self._overrides_of = overrides_of
        self._params = params or []

    def setup(self, *args, **kwargs) -> None:
        # Ray asks for an API key unless the WANDB_MODE variable says offline: an offline sweep needs none.
        if self.kwargs.get("mode") in ("offline", "disabled"):
            os.environ["WANDB_MODE"] = self.kwargs["mode"]
        super().setup(*args, **kwargs)

    def log_trial_start(self, trial) -> None:
        # WandbLoggerCallback passes self.kwargs to wandb.init after its own arguments, so these win.
        number = _optuna_number(trial)
        searched = {label: trial.config.get(key) for key, label in param_labels(self._params).items()}
        self.kwargs["config"] = {**self._overrides_of(trial.config), "trial_number": number, "searched": searched}
        self.kwargs["name"] = " ".join([f"{self.group} #{trial.trial_id if number is None else number}",
                                        *(f"{label}={short(value)}" for label, value in searched.items())])
        super().log_trial_start(trial)


def _optuna_number(trial) -> int | None:
    """The Optuna trial number of a Tune trial (the searcher tags it with the Tune trial id when it suggests it), from
    the study of the sweep directory the trial's Tune experiment is in; None when the study does not say."""
    from klsweep.analysis.load import study_of

    sweep_dir = Path(trial.storage.experiment_fs_path).parent
    for told in study_of(sweep_dir).get_trials(deepcopy=False):
        if told.user_attrs.get(ATTR_RAY_TRIAL_ID) == trial.trial_id:
            return told.number
    return None


def wandb_callback(sweep, out_dir: Path) -> VerlWandbCallback | None:
    """The W&B callback of ``sweep.wandb`` (project defaults to the sweep name, group = sweep name, tags = sweep name,
    algorithm, trainer), or None with a warning when ``mode: online`` has no credentials (W&B never stops a sweep).

    W&B run files go to ``$WANDB_DIR`` as the driver sees it, else to the sweep directory ``out_dir``
    (``out_dir/wandb/offline-run-*``): the logging actors are Ray workers, which do not inherit the driver's
    environment once Ray runs, and would otherwise write into their own working directory.
    """
    from klsweep.space import parameters, trial_overrides

    if sweep.wandb.mode == "online" and not _has_credentials():
        print("warning: wandb.mode is online but no W&B credentials were found (WANDB_API_KEY or `wandb login`): "
              "the sweep runs without W&B; use wandb.mode: offline to log locally and `wandb sync` later",
              file=sys.stderr)
        return None
    kwargs = {"project": sweep.wandb.project or sweep.name, "group": sweep.name, "mode": sweep.wandb.mode,
              "dir": os.environ.get("WANDB_DIR") or str(out_dir), "tags": [sweep.name, sweep.algorithm, sweep.trainer]}
    if sweep.wandb.entity:
        kwargs["entity"] = sweep.wandb.entity
    return VerlWandbCallback(functools.partial(trial_overrides, sweep), list(parameters(sweep)), **kwargs)


def _has_credentials() -> bool:
    import wandb

    try:
        return bool(wandb.login(prompt=False, verify=False))
    except Exception:  # a broken W&B setup is a warning, never a failed sweep
        return False
