"""``sweep run``: a sweep file becomes Ray Tune trials proposed by Optuna, stopped by health rules, saved to runs/<name>/.

The flow: load and validate the sweep file → preflight every seed trial's verl config → Ray (private local Ray, or
``--address`` for a cluster) → ``Tuner`` with :class:`~klsweep.orchestrate.searcher.KlsweepSearch` (Optuna study in
``<out>/study.db``), :class:`~klsweep.health.HealthStopper` as the stopper, optional ASHA → ``trials.csv`` and the best
trial with the verl command line that reproduces it.

Results directory (``runs/<name>/`` or ``--out``): ``sweep.json`` (the resolved sweep), ``study.db`` (Optuna),
``tune/`` (the Ray Tune experiment), ``trials.csv`` (one row per trial, :func:`klsweep.analysis.load`).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from klsweep.errors import ResultsError
from klsweep.analysis.load import SWEEP_FILE, TUNE_DIR, storage_from_url

TRIALS_CSV = "trials.csv"


def _prepare_out(out: Path, *, resume: bool, overwrite: bool) -> None:
    if out.exists() and any(out.iterdir()):
        if overwrite:
            shutil.rmtree(out)
        elif not resume:
            raise ResultsError(
                f"{out} already holds a sweep: pass --resume to continue it, --overwrite to replace it, "
                f"or --out DIR to write elsewhere"
            )
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
    _preflight(sweep)
    out_dir = Path(out or Path("runs") / sweep.name).resolve()
    if resume and (out_dir / SWEEP_FILE).is_file():
        return resume_sweep(str(out_dir), overrides, address=address, quiet=quiet)
    _prepare_out(out_dir, resume=resume, overwrite=overwrite)
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

    Raises:
        ResultsError: ``run_dir`` is not a sweep directory.
    """
    from klsweep.analysis.load import sweep_info
    from klsweep.spec import load_sweep

    out_dir = Path(run_dir).resolve()
    info = sweep_info(out_dir)
    sweep = load_sweep(info["sweep_file"], [*info.get("overrides", []), *overrides])
    info["overrides"] = [*info.get("overrides", []), *overrides]
    info["sweep"] = sweep.model_dump(mode="json")
    (out_dir / SWEEP_FILE).write_text(json.dumps(info, indent=2))
    return _fit(sweep, info, out_dir, address=address, quiet=quiet, restore=True)


def _preflight(sweep) -> None:
    from klsweep.space import trial_overrides
    from klsweep.verl.preflight import preflight

    for params in sweep.seed_trials or [{}]:
        for warning in preflight(trial_overrides(sweep, params), trainer=sweep.trainer):
            print(f"warning: {warning}", file=sys.stderr)


def _init_ray(sweep, address: str | None) -> None:
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if ray.is_initialized():
        return
    if address:
        ray.init(address=address, log_to_driver=False)
        return
    cpus = max(os.cpu_count() or 1, int(sweep.budget.max_concurrent * sweep.budget.resources.cpu))
    ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False, logging_level="ERROR")


def _fit(sweep, info: dict, out_dir: Path, *, address: str | None, quiet: bool, restore: bool) -> int:
    import optuna
    from ray import tune

    from klsweep.health import HealthStopper, load_ruleset
    from klsweep.orchestrate.progress import SweepProgress
    from klsweep.orchestrate.samplers import build_sampler
    from klsweep.orchestrate.searcher import KlsweepSearch
    from klsweep.orchestrate.trainable import run_trial
    from klsweep.space import define_space, trial_overrides

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    metrics = [o.metric for o in sweep.objectives]
    modes = [o.mode for o in sweep.objectives]
    single = len(metrics) == 1
    searcher = KlsweepSearch(
        space=define_space(sweep),
        metric=metrics[0] if single else metrics,
        mode=modes[0] if single else modes,
        points_to_evaluate=None if restore else [dict(p) for p in sweep.seed_trials] or None,
        sampler=build_sampler(sweep),
        study_name=info["study_name"],
        storage=storage_from_url(info["storage"]),
        overrides_of=lambda params: trial_overrides(sweep, params),
        total_steps=sweep.budget.max_steps,
    )
    scheduler = None
    if sweep.scheduler.type == "asha":
        from ray.tune.schedulers import ASHAScheduler

        scheduler = ASHAScheduler(
            time_attr="training_iteration", metric=metrics[0], mode=modes[0], max_t=sweep.budget.max_steps,
            grace_period=sweep.scheduler.grace_period, reduction_factor=sweep.scheduler.reduction_factor,
        )
    resources = {"cpu": sweep.budget.resources.cpu, "gpu": sweep.budget.resources.gpu}
    trainable = tune.with_resources(tune.with_parameters(run_trial, sweep=sweep), resources)
    progress = SweepProgress(sweep.budget.trials, metrics, quiet=quiet)
    stopper = HealthStopper(load_ruleset(sweep.health), run_config_of=lambda params: trial_overrides(sweep, params))

    _init_ray(sweep, address)
    tune_config = tune.TuneConfig(
        search_alg=searcher,
        scheduler=scheduler,
        num_samples=sweep.budget.trials,
        max_concurrent_trials=sweep.budget.max_concurrent,
        reuse_actors=True,
    )
    run_config = tune.RunConfig(
        name=TUNE_DIR,
        storage_path=str(out_dir),
        stop=stopper,
        callbacks=[progress],
        verbose=0,
        failure_config=tune.FailureConfig(max_failures=0),
    )
    tune_path = out_dir / TUNE_DIR
    if restore and tune.Tuner.can_restore(str(tune_path)):
        tuner = tune.Tuner.restore(str(tune_path), trainable=trainable, resume_errored=False, restart_errored=False)
    else:
        tuner = tune.Tuner(trainable, tune_config=tune_config, run_config=run_config)
    tuner.fit()
    return _finish(sweep, out_dir)


def _finish(sweep, out_dir: Path) -> int:
    from klsweep.analysis.load import load
    from klsweep.orchestrate.summary import print_summary

    df = load(out_dir)
    tmp = out_dir / (TRIALS_CSV + ".tmp")
    df.to_csv(tmp, index=False)
    os.replace(tmp, out_dir / TRIALS_CSV)
    return print_summary(sweep, df, out_dir)
