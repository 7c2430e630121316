"""Repairs of Ray Tune's and Optuna's saved state after the sweep driver was killed (SIGKILL, a lost login node).

The driver saves three things at different times: Tune's experiment state (every few seconds), Tune's search state
(with the searcher) and the Optuna study (on every tell). After a SIGKILL they disagree, and ``Tuner.restore`` alone
would re-run finished trials, hang on trials it will never start, or overrun the budget. The functions here make them
agree before the restore. They rely on the private internals named below. These were checked against **Ray 2.60.0**
and **Optuna 5.0.0**; ``pyproject.toml`` pins both, and this module must be re-checked when either moves:

- ``<tune>/experiment_state-*.json``: JSON with ``trial_data``, a list of ``[trial_json, metadata]`` pairs whose
  ``trial_json`` holds ``trial_id`` and ``status`` (``ray/tune/execution/tune_controller.py``, ``save_to_dir``).
- ``<tune>/search_gen_state-*.json``: a cloudpickled dict of ``SearchGenerator`` with ``counter`` (trials created)
  and, for the ``ConcurrencyLimiter``, ``name:ConcurrencyLimiter`` → ``live_trials`` and
  ``num_unfinished_live_trials`` (``ray/tune/search/search_generator.py``, ``concurrency_limiter.py``).
- ``<tune>/searcher-state-*.pkl``: the pickled ``__dict__`` of ``OptunaSearch``, whose ``_ot_trials`` maps Tune
  trial ids to Optuna trials (``ray/tune/search/optuna/optuna_search.py``).
- ``trial_data``'s ``metadata`` is ``_TrainingRunMetadata.get_json_state`` (``ray/tune/trainable/metadata.py``); its
  ``checkpoint_manager`` is a ``_CheckpointManager`` (``ray/train/_internal/checkpoint_manager.py``) whose private
  ``_checkpoint_results`` and ``_latest_checkpoint_result`` hold ``_TrainingResult`` (checkpoint, metrics); whether
  a checkpoint exists is ``_exists_at_fs_path`` (``ray/train/_internal/storage.py``), as ``Trainable.restore`` asks.
  ``_TrainingResult`` is in ``ray/train/_internal/session.py``; a checkpoint's metrics are its reported result,
  the row ``JsonLoggerCallback`` writes to ``result.json`` with its ``checkpoint_dir_name``.
- Optuna's ``RDBStorage`` pickles its ``url`` and opens it when unpickled (``__setstate__``,
  ``optuna/storages/_rdb/storage.py``).
- Optuna: ``Study._storage`` with ``set_trial_user_attr`` / ``set_trial_state_values``, and ``FrozenTrial._trial_id``
  (``optuna/storages/_base.py``), to finish a trial another process asked.

``KlsweepSearch.restore`` (orchestrate/searcher.py) then adopts the study's orphaned RUNNING trials.
"""

from __future__ import annotations

import io
import json
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path

import optuna
import ray.cloudpickle as cloudpickle
from ray.train._internal.session import _TrainingResult
from ray.train._internal.storage import _exists_at_fs_path
from ray.tune.result import EXPR_RESULT_FILE
from ray.tune.trainable.metadata import _TrainingRunMetadata

from klsweep.results import ATTR_RAY_TRIAL_ID, ATTR_STOP_REASON, result_rows


class _Repointing(pickle.Unpickler):
    """Unpickles every Optuna ``RDBStorage`` with its URL replaced by ``url`` (a plain ``RDBStorage`` again once
    built)."""

    def __init__(self, data: bytes, url: str):
        super().__init__(io.BytesIO(data))
        self._url = url

    def find_class(self, module: str, name: str) -> type:
        if (module, name) != ("optuna.storages._rdb.storage", "RDBStorage"):
            return super().find_class(module, name)
        url = self._url

        class Repointed(optuna.storages.RDBStorage):
            def __setstate__(self, state: dict) -> None:
                super().__setstate__({**state, "url": url})
                self.__class__ = optuna.storages.RDBStorage  # type: ignore[assignment]

        return Repointed


def repoint_search_state(tune_path: str | Path, url: str) -> None:
    """Point the study storage saved with the searcher (``searcher-state-*.pkl``, ``search_gen_state-*.json``) at
    ``url``, the sweep's storage as resolved for its results directory now.

    The saved ``RDBStorage`` holds the URL of when it was saved, and unpickling it opens that URL. A results
    directory moved since then saved the old absolute path of its ``study.db``, which no longer opens, and
    Tune's restore of the searcher would fail on it."""
    for pattern in ("searcher-state-*.pkl", "search_gen_state-*.json"):
        for file in Path(tune_path).glob(pattern):
            state = _Repointing(file.read_bytes(), url).load()
            file.write_bytes(cloudpickle.dumps(state))


def _saved_trials(tune_path: str) -> list[dict] | None:
    """The trials of Tune's latest saved experiment state (each a dict with ``trial_id`` and ``status``), or None
    when Tune saved none."""
    states = sorted(Path(tune_path).glob("experiment_state-*.json"))
    if not states:
        return None
    return [json.loads(state) if isinstance(state, str) else state
            for state, _meta in json.loads(states[-1].read_text()).get("trial_data", [])]


def tune_finished(tune_path: str, num_samples: int) -> bool:
    """Whether the saved Tune experiment created its ``num_samples`` trials and every one of them ended."""
    trials = _saved_trials(tune_path)
    if trials is None:
        return True
    return len(trials) >= num_samples and all(t.get("status") in ("TERMINATED", "ERROR") for t in trials)


def copy_staged_results(session_dir: Path | None, tune_path: str) -> list[str]:
    """Copy into ``tune_path`` the files a killed driver had written in its Ray session but not yet synced there.

    Tune's driver writes each trial's ``progress.csv`` and ``params.json`` and its experiment state in a staging
    folder of its Ray session, ``<session>/artifacts/<time>/<experiment>/driver_artifacts`` (``StorageContext``,
    ray/train/_internal/storage.py), and copies it to storage only every few seconds and when it ends. A SIGKILL
    loses the last copy. (``result.json`` is written in storage row by row:
    :class:`klsweep.orchestrate.result_json.ResultsFromCheckpoint`.) A staged file newer than the one in storage
    replaces it; the rest is kept.

    Returns:
        The paths copied, relative to ``tune_path``.
    """
    if session_dir is None:
        return []
    copied = []
    for staging in sorted(Path(session_dir).glob(f"artifacts/*/{Path(tune_path).name}/driver_artifacts")):
        for source in sorted(p for p in staging.rglob("*") if p.is_file()):
            target = Path(tune_path, source.relative_to(staging))
            if target.exists() and target.stat().st_mtime >= source.stat().st_mtime:
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
            copied.append(str(source.relative_to(staging)))
    return copied


def close_told_trials(tune_path: str, study) -> None:
    """Mark TERMINATED, in Tune's saved experiment state, the trials the study already holds as finished.

    Tune saves its state every few seconds. After a SIGKILL of the driver, that state can be older than the study.
    A trial may have finished and been told to Optuna after the last save. ``Tuner.restore`` would re-run it from
    step 0, and its results on the finished Optuna trial would raise UpdateFinishedTrialError and abort the resume.
    """
    done = {t.user_attrs.get(ATTR_RAY_TRIAL_ID) for t in study.get_trials(deepcopy=False, states=(
        optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL))}

    def close(entry: list) -> bool:
        trial = json.loads(entry[0])
        if trial.get("trial_id") not in done or trial.get("status") in ("TERMINATED", "ERROR"):
            return False
        entry[0] = json.dumps(trial | {"status": "TERMINATED"})
        return True

    _edit_saved_trials(tune_path, close)


def _edit_saved_trials(tune_path: str, edit: Callable[[list], bool]) -> None:
    """Call ``edit`` on every ``[trial_json, metadata_json]`` entry of each of Tune's saved experiment states; it
    changes the entry in place and says whether it did. A file is rewritten when one of its entries changed."""
    for state_file in Path(tune_path).glob("experiment_state-*.json"):
        data = json.loads(state_file.read_text())
        if [entry for entry in data.get("trial_data", []) if edit(entry)]:  # every entry is edited
            state_file.write_text(json.dumps(data))


def drop_lost_checkpoints(tune_path: str) -> list[str]:
    """Replace, in Tune's saved experiment state, the trials' checkpoints that are gone from storage.

    With ``CheckpointConfig(num_to_keep=1)`` the driver deletes a trial's previous checkpoint as soon as it registers
    a new one, and saves its experiment state only every few seconds. A SIGKILL between the two leaves a state that
    names a deleted checkpoint; ``Trainable.restore`` raises on it ("Could not recover from checkpoint") and the
    resumed trial ends in ERROR. The lost entries are dropped; a lost latest checkpoint becomes the newest one still
    on storage that the trial's ``result.json`` logged (its row is the checkpoint's metrics), else the newest entry
    left, else none: an in-process trial then runs again from step 1, a verl trial reports the steps its files
    logged and resumes verl's own checkpoint.

    Returns:
        The ids of the trials whose checkpoints changed.
    """
    changed_ids: list[str] = []

    def repoint(entry: list) -> bool:
        metadata = _TrainingRunMetadata.from_json_state(entry[1])
        manager = metadata.checkpoint_manager
        if manager is None:
            return False
        kept = [r for r in manager._checkpoint_results if _stored(r)]
        latest = manager._latest_checkpoint_result
        if len(kept) == len(manager._checkpoint_results) and (latest is None or _stored(latest)):
            return False
        if latest is not None and not _stored(latest):
            latest = _newest_logged(latest) or (kept[-1] if kept else None)
            if latest is not None and all(r.checkpoint.path != latest.checkpoint.path for r in kept):
                kept.append(latest)
        manager._checkpoint_results, manager._latest_checkpoint_result = kept, latest
        metadata.checkpoint_manager = manager  # invalidates the cached JSON
        entry[1] = metadata.get_json_state()
        changed_ids.append(json.loads(entry[0]).get("trial_id"))
        return True

    _edit_saved_trials(tune_path, repoint)
    return changed_ids


def _stored(result) -> bool:
    """Whether the checkpoint of a ``_TrainingResult`` is still on its storage."""
    return _exists_at_fs_path(result.checkpoint.filesystem, result.checkpoint.path)


def _newest_logged(lost):
    """The newest checkpoint in the folder of the ``_TrainingResult`` ``lost`` that is on storage and has a row in
    the folder's ``result.json`` (``checkpoint_dir_name``), as a ``_TrainingResult`` with that row as its metrics;
    None when there is none."""
    fs, folder = lost.checkpoint.filesystem, lost.checkpoint.path.rsplit("/", 1)[0]
    rows = {row["checkpoint_dir_name"]: row for row in result_rows(Path(folder, EXPR_RESULT_FILE))
            if isinstance(row, dict) and isinstance(row.get("checkpoint_dir_name"), str)}
    for name in sorted(rows, reverse=True):
        checkpoint = type(lost.checkpoint)(f"{folder}/{name}", filesystem=fs)
        if _exists_at_fs_path(fs, checkpoint.path):
            return _TrainingResult(checkpoint=checkpoint, metrics=rows[name])
    return None


def reconcile_search_state(tune_path: str, study) -> None:
    """Make the saved search state agree with Tune's saved experiment state and the study, after a SIGKILL.

    The three are saved at different times.

    (1) Trials suggested after the last experiment save are in ``ConcurrencyLimiter.live_trials`` and
    ``KlsweepSearch._ot_trials``, but Tune will never start or finish them. Left there, the limiter would count them
    as running forever, and the resume would hang with idle workers. Once dropped, their Optuna trials (still
    RUNNING) are adopted by the next trials (``KlsweepSearch.restore``).

    (2) A trial that started and finished between two experiment saves is finished in the study but unknown to Tune.
    It counts against the number of trials Tune still creates (``SearchGenerator.counter``), so the budget is not
    overrun.

    (3) A trial suggested after the last search save, but started before the last experiment save, is resumed by
    Tune yet missing from ``live_trials``. ``ConcurrencyLimiter.on_trial_complete`` ignores a trial it does not hold.
    Its end would never reach the study: the trial would run to its last step only to be marked FAIL.

    ``live_trials`` becomes exactly the trials Tune will resume.
    """
    trials = _saved_trials(tune_path)
    if trials is None:
        return
    known = {t["trial_id"] for t in trials}
    unfinished = {t["trial_id"] for t in trials if t.get("status") not in ("TERMINATED", "ERROR")}
    ran_unknown = [t for t in study.get_trials(deepcopy=False) if t.state.is_finished()
                   and t.user_attrs.get(ATTR_RAY_TRIAL_ID) not in known]
    for file in Path(tune_path).glob("search_gen_state-*.json"):
        state = cloudpickle.loads(file.read_bytes())
        limiter = state.get("name:ConcurrencyLimiter")
        if limiter:  # exactly the trials Tune will resume: the limiter forwards only their completion to the search
            limiter["live_trials"] = set(unfinished)
            limiter["num_unfinished_live_trials"] = len(unfinished)
        state["counter"] = max(state.get("counter", 0), len(known) + len(ran_unknown))
        file.write_bytes(cloudpickle.dumps(state))
    for file in Path(tune_path).glob("searcher-state-*.pkl"):
        state = pickle.loads(file.read_bytes())
        if isinstance(state, dict) and set(state.get("_ot_trials", {})) - known:
            state["_ot_trials"] = {k: v for k, v in state["_ot_trials"].items() if k in known}
            file.write_bytes(pickle.dumps(state))


def fail_leftovers(study) -> None:
    """Mark FAIL, with the reason, every trial still RUNNING in the study once the resumed Tuners have ended.

    Its Tune trial can no longer run. Optuna's public API cannot finish a trial of another process's ``ask``."""
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        study._storage.set_trial_user_attr(
            trial._trial_id, ATTR_STOP_REASON,
            "in flight when the sweep driver stopped, and its Tune trial could not be resumed: marked FAIL on resume",
        )
        study._storage.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.FAIL)
