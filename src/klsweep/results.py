"""The results contract: what a sweep directory holds, the keys of the results klsweep reports to Ray Tune, and the
Optuna user attributes of every trial. One home for every name, as Ray keeps Tune's in ``ray/tune/result.py``;
orchestrate writes them, analysis reads them, and neither spells a name itself.

A sweep directory (``runs/<name>/`` or ``--out``)::

    sweep.json      SweepRecord: the resolved sweep, its study and storage, how it was started
    study.db        the Optuna study (default storage; relative to the directory, so it can be moved or rsynced)
    tune/           the Ray Tune experiment: one folder per trial with result.json (one JSON object per report)
    trials.csv      one row per trial (klsweep.analysis.load)
    report/         report.html and PNGs (sweep report)
    ray_session.json  the driver's private local Ray, ended by the next start if the driver was killed
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from klsweep.errors import ResultsError

if TYPE_CHECKING:
    from collections.abc import Callable

# -- files of a sweep directory
SWEEP_FILE = "sweep.json"
STUDY_DB = "study.db"
TUNE_DIR = "tune"
TRIALS_CSV = "trials.csv"
REPORT_DIR = "report"
#: klsweep.analysis.baseline: the reference policy's scores, computed once per sweep (building it takes seconds)
REFERENCE_FILE = "reference_scores.json"
#: klsweep.orchestrate._ray_session: the session of the driver's private local Ray
RAY_SESSION_FILE = "ray_session.json"

# -- keys of every result a trial reports to Ray Tune (besides verl's metric names)
#: the trainer's global step after the reported update (verl's ``step`` of its file logger)
STEP = "step"
#: the trial's step budget, so that the searcher tells a finished trial from an early-stopped one
TOTAL_STEPS = "total_steps"
#: written by the health stopper: ``healthy`` | ``warned`` | ``stopped``
HEALTH = "health"
#: written by the health stopper: the stop reason's text ("" when none)
STOP_REASON = "stop_reason"
#: written by the health stopper: the kind of stop (``diverged``, ``no_signal``, ``nonfinite``, ...; "" when none)
STOP_KIND = "stop_kind"
#: the stop kind of :class:`klsweep.orchestrate.objective_stop.ObjectiveStopper`: peers beat the trial by more than
#: the noise; recorded PRUNED with its reason, not as a health stop
STOP_KIND_OBJECTIVE = "objective"
#: how the stop reasons of median stopping (:mod:`klsweep.orchestrate.median_stop`) and fate stopping
#: (:mod:`klsweep.orchestrate.fate_stop`) begin; both are recorded with :data:`STOP_KIND_OBJECTIVE`
MEDIAN_STOP_REASON = "median stopping at step "
FATE_STOP_REASON = "fate at step "

#: the start of the stop reason the searcher records for a trial that raised (Ray Tune's ERROR state,
#: ``KlsweepSearch._outcome``): the exception itself is in the trial's ``error.txt`` (:func:`error_line`)
RAISED = "trial raised an error"

# -- Optuna user attributes of every trial klsweep told
#: the Ray Tune trial id of the study trial
ATTR_RAY_TRIAL_ID = "ray_trial_id"
#: JSON of the trial's full verl override dict
ATTR_VERL_OVERRIDES = "verl_overrides"
#: the trial's health verdict (as :data:`HEALTH`)
ATTR_HEALTH = HEALTH
#: why the trial stopped early or failed (as :data:`STOP_REASON`)
ATTR_STOP_REASON = STOP_REASON
#: training steps the trial ran
ATTR_STEPS = "steps"
#: JSON list of the trial's remedy records, oldest first (:func:`remedy_records`, :class:`Restart`)
ATTR_REMEDIES = "remedies"
#: a remedied trial's objective values (JSON list, in the study's objective order): what its restart schedule
#: scored. The trial is PRUNED: its params are not a setting that scores that run unchanged
ATTR_RESCUED_VALUES = "rescued_values"
#: the start of a remedied trial's stop reason (:func:`remedied_reason`)
REMEDIED = "remedied:"
#: a confirmation run (``budget.confirm``, :mod:`klsweep.orchestrate.confirm_search`): the number of the search trial it
#: re-runs with a new training seed; absent on search trials
ATTR_CONFIRM_OF = "confirm_of"
#: a confirmation run's training seed (``data.seed``), set when it is enqueued, before it has params
ATTR_CONFIRM_SEED = "confirm_seed"
#: The system attribute holding a multi-objective trial's constraint values: ``[1.0]`` (infeasible) when a health
#: rule stopped it, else ``[-1.0]``. It is the list a sampler's ``constraints_func`` writes (optuna/samplers/_base.py),
#: which Optuna reads (``FrozenTrial.constraints == {"0": 1.0}``) and optuna-dashboard 0.21 draws; the dashboard does
#: not read the ``constraints:<key>`` attributes of ``Trial.set_constraint``.
CONSTRAINTS_ATTR = "constraints"


class Objective(BaseModel):
    """One objective of a sweep: a metric name and ``max`` or ``min``."""

    model_config = ConfigDict(extra="forbid")
    metric: str
    mode: str


class SweepRecord(BaseModel):
    """``sweep.json``: everything needed to read, report on or resume a sweep without the sweep file.

    Raises (on :meth:`read`):
        ResultsError: the directory holds no ``sweep.json``, or one that is not a klsweep record.
    """

    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="the sweep's name")
    sweep_file: str = Field(description="absolute path of the sweep file the sweep was started from")
    overrides: list[str] = Field(default_factory=list, description="command-line overrides (`budget.trials=8`)")
    study_name: str = Field(description="Optuna study name")
    storage: str = Field(description="Optuna storage URL; a relative sqlite path is relative to the sweep directory")
    objectives: list[Objective] = Field(description="the objectives, in the order of the study's values")
    sweep: dict[str, Any] = Field(description="the resolved sweep (klsweep.spec.Sweep, as JSON)")
    tune_num_samples: int = Field(0, description="trials the last Tuner was asked to create (to tell if it finished)")

    @classmethod
    def read(cls, run_dir: str | Path) -> SweepRecord:
        """The record of the sweep directory ``run_dir``."""
        file = Path(run_dir) / SWEEP_FILE
        if not file.is_file():
            raise ResultsError(f"{run_dir} is not a sweep directory: {SWEEP_FILE} is missing (run `sweep run` first)")
        try:
            return cls.model_validate_json(file.read_text())
        except ValidationError as e:
            raise ResultsError(f"{file} is not a klsweep sweep record ({e.error_count()} problems, first: "
                               f"{e.errors()[0]['loc']}: {e.errors()[0]['msg']}); was it written by klsweep?") from None

    def write(self, run_dir: str | Path) -> None:
        """Write ``run_dir/sweep.json`` atomically (a temporary file, then a rename)."""
        file = Path(run_dir) / SWEEP_FILE
        tmp = file.with_name(file.name + ".tmp")
        tmp.write_text(self.model_dump_json(indent=2))
        os.replace(tmp, file)

    def storage_url(self, run_dir: str | Path) -> str:
        """:attr:`storage` with a relative sqlite path resolved against ``run_dir`` (``sqlite:///study.db`` is
        ``run_dir/study.db``); any other URL as it is."""
        return resolve_storage(self.storage, run_dir)


def default_storage() -> str:
    """The storage of a sweep started without ``--storage``: ``study.db`` in its directory, as a relative URL."""
    return f"{_SQLITE}{STUDY_DB}"


_SQLITE = "sqlite:///"
_JOURNAL = "journal://"


def sqlite_path(url: str) -> Path | None:
    """The file of a ``sqlite:///PATH`` storage URL (relative when PATH is), or None for any other URL."""
    return Path(url[len(_SQLITE):]) if url.startswith(_SQLITE) else None


def storage_file(url: str) -> Path | None:
    """The file a ``sqlite:///`` or ``journal://`` storage URL keeps its studies in; None for a database server."""
    return sqlite_path(url) or (Path(url[len(_JOURNAL):]) if url.startswith(_JOURNAL) else None)


def resolve_storage(storage: str, run_dir: str | Path) -> str:
    """The storage URL ``storage`` with a relative sqlite path resolved against ``run_dir``; any other URL as it is."""
    file = sqlite_path(storage)
    if file is not None and not file.is_absolute():
        return _SQLITE + str(Path(run_dir).resolve() / file)
    return storage


def storage_problem(url: str, open_storage: Callable[[str], Any]) -> str | None:
    """Why Optuna cannot open the storage ``url``: the first line of the error opening it raises (a missing database
    driver, a URL that does not parse, a folder that does not exist, a server that does not answer). None when it
    opens.

    ``open_storage`` opens a URL as the sweep does (:func:`klsweep.analysis.sweep_dir.storage_from_url`). A SQLite or
    journal file that the opening creates is deleted again."""
    file = storage_file(url)
    existed = file is None or file.exists()
    try:
        storage = open_storage(url)
    except Exception as e:  # any error opening it: ImportError, sqlalchemy's ArgumentError or OperationalError, ...
        text = str(e).strip()
        return text.splitlines()[0].rstrip(".") if text else type(e).__name__
    engine = getattr(storage, "engine", None)
    if engine is not None:  # RDBStorage: close its connections before its file goes
        engine.dispose()
    if not existed and file is not None and file.is_file():
        file.unlink()
    return None


#: The exception's line in a Tune ``error.txt`` (a traceback's last ``module.Error: message`` line).
_EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?([A-Za-z_]\w*(?:Error|Exception)): (.+)$")


def result_rows(file: Path) -> list[dict[str, Any]]:
    """The rows of a Tune trial's ``result.json`` (one JSON object per line), up to a line that does not decode (the
    last line of a driver killed mid-write); none when the file is missing."""
    rows = []
    for line in file.read_text().splitlines() if file.is_file() else []:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return rows


def error_line(out_dir: str | Path, trial_id: str) -> str:
    """``"OverrideError: <message>"``: the exception a failed trial raised, from the last exception line of its Ray
    Tune ``error.txt`` (``OUT/tune/<trainable>_<trial_id>_<n>_.../error.txt``, ``Trial.handle_error``); "" when there is
    no such file or line."""
    for path in sorted((Path(out_dir) / TUNE_DIR).glob(f"*_{trial_id}_*/error.txt")):
        lines = [m for line in path.read_text(errors="replace").splitlines() if (m := _EXCEPTION.match(line.strip()))]
        if lines:
            return f"{lines[-1].group(1)}: {lines[-1].group(2)}"
    return ""


def failure_reason(out_dir: str | Path, state: Any, trial_id: Any, stop_reason: Any) -> Any:
    """A trial's stop reason as ``trials.csv``, ``sweep status`` and the summary show it.

    For a FAIL trial that raised (``stop_reason`` starting with :data:`RAISED`): the exception from its
    ``error.txt`` (:func:`error_line`). Any other ``stop_reason`` is returned as it is. So is the recorded one when
    there is no ``error.txt`` with an exception line."""
    if state != "FAIL" or not isinstance(stop_reason, str) or not stop_reason.startswith(RAISED) or not trial_id:
        return stop_reason
    return error_line(out_dir, str(trial_id)) or stop_reason


@dataclass(frozen=True)
class Restart:
    """One restart of a remedied trial, as a health rule's remedy decided it.

    Attributes:
        number: the trial's restart count at this restart, from 1.
        step: the training step the rule fired at.
        rule: the name of the health rule that fired.
        from_step: the step of the checkpoint the trial restarted from.
        changes: each changed verl key → (old value, new value), in prescription order.
    """

    number: int
    step: int
    rule: str
    from_step: int
    changes: dict[str, tuple[float, float]]

    def records(self) -> list[dict[str, Any]]:
        """The on-disk form: one ``{"restart", "step", "rule", "from_step", "key", "old", "new"}`` per knob."""
        return [{"restart": self.number, "step": self.step, "rule": self.rule, "from_step": self.from_step,
                 "key": key, "old": old, "new": new} for key, (old, new) in self.changes.items()]


def remedy_records(value: Any) -> list[dict[str, Any]]:
    """A trial's flat remedy records, from trials.csv's ``remedies`` JSON column or the Tune config's list.

    Takes a JSON string, a list or tuple of records, or anything else (NaN, None) for none.
    Returns ``[{"restart", "step", "rule", "from_step", "key", "old", "new"}, ...]`` as stored.

    Raises:
        ValueError: ``value`` is a string that is not a JSON list.
    """
    if isinstance(value, str):
        value = json.loads(value) if value.strip() else []
        if not isinstance(value, list):
            raise ValueError(f"the remedies column holds {value!r}, not a JSON list of remedies")
    return list(value) if isinstance(value, (list, tuple)) else []


def restarts(value: Any) -> list[Restart]:
    """A trial's remedy records (any form :func:`remedy_records` reads) grouped into restarts.

    Records with the same ``restart`` number form one restart; its step, rule and from_step are its first record's.
    Returns the restarts sorted by number.

    Raises:
        ValueError: ``value`` is a string that is not a JSON list.
    """
    grouped: dict[int, list[dict[str, Any]]] = {}
    for record in remedy_records(value):
        grouped.setdefault(int(record["restart"]), []).append(record)
    return [Restart(number, int(rs[0]["step"]), str(rs[0]["rule"]), int(rs[0]["from_step"]),
                    {r["key"]: (r["old"], r["new"]) for r in rs}) for number, rs in sorted(grouped.items())]


def schedule_line(value: Any) -> str:
    """A trial's remedy schedule on one line, for the trial lines of ``sweep run`` and ``sweep status``.

    Format: ``"2× kl_runaway@46 from 32 kl_coef 0.002363→0.003545; ..."``: the restart count, then per restart
    the rule, its step, the step restarted from and each knob (last key component) old → new. ``""`` for none.
    ``value``: any form :func:`remedy_records` reads.

    Raises:
        ValueError: ``value`` is a string that is not a JSON list.
    """
    parts = [f"{r.rule}@{r.step} from {r.from_step} "
             + ", ".join(f"{key.rsplit('.', 1)[-1]} {old:.4g}→{new:.4g}" for key, (old, new) in r.changes.items())
             for r in restarts(value)]
    return f"{len(parts)}× " + "; ".join(parts) if parts else ""


def remedied_reason(remedies: Any) -> str:
    """The stop reason of a remedied trial: ``remedied: a restart schedule, not one setting (<schedule>)``.

    ``remedies``: any form :func:`remedy_records` reads.
    """
    return f"{REMEDIED} a restart schedule, not one setting ({schedule_line(remedies)})"
