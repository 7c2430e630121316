"""What a resume may change: the saved sweep (``sweep.json``) against the sweep a resume is given.

A resumed sweep continues the same Optuna study and Tune experiment, so every trial must come from one search space,
one trial config and one set of health rules. The fields of :data:`RESUMABLE` decide only how many trials run and
where, not what a trial is. A resume applies and states them, except a ``budget.trials`` below the search trials
the study already holds. It refuses any other difference, naming each, with the fix: a new results directory.
Optuna itself warns that a changed search space within one study misleads its samplers (optuna/optuna#2564, #2328).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from klsweep.analysis.study_file import StudyNotCreated
from klsweep.analysis.sweep_dir import study_of
from klsweep.errors import ResultsError
from klsweep.orchestrate.confirm_search import search_trial_count

#: Dotted sweep fields a resume may change (a field and everything below it).
RESUMABLE = ("budget.trials", "budget.max_concurrent", "budget.confirm", "launcher", "wandb")


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(_flatten(value, path + "."))
        else:
            out[path] = value
    return out


def sweep_changes(saved: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Every dotted field whose value differs between two resolved sweeps (``Sweep.model_dump(mode="json")``):
    ``{field: (saved value, given value)}``; a field only one of them has is ``None`` in the other."""
    old, new = _flatten(saved), _flatten(given)
    return {k: (old.get(k), new.get(k)) for k in sorted(old.keys() | new.keys()) if old.get(k) != new.get(k)}


def check_resume(saved: Mapping[str, Any], given: Mapping[str, Any], *, run_dir: str, source: str) -> list[str]:
    """The changes a resume applies, one line each (``budget.trials: 3 → 8``).

    Args:
        saved: the resolved sweep stored in ``run_dir/sweep.json``.
        given: the resolved sweep of the resume (the file and overrides it was given).
        run_dir: the results directory; its study is read when the given ``budget.trials`` is lower than the saved.
        source: what the resume was given, for the message (``sweeps/edited.yaml``, ``the command line``).

    Raises:
        ResultsError: a field outside :data:`RESUMABLE` differs; the message lists each with both values and says
            how to run the changed sweep instead; or the given ``budget.trials`` is below the number of search
            trials the study already holds (:func:`klsweep.orchestrate.confirm_search.search_trial_count`).
    """
    changes = sweep_changes(saved, given)
    resumable = {k: v for k, v in changes.items() if any(k == f or k.startswith(f + ".") for f in RESUMABLE)}
    refused = {k: v for k, v in changes.items() if k not in resumable}
    if refused:
        lines = "\n".join(f"  {k}: {_show(a)} → {_show(b)}" for k, (a, b) in refused.items())
        raise ResultsError(
            f"{run_dir} holds a sweep whose trials differ from those of {source}:\n{lines}\n"
            f"A resume continues the same study, so its trials must come from the same search space, trial config "
            f"and health rules; only {', '.join(RESUMABLE)} may change. To run the changed sweep, give it a new "
            f"results directory (--out DIR), or replace this one with --overwrite."
        )
    if "budget.trials" in resumable:
        _check_budget(resumable["budget.trials"], run_dir)
    return [f"{k}: {_show(a)} → {_show(b)}" for k, (a, b) in resumable.items()]


def _check_budget(change: tuple[Any, Any], run_dir: str) -> None:
    """Refuse a lowered ``budget.trials`` below the search trials the study of ``run_dir`` holds."""
    old, new = change
    if not isinstance(new, int) or (isinstance(old, int) and new >= old):
        return  # not lowered: the saved budget was checked when it was given
    try:
        held = search_trial_count(study_of(run_dir))
    except StudyNotCreated:
        return  # no trial started yet
    if new < held:
        raise ResultsError(f"{run_dir}: its study already holds {held} trials, so budget.trials must be at least "
                           f"{held} (given {new}); give budget.trials={held} or more")


def _show(value: Any) -> str:
    return "(unset)" if value is None else repr(value)
