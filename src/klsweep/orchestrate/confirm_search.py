"""The confirmation phase's Tune trials (``budget.confirm``): the leaders' re-runs with new training seeds.

The runs are trials of the same Ray Tune experiment and Optuna study. Each is enqueued (``Study.enqueue_trial``)
with its leader's params plus ``data.seed``, an Optuna param fixed by the queue. It carries the user attributes
``confirm_of`` (the leader's trial number) and ``confirm_seed``. optuna-dashboard, ``trials.csv`` and the samplers
thus see them. Which runs, and what their means say: :mod:`klsweep.analysis.leaders`.

Resume: a run is enqueued only when Tune asks for a trial, so it never waits where the search could take it.
:func:`confirmation_phase` plans only the runs the study does not hold yet. It adopts confirmation trials left
RUNNING by a killed driver. A sweep stopped in this phase thus resumes without duplicates or lost runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
from ray.tune.search import Searcher

from klsweep.analysis.leaders import planned
from klsweep.analysis.sweep_dir import load, study_of
from klsweep.orchestrate.searcher import KlsweepSearch
from klsweep.results import ATTR_CONFIRM_OF, ATTR_CONFIRM_SEED
from klsweep.spec.space import SEED_KEY

if TYPE_CHECKING:
    from klsweep.spec.schema import Sweep
    from klsweep.spec.space import SearchSpace

#: The largest training seed a confirmation run's Optuna param may hold (its IntDistribution's high end).
SEED_MAX = 2**31 - 1


@dataclass(frozen=True)
class Run:
    """One confirmation run to enqueue: ``params`` (the leader's Optuna params) with ``data.seed = seed``."""

    of: int
    seed: int
    params: dict[str, Any]


@dataclass
class Phase:
    """What the confirmation phase still has to run: ``runs`` to enqueue, and ``adopt``.

    ``adopt`` holds the study trial ids of confirmation trials left RUNNING by a killed driver; they re-run under
    new Tune trials. ``len`` is the number of Tune trials the phase needs."""

    runs: list[Run] = field(default_factory=list)
    adopt: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.runs) + len(self.adopt)


def search_trial_count(study: optuna.Study) -> int:
    """The number of trials of an Optuna study that belong to the search (all but the confirmation runs), not
    counting WAITING ones: an enqueued trial no Tune trial took yet (a driver killed before its first trial started)
    is what the next ``Study.ask`` returns, so it is one of the trials still to run."""
    return sum(ATTR_CONFIRM_OF not in t.user_attrs and t.state != optuna.trial.TrialState.WAITING
               for t in study.get_trials(deepcopy=False))


def confirmation_phase(sweep: Sweep, out_dir: str | Path) -> Phase:
    """The runs of :func:`klsweep.analysis.leaders.planned` the study in ``out_dir`` lacks, and its confirmation
    trials left RUNNING (their Tune trials are gone once every Tuner of this driver has ended)."""
    if sweep.budget.confirm is None:
        return Phase()
    study = study_of(out_dir)
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    held = {(t.user_attrs[ATTR_CONFIRM_OF], t.user_attrs.get(ATTR_CONFIRM_SEED))
            for t in trials.values() if ATTR_CONFIRM_OF in t.user_attrs}
    runs = [Run(of, seed, dict(trials[of].params)) for of, seed in planned(sweep, load(out_dir))
            if (of, seed) not in held]
    adopt = [t._trial_id for t in trials.values()
             if ATTR_CONFIRM_OF in t.user_attrs and t.state == optuna.trial.TrialState.RUNNING]
    return Phase(runs, adopt)


class ConfirmSpace:
    """The sweep's define-by-run space (:class:`klsweep.spec.space.SearchSpace`) plus the training seed ``data.seed`` as
    an Optuna int param: a confirmation trial's queue entry fixes both the leader's params and the seed."""

    def __init__(self, space: SearchSpace):
        self.space = space

    def __call__(self, trial: optuna.Trial) -> dict[str, Any]:
        constants = self.space(trial)
        trial.suggest_int(SEED_KEY, 0, SEED_MAX)
        return constants


class ConfirmSearch(KlsweepSearch):
    """:class:`KlsweepSearch` for the confirmation phase; it never proposes a trial of its own.

    Each trial Tune asks for is the next run of ``phase`` (enqueued at that moment, then asked), or a RUNNING
    confirmation trial it adopts. When none is left, it answers ``Searcher.FINISHED``.

    Args:
        phase: from :func:`confirmation_phase`.
        **kwargs: as :class:`KlsweepSearch` (``space`` is wrapped in :class:`ConfirmSpace`).
    """

    def __init__(self, *, phase: Phase, **kwargs):
        super().__init__(**{**kwargs, "space": ConfirmSpace(kwargs["space"])})
        self._queue: list[Run] = list(phase.runs)
        # read through this searcher's own study: Optuna's cached storage knows a trial id only once it has read the
        # trial, and suggesting a param into one it never read raises KeyError (a run the killed driver asked for)
        adopt = set(phase.adopt)
        self._orphans = [optuna.Trial(self._ot_study, t._trial_id)
                         for t in self._ot_study.get_trials(deepcopy=False) if t._trial_id in adopt]

    def suggest(self, trial_id: str) -> dict | None:
        """The next confirmation run (or an adopted one), tagged with the Tune trial id; ``FINISHED`` when none."""
        if trial_id not in self._ot_trials and not self._orphans:
            if not self._queue:
                return Searcher.FINISHED
            run = self._queue.pop(0)
            self._ot_study.enqueue_trial({**run.params, SEED_KEY: run.seed},
                                         user_attrs={ATTR_CONFIRM_OF: run.of, ATTR_CONFIRM_SEED: run.seed})
        return super().suggest(trial_id)


