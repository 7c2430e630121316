"""The Ray Tune ``Tuner`` of a sweep: searcher, scheduler, stoppers, callbacks and the trainable with its resources.

:func:`build_tuner` assembles one Tuner for the search or for the confirmation phase; :func:`trainable` is what a
restored experiment runs again.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
from ray import tune
from ray.tune import Callback
from ray.tune.schedulers import TrialScheduler
from ray.tune.stopper import Stopper

from klsweep.analysis.sweep_dir import storage_from_url
from klsweep.health import HealthStopper
from klsweep.launchers import multinode
from klsweep.orchestrate.asha import HealthAwareASHA
from klsweep.orchestrate.confirm_search import ConfirmSearch
from klsweep.orchestrate.fate_stop import FateStopper
from klsweep.orchestrate.live_trials_csv import TrialsCsv
from klsweep.orchestrate.median_stop import MedianStopper
from klsweep.orchestrate.objective_stop import ObjectiveStopper
from klsweep.orchestrate.progress import SweepProgress
from klsweep.orchestrate.remedy import overrides_of, remedies_on
from klsweep.orchestrate.remedy_tune import KeepRestartPoints, RemedyScheduler, checkpoint_config
from klsweep.orchestrate.result_json import ResultsFromCheckpoint
from klsweep.orchestrate.rule_stopper import StopperChain
from klsweep.orchestrate.samplers import build_sampler
from klsweep.orchestrate.searcher import KlsweepSearch
from klsweep.orchestrate.trainable import run_trial
from klsweep.results import TUNE_DIR, SweepRecord, result_rows
from klsweep.spec.space import SEED_KEY, define_space, parameters, seed_params, trial_overrides
from klsweep.trainers import trainer_kind

if TYPE_CHECKING:
    from klsweep.orchestrate.confirm_search import Phase
    from klsweep.spec.schema import Sweep


def build_tuner(sweep: Sweep, record: SweepRecord, out_dir: Path, *, num_samples: int, seed_trials: bool,
                quiet: bool, confirm: Phase | None = None) -> tune.Tuner:
    """The Tuner that runs ``num_samples`` trials of ``sweep`` into ``out_dir/tune``.

    ``seed_trials`` enqueues the sweep's seed trials first. With ``confirm``, the Tuner runs that confirmation
    phase's re-runs only: no ASHA and no objective stopping, each re-run is measured to its end.
    """
    objective = sweep.objectives[0]
    scheduler: TrialScheduler | None = None
    if sweep.scheduler.type == "asha" and confirm is None:  # a confirmation run is measured to the end, not raced
        scheduler = HealthAwareASHA(
            time_attr="training_iteration", metric=objective.metric, mode=objective.mode,
            max_t=sweep.budget.max_steps, grace_period=sweep.scheduler.grace_period,
            reduction_factor=sweep.scheduler.reduction_factor,
        )
    search = _searcher(sweep, record, out_dir, seed_trials=seed_trials, confirm=confirm)
    ruleset = sweep.ruleset
    retention: list[Callback] = []  # checkpoints: the newest alone (checkpoint_config), or the restart points too
    stopper: Stopper
    run_config_of = functools.partial(overrides_of if remedies_on(sweep) else trial_overrides, sweep)
    if remedies_on(sweep):
        retention = [KeepRestartPoints(sweep)]
        scheduler = remedies = RemedyScheduler(sweep, search)  # restarts the remedied trials
        stopper = HealthStopper(ruleset, run_config_of=run_config_of, remedies=remedies)
    else:  # under ASHA, or with health: {remedies: false}, a rule with a remedy stops as any other
        stopper = HealthStopper(ruleset, run_config_of=run_config_of)
    stoppers = [stopper]
    objectives = [(o.metric, o.mode) for o in sweep.objectives]
    if confirm is None:  # a confirmation run runs to the end
        # then trials heading where the health rules stopped others (it hears of those stops through the chain)
        if sweep.stopping.fate is not None:
            stoppers.append(FateStopper(objectives, sweep.budget.max_steps, sweep.placement, sweep.stopping.fate,
                                        run_config_of=run_config_of))
        # trials their peers beat by more than the noise
        if sweep.stopping.objective is not None:
            stoppers.append(ObjectiveStopper(objectives, sweep.budget.max_steps, sweep.stopping.objective))
        # and trials below the median of those that finished healthy
        if sweep.stopping.median is not None:
            stoppers.append(MedianStopper(objectives, sweep.budget.max_steps, sweep.stopping.median))
    stopper = StopperChain(*stoppers)
    if confirm is None:  # a Tuner that extends a sweep: its stoppers know the trials that ran before
        for result_json in sorted((out_dir / TUNE_DIR).glob("*/result.json")):
            if rows := result_rows(result_json):
                stopper.replay(str(rows[0].get("trial_id")), rows)
    callbacks: list[Callback] = [
        SweepProgress(num_samples, [o.metric for o in sweep.objectives], quiet=quiet,
                      params=[*parameters(sweep), *([SEED_KEY] if confirm is not None else [])]),  # a re-run's seed
        # result.json in the sweep directory as each row comes, without the steps a restart superseded
        ResultsFromCheckpoint(),
        TrialsCsv(),
        *retention,
    ]
    if sweep.wandb.mode != "disabled":
        from klsweep.orchestrate.wandb_logging import wandb_callback  # imports wandb: only for a sweep that logs there

        callbacks += [c for c in (wandb_callback(sweep, out_dir),) if c is not None]
    return tune.Tuner(
        trainable(sweep),
        tune_config=tune.TuneConfig(
            search_alg=search,
            scheduler=scheduler,
            num_samples=num_samples,
            max_concurrent_trials=multinode.max_concurrent(sweep),  # multi-node: what the cluster holds
            reuse_actors=reuse_actors(sweep.trainer),
        ),
        run_config=tune.RunConfig(
            name=TUNE_DIR,
            storage_path=str(out_dir),
            stop=stopper,
            callbacks=callbacks,
            checkpoint_config=checkpoint_config(sweep),
            verbose=0,
            failure_config=tune.FailureConfig(max_failures=0),
        ),
    )


def trainable(sweep: Sweep) -> Any:
    """The sweep's trial function (:func:`klsweep.orchestrate.trainable.run_trial`) with ``budget.resources``."""
    resources = {"cpu": sweep.budget.resources.cpu, "gpu": sweep.budget.resources.gpu}
    return tune.with_resources(tune.with_parameters(run_trial, sweep=sweep), resources)


def reuse_actors(trainer: str) -> bool:
    """Whether Tune may reuse a trial's actor for the next trial: only for in-process trainers.

    A reused actor's next trial starts in ``FunctionTrainable.reset_config``, which waits
    ``TUNE_FUNCTION_THREAD_TIMEOUT_S`` (2 s) for the previous trial's thread and fails the trial if it still runs.
    A process trial's thread ends only once its process tree is gone (SIGTERM, a grace period, then SIGKILL), which
    rarely takes under 2 s for verl. Waiting less would start the next trial on GPUs the old tree still holds.
    """
    return trainer_kind(trainer).in_process is not None


def _searcher(sweep: Sweep, record: SweepRecord, out_dir: Path, *, seed_trials: bool,
              confirm: Phase | None = None) -> KlsweepSearch:
    """The sweep's :class:`KlsweepSearch`; with ``confirm`` the confirmation phase's, proposing only its runs."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    metrics = [o.metric for o in sweep.objectives]
    modes = [o.mode for o in sweep.objectives]
    single = len(metrics) == 1
    search: Any = KlsweepSearch if confirm is None else functools.partial(ConfirmSearch, phase=confirm)
    return search(
        space=define_space(sweep),  # a picklable SearchSpace: Tune saves the searcher with the experiment
        metric=metrics[0] if single else metrics,
        mode=modes[0] if single else modes,
        points_to_evaluate=(seed_params(sweep) or None) if seed_trials else None,
        sampler=build_sampler(sweep),
        study_name=record.study_name,
        storage=storage_from_url(record.storage_url(out_dir)),
        overrides_of=functools.partial(trial_overrides, sweep),
        total_steps=sweep.budget.max_steps,
        description=study_description(sweep, record),
    )


def study_description(sweep: Sweep, record: SweepRecord) -> str:
    """One line on what the sweep searches: ``tiny: ppo on the embedded trainer, KL in reward; searches
    algorithm.kl_ctrl.kl_coef; max val-core/arith/acc/mean@1; 3 trials × 4 steps; from /path/tiny.yaml``."""
    objectives = ", ".join(f"{o.mode} {o.metric}" for o in sweep.objectives)
    return (f"{sweep.name}: {sweep.algorithm} on the {sweep.trainer} trainer, KL in {sweep.placement}; searches "
            f"{', '.join(parameters(sweep)) or 'nothing'}; {objectives}; {sweep.budget.trials} trials × "
            f"{sweep.budget.max_steps} steps; from {record.sweep_file}")
