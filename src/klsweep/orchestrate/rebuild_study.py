"""``sweep rebuild-study RUN_DIR``: a sweep's Optuna study rebuilt from its Ray Tune experiment (``tune/``).

Every Tune trial folder holds what the study held about it: ``params.json`` (its config), ``result.json`` (one JSON
object per reported step, the last with the health verdict and stop reason) and, for a trial that raised,
``error.txt``. Tune's ``experiment_state-*.json`` holds each trial's status. From these, each trial is added with
Optuna's ``create_trial``/``Study.add_trial`` (optuna.readthedocs.io, "optuna.trial.create_trial"):

- params: the searched parameters of the config, as first proposed. A remedied trial's config holds its restart
  values; the first remedy record of each changed knob gives its proposed value (``old``);
- distributions: the sweep's search space replayed on those params (``optuna.trial.FixedTrial``);
- state and values: the rule the searcher applies when a trial ends
  (:func:`klsweep.orchestrate.searcher.outcome`); intermediate values: each step's objective (one objective);
- user attributes: ``ray_trial_id``, ``health``, ``stop_reason``, ``steps``, ``verl_overrides``, ``remedies``, and
  ``confirm_of``/``confirm_seed`` for a confirmation run (its params, less ``data.seed``, are an earlier trial's).

A trial Tune had not finished when the study was lost is added FAIL with that reason: its Optuna trial cannot be
matched to the searcher state Tune saved. Trials are numbered in the order Tune created them. A corrupt or empty
study file is kept beside the new one as ``study.db.broken-<UTC time>``.
"""

from __future__ import annotations

import json
import math
import re
import time
import warnings
from pathlib import Path
from typing import Any

import optuna

from klsweep._format import arg
from klsweep.analysis.study_file import check_study, sqlite_file, study_problem
from klsweep.analysis.sweep_dir import storage_from_url
from klsweep.analysis.trials_csv import write_trials_csv
from klsweep.errors import ResultsError
from klsweep.orchestrate.confirm_search import SEED_MAX
from klsweep.orchestrate.driver_lock import driver_lock
from klsweep.orchestrate.remedy import REMEDIES
from klsweep.orchestrate.searcher import outcome
from klsweep.orchestrate.tuner import study_description
from klsweep.results import (
    ATTR_CONFIRM_OF,
    ATTR_CONFIRM_SEED,
    ATTR_HEALTH,
    ATTR_RAY_TRIAL_ID,
    ATTR_REMEDIES,
    ATTR_RESCUED_VALUES,
    ATTR_STEPS,
    ATTR_STOP_REASON,
    ATTR_VERL_OVERRIDES,
    CONSTRAINTS_ATTR,
    HEALTH,
    STEP,
    STOP_KIND,
    STOP_REASON,
    TOTAL_STEPS,
    TUNE_DIR,
    SweepRecord,
    remedied_reason,
    result_rows,
)
from klsweep.spec.schema import Sweep
from klsweep.spec.space import SEED_KEY, define_space, trial_overrides

#: Tune's trial folder name ends with the trial's creation time (``..._2026-12-01_23-24-15``)
_CREATED = re.compile(r"_(\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2})$")
#: Tune's trial folder name: ``<trainable>_<trial id>_<index>_...``
_INDEX = re.compile(r"_[0-9a-f]{5,}_(\d+)_")
_UNFINISHED = ("in flight when the study was lost; its Optuna trial could not be matched to Tune's saved searcher "
               "state: marked FAIL by sweep rebuild-study")


def rebuild_study(run_dir: str) -> int:
    """Rebuild the study of the sweep in ``run_dir`` from ``tune/``, write ``trials.csv`` and say what it holds.

    Returns 0.

    Raises:
        ResultsError: ``run_dir`` is not a sweep directory; another driver runs there; its study is readable (nothing
            to rebuild); its storage is not a SQLite file; or ``tune/`` holds no trial.
    """
    out_dir = Path(run_dir).resolve()
    record = SweepRecord.read(out_dir)
    file = sqlite_file(record, out_dir)
    if file is None:
        raise ResultsError(f"{out_dir}: its study is in {record.storage}, not a SQLite file: sweep rebuild-study "
                           "rebuilds a sweep's own study.db only")
    problem = study_problem(record, out_dir)
    if problem is None:
        raise ResultsError(f"{file} holds the study {record.study_name!r} and is readable: nothing to rebuild "
                           f"(sweep status {arg(run_dir)} shows it)")
    trials = tune_trials(out_dir)
    if not trials:
        raise ResultsError(f"{out_dir / TUNE_DIR} holds no trial: nothing to rebuild the study from. Start the sweep "
                           f"again with: sweep run {record.sweep_file} --out {out_dir} --overwrite")
    with driver_lock(out_dir):
        sweep = Sweep.model_validate(record.sweep)
        if file.exists():
            kept = file.with_name(f"{file.name}.broken-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
            file.rename(kept)
            print(f"rebuild-study: {file.name} was {problem}; kept as {kept.name}")
        study = _new_study(sweep, record, out_dir)
        for frozen in study_trials(sweep, record, trials):
            study.add_trial(frozen)
        check_study(record, out_dir)
        df = write_trials_csv(out_dir)
    counts = df["state"].value_counts()
    print(f"rebuild-study: {len(df)} trials from {out_dir / TUNE_DIR} into {file} ("
          + ", ".join(f"{n} {state}" for state, n in counts.items()) + f"); continue with: sweep resume {arg(run_dir)}")
    return 0


def _new_study(sweep: Sweep, record: SweepRecord, out_dir: Path) -> optuna.Study:
    """The empty study, labelled as the searcher labels it (metric names, description)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name=record.study_name, storage=storage_from_url(record.storage_url(out_dir)),
                                directions=["maximize" if o.mode == "max" else "minimize" for o in record.objectives])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # set_metric_names: Optuna 3.2+
        study.set_metric_names([o.metric for o in record.objectives])
    study.set_user_attr("description", study_description(sweep, record))
    return study


def tune_trials(out_dir: Path) -> list[dict[str, Any]]:
    """The Tune trials of ``out_dir/tune``, in creation order: each a dict with ``trial_id``, ``status`` (Tune's
    last saved one, else ``TERMINATED`` for a trial whose last result says ``done``), ``config`` (``params.json``),
    ``rows`` (``result.json``) and ``error`` (an ``error.txt`` is there)."""
    tune_dir = out_dir / TUNE_DIR
    saved: dict[str, dict[str, Any]] = {}
    for state in sorted(tune_dir.glob("experiment_state-*.json")):
        try:
            entries = json.loads(state.read_text()).get("trial_data", [])
        except (OSError, json.JSONDecodeError):
            continue
        for trial_json, _meta in entries:
            trial = json.loads(trial_json) if isinstance(trial_json, str) else trial_json
            saved[str(trial.get("relative_logdir"))] = trial
    out = []
    for folder in sorted(tune_dir.iterdir() if tune_dir.is_dir() else [], key=_created):
        if not (folder / "params.json").is_file():
            continue
        rows = result_rows(folder / "result.json")
        trial = saved.get(folder.name, {})
        trial_id = trial.get("trial_id") or (rows[0].get("trial_id") if rows else None)
        if not trial_id:
            continue
        done = bool(rows and rows[-1].get("done"))
        out.append({"trial_id": trial_id, "status": trial.get("status") or ("TERMINATED" if done else "RUNNING"),
                    "config": json.loads((folder / "params.json").read_text()), "rows": rows,
                    "error": (folder / "error.txt").is_file()})
    return out


def _created(folder: Path) -> tuple[str, int, str]:
    created = _CREATED.search(folder.name)
    index = _INDEX.search(folder.name)
    return (created.group(1) if created else "", int(index.group(1)) if index else 0, folder.name)


def study_trials(sweep: Sweep, record: SweepRecord, trials: list[dict[str, Any]]) -> list[optuna.trial.FrozenTrial]:
    """The study's trials for the Tune ``trials`` of :func:`tune_trials` (see the module docstring)."""
    metrics = [o.metric for o in record.objectives]
    out: list[optuna.trial.FrozenTrial] = []
    numbers: dict[str, int] = {}  # a search trial's params (JSON) → its number, for confirmation runs
    for number, trial in enumerate(trials):
        remedies = list((trial["rows"][-1].get("config") or {}).get(REMEDIES, ())) if trial["rows"] else []
        config = {k: v for k, v in trial["config"].items() if k != REMEDIES}
        for record_ in reversed(remedies or trial["config"].get(REMEDIES, ())):  # the oldest record wins
            config[record_["key"]] = record_["old"]
        seed = config.pop(SEED_KEY, None)
        fixed = optuna.trial.FixedTrial(config)
        define_space(sweep)(fixed)
        params, distributions = dict(fixed.params), dict(fixed.distributions)
        attrs: dict[str, Any] = {ATTR_RAY_TRIAL_ID: trial["trial_id"]}
        key = json.dumps(params, sort_keys=True, default=str)
        if seed is not None and key in numbers:
            params[SEED_KEY] = seed
            distributions[SEED_KEY] = optuna.distributions.IntDistribution(0, SEED_MAX)
            attrs.update({ATTR_CONFIRM_OF: numbers[key], ATTR_CONFIRM_SEED: seed})
        else:
            numbers.setdefault(key, number)
        attrs[ATTR_VERL_OVERRIDES] = json.dumps(trial_overrides(sweep, {**config, **(
            {SEED_KEY: seed} if seed is not None else {})}))
        if remedies:
            attrs[ATTR_REMEDIES] = json.dumps(remedies)
        out.append(_frozen(sweep, metrics, trial, params, distributions, attrs))
    return out


def _frozen(sweep: Sweep, metrics: list[str], trial: dict[str, Any], params: dict[str, Any],
            distributions: dict[str, Any], attrs: dict[str, Any]) -> optuna.trial.FrozenTrial:
    """One trial's ``create_trial``: its state, values and attributes from its last result."""
    rows = trial["rows"]
    last = rows[-1] if rows else {}
    values: list[float | None] = []
    for metric in metrics:
        seen = [float(r[metric]) for r in rows if _number(r.get(metric))]
        values.append(seen[-1] if seen else None)
    steps = int(last.get(STEP, last.get("training_iteration", 0)) or 0)
    health = str(last.get(HEALTH) or "healthy")
    if trial["status"] not in ("TERMINATED", "ERROR"):
        state, reason = optuna.trial.TrialState.FAIL, _UNFINISHED
    else:
        total = int(last.get(TOTAL_STEPS) or sweep.budget.max_steps)
        state, reason = outcome(metrics, trial["error"] or trial["status"] == "ERROR", health,
                                str(last.get(STOP_KIND) or ""), str(last.get(STOP_REASON) or ""), steps < total,
                                steps, values)
    if attrs.get(ATTR_REMEDIES) and state == optuna.trial.TrialState.COMPLETE:  # as the searcher records it
        state, reason = optuna.trial.TrialState.PRUNED, remedied_reason(attrs[ATTR_REMEDIES])
        attrs[ATTR_RESCUED_VALUES] = values
    attrs.update({ATTR_HEALTH: health, ATTR_STOP_REASON: reason, ATTR_STEPS: steps})
    intermediate = {int(r["training_iteration"]): float(r[metrics[0]]) for r in rows
                    if len(metrics) == 1 and _number(r.get(metrics[0])) and math.isfinite(r[metrics[0]])
                    and "training_iteration" in r}
    told: Any = None
    if state == optuna.trial.TrialState.PRUNED and intermediate:
        told = intermediate[max(intermediate)]  # as Optuna's tell: a PRUNED trial's last intermediate value
    elif state == optuna.trial.TrialState.COMPLETE:
        told = values if len(values) > 1 else values[0]
    feasible = len(metrics) > 1 and state != optuna.trial.TrialState.FAIL
    system = {CONSTRAINTS_ATTR: [1.0 if health == "stopped" else -1.0]} if feasible else {}
    return optuna.trial.create_trial(
        state=state, params=params, distributions=distributions, user_attrs=attrs, system_attrs=system,
        intermediate_values=intermediate, **({"values": told} if isinstance(told, list) else {"value": told}))


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
