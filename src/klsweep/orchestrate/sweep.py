"""``sweep run``: a sweep file becomes Ray Tune trials proposed by Optuna, stopped by health rules, saved to runs/<name>/.

The flow: load and validate the sweep file → preflight every seed trial's verl config → Ray (private local Ray, or
``--address`` for a cluster) → ``Tuner`` with :class:`~klsweep.orchestrate.searcher.KlsweepSearch` (Optuna study in
``<out>/study.db``), :class:`~klsweep.health.HealthStopper` as the stopper, optional ASHA → ``trials.csv`` and the best
trial with the verl command line that reproduces it.

Results directory (``runs/<name>/`` or ``--out``): ``sweep.json`` (the resolved sweep), ``study.db`` (Optuna),
``tune/`` (the Ray Tune experiment), ``trials.csv`` (one row per trial, :func:`klsweep.analysis.load`).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import sys
from pathlib import Path

from klsweep.errors import ResultsError
from klsweep.analysis.load import SWEEP_FILE, TUNE_DIR, storage_from_url

TRIALS_CSV = "trials.csv"


def _refuse_existing(out: Path, *, resume: bool, overwrite: bool) -> None:
    """Refuse (before the slow preflight) to write into a directory that holds results, unless told what to do."""
    if out.exists() and any(out.iterdir()) and not (resume or overwrite):
        raise ResultsError(
            f"{out} already holds a sweep: pass --resume to continue it, --overwrite to replace it, "
            f"or --out DIR to write elsewhere"
        )


def _prepare_out(out: Path, *, overwrite: bool) -> None:
    if overwrite and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)


def run_sweep(
    sweep_file: str,
    overrides: list[str],
    *,
    out: str | None = None,
    storage: str | None = None,
    address: str | None = None,
    resume: bool = False,
    overwrite: bool = False,
    launcher: str | None = None,
    quiet: bool = False,
) -> int:
    """Run the sweep in ``sweep_file`` with command-line ``overrides`` (``budget.trials=4``). Returns the exit code:
    0 when at least one trial completed, 1 when none did.

    Raises:
        SweepFileError / PreflightError: the sweep file or a trial config is invalid (nothing was started).
        ResultsError: the results directory holds a sweep and neither ``resume`` nor ``overwrite`` was given.
    """
    from klsweep.spec import load_sweep

    if launcher:
        overrides = [*overrides, f"launcher={launcher}"]
    sweep = load_sweep(sweep_file, overrides)
    out_dir = Path(out or Path("runs") / sweep.name).resolve()
    _refuse_existing(out_dir, resume=resume, overwrite=overwrite)
    _preflight(sweep)
    if resume and (out_dir / SWEEP_FILE).is_file():
        return resume_sweep(str(out_dir), overrides, address=address, quiet=quiet)
    _prepare_out(out_dir, overwrite=overwrite)
    info = {
        "name": sweep.name,
        "sweep_file": str(Path(sweep_file).resolve()),
        "overrides": overrides,
        "study_name": sweep.name,
        "storage": storage or f"sqlite:///{out_dir / 'study.db'}",
        "objectives": [o.model_dump() for o in sweep.objectives],
        "sweep": sweep.model_dump(mode="json"),
    }
    (out_dir / SWEEP_FILE).write_text(json.dumps(info, indent=2))
    return _fit(sweep, info, out_dir, address=address, quiet=quiet, restore=False)


def resume_sweep(run_dir: str, overrides: list[str], *, address: str | None = None, quiet: bool = False) -> int:
    """Continue the sweep stored in ``run_dir`` (after Ctrl-C or a killed driver) or extend it (``budget.trials=N``).

    Tune's saved experiment is restored (unfinished trials continue from their last checkpoint; trials Optuna had
    proposed but Tune never started are adopted by the next trials, see ``KlsweepSearch.restore``); then, if the
    budget asks for more trials than the study holds, a new Tuner on the same study runs the rest. Finally any trial
    still RUNNING in the study (its Tune trial can no longer run) is marked FAIL with the reason.

    Raises:
        ResultsError: ``run_dir`` is not a sweep directory.
    """
    from klsweep.analysis.load import sweep_info
    from klsweep.spec import load_sweep

    out_dir = Path(run_dir).resolve()
    info = sweep_info(out_dir)
    info["overrides"] = [*info.get("overrides", []), *overrides]
    sweep = load_sweep(info["sweep_file"], info["overrides"])
    info["sweep"] = sweep.model_dump(mode="json")
    (out_dir / SWEEP_FILE).write_text(json.dumps(info, indent=2))
    return _fit(sweep, info, out_dir, address=address, quiet=quiet, restore=True)


def _preflight(sweep) -> None:
    """Refuse a sweep verl would reject before any directory is written or Ray starts; print its warnings."""
    from klsweep.orchestrate.plan import preflight_sweep
    from klsweep.orchestrate.samplers import build_sampler

    build_sampler(sweep)  # a sampler refusal (grid over a range, cmaes on categories)
    for warning in [*sweep.warnings, *preflight_sweep(sweep)]:
        print(f"warning: {warning}", file=sys.stderr)


def _init_ray(sweep, address: str | None) -> None:
    """Start a private local Ray, or join the cluster of ``--address`` (or of the sweep's launch profile)."""
    import ray

    from klsweep.launchers import ray_address

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # Validation metrics come every trainer.test_freq steps, not in every result; KlsweepSearch handles the gaps and
    # fails a trial that never reports an objective.
    os.environ["TUNE_DISABLE_STRICT_METRIC_CHECKING"] = "1"
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # Tune's own tables off (verbose=0): SweepProgress draws ours
    if ray.is_initialized():
        return
    address = ray_address(sweep.launcher, address)
    if address:
        ray.init(address=address, log_to_driver=False)
        return
    cpus = max(os.cpu_count() or 1, int(sweep.budget.max_concurrent * sweep.budget.resources.cpu))
    ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False, logging_level="ERROR")


def _searcher(sweep, info: dict, *, seed_trials: bool):
    import optuna

    from klsweep.orchestrate.samplers import build_sampler
    from klsweep.orchestrate.searcher import KlsweepSearch
    from klsweep.space import define_space, seed_params, trial_overrides

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    metrics = [o.metric for o in sweep.objectives]
    modes = [o.mode for o in sweep.objectives]
    single = len(metrics) == 1
    return KlsweepSearch(
        space=define_space(sweep),  # a picklable SearchSpace: Tune saves the searcher with the experiment
        metric=metrics[0] if single else metrics,
        mode=modes[0] if single else modes,
        points_to_evaluate=(seed_params(sweep) or None) if seed_trials else None,
        sampler=build_sampler(sweep),
        study_name=info["study_name"],
        storage=storage_from_url(info["storage"]),
        overrides_of=functools.partial(trial_overrides, sweep),
        total_steps=sweep.budget.max_steps,
    )


def _trainable(sweep):
    from ray import tune

    from klsweep.orchestrate.trainable import run_trial

    resources = {"cpu": sweep.budget.resources.cpu, "gpu": sweep.budget.resources.gpu}
    return tune.with_resources(tune.with_parameters(run_trial, sweep=sweep), resources)


def _tuner(sweep, info: dict, out_dir: Path, *, num_samples: int, seed_trials: bool, quiet: bool):
    from ray import tune

    from klsweep.health import HealthStopper, load_ruleset
    from klsweep.orchestrate.progress import SweepProgress
    from klsweep.space import trial_overrides

    objective = sweep.objectives[0]
    scheduler = None
    if sweep.scheduler.type == "asha":
        from ray.tune.schedulers import ASHAScheduler

        scheduler = ASHAScheduler(
            time_attr="training_iteration", metric=objective.metric, mode=objective.mode,
            max_t=sweep.budget.max_steps, grace_period=sweep.scheduler.grace_period,
            reduction_factor=sweep.scheduler.reduction_factor,
        )
    stopper = HealthStopper(load_ruleset(sweep.health), run_config_of=functools.partial(trial_overrides, sweep))
    callbacks = [SweepProgress(num_samples, [o.metric for o in sweep.objectives], quiet=quiet)]
    if sweep.wandb.mode != "disabled":
        from klsweep.orchestrate.wandb_logging import wandb_callback

        callbacks += [c for c in (wandb_callback(sweep, out_dir),) if c is not None]
    return tune.Tuner(
        _trainable(sweep),
        tune_config=tune.TuneConfig(
            search_alg=_searcher(sweep, info, seed_trials=seed_trials),
            scheduler=scheduler,
            num_samples=num_samples,
            max_concurrent_trials=sweep.budget.max_concurrent,
            reuse_actors=True,
        ),
        run_config=tune.RunConfig(
            name=TUNE_DIR,
            storage_path=str(out_dir),
            stop=stopper,
            callbacks=callbacks,
            verbose=0,
            failure_config=tune.FailureConfig(max_failures=0),
        ),
    )


def _fit(sweep, info: dict, out_dir: Path, *, address: str | None, quiet: bool, restore: bool) -> int:
    from ray import tune

    from klsweep.analysis.load import study_of

    _init_ray(sweep, address)
    tune_path = str(out_dir / TUNE_DIR)
    if not restore:
        _record_samples(info, out_dir, sweep.budget.trials)
        _tuner(sweep, info, out_dir, num_samples=sweep.budget.trials, seed_trials=True, quiet=quiet).fit()
        return _finish(sweep, out_dir)
    _close_told_trials(tune_path, study_of(info))
    _reconcile_search_state(tune_path, study_of(info))
    if tune.Tuner.can_restore(tune_path) and not _tune_finished(tune_path, info.get("tune_num_samples", 0)):
        tune.Tuner.restore(tune_path, trainable=_trainable(sweep), resume_unfinished=True,
                           resume_errored=False, restart_errored=False).fit()
    study = study_of(info)
    remaining = sweep.budget.trials - len(study.trials)
    if remaining > 0:
        _record_samples(info, out_dir, remaining)
        _tuner(sweep, info, out_dir, num_samples=remaining, seed_trials=False, quiet=quiet).fit()
    _fail_leftovers(study_of(info))
    return _finish(sweep, out_dir)


def _record_samples(info: dict, out_dir: Path, num_samples: int) -> None:
    """Remember how many trials the Tuner about to start will create (to tell later whether it finished)."""
    info["tune_num_samples"] = num_samples
    (out_dir / SWEEP_FILE).write_text(json.dumps(info, indent=2))


def _saved_trials(tune_path: str) -> list[dict] | None:
    """The trials of Tune's latest saved experiment state (each a dict with ``trial_id`` and ``status``), or None
    when Tune saved none."""
    states = sorted(Path(tune_path).glob("experiment_state-*.json"))
    if not states:
        return None
    return [json.loads(state) if isinstance(state, str) else state
            for state, _meta in json.loads(states[-1].read_text()).get("trial_data", [])]


def _tune_finished(tune_path: str, num_samples: int) -> bool:
    """Whether the saved Tune experiment created its ``num_samples`` trials and every one of them ended."""
    trials = _saved_trials(tune_path)
    if trials is None:
        return True
    return len(trials) >= num_samples and all(t.get("status") in ("TERMINATED", "ERROR") for t in trials)


def _close_told_trials(tune_path: str, study) -> None:
    """Mark TERMINATED, in Tune's saved experiment state, the trials the study already holds as finished.

    Tune saves its state every few seconds; after a SIGKILL of the driver that state can be older than the study, and
    ``Tuner.restore`` would re-run from step 0 a trial that had finished and been told to Optuna after the last save
    (its results on the finished Optuna trial then raise UpdateFinishedTrialError and abort the resume).
    """
    import optuna

    done = {t.user_attrs.get("ray_trial_id") for t in study.get_trials(deepcopy=False, states=(
        optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL))}
    for state_file in Path(tune_path).glob("experiment_state-*.json"):
        data = json.loads(state_file.read_text())
        changed = False
        for entry in data.get("trial_data", []):
            trial = json.loads(entry[0])
            if trial.get("trial_id") in done and trial.get("status") not in ("TERMINATED", "ERROR"):
                trial["status"] = "TERMINATED"
                entry[0] = json.dumps(trial)
                changed = True
        if changed:
            state_file.write_text(json.dumps(data))


def _reconcile_search_state(tune_path: str, study) -> None:
    """Make the saved search state agree with Tune's saved experiment state and the study, after a SIGKILL.

    The three are saved at different times. (1) Trials suggested after the last experiment save are in
    ``ConcurrencyLimiter.live_trials`` and ``KlsweepSearch._ot_trials`` but Tune will never start or finish them: left
    there, the limiter counts them as running forever and the resume hangs with idle workers; dropped, their Optuna
    trials (still RUNNING) are adopted by the next trials (``KlsweepSearch.restore``). (2) A trial that started and
    finished between two experiment saves is finished in the study but unknown to Tune: it counts against the
    number of trials Tune still creates (``SearchGenerator.counter``), so the budget is not overrun.
    """
    import pickle

    import ray.cloudpickle as cloudpickle

    trials = _saved_trials(tune_path)
    if trials is None:
        return
    known = {t["trial_id"] for t in trials}
    unfinished = {t["trial_id"] for t in trials if t.get("status") not in ("TERMINATED", "ERROR")}
    ran_unknown = [t for t in study.get_trials(deepcopy=False) if t.state.is_finished()
                   and t.user_attrs.get("ray_trial_id") not in known]
    for file in Path(tune_path).glob("search_gen_state-*.json"):
        state = cloudpickle.loads(file.read_bytes())
        limiter = state.get("name:ConcurrencyLimiter")
        if limiter:
            limiter["live_trials"] = set(limiter.get("live_trials", ())) & unfinished
            limiter["num_unfinished_live_trials"] = len(limiter["live_trials"])
        state["counter"] = max(state.get("counter", 0), len(known) + len(ran_unknown))
        file.write_bytes(cloudpickle.dumps(state))
    for file in Path(tune_path).glob("searcher-state-*.pkl"):
        state = pickle.loads(file.read_bytes())
        if isinstance(state, dict) and set(state.get("_ot_trials", {})) - known:
            state["_ot_trials"] = {k: v for k, v in state["_ot_trials"].items() if k in known}
            file.write_bytes(pickle.dumps(state))


def _fail_leftovers(study) -> None:
    import optuna

    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        study._storage.set_trial_user_attr(
            trial._trial_id, "stop_reason",
            "in flight when the sweep driver stopped, and its Tune trial could not be resumed: marked FAIL on resume",
        )
        study._storage.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.FAIL)


def _finish(sweep, out_dir: Path) -> int:
    from klsweep.analysis.load import load
    from klsweep.orchestrate.summary import print_summary

    df = load(out_dir)
    tmp = out_dir / (TRIALS_CSV + ".tmp")
    df.to_csv(tmp, index=False)
    os.replace(tmp, out_dir / TRIALS_CSV)
    return print_summary(sweep, df, out_dir)
