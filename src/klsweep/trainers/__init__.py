"""The trainers a sweep can run (``trainer:`` in a sweep file), behind one interface and one name table.

==========  =========================================================  ==========================================
name        what a trial runs                                           how
==========  =========================================================  ==========================================
embedded    the CPU trainer of klsweep (verl's ``core_algos`` math)     in the Tune trial's process
verl        ``python -m verl.trainer.main_ppo`` (GPU nodes)              one supervised process per trial
replay      a recorded verl log played back step by step               in the Tune trial's process
tabular     the recorded embedded run nearest the trial                 in the Tune trial's process
==========  =========================================================  ==========================================

An in-process trainer is a :class:`Trainer`; a process trainer is a module run with verl's command-line shape
(``python -m MODULE key=value ...``) that writes verl's file-logger lines to ``$VERL_FILE_LOGGER_PATH``
(:mod:`klsweep.launchers.process`). Nothing here imports torch or verl: the trainers load on first use, as Ray Tune's
``SEARCH_ALG_IMPORT`` maps searcher names to lazy imports.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, get_args, runtime_checkable

from klsweep.results import restarts
from klsweep.trainers.embedded.config import VAL_METRIC as EMBEDDED_VAL_METRIC  # no torch: config only
from klsweep.verl.config import verl_command

if TYPE_CHECKING:
    from klsweep.spec.schema import Sweep

#: The names ``trainer:`` accepts (the keys of :data:`TRAINERS`).
TrainerName = Literal["embedded", "verl", "replay", "tabular"]

#: verl's entry point, the command every reproduce line ends up in.
VERL_MODULE = "verl.trainer.main_ppo"


@runtime_checkable
class Trainer(Protocol):
    """A trainer the Tune trainable drives step by step (orchestrate/trainable.py).

    Attributes:
        global_step: training steps done (0 before the first; verl's ``global_steps`` after an update).
        total_steps: the step at which training ends (verl's ``trainer.total_training_steps``).
    """

    global_step: int
    total_steps: int

    def train_step(self) -> dict[str, float]:
        """One training step (rollout, update, validation when due); the metrics it logged under verl's names."""
        ...

    def save(self, directory: str | os.PathLike) -> Path:
        """Write a checkpoint of everything :meth:`load` needs into ``directory``; returns the file written."""
        ...

    def load(self, directory: str | os.PathLike) -> None:
        """Continue from the checkpoint in ``directory`` (as verl's ``trainer.resume_mode=auto``)."""
        ...


@dataclass(frozen=True)
class TrainerKind:
    """One row of :data:`TRAINERS`.

    Attributes:
        name: the ``trainer:`` value.
        description: one line for help texts.
        module: the module run as ``python -m MODULE key=value ...`` (process mode); None when it has none.
        in_process: builds the :class:`Trainer` of a trial from ``(sweep, overrides)``; None when every trial is a
            process (``verl``).
        validation_metric: the only validation metric the trainer logs, when it is known before a trial runs.
        defaults: knob values the trainer brings where verl's defaults do not fit, given the trial's user overrides.
        reproduce: ``[(label, command)]`` that rerun a trial from its verl overrides.
        runs_verl: every trial is verl's own ``main_ppo`` on GPUs: the launcher owns its checkpoint and logger keys,
            the preflight checks GPUs, resources and the keys verl requires, and retries resume from checkpoints.
        section: the sweep-file section the trainer reads (``replay:``, ``tabular:``), required with it and refused
            without it; None when it reads none.
        scores_reference: the reference policy (the trial's starting weights) can be scored in klsweep's process,
            as the KL frontier's d = 0 point (:mod:`klsweep.analysis.baseline`).
        no_restarts: why a trial cannot be restarted from its checkpoint with changed knobs (a remedy):
            the trainer serves recorded runs, none of them restarted with another coefficient; remedies are off
            under it (kill-only, as ``health: {remedies: false}``). None: it restarts.
    """

    name: str
    description: str
    module: str | None
    in_process: Callable[[Sweep, Mapping[str, Any]], Trainer] | None
    validation_metric: str | None = None
    defaults: Callable[[Mapping[str, Any]], dict[str, Any]] = field(default=lambda user: {})
    reproduce: Callable[[Mapping[str, Any]], list[tuple[str, str]]] = field(default=lambda overrides: [])
    runs_verl: bool = False
    section: str | None = None
    scores_reference: bool = False
    no_restarts: str | None = None


def _embedded(sweep: Sweep, overrides: Mapping[str, Any]) -> Trainer:
    from klsweep.trainers.embedded import EmbeddedTrainer

    trainer: Trainer = EmbeddedTrainer(overrides)
    return trainer


def _replay(sweep: Sweep, overrides: Mapping[str, Any]) -> Trainer:
    from klsweep.trainers.replay import ReplayTrainer

    return ReplayTrainer(overrides, trace=sweep.replay.trace, speed=sweep.replay.speed, run=sweep.replay.run)


def _tabular(sweep: Sweep, overrides: Mapping[str, Any]) -> Trainer:
    from klsweep.trainers.tabular import TabularTrainer

    return TabularTrainer(overrides, table=sweep.tabular.table)


def _embedded_defaults(user: Mapping[str, Any]) -> dict[str, Any]:
    """The sizes and learning rates of :data:`klsweep.trainers.embedded.config.EMBEDDED_DEFAULTS` that are knobs of a
    trial, and one mini-batch per step (the mini-batch follows the trial's ``data.train_batch_size`` when set)."""
    from klsweep.trainers.embedded.config import EMBEDDED_DEFAULTS
    from klsweep.verl.presets import CRITIC_KNOBS, KNOBS

    knobs = {k: v for k, v in EMBEDDED_DEFAULTS.items() if k in KNOBS or k in CRITIC_KNOBS}
    batch = user.get("data.train_batch_size", EMBEDDED_DEFAULTS["data.train_batch_size"])
    return {**knobs, "actor_rollout_ref.actor.ppo_mini_batch_size": batch}


def _embedded_reproduce(overrides: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The embedded trainer's own command, then verl's with the KL and algorithm settings only.

    verl's command drops the embedded sizes: the user adds a model, data and batch sizes. The label names the
    trial's batch size and responses per prompt where they are not the embedded defaults (a searched batch size).
    The KL settings were found at those sizes: verl's adaptive controller advances by train_batch_size × rollout.n
    responses per step against its horizon."""
    from klsweep.trainers.embedded.config import EMBEDDED_DEFAULTS, EMBEDDED_SIZES

    transferable = {k: v for k, v in overrides.items() if k not in EMBEDDED_SIZES}
    own = [f"{k}={overrides[k]}" for k in ("data.train_batch_size", "actor_rollout_ref.rollout.n")
           if k in overrides and overrides[k] != EMBEDDED_DEFAULTS.get(k)]
    found_at = f"; this trial ran with {', '.join(own)}" if own else ""
    return [("reproduce on the embedded trainer:", verl_command(overrides, module="klsweep.trainers.embedded")),
            (f"the same KL and algorithm settings on verl (add your model, data and batch sizes{found_at}):",
             verl_command(transferable))]


def _tabular_reproduce(overrides: Mapping[str, Any]) -> list[tuple[str, str]]:
    """:func:`_embedded_reproduce` of the trial's config: a tabular trial served the recorded embedded run of the
    table's grid point nearest that config, so the commands run the config itself, and the labels say so."""
    served = "(the table served the recorded run of the grid point nearest this config)"
    return [(f"{label.removesuffix(':')} {served}:" if i == 0 else label, command)
            for i, (label, command) in enumerate(_embedded_reproduce(overrides))]


def _verl_reproduce(overrides: Mapping[str, Any]) -> str:
    """verl's command; for a multi-node trial (``trainer.nnodes`` > 1) the ``ray job submit`` line that runs it on a
    cluster (:func:`klsweep.verl.late_failures.job_submit_command`)."""
    nnodes = overrides.get("trainer.nnodes", 1)
    if isinstance(nnodes, int) and nnodes > 1:
        from klsweep.verl.late_failures import job_submit_command

        return job_submit_command(overrides)
    return verl_command(overrides)


#: Every trainer by its ``trainer:`` name.
TRAINERS: dict[str, TrainerKind] = {
    "embedded": TrainerKind(
        "embedded", "the CPU trainer in klsweep (verl's core_algos on a small arithmetic task)",
        module="klsweep.trainers.embedded", in_process=_embedded, validation_metric=EMBEDDED_VAL_METRIC,
        defaults=_embedded_defaults, reproduce=_embedded_reproduce, scores_reference=True,
    ),
    "verl": TrainerKind(
        "verl", "python -m verl.trainer.main_ppo, one process per trial (GPU nodes)",
        module=VERL_MODULE, in_process=None, reproduce=lambda overrides: [("", _verl_reproduce(overrides))],
        runs_verl=True,
    ),
    "replay": TrainerKind(
        "replay", "plays back a recorded verl log (replay: {trace: PATH}), to try health rules and the pipeline",
        module=None, in_process=_replay, section="replay", no_restarts="a recorded log holds no restarted runs",
    ),
    "tabular": TrainerKind(
        "tabular", "serves the recorded embedded run of the nearest grid point (tabular: {table: PATH}), for "
        "benchmarks of thousands of sweeps", module=None, in_process=_tabular, validation_metric=EMBEDDED_VAL_METRIC,
        defaults=_embedded_defaults, reproduce=_tabular_reproduce, section="tabular",
        no_restarts="a table holds no restarted runs",
    ),
}
assert set(TRAINERS) == set(get_args(TrainerName)), "TRAINERS and TrainerName must list the same trainers"


def reproduce_commands(trainer: str, overrides: Mapping[str, Any], remedies: Any = None) -> list[tuple[str, str]]:
    """``[(label, command)]`` that rerun a trial: ``TrainerKind.reproduce`` of its overrides, once per run segment.

    The one builder of what ``sweep run``, ``sweep status``, ``sweep plan``, the report and the notebook print.
    A remedied trial reruns as its schedule. Segment k resumes from the checkpoint of the step restart k−1 went back
    to, with the knobs the remedies changed so far. It uses ``trainer.resume_mode=resume_path``, as
    :func:`klsweep.launchers.resume.rewind` restarts it. The segment that last ran a restart point's step saves it:
    ``trainer.save_freq`` = the greatest common divisor of its steps, unless its own cadence saves them all.

    Args:
        trainer: the sweep's ``trainer:`` name.
        overrides: the trial's full flat verl overrides as proposed (``config/`` columns of trials.csv).
        remedies: its remedy records (any form :func:`klsweep.results.remedy_records` reads); None or empty: one run.

    Raises:
        ValueError: ``trainer`` is not a trainer (the message lists the valid names), or ``remedies`` is a string
            that is not a JSON list.
    """
    kind = trainer_kind(trainer)
    runs = restarts(remedies)
    if not runs:
        return kind.reproduce(overrides)
    firsts = [1] + [run.from_step + 1 for run in runs]  # the first step of each segment
    saves: dict[int, list[int]] = {}  # segment → the steps it must save, for the restarts that go back to them
    for k, run in enumerate(runs):
        writer = max((j for j in range(k + 1) if firsts[j] <= run.from_step), default=None)
        if writer is not None and run.from_step not in saves.setdefault(writer, []):
            saves[writer].append(run.from_step)
    out: list[tuple[str, str]] = []
    current = dict(overrides)
    for i, first in enumerate(firsts):
        steps = f"steps {first}-{runs[i].step} ({runs[i].rule} fired at step {runs[i].step})" \
            if i < len(runs) else f"steps {first} to the end"
        head = f"segment {i + 1} of {len(firsts)}: {steps}"
        extra: dict[str, Any] = {}
        if i:
            changes = runs[i - 1].changes
            current.update({key: new for key, (_, new) in changes.items()})
            changed = ", ".join(f"{key}={new:.6g}" for key, (_, new) in changes.items())
            head += f" from the checkpoint of step {first - 1} with {changed}"
            extra = {"trainer.resume_mode": "resume_path",
                     "trainer.resume_from_path": f"${{trainer.default_local_dir}}/global_step_{first - 1}"}
        if saves.get(i):
            keep, every = saves[i], current.get("trainer.save_freq")
            if not (isinstance(every, int) and every > 0 and all(step % every == 0 for step in keep)):
                extra["trainer.save_freq"] = math.gcd(*keep)
            users = [k + 2 for k, run in enumerate(runs) if run.from_step in keep]
            many, plural = len(keep) > 1, len(users) > 1
            head += (f", saving the checkpoint{'s' * many} of step{'s' * many} {_and(sorted(keep))} that "
                     f"segment{'s' * plural} {_and(users)} start{'s' * (not plural)} from")
        for label, command in kind.reproduce({**current, **extra}):
            out.append((f"{head}{': ' + label if label else ':'}", command))
    return out


def _and(items: list[int]) -> str:
    """``[2]`` → ``2``; ``[2, 3, 4]`` → ``2, 3 and 4``. ``items`` must not be empty."""
    return " and ".join([", ".join(map(str, items[:-1])), str(items[-1])]) if len(items) > 1 else str(items[0])


def reproduce_lines(trainer: str, overrides: Mapping[str, Any], remedies: Any = None) -> list[str]:
    """:func:`reproduce_commands` as lines: each label (when not empty) followed by its command. For the embedded
    trainer: its own command, then verl's without the embedded sizes (8-token responses, batch 16).

    Raises:
        ValueError: ``trainer`` is not a trainer (the message lists the valid names).
    """
    return [line for label, command in reproduce_commands(trainer, overrides, remedies) for line in (label, command)
            if line]


def runs_verl(name: str) -> bool:
    """Whether the trials of trainer ``name`` are verl's own ``main_ppo`` (:attr:`TrainerKind.runs_verl`).

    Raises:
        ValueError: ``name`` is not a trainer; the message lists the valid names.
    """
    return trainer_kind(name).runs_verl


def trainer_kind(name: str) -> TrainerKind:
    """The row of :data:`TRAINERS` for ``name``.

    Raises:
        ValueError: ``name`` is not a trainer; the message lists the valid names.
    """
    try:
        return TRAINERS[name]
    except KeyError:
        raise ValueError(f"trainer {name!r} is not a klsweep trainer: use one of {', '.join(TRAINERS)}") from None
