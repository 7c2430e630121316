"""Is a sweep's Optuna study there, and whole? Checked before Optuna opens it, so that reading never creates one.

Optuna's ``RDBStorage`` creates a missing SQLite file and its tables on open (``optuna/storages/_rdb/storage.py``).
A ``sweep status`` on a sweep whose ``study.db`` was deleted would then report an empty study ("0 finished"), and a
``sweep resume`` would start the sweep again. The results are still in ``tune/`` (one ``result.json`` per trial):
:func:`check_study` tells "not created yet" (nothing ran) from "lost" (trials ran), and names the command that
rebuilds the study from ``tune/``.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING

from klsweep._format import arg
from klsweep.errors import ResultsError
from klsweep.results import TUNE_DIR

if TYPE_CHECKING:
    from klsweep.results import SweepRecord


class StudyNotCreated(ResultsError):
    """The sweep's study does not exist yet, and no trial ran: the driver ended before its first trial."""


def sqlite_file(record: SweepRecord, run_dir: str | Path) -> Path | None:
    """The SQLite file of the sweep's storage, or None for another storage (a server database, a journal file)."""
    url = record.storage_url(run_dir)
    prefix = "sqlite:///"
    return Path(url[len(prefix):]) if url.startswith(prefix) else None


def ran_trials(run_dir: str | Path) -> int:
    """How many Tune trials of the sweep reported at least one result (a non-empty ``tune/*/result.json``)."""
    tune_dir = Path(run_dir) / TUNE_DIR
    return sum(1 for f in tune_dir.glob("*/result.json") if f.stat().st_size) if tune_dir.is_dir() else 0


def rebuild_hint(run_dir: str | Path) -> str:
    """The command that rebuilds a sweep's study from ``tune/``."""
    return f"sweep rebuild-study {arg(run_dir)}"


def study_problem(record: SweepRecord, run_dir: str | Path) -> str | None:
    """What is wrong with the sweep's SQLite study file, or None when the study is there and readable (or the
    storage is not SQLite, which Optuna checks itself).

    Opens the file read-only: never creates it, and changes it only to roll back a transaction a killed writer left
    in a hot journal (``study.db-journal``), as SQLite does on Optuna's own next open: a read-only connection cannot,
    and fails with "attempt to write a readonly database". Returns "missing", "empty" (no bytes, no tables or no
    study of this name) or "corrupt: <sqlite's reason>".
    """
    file = sqlite_file(record, run_dir)
    if file is None:
        return None
    if not file.is_file():
        return "missing"
    if file.stat().st_size == 0:
        return "empty"
    try:
        if Path(f"{file}-journal").is_file():  # a driver SIGKILLed mid-write: roll back its transaction
            db = sqlite3.connect(file)
            try:
                db.execute("PRAGMA quick_check").fetchone()
            finally:
                db.close()
        with sqlite3.connect(f"file:{file}?mode=ro", uri=True) as db:
            check = db.execute("PRAGMA quick_check").fetchone()
            if check and check[0] != "ok":
                return f"corrupt: {check[0]}"
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if "studies" not in tables:
                return "empty"
            names = {r[0] for r in db.execute("SELECT study_name FROM studies")}
    except sqlite3.DatabaseError as e:
        return f"corrupt: {e}"
    return None if record.study_name in names else "empty"


def check_study(record: SweepRecord, run_dir: str | Path) -> None:
    """Refuse to open a sweep's study that is missing, empty or corrupt, with what is wrong and the fix.

    Raises:
        StudyNotCreated: the study is missing or empty and ``tune/`` holds no trial results: nothing ran yet.
        ResultsError: the study file is corrupt; or it is missing or empty while ``tune/`` holds trial results
            (the message names the file, the trials and the rebuild command).
    """
    problem = study_problem(record, run_dir)
    if problem is None:
        return
    file = sqlite_file(record, run_dir)
    ran = ran_trials(run_dir)
    if problem in ("missing", "empty") and not ran:
        raise StudyNotCreated(f"{run_dir}: the study {record.study_name!r} is not in its storage yet (the sweep "
                              "creates it when its first trial starts)")
    what = {"missing": "is missing", "empty": f"holds no study {record.study_name!r}"}.get(
        problem, f"is not a readable Optuna database ({problem.removeprefix('corrupt: ')})")
    held = f"{Path(run_dir) / TUNE_DIR} holds {ran} trial results" if ran else "no trial results are in tune/ either"
    raise ResultsError(f"{file} {what}, while {held}. Nothing was changed. Rebuild the study from tune/ with: "
                       f"{rebuild_hint(run_dir)}")
