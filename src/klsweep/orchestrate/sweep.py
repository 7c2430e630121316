"""``sweep run``: a sweep file becomes Ray Tune trials proposed by Optuna, stopped by health rules, saved in runs/.

The flow: load and validate the sweep file → preflight every seed trial's verl config → Ray (private local Ray, or
``--address`` for a cluster) → ``Tuner`` with :class:`~klsweep.orchestrate.searcher.KlsweepSearch` (Optuna study in
``<out>/study.db``), :class:`~klsweep.health.HealthStopper` as the stopper, optional ASHA → ``trials.csv`` and the best
trial with the verl command line that reproduces it.

Results directory (``runs/<name>/`` or ``--out``): ``sweep.json`` (the resolved sweep), ``study.db`` (Optuna),
``tune/`` (the Ray Tune experiment), ``trials.csv`` (one row per trial, :func:`klsweep.analysis.load`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import sys
import threading
from pathlib import Path

from klsweep.analysis.sweep_dir import storage_from_url, study_of
from klsweep.errors import ClusterError, ResultsError
from klsweep.orchestrate import _ray_session
from klsweep.orchestrate.driver_lock import DRIVER_LOCK, driver_lock
from klsweep.results import SWEEP_FILE, TUNE_DIR, SweepRecord, default_storage


def _refuse_existing(out: Path, *, resume: bool, overwrite: bool) -> None:
    """Refuse (before the slow preflight) to write into a directory that holds results, unless told what to do, and
    to write into or delete a directory that holds anything but a klsweep sweep (``--overwrite`` included)."""
    if out.exists() and not out.is_dir():
        raise ResultsError(f"{out} is a file, not a results directory: choose another --out DIR")
    if not out.exists() or not any(p.name != DRIVER_LOCK for p in out.iterdir()):
        return
    if not (out / SWEEP_FILE).is_file():
        raise ResultsError(
            f"{out} holds files but no klsweep sweep (no {SWEEP_FILE}): klsweep neither writes into it nor deletes "
            f"it, --overwrite included. Choose another --out DIR"
        )
    if not (resume or overwrite):
        raise ResultsError(
            f"{out} already holds a sweep: pass --resume to continue it, --overwrite to replace it, "
            f"or --out DIR to write elsewhere"
        )


def _prepare_out(out: Path, *, overwrite: bool) -> None:
    if overwrite and out.exists():
        _ray_session.end_orphaned_session(out)  # the record of a killed driver's Ray goes with the directory
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

    With ``resume`` and a sweep already in the results directory, the given file is compared with the saved sweep
    (:func:`klsweep.orchestrate.resume.check_resume`): a larger budget is applied and said, a changed search space
    or trial config is refused.

    Raises:
        SweepFileError / PreflightError: the sweep file or a trial config is invalid (nothing was started).
        ResultsError: the results directory holds a sweep and neither ``resume`` nor ``overwrite`` was given,
            ``resume`` was given a sweep whose trials differ from the saved one, or another driver still runs there
            (:func:`klsweep.orchestrate.driver_lock.driver_lock`).
        ClusterError: the Ray cluster cannot be joined, or no node of it can hold a trial.
    """
    from klsweep.spec import load_sweep

    if launcher:
        overrides = [*overrides, f"launcher={launcher}"]
    sweep = load_sweep(sweep_file, overrides)
    out_dir = Path(out or Path("runs") / sweep.name).resolve()
    _refuse_existing(out_dir, resume=resume, overwrite=overwrite)
    with contextlib.ExitStack() as held:
        if out_dir.is_dir():  # a live driver there is refused before anything is checked or written
            held.enter_context(driver_lock(out_dir))
        _preflight(sweep, address)
        record = SweepRecord(
            name=sweep.name,
            sweep_file=str(Path(sweep_file).resolve()),
            overrides=overrides,
            study_name=sweep.name,
            storage=storage or default_storage(),
            objectives=[o.model_dump() for o in sweep.objectives],
            sweep=sweep.model_dump(mode="json"),
        )
        if resume and (out_dir / SWEEP_FILE).is_file():
            return _resume(out_dir, sweep, record, SweepRecord.read(out_dir), source=sweep_file, address=address,
                           quiet=quiet)
        created = not out_dir.exists()
        _prepare_out(out_dir, overwrite=overwrite)
        if created or overwrite:  # a new directory (--overwrite deleted the old one with its lock file)
            held.enter_context(driver_lock(out_dir))
        record.write(out_dir)
        try:
            _init_ray(sweep, address, out_dir)
        except (ClusterError, KeyboardInterrupt):  # nothing ran: leave nothing behind that would block the retry
            if created:
                shutil.rmtree(out_dir)
            else:
                (out_dir / SWEEP_FILE).unlink()
            raise
        return _fit(sweep, record, out_dir, address=address, quiet=quiet, restore=False)


def resume_sweep(run_dir: str, overrides: list[str], *, address: str | None = None, quiet: bool = False) -> int:
    """Continue the sweep stored in ``run_dir`` (after Ctrl-C or a killed driver) or extend it (``budget.trials=N``).

    The sweep is its file (as saved in ``sweep.json``) with the saved and the new ``overrides``; if the file changed
    since, the changes are checked as for ``sweep run FILE --resume``. Tune's saved experiment is restored (unfinished
    trials continue from their last checkpoint; trials Optuna had proposed but Tune never started are adopted by the
    next trials, see ``KlsweepSearch.restore``); then, if the budget asks for more trials than the study holds, a new
    Tuner on the same study runs the rest. Finally any trial still RUNNING in the study (its Tune trial can no longer
    run) is marked FAIL with the reason.

    Raises:
        ResultsError: ``run_dir`` is not a sweep directory, its sweep file is gone, the file changed in a way a
            resume cannot apply, or another driver still runs there.
        ClusterError: the Ray cluster cannot be joined, or no node of it can hold a trial.
    """
    from klsweep.spec import load_sweep

    out_dir = Path(run_dir).resolve()
    saved = SweepRecord.read(out_dir)
    if not Path(saved.sweep_file).is_file():
        raise ResultsError(f"{out_dir}: its sweep file {saved.sweep_file} is gone; give the file again: "
                           f"sweep run FILE --out {out_dir} --resume")
    with driver_lock(out_dir):  # a live driver there is refused before anything is checked or written
        sweep = load_sweep(saved.sweep_file, [*saved.overrides, *overrides])
        _preflight(sweep, address)
        record = saved.model_copy(update={"overrides": [*saved.overrides, *overrides],
                                          "sweep": sweep.model_dump(mode="json")})
        return _resume(out_dir, sweep, record, saved, source=saved.sweep_file, address=address, quiet=quiet)


def _resume(out_dir: Path, sweep, record: SweepRecord, saved: SweepRecord, *, source: str, address: str | None,
            quiet: bool) -> int:
    """Check ``record`` (the sweep a resume was given) against ``saved`` (its ``sweep.json``), say what changes, save
    it, resume."""
    from klsweep.orchestrate.resume import check_resume

    for change in check_resume(saved.sweep, record.sweep, run_dir=str(out_dir), source=source):
        print(f"resume: {change}", file=sys.stderr)
    _init_ray(sweep, address, out_dir)  # a cluster that cannot hold a trial is refused before sweep.json changes
    record = record.model_copy(update={"study_name": saved.study_name, "storage": saved.storage,
                                       "tune_num_samples": saved.tune_num_samples})
    record.write(out_dir)
    return _fit(sweep, record, out_dir, address=address, quiet=quiet, restore=True)


def _preflight(sweep, address: str | None) -> None:
    """Refuse a sweep verl would reject before any directory is written or Ray starts; print its warnings. On a
    private local Ray (no ``address``, none from the launch profile) the trials run here: a local data file or model
    folder missing here is refused too."""
    from klsweep.launchers import ray_address
    from klsweep.orchestrate.plan import preflight_sweep
    from klsweep.orchestrate.samplers import build_sampler

    build_sampler(sweep)  # a sampler refusal (grid over a range, cmaes on categories)
    here = ray_address(sweep.launcher, address) is None
    for warning in [*sweep.warnings, *preflight_sweep(sweep, files_here=here)]:
        print(f"warning: {warning}", file=sys.stderr)


def _init_ray(sweep, address: str | None, out_dir: Path) -> None:
    """Start a private local Ray, or join the cluster of ``--address`` (or of the sweep's launch profile).

    First ends what a killed driver left of the private Ray it recorded in ``out_dir``; a private Ray started here is
    recorded there in turn (:mod:`klsweep.orchestrate._ray_session`). Then refuses a sweep whose trials no node of
    that Ray can hold (:func:`klsweep.orchestrate.capacity.check_trial_fits`), leaving a Ray started here shut down.

    Raises:
        ClusterError: no cluster at the address, or no node for a trial's ``budget.resources``.
    """
    import ray

    from klsweep.launchers import ray_address
    from klsweep.orchestrate.capacity import check_trial_fits

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # Validation metrics come every trainer.test_freq steps, not in every result; KlsweepSearch handles the gaps and
    # fails a trial that never reports an objective.
    os.environ["TUNE_DISABLE_STRICT_METRIC_CHECKING"] = "1"
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # Tune's own tables off (verbose=0): SweepProgress draws ours
    if ray.is_initialized():  # the caller's Ray (tests, notebooks): checked, left as it is
        check_trial_fits(sweep)
        return
    _ray_session.end_orphaned_session(out_dir)
    address = ray_address(sweep.launcher, address)
    if address:
        try:
            ray.init(address=address, log_to_driver=False)
        except ConnectionError as e:
            how = f"--address {address}" if address != "auto" or sweep.launcher == "local" else (
                f"launcher {sweep.launcher} (address auto)")
            reason = str(e).strip().splitlines()[0].rstrip(".") if str(e).strip() else type(e).__name__
            raise ClusterError(
                f"no Ray cluster to join at {how}: {reason}. Start the cluster first (`ray start --head`, or the "
                f"launch profile in launchers/README.md), or leave out --address/--launcher to run on a private "
                f"local Ray") from None
        from klsweep.launchers.storage import require_shared_results

        check_trial_fits(sweep)
        require_shared_results(out_dir)  # a node that cannot see --out would keep its trials' files
        return
    cpus = max(os.cpu_count() or 1, int(sweep.budget.max_concurrent * sweep.budget.resources.cpu))
    ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        check_trial_fits(sweep)
    except ClusterError:
        ray.shutdown()  # nothing of it is left to record or clean up
        raise
    _ray_session.record_session(out_dir)


def _searcher(sweep, record: SweepRecord, out_dir: Path, *, seed_trials: bool, confirm=None):
    """The sweep's :class:`KlsweepSearch`; with ``confirm`` (a :class:`klsweep.orchestrate.confirm.Phase`) the
    confirmation phase's, which proposes only that phase's runs."""
    import optuna

    from klsweep.orchestrate.samplers import build_sampler
    from klsweep.orchestrate.searcher import KlsweepSearch
    from klsweep.space import define_space, seed_params, trial_overrides

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    metrics = [o.metric for o in sweep.objectives]
    modes = [o.mode for o in sweep.objectives]
    single = len(metrics) == 1
    search = KlsweepSearch
    if confirm is not None:
        from klsweep.orchestrate.confirm import ConfirmSearch

        search = functools.partial(ConfirmSearch, phase=confirm)
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
        description=_description(sweep, record),
    )


def _description(sweep, record: SweepRecord) -> str:
    """One line on what the sweep searches: ``tiny: ppo on the embedded trainer, KL in reward; searches
    algorithm.kl_ctrl.kl_coef; max val-core/arith/acc/mean@1; 3 trials × 4 steps; from /path/tiny.yaml``."""
    from klsweep.space import parameters

    objectives = ", ".join(f"{o.mode} {o.metric}" for o in sweep.objectives)
    return (f"{sweep.name}: {sweep.algorithm} on the {sweep.trainer} trainer, KL in {sweep.placement}; searches "
            f"{', '.join(parameters(sweep)) or 'nothing'}; {objectives}; {sweep.budget.trials} trials × "
            f"{sweep.budget.max_steps} steps; from {record.sweep_file}")


def _trainable(sweep):
    from ray import tune

    from klsweep.orchestrate.trainable import run_trial

    resources = {"cpu": sweep.budget.resources.cpu, "gpu": sweep.budget.resources.gpu}
    return tune.with_resources(tune.with_parameters(run_trial, sweep=sweep), resources)


def _reuse_actors(trainer: str) -> bool:
    """Whether Tune may reuse a trial's actor for the next trial: only for in-process trainers.

    A reused actor's next trial starts in ``FunctionTrainable.reset_config`` (ray/tune/trainable/function_trainable.py,
    Ray 2.60), which waits ``TUNE_FUNCTION_THREAD_TIMEOUT_S`` (2 s, read as an int) for the previous trial's thread
    and fails the reset if it still runs; the next trial is then ERROR ("Could not re-use actor") without running,
    and in our tests Tune's ``fit`` did not return afterwards. A process trial's thread ends only once its process
    tree is gone (:func:`klsweep.launchers.process.run_process_trial`: SIGTERM, ``grace_s`` = 5 s, then SIGKILL), and
    verl's tree (its own Ray, vLLM) rarely ends within 2 s. Waiting less is no fix: the next trial would then start on
    GPUs the old tree still holds. Raising the timeout only helps where the variable reaches the trial workers
    (the driver's environment does not reach a cluster's). What reuse saves, ~1.8 s per trial, is nothing next to a
    process that starts verl (tests/launchers/test_tune.py: test_a_stopped_process_trial_does_not_lose_the_next_one).
    """
    from klsweep.trainers import trainer_kind

    return trainer_kind(trainer).in_process is not None


def _tuner(sweep, record: SweepRecord, out_dir: Path, *, num_samples: int, seed_trials: bool, quiet: bool,
           confirm=None):
    from ray import tune
    from ray.tune import Callback

    from klsweep.health import HealthStopper, load_ruleset
    from klsweep.orchestrate.progress import SweepProgress, TrialsCsv
    from klsweep.space import SEED_KEY, parameters, trial_overrides

    objective = sweep.objectives[0]
    scheduler = None
    if sweep.scheduler.type == "asha" and confirm is None:  # a confirmation run is measured to the end, not raced
        from ray.tune.schedulers import ASHAScheduler

        scheduler = ASHAScheduler(
            time_attr="training_iteration", metric=objective.metric, mode=objective.mode,
            max_t=sweep.budget.max_steps, grace_period=sweep.scheduler.grace_period,
            reduction_factor=sweep.scheduler.reduction_factor,
        )
    search = _searcher(sweep, record, out_dir, seed_trials=seed_trials, confirm=confirm)
    ruleset = load_ruleset(sweep.health)
    from klsweep.orchestrate.remedy import KeepRestartPoints, ResultsFromCheckpoint, checkpoint_config, remedies_on

    retention: list[Callback] = []  # checkpoints: the newest alone (checkpoint_config), or the restart points too
    if remedies_on(sweep):
        from klsweep.orchestrate.remedy import RemedyScheduler, overrides_of

        retention = [KeepRestartPoints(sweep)]
        scheduler = remedies = RemedyScheduler(sweep, search)  # restarts remedied trials (issue 17)
        stopper = HealthStopper(ruleset, run_config_of=functools.partial(overrides_of, sweep), remedies=remedies)
    else:  # under ASHA, or with health: {remedies: false}, a rule with a remedy stops as any other
        stopper = HealthStopper(ruleset, run_config_of=functools.partial(trial_overrides, sweep))
    # issue 16: then stop trials their peers beat by more than the noise (not a confirmation run: it runs to the end)
    if sweep.stopping.objective is not None and confirm is None:
        from ray.tune.stopper import CombinedStopper

        from klsweep.orchestrate.objective_stop import ObjectiveStopper

        stopper = CombinedStopper(stopper, ObjectiveStopper([(o.metric, o.mode) for o in sweep.objectives],
                                                            sweep.budget.max_steps, sweep.stopping.objective))
    callbacks: list[Callback] = [
        SweepProgress(num_samples, [o.metric for o in sweep.objectives], quiet=quiet,
                      params=[*parameters(sweep), *([SEED_KEY] if confirm is not None else [])]),  # a re-run's seed
        TrialsCsv(),
        # result.json without the steps a restart from a checkpoint superseded
        ResultsFromCheckpoint(in_process=_reuse_actors(sweep.trainer)),  # the in-process trainers
        *retention,
    ]
    if sweep.wandb.mode != "disabled":
        from klsweep.orchestrate.wandb_logging import wandb_callback

        callbacks += [c for c in (wandb_callback(sweep, out_dir),) if c is not None]
    return tune.Tuner(
        _trainable(sweep),
        tune_config=tune.TuneConfig(
            search_alg=search,
            scheduler=scheduler,
            num_samples=num_samples,
            max_concurrent_trials=sweep.budget.max_concurrent,
            reuse_actors=_reuse_actors(sweep.trainer),
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


def _fit(sweep, record: SweepRecord, out_dir: Path, *, address: str | None, quiet: bool, restore: bool) -> int:
    from ray import tune

    from klsweep.orchestrate import _repair

    try:
        _init_ray(sweep, address, out_dir)
        if restore and not _study_created(out_dir, record):
            print("resume: the driver ended before the sweep's first trial (its study was not created yet): the "
                  "sweep starts from its first trial", file=sys.stderr)
            restore = False
        with _sigterm_as_ctrl_c():
            tune_path = str(out_dir / TUNE_DIR)
            if not restore:
                _record_samples(record, out_dir, sweep.budget.trials)
                if _interrupted_fit(_tuner(sweep, record, out_dir, num_samples=sweep.budget.trials, seed_trials=True,
                                           quiet=quiet)) or _confirm(sweep, record, out_dir, quiet=quiet):
                    return _interrupted(sweep, out_dir)
                return _finish(sweep, out_dir)
            _repair.close_told_trials(tune_path, study_of(out_dir))
            _repair.reconcile_search_state(tune_path, study_of(out_dir))
            if tune.Tuner.can_restore(tune_path) and not _repair.tune_finished(tune_path, record.tune_num_samples):
                if _interrupted_fit(tune.Tuner.restore(tune_path, trainable=_trainable(sweep), resume_unfinished=True,
                                                       resume_errored=False, restart_errored=False)):
                    return _interrupted(sweep, out_dir)
            from klsweep.orchestrate.confirm import search_trial_count

            remaining = sweep.budget.trials - search_trial_count(study_of(out_dir))
            if remaining > 0:
                _record_samples(record, out_dir, remaining)
                if _interrupted_fit(_tuner(sweep, record, out_dir, num_samples=remaining, seed_trials=False,
                                           quiet=quiet)):
                    return _interrupted(sweep, out_dir)
            if _confirm(sweep, record, out_dir, quiet=quiet):
                return _interrupted(sweep, out_dir)
            _repair.fail_leftovers(study_of(out_dir))
            return _finish(sweep, out_dir)
    except KeyboardInterrupt:  # Ctrl-C outside Tune's loop (Ray starting, the study opening) or a second Ctrl-C
        return _interrupted(sweep, out_dir)


def _study_created(out_dir: Path, record: SweepRecord) -> bool:
    """Whether the sweep's Optuna study exists: `sweep run` creates it with its first trial's Tuner, so a driver
    killed before (SIGKILL while Ray started, an OOM kill) leaves ``sweep.json`` and nothing that ran."""
    try:
        study_of(out_dir, record)
    except ResultsError:
        return False
    return True


def _confirm(sweep, record: SweepRecord, out_dir: Path, *, quiet: bool) -> bool:
    """The confirmation phase (``budget.confirm``, :mod:`klsweep.orchestrate.confirm`): a Tuner of the leaders'
    re-runs the study does not hold yet, when there are any. True when Ctrl-C ended it."""
    from klsweep.analysis.sweep_dir import load
    from klsweep.orchestrate.confirm import confirmation_phase, nothing_to_run

    phase = confirmation_phase(sweep, out_dir)
    if not len(phase):
        note = nothing_to_run(sweep, load(out_dir))
        if note and not quiet:
            print(f"confirmation: {note}")
        return False
    _record_samples(record, out_dir, len(phase))
    return _interrupted_fit(_tuner(sweep, record, out_dir, num_samples=len(phase), seed_trials=False, quiet=quiet,
                                   confirm=phase))


def _interrupted_fit(tuner) -> bool:
    """``tuner.fit()``; True when Ctrl-C (SIGINT) ended it.

    Tune takes the first SIGINT itself (``_setup_signal_catching`` in ray/tune/tune.py, Ray 2.60): it stops the
    trials, saves the experiment and returns from ``fit`` as if it had finished, after putting back the handler it
    found. That handler is :func:`_second_sigint`, installed here, so it is still in place after ``fit`` exactly when
    Tune took a SIGINT; a second SIGINT during Tune's shutdown reaches it and raises ``KeyboardInterrupt``.
    """
    if threading.current_thread() is not threading.main_thread():  # no signal handlers there, Tune's neither
        tuner.fit()
        return False
    previous = signal.signal(signal.SIGINT, _second_sigint)
    try:
        tuner.fit()
        return signal.getsignal(signal.SIGINT) is _second_sigint
    finally:
        signal.signal(signal.SIGINT, previous)


def _second_sigint(signum, frame) -> None:
    raise KeyboardInterrupt


#: The signal that interrupted the sweep (SIGINT or SIGTERM), for :func:`_interrupted`'s last lines and exit status.
_ended_by = [signal.SIGINT]


@contextlib.contextmanager
def _sigterm_as_ctrl_c():
    """Within the block, SIGTERM ends the sweep as Ctrl-C does (:func:`_interrupted`: trials stopped and saved, the
    study left resumable, ``continue with: sweep resume DIR``), with exit status 143 (128 + SIGTERM).

    SIGTERM is how a sweep is ended from outside a terminal: SLURM at a job's time limit or preemption (SIGKILL follows
    after ``KillWait``, 30 s by default), Kubernetes when a pod is deleted (``terminationGracePeriodSeconds``, 30 s),
    ``timeout`` and ``kill``. ``ray.init`` installs abseil's failure signal handler for it in the driver, which
    prints a stack dump and ends the process without Tune saving its experiment; the block replaces that handler
    (entered after ``ray.init``: before, Ray would replace this one) by a SIGINT to the same process, which Tune's
    handler or :func:`_second_sigint` then takes, and puts it back on exit. Main thread only, like every signal
    handler.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _ended_by[:] = [signal.SIGINT]

    def as_sigint(signum, frame) -> None:
        _ended_by[:] = [signal.SIGTERM]
        signal.raise_signal(signal.SIGINT)

    previous = signal.signal(signal.SIGTERM, as_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupted(sweep, out_dir: Path) -> int:
    """After Ctrl-C (or SIGTERM, :func:`_sigterm_as_ctrl_c`): ``trials.csv`` as it stands, what finished (and the best
    so far), and the command that continues the sweep. Returns 130 (128 + SIGINT, as a shell reports a command ended
    by Ctrl-C), or 143 after SIGTERM."""
    from klsweep._format import console
    from klsweep.orchestrate.progress import write_trials_csv
    from klsweep.orchestrate.summary import counts_line, print_summary

    main_thread = threading.current_thread() is threading.main_thread()
    # the last lines are printed whole, even on a third Ctrl-C
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main_thread else None
    try:
        df = write_trials_csv(out_dir)
        print_summary(sweep, df, out_dir, ended=False)
        out = console()
        how = "Ctrl-C" if _ended_by[0] == signal.SIGINT else _ended_by[0].name
        out.print(f"\ninterrupted ({how}): {counts_line(sweep, df)}", highlight=False)
        out.print(f"continue with: sweep resume {_shown(out_dir)}", highlight=False)
    finally:
        if main_thread:
            signal.signal(signal.SIGINT, previous)
    return 128 + _ended_by[0]


def _shown(path: Path) -> str:
    """``path`` as the user would type it here: relative to the working directory when inside it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _record_samples(record: SweepRecord, out_dir: Path, num_samples: int) -> None:
    """Remember how many trials the Tuner about to start will create (to tell later whether it finished)."""
    record.tune_num_samples = num_samples
    record.write(out_dir)


def _finish(sweep, out_dir: Path) -> int:
    from klsweep.orchestrate.progress import write_trials_csv
    from klsweep.orchestrate.summary import print_summary

    return print_summary(sweep, write_trials_csv(out_dir), out_dir)
