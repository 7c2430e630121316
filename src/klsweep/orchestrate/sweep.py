"""``sweep run`` and ``sweep resume``: a sweep file becomes Ray Tune trials proposed by Optuna, saved in runs/.

The flow:

1. load and validate the sweep file;
2. preflight every seed trial's verl config;
3. start Ray: a private local Ray, or ``--address`` for a cluster;
4. run the Tuner (:mod:`klsweep.orchestrate.tuner`);
5. write ``trials.csv``, and print the best trial with the verl command line that reproduces it.

Ctrl-C and SIGTERM end it resumably (:mod:`klsweep.orchestrate.interrupt`).

Results directory (``runs/<name>/`` or ``--out``): ``sweep.json`` (the resolved sweep), ``study.db`` (Optuna),
``tune/`` (the Ray Tune experiment), ``trials.csv`` (one row per trial, :func:`klsweep.analysis.load`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import optuna
import ray
from ray import tune

from klsweep._format import arg
from klsweep.analysis.leaders import nothing_to_run
from klsweep.analysis.study_file import StudyNotCreated, check_study
from klsweep.analysis.summary import print_summary
from klsweep.analysis.sweep_dir import load, storage_from_url, study_of
from klsweep.analysis.trials_csv import write_trials_csv
from klsweep.errors import ClusterError, ResultsError
from klsweep.launchers import ray_address
from klsweep.launchers.multinode import stop_recorded_jobs
from klsweep.launchers.storage import require_shared_results
from klsweep.orchestrate import _ray_session, _repair
from klsweep.orchestrate.capacity import check_trial_fits
from klsweep.orchestrate.confirm_search import confirmation_phase, search_trial_count
from klsweep.orchestrate.driver_lock import DRIVER_LOCK, driver_lock
from klsweep.orchestrate.interrupt import interrupted_fit, report_interrupted, shutdown_ray, sigterm_as_ctrl_c
from klsweep.orchestrate.plan import preflight_sweep
from klsweep.orchestrate.resume_changes import check_resume
from klsweep.orchestrate.samplers import build_sampler
from klsweep.orchestrate.tuner import build_tuner, trainable
from klsweep.results import SWEEP_FILE, TUNE_DIR, SweepRecord, default_storage, storage_file
from klsweep.spec import load_sweep

if TYPE_CHECKING:
    from klsweep.spec.schema import Sweep


def _refuse_existing(out: Path, *, resume: bool, overwrite: bool) -> None:
    """Refuse, before the slow preflight, to write into a directory that holds results unless told what to do.

    Also refuse to write into or delete a directory that holds anything but a klsweep sweep, ``--overwrite``
    included."""
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


def _refuse_taken_study(record: SweepRecord, out: Path, *, overwrite: bool) -> None:
    """Refuse a new sweep whose ``--storage`` already holds a study of its name: Optuna would load that study and the
    two sweeps' trials would mix. With ``overwrite``, the study the replaced sweep recorded (``out/sweep.json``: the
    same storage and name) is deleted instead, as its directory is.

    Raises:
        ResultsError: the storage, the study's trial count and the fixes.
    """
    url = record.storage_url(out)
    file = storage_file(url)
    if file is not None and not file.exists():
        return  # a new database holds no study
    storage = storage_from_url(url)
    taken = [s for s in optuna.get_all_study_summaries(storage, include_best_trial=False)
             if s.study_name == record.study_name]
    if not taken:
        return
    if overwrite and (out / SWEEP_FILE).is_file():
        old = SweepRecord.read(out)
        if (old.study_name, old.storage_url(out)) == (record.study_name, url):
            optuna.delete_study(study_name=record.study_name, storage=storage)
            return
    raise ResultsError(
        f"--storage {record.storage} already holds a study named {record.study_name!r} ({taken[0].n_trials} trials) of "
        f"another sweep directory: this sweep's trials would mix with its. Give this sweep another name "
        f"(name={record.study_name}-2 on the command line), another --storage, or delete that study with "
        f"`optuna delete-study --study-name {arg(record.study_name)} --storage {arg(url)}`")


def _prepare_out(out: Path, *, overwrite: bool) -> None:
    """Create ``out``; with ``overwrite``, delete it first and end what a killed driver left of its Ray."""
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
    (:func:`klsweep.orchestrate.resume_changes.check_resume`). A larger budget is applied and said. A changed
    search space or trial config is refused.

    Raises:
        SweepFileError / PreflightError: the sweep file or a trial config is invalid (nothing was started).
        ResultsError: the results directory holds a sweep and neither ``resume`` nor ``overwrite`` was given;
            ``resume`` was given a sweep whose trials differ from the saved one; or another driver still runs there
            (:func:`klsweep.orchestrate.driver_lock.driver_lock`).
        ClusterError: the Ray cluster cannot be joined, or no node of it can hold a trial.
    """
    if launcher:
        overrides = [*overrides, f"launcher={launcher}"]
    sweep = load_sweep(sweep_file, overrides)
    out_dir = Path(out or Path("runs") / sweep.name).resolve()
    _refuse_existing(out_dir, resume=resume, overwrite=overwrite)
    with contextlib.ExitStack() as held:
        locked = out_dir.is_dir()
        if locked:  # a live driver there is refused before anything is checked or written
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
        if storage is not None:
            _refuse_taken_study(record, out_dir, overwrite=overwrite)
        created = not out_dir.exists()
        _prepare_out(out_dir, overwrite=overwrite)
        if overwrite or not locked:  # a new directory (--overwrite deleted the old one with its lock file)
            held.enter_context(driver_lock(out_dir))
            # a driver started at the same moment may have made the directory first: it holds the lock (refused
            # above), or it ended and left its sweep there. Another file is no sweep: a reader (a notebook opening
            # study.db) may have made one within the moment
            if (out_dir / SWEEP_FILE).is_file():
                _refuse_existing(out_dir, resume=False, overwrite=False)
        record.write(out_dir)
        own_ray = not ray.is_initialized()
        try:
            _init_ray(sweep, address, out_dir)
        except (ClusterError, KeyboardInterrupt):  # nothing ran: leave nothing behind that would block the retry
            if created:
                shutil.rmtree(out_dir)
            else:
                (out_dir / SWEEP_FILE).unlink()
            raise
        return _fit(sweep, record, out_dir, address=address, quiet=quiet, restore=False, own_ray=own_ray)


def resume_sweep(run_dir: str, overrides: list[str], *, address: str | None = None, quiet: bool = False) -> int:
    """Continue the sweep stored in ``run_dir`` (after Ctrl-C or a killed driver) or extend it (``budget.trials=N``).

    The sweep is its file (as saved in ``sweep.json``) with the saved and the new ``overrides``. If the file changed
    since, the changes are checked as for ``sweep run FILE --resume``. Tune's saved experiment is restored:
    unfinished trials continue from their last checkpoint. Trials Optuna had proposed but Tune never started are
    adopted by the next trials (``KlsweepSearch.restore``). Then, if the budget asks for more trials than the study
    holds, a new Tuner on the same study runs the rest. Finally, any trial still RUNNING in the study is marked FAIL
    with the reason: its Tune trial can no longer run.

    Raises:
        ResultsError: ``run_dir`` is not a sweep directory, its sweep file is gone, the file changed in a way a
            resume cannot apply, or another driver still runs there.
        ClusterError: the Ray cluster cannot be joined, or no node of it can hold a trial.
    """
    out_dir = Path(run_dir).resolve()
    saved = SweepRecord.read(out_dir)
    if not Path(saved.sweep_file).is_file():
        raise ResultsError(f"{out_dir}: its sweep file {saved.sweep_file} is gone; give the file again: "
                           f"sweep run FILE --out {arg(out_dir)} --resume")
    with driver_lock(out_dir):  # a live driver there is refused before anything is checked or written
        sweep = load_sweep(saved.sweep_file, [*saved.overrides, *overrides])
        _preflight(sweep, address)
        record = saved.model_copy(update={"overrides": [*saved.overrides, *overrides],
                                          "sweep": sweep.model_dump(mode="json")})
        return _resume(out_dir, sweep, record, saved, source=saved.sweep_file, address=address, quiet=quiet)


def _resume(out_dir: Path, sweep: Sweep, record: SweepRecord, saved: SweepRecord, *, source: str, address: str | None,
            quiet: bool) -> int:
    """Check ``record`` (the sweep a resume was given) against ``saved`` (its ``sweep.json``), say what changes, save
    it, resume.

    A study that is missing, empty or corrupt while ``tune/`` holds trial results is refused before Ray starts
    (:func:`klsweep.analysis.study_file.check_study`): resuming would run the finished trials again."""
    try:
        check_study(saved, out_dir)
    except StudyNotCreated:
        pass  # the driver ended before the first trial: _fit starts the sweep from its first trial
    for change in check_resume(saved.sweep, record.sweep, run_dir=str(out_dir), source=source):
        print(f"resume: {change}", file=sys.stderr)
    # the rows a killed driver had not synced yet, before this driver's Ray replaces the record of the killed one's
    _repair.copy_staged_results(_ray_session.dead_session_dir(out_dir), str(out_dir / TUNE_DIR))
    own_ray = not ray.is_initialized()
    _init_ray(sweep, address, out_dir)  # a cluster that cannot hold a trial is refused before sweep.json changes
    for attempt in stop_recorded_jobs((out_dir / TUNE_DIR).glob("*")):  # what a lost supervisor left running
        print(f"resume: ended {attempt.parent.name}/{attempt.name}'s multi-node job, still running", file=sys.stderr)
    record = record.model_copy(update={"study_name": saved.study_name, "storage": saved.storage,
                                       "tune_num_samples": saved.tune_num_samples})
    record.write(out_dir)
    return _fit(sweep, record, out_dir, address=address, quiet=quiet, restore=True, own_ray=own_ray)


def _preflight(sweep: Sweep, address: str | None) -> None:
    """Refuse a sweep verl would reject before any directory is written or Ray starts; print its warnings. On a
    private local Ray (no ``address``, none from the launch profile) the trials run here: a local data file or model
    folder missing here is refused too."""
    build_sampler(sweep)  # a sampler refusal (grid over a range, cmaes on categories)
    here = ray_address(sweep.launcher, address) is None
    for warning in [*sweep.warnings, *preflight_sweep(sweep, files_here=here)]:
        print(f"warning: {warning}", file=sys.stderr)


def _init_ray(sweep: Sweep, address: str | None, out_dir: Path) -> None:
    """Start a private local Ray, or join the cluster of ``--address`` (or of the sweep's launch profile).

    First ends what a killed driver left of the private Ray it recorded in ``out_dir``; a private Ray started here is
    recorded there in turn (:mod:`klsweep.orchestrate._ray_session`). Then refuses a sweep whose trials no node of
    that Ray can hold (:func:`klsweep.orchestrate.capacity.check_trial_fits`), leaving a Ray started here shut down.

    Raises:
        ClusterError: no cluster at the address, no node for a trial's ``budget.resources``, or a local Ray that did
            not start (:func:`klsweep.orchestrate._ray_session.start_local_ray`).
    """
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
        check_trial_fits(sweep)
        require_shared_results(out_dir)  # a node that cannot see --out would keep its trials' files
        return
    cpus = max(os.cpu_count() or 1, int(sweep.budget.max_concurrent * sweep.budget.resources.cpu))
    _ray_session.start_local_ray(num_cpus=cpus, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        check_trial_fits(sweep)
    except ClusterError:
        ray.shutdown()  # nothing of it is left to record or clean up
        raise
    _ray_session.record_session(out_dir)


def _fit(sweep: Sweep, record: SweepRecord, out_dir: Path, *, address: str | None, quiet: bool,
         restore: bool, own_ray: bool) -> int:
    """Run the sweep's Tuners in ``out_dir`` (restored ones first with ``restore``); returns the exit code.

    0 or 1 as :func:`klsweep.analysis.summary.print_summary` says, 130 or 143 when a signal interrupted it.
    ``own_ray``: the Ray was started or joined for this sweep, and is shut down at the end (not the caller's).
    """
    try:
        _init_ray(sweep, address, out_dir)
        if restore and not _study_created(out_dir, record):
            print("resume: the driver ended before the sweep's first trial (its study was not created yet): the "
                  "sweep starts from its first trial", file=sys.stderr)
            restore = False
        with sigterm_as_ctrl_c():
            tune_path = str(out_dir / TUNE_DIR)
            if not restore:
                _record_samples(record, out_dir, sweep.budget.trials)
                if interrupted_fit(build_tuner(sweep, record, out_dir, num_samples=sweep.budget.trials,
                                               seed_trials=True, quiet=quiet)) \
                        or _confirm(sweep, record, out_dir, quiet=quiet):
                    return report_interrupted(sweep, out_dir)
                return _finish(sweep, out_dir)
            _repair.close_told_trials(tune_path, study_of(out_dir))
            _repair.drop_lost_checkpoints(tune_path)
            _repair.repoint_search_state(tune_path, record.storage_url(out_dir))  # a moved directory
            _repair.reconcile_search_state(tune_path, study_of(out_dir))
            if tune.Tuner.can_restore(tune_path) and not _repair.tune_finished(tune_path, record.tune_num_samples):
                if interrupted_fit(tune.Tuner.restore(tune_path, trainable=trainable(sweep), resume_unfinished=True,
                                                      resume_errored=False, restart_errored=False)):
                    return report_interrupted(sweep, out_dir)
            remaining = sweep.budget.trials - search_trial_count(study_of(out_dir))
            if remaining > 0:
                _record_samples(record, out_dir, remaining)
                if interrupted_fit(build_tuner(sweep, record, out_dir, num_samples=remaining, seed_trials=False,
                                               quiet=quiet)):
                    return report_interrupted(sweep, out_dir)
            if _confirm(sweep, record, out_dir, quiet=quiet):
                return report_interrupted(sweep, out_dir)
            _repair.fail_leftovers(study_of(out_dir))
            return _finish(sweep, out_dir)
    except KeyboardInterrupt:  # Ctrl-C outside Tune's loop (Ray starting, the study opening) or a second Ctrl-C
        return report_interrupted(sweep, out_dir)
    finally:
        if own_ray:
            shutdown_ray()


def _study_created(out_dir: Path, record: SweepRecord) -> bool:
    """Whether the sweep's Optuna study exists.

    `sweep run` creates it with its first trial's Tuner. A driver killed before that (SIGKILL while Ray started, an
    OOM kill) leaves ``sweep.json`` and nothing that ran."""
    try:
        study_of(out_dir, record)
    except StudyNotCreated:  # a lost study (trials ran) raises on: resume refuses it
        return False
    return True


def _confirm(sweep: Sweep, record: SweepRecord, out_dir: Path, *, quiet: bool) -> bool:
    """Run the confirmation phase (``budget.confirm``): a Tuner of the leaders' re-runs the study lacks, if any.

    Returns True when Ctrl-C ended it.
    """
    phase = confirmation_phase(sweep, out_dir)
    if not len(phase):
        note = nothing_to_run(sweep, load(out_dir))
        if note and not quiet:
            print(f"confirmation: {note}")
        return False
    _record_samples(record, out_dir, len(phase))
    return interrupted_fit(build_tuner(sweep, record, out_dir, num_samples=len(phase), seed_trials=False,
                                       quiet=quiet, confirm=phase))


def _record_samples(record: SweepRecord, out_dir: Path, num_samples: int) -> None:
    """Remember how many trials the Tuner about to start will create (to tell later whether it finished)."""
    record.tune_num_samples = num_samples
    record.write(out_dir)


def _finish(sweep: Sweep, out_dir: Path) -> int:
    """Write ``trials.csv`` and print the summary; returns its exit code."""
    return print_summary(sweep, write_trials_csv(out_dir), out_dir)
