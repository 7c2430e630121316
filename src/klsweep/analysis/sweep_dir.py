"""Read a sweep directory into pandas: one row per trial (:func:`load`) or one per trial step (:func:`load_history`).

A sweep directory (``runs/<name>/``) holds ``sweep.json`` (the resolved sweep), the Optuna study (``study.db``
unless another storage was given) and the Ray Tune experiment (``tune/``, one folder per trial with a
``result.json`` of one JSON object per reported step). Nothing here needs Ray running.

Columns of :func:`load` (the same as ``trials.csv``):

- ``number`` (Optuna trial number), ``trial_id`` (Ray Tune trial id), ``state`` (COMPLETE, PRUNED, FAIL, RUNNING),
  ``health`` (healthy | warned | stopped), ``stop_reason`` (of a trial that raised: the exception from its Tune
  ``error.txt``, :func:`klsweep.results.failure_reason`), ``steps`` (training steps run), ``wall_s`` (seconds),
  ``gpu_s`` (GPU-seconds reserved: ``wall_s`` × the sweep's ``budget.resources.gpu``);
- ``config/<verl key>``: every verl override of the trial as proposed (e.g. ``config/algorithm.kl_ctrl.kl_coef``);
- ``remedies``: a remedied trial's schedule, JSON: ``[{"restart", "step", "rule", "from_step", "key",
  "old", "new"}, ...]``, oldest first; its other columns are those of its last run (empty when not remedied);
- ``value/<metric>``: the value told to Optuna for each objective (the last reported value; empty when PRUNED/FAIL);
- ``last/<metric>`` and ``best/<metric>``: the **last** reported value and the best value over the run (by the
  objective's direction) for each objective. Stock Ray dataframes give the best-ever row; the names here say which;
- ``last/ref_kl``, ``max/ref_kl``, ``kl_metric``: the reference KL (``actor/kl_loss`` with KL in the loss,
  ``actor/reward_kl_penalty`` with KL in the reward; ``kl_metric`` names which), last and peak;
- ``last/entropy``, ``min/entropy``, ``last/score``, ``max/score``: policy entropy and training score
  (``critic/score/mean``);
- ``stop_kind``: the kind of a stop (a health rule's ``diverged``, ``collapsed``, ..., or ``objective``; empty when
  none); ``confirm_of``: on a confirmation run (``budget.confirm``), the number of the search trial it re-runs with a
  new training seed (``config/data.seed``), and ``confirm_seed``: that seed; both integers (pandas ``Int64``), empty
  on search trials.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from klsweep.analysis.study_file import StudyNotCreated, check_study
from klsweep.results import (
    ATTR_CONFIRM_OF,
    ATTR_CONFIRM_SEED,
    ATTR_HEALTH,
    ATTR_RAY_TRIAL_ID,
    ATTR_REMEDIES,
    ATTR_STEPS,
    ATTR_STOP_REASON,
    ATTR_VERL_OVERRIDES,
    HEALTH,
    STEP,
    STOP_KIND,
    STOP_REASON,
    TOTAL_STEPS,
    TUNE_DIR,
    SweepRecord,
    failure_reason,
)
from klsweep.verl.metrics import resolve

if TYPE_CHECKING:
    from klsweep.results import Objective


def sweep_info(path: str | Path) -> SweepRecord:
    """The record of a sweep directory (``sweep.json``): name, study, storage, objectives, the resolved sweep.

    Raises:
        ResultsError: the directory is not a klsweep sweep directory.
    """
    return SweepRecord.read(path)


def study_of(path: str | Path, record: SweepRecord | None = None):
    """The Optuna study of the sweep directory ``path`` (its ``study_name`` and ``storage`` in ``sweep.json``).

    Never creates a study or its file (:func:`klsweep.analysis.study_file.check_study`).

    Raises:
        StudyNotCreated: its study is not created yet and no trial ran (a sweep creates it when its first trial
            starts).
        ResultsError: ``path`` is not a sweep directory, or its study file is missing, empty or corrupt while
            ``tune/`` holds trial results (the message names the rebuild command).
    """
    import optuna

    record = record or SweepRecord.read(path)
    check_study(record, path)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        return optuna.load_study(study_name=record.study_name, storage=storage_from_url(record.storage_url(path)))
    except KeyError:  # optuna's "Record does not exist."
        raise StudyNotCreated(f"{path}: the study {record.study_name!r} is not in its storage yet (the sweep creates "
                              "it when its first trial starts)") from None


def storage_from_url(url: str):
    """An Optuna storage object for a URL: ``sqlite:///…`` or any RDB URL, or ``journal:///path.log`` (journal file,
    for sweeps whose trials run on several nodes without a database server)."""
    import optuna

    if url.startswith("journal://"):
        from optuna.storages.journal import JournalFileBackend

        return optuna.storages.JournalStorage(JournalFileBackend(url[len("journal://"):]))
    import sqlalchemy.exc

    engine_kwargs = {"connect_args": {"timeout": 30}} if url.startswith("sqlite") else None
    for attempt in range(3):
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs)
        except (sqlalchemy.exc.OperationalError, sqlalchemy.exc.IntegrityError) as e:
            # two processes opened a new database at once (a driver creating it, a notebook polling it): both saw no
            # tables and both created them (RDBStorage's create_all); the one that lost finds them made on a retry
            if attempt == 2 or not any(s in str(e) for s in ("already exists", "UNIQUE constraint failed")):
                raise
            time.sleep(0.1)
    raise AssertionError("unreachable")


def _tune_trials(path: Path) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    tune_dir = path / TUNE_DIR
    if not tune_dir.is_dir():
        return
    for result_file in sorted(tune_dir.glob("*/result.json")):
        lines = [line for line in result_file.read_text().splitlines() if line.strip()]
        try:  # one decode per file, not one per line (benchmarks/load_speed.py times it)
            rows = json.loads("[" + ",".join(lines) + "]")
        except json.JSONDecodeError:
            rows = []
            for line in lines:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:  # the last line of a trial killed mid-write
                    break
        if rows:
            yield rows[0].get("trial_id", result_file.parent.name), rows


def _numbers(rows: list[dict[str, Any]], key: str) -> list[float]:
    out = []
    for row in rows:
        v = row.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out.append(float(v))
    return out


def _summarise(rows: list[dict[str, Any]], objectives: list[Objective]) -> dict[str, Any]:
    last = rows[-1]
    out: dict[str, Any] = {
        "steps": int(last.get(STEP, last.get("training_iteration", len(rows)))),
        "wall_s": float(last.get("time_total_s", float("nan"))),
        "health": last.get(HEALTH),
        "stop_reason": last.get(STOP_REASON),
        "stop_kind": last.get(STOP_KIND),
    }
    for objective in objectives:
        metric, values = objective.metric, _numbers(rows, objective.metric)
        out[f"last/{metric}"] = values[-1] if values else None
        out[f"best/{metric}"] = (max(values) if objective.mode == "max" else min(values)) if values else None
    for alias, stat, reduce in (("ref_kl", "max", max), ("entropy", "min", min), ("score", "max", max)):
        key = next((k for k in (resolve(r, alias) for r in rows) if k), None)
        values = _numbers(rows, key) if key else []
        out[f"last/{alias}"] = values[-1] if values else None
        out[f"{stat}/{alias}"] = reduce(values) if values else None
        if alias == "ref_kl":
            out["kl_metric"] = key
    return out


#: ``load(path).attrs[STEP_SECONDS]``: each trial's seconds per step, ``{trial_id: seconds}`` (:func:`step_seconds`).
STEP_SECONDS = "step_s"


def step_seconds(rows: list[dict[str, Any]]) -> float | None:
    """A trial's seconds per training step from its Tune results ``rows``, its process's start-up left out.

    Tune's ``time_total_s`` counts from the trainable's start, so a trial's first report also holds the start-up of
    its process (Ray's worker, imports, the model's load: minutes for verl), and so does the first report after a
    resume (``iterations_since_restore`` 1). The rate is therefore the time between reports over the steps between
    them, ``Σ (time_total_s[i] − time_total_s[i−1]) / Σ (step[i] − step[i−1])``, over the reports ``i`` after a
    trial's first that are not the first of a (re)start and whose step is past the one before. None when there is
    no such pair (a single step).
    """
    seconds = steps = 0.0
    for before, row in zip(rows, rows[1:]):
        if row.get("iterations_since_restore") == 1:
            continue
        times = [row.get("time_total_s"), before.get("time_total_s")]
        marks = [row.get(STEP, row.get("training_iteration")), before.get(STEP, before.get("training_iteration"))]
        if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in times + marks):
            continue
        if marks[0] > marks[1] and times[0] >= times[1]:
            seconds += times[0] - times[1]
            steps += marks[0] - marks[1]
    return seconds / steps if steps else None


def load(path: str | Path) -> pd.DataFrame:
    """One row per trial of the sweep in ``path`` (columns: see the module docstring), ordered by trial number.

    ``attrs[STEP_SECONDS]`` holds each trial's seconds per step (:func:`step_seconds`), read in the same pass.

    A WAITING study trial (enqueued, never taken by a Tune trial: a driver killed before it started) has no row: it
    has not run, and ``sweep resume`` runs it.

    Raises:
        ResultsError: ``path`` is not a sweep directory.
    """
    path = Path(path)
    record = SweepRecord.read(path)
    objectives = record.objectives
    histories = dict(_tune_trials(path))
    rows = []
    try:
        trials = study_of(path, record).get_trials(deepcopy=False)
    except StudyNotCreated:
        trials = []  # started, but its first trial not yet: no row
    for trial in trials:
        if trial.state.name == "WAITING":
            continue
        attrs = trial.user_attrs
        trial_id = attrs.get(ATTR_RAY_TRIAL_ID)
        row: dict[str, Any] = {"number": trial.number, "trial_id": trial_id, "state": trial.state.name}
        overrides = attrs.get(ATTR_VERL_OVERRIDES)
        if isinstance(overrides, str) and overrides.startswith("{"):
            row.update({f"config/{k}": v for k, v in json.loads(overrides).items()})
        else:
            row.update({f"config/{k}": v for k, v in trial.params.items()})
        history = histories.get(trial_id)
        if history:
            row.update(_summarise(history, objectives))
        for column, attr in (("health", ATTR_HEALTH), ("stop_reason", ATTR_STOP_REASON), ("steps", ATTR_STEPS),
                             ("remedies", ATTR_REMEDIES)):
            if attrs.get(attr) is not None:
                row[column] = attrs[attr]
        if "stop_reason" in row:  # a trial that raised: the exception, from its error.txt
            row["stop_reason"] = failure_reason(path, row["state"], trial_id, row["stop_reason"])
        for column, attr in (("confirm_of", ATTR_CONFIRM_OF), ("confirm_seed", ATTR_CONFIRM_SEED)):
            if attrs.get(attr) is not None:
                row[column] = attrs[attr]
        values = trial.values or []
        for objective, value in zip(objectives, values):
            row[f"value/{objective.metric}"] = value
        rows.append(row)
    df = pd.DataFrame(rows)
    for column in ("confirm_of", "confirm_seed"):  # integers, empty on search trials (float64 wrote "2.0")
        if column in df:
            df[column] = pd.to_numeric(df[column]).astype("Int64")
    df.attrs[STEP_SECONDS] = {str(t): rate for t, rows in histories.items()
                              if (rate := step_seconds(rows)) is not None}
    if "wall_s" in df:
        df["gpu_s"] = df["wall_s"] * float(record.sweep.get("budget", {}).get("resources", {}).get("gpu", 0.0))
    return df


def overrides_of(row: Mapping[str, Any]) -> dict[str, Any]:
    """The flat verl overrides of one trial, from the ``config/<verl key>`` entries of a :func:`load` row.

    ``row`` is a pandas Series or a dict. Empty cells (keys other trials set) are left out.
    Numpy scalars become Python values, ready for :func:`klsweep.verl.config.verl_command`.
    Whole floats become ints: verl's int fields (``ppo_epochs``) refuse ``1.0``, its float fields accept ``1``."""
    out = {}
    for key, value in row.items():
        if not str(key).startswith("config/") or value is None or (isinstance(value, float) and math.isnan(value)):
            continue
        value = value.item() if hasattr(value, "item") else value
        out[key[len("config/"):]] = int(value) if isinstance(value, float) and value.is_integer() else value
    return out


def load_history(path: str | Path) -> pd.DataFrame:
    """Every reported step of every trial in long format: columns ``trial_id``, ``step``, ``metric``, ``value``.

    ``step`` is the training step (``step``, else Tune's ``training_iteration``).

    Only numeric metrics are kept (strings such as ``stop_reason`` are in :func:`load`).

    Raises:
        ResultsError: ``path`` is not a sweep directory.
    """
    path = Path(path)
    SweepRecord.read(path)
    records = []
    skip = {"training_iteration", "timestamp", "time_this_iter_s", "time_total_s", "time_since_restore",
            "iterations_since_restore", "pid", "done", TOTAL_STEPS}
    for trial_id, rows in _tune_trials(path):
        for row in rows:
            step = row.get(STEP, row.get("training_iteration"))
            for key, value in row.items():
                if key in skip or isinstance(value, bool) or not isinstance(value, (int, float)):
                    continue
                records.append((trial_id, step, key, float(value)))
    return pd.DataFrame.from_records(records, columns=["trial_id", "step", "metric", "value"])
