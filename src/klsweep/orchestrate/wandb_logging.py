"""W&B: one run per trial (per restart segment of a remedied trial), grouped by sweep, with the trial's verl
overrides as its config.

Each run is named ``<sweep> #<Optuna trial number> <parameter>=<value> ...``; its id stays the Ray Tune trial id.
It is tagged with the sweep name, algorithm and trainer. Its config carries ``trial_number`` and the searched
parameters (``searched``). With every result, the config also gets the health stopper's verdict (``health``), stop
reason (``stop_reason``) and stop kind (``stop_kind``). W&B keeps only numbers in a run's history, so these strings
would otherwise never reach it.

Ray Tune's ``WandbLoggerCallback`` logs from its own actor, so W&B never blocks a trial. Offline mode is the default
when W&B is on (wandb#2812: several trials in one W&B run; Search-R1#141: offline W&B on many nodes).
``WANDB_API_KEY`` is read from the environment by wandb itself and never written to any klsweep file.

This callback makes a trial's only W&B runs. verl's own W&B logger stays off in every trial: ``trainer.logger`` is
``[console, file]``, and :func:`klsweep.spec.space.launcher_overrides` refuses ``wandb`` in a sweep's ``overrides``.
With it on, verl's ``Tracking`` would call ``wandb.init`` in the trial process (verl/utils/tracking.py) without this
callback's mode and directory. An offline or keyless trial would fail at start; an online one would make a second run.

A trial that ``sweep resume`` continues from its checkpoint (after Ctrl-C, SIGTERM or a killed driver) keeps its run:
the resumed part logs to the same run id with ``wandb.init(resume="allow")``. Offline, W&B writes it to a second
``offline-run-*-<id>`` folder; ``wandb sync`` of both folders appends it to the one run (docs.wandb.ai, "Resume a
run"). Its steps start after the checkpoint's; steps the run already holds are ones the driver received before it
was killed, and W&B keeps their first values.

A remedied trial (:mod:`klsweep.orchestrate.remedy`) logs each restart segment to a W&B run of its own
(:meth:`VerlWandbCallback.log_trial_start`). The restart continues from a checkpoint before the last step the trial
logged, and W&B's step only grows. In one run per trial, W&B would drop the restarted steps ("Tried to log to step 33
that is less than the current step 46").
"""

from __future__ import annotations

import functools
import os
import socket
import sys
import threading
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import ray
from ray.air.integrations.wandb import WANDB_ENV_VAR, WandbLoggerCallback, _WandbLoggingActor
from ray.air.util.node import _force_on_current_node

from klsweep._format import param_labels, short
from klsweep.health.stopper import REMEDY_NOTE
from klsweep.orchestrate.remedy import REMEDIES, overrides_of
from klsweep.orchestrate.searcher import optuna_number
from klsweep.results import HEALTH, STOP_KIND, STOP_REASON, restarts, schedule_line
from klsweep.spec.space import parameters

if TYPE_CHECKING:
    from klsweep.spec.schema import Sweep


#: seconds an interrupted sweep waits for its W&B runs to be written (Tune's own trial cleanup takes up to 5 s more):
#: the driver then ends well within the 30 s SLURM and Kubernetes give a stopped job before SIGKILL
INTERRUPTED_FLUSH_S = 8


class _FlushingWandbLoggingActor(_WandbLoggingActor):
    """Ray's W&B logging actor, which also waits for W&B's service process to write the run file before it returns.

    ``wandb.finish`` returns before wandb-core has flushed the run (ray/air/integrations/wandb.py ends the actor
    right after it), so an offline run file can be left with its header only.
    ``wandb.teardown`` waits for the service to finish every stream.
    """
    def run(self):
        try:
            super().run()
        finally:
            self._wandb.teardown()


class VerlWandbCallback(WandbLoggerCallback):
    """``WandbLoggerCallback`` whose run config is the trial's full verl override dict, not Optuna's params.

    The config also holds the trial number, the searched parameters, the health verdict and the stop reason. The run
    name is readable. A remedied trial gets one W&B run per restart segment.

    Restart segments: a remedy restarts its trial from a checkpoint at step ``s`` (32, say) after the trial has
    logged up to its finding (46). Ray's callback would keep the trial's logging actor and run across the restart
    (``_start_logging_actor`` reuses it) and log with ``step=training_iteration``. W&B's step only grows, so it
    would drop steps 33-46 of the restarted run ("Tried to log to step 33 that is less than the current step
    46 ... this data will be ignored"). Here the segment's run ends and the restart logs to a new run of the same
    group:

    - id ``<trial id>-r<restart>``, name ``<trial name>-r<restart>`` with the segment's parameter values;
    - config: the segment's verl overrides (the prescribed knobs changed), with ``restart``, ``from_step``,
      ``parent_run`` (the previous segment's run id) and ``remedy_schedule`` (:func:`klsweep.results.schedule_line`);
    - tag ``remedied``.

    The previous run's config keeps its ``remedy_note``: the rule, step and prescription that ended it. Each run's
    step axis is the trial's training step. The segments of a trial thus overlay on one chart, the restarted one
    starting after its checkpoint's step.

    Rejected alternatives. One run with a custom x-axis (``define_metric("*", step_metric=...)``) would draw the
    abandoned and the restarted steps 33-46 as one line, back and forth, with nothing telling them apart. W&B's
    rewind and fork (``wandb.init(resume_from=...)``, ``fork_from="<id>?_step=32"``, docs.wandb.ai/models/runs/
    rewind and /forking) are server-side preview features; an offline run cannot use them. A rewind also moves the
    abandoned steps, which the remedy was decided on, to an archived copy of the run.

    Args:
        overrides_of: Tune config → verl overrides (:func:`klsweep.orchestrate.remedy.overrides_of` bound to the
            sweep: the trial's remedy schedule left out).
        params: the searched verl keys (:func:`klsweep.spec.space.parameters`), named in the run name by their leaf.
        **kwargs: ``WandbLoggerCallback`` arguments (project, group, entity, mode, tags, ...).
    """
    _logger_actor_cls = _FlushingWandbLoggingActor
    #: result keys W&B gets as config (updated with every result), not as history: strings are dropped there
    AUTO_CONFIG_KEYS = [*WandbLoggerCallback.AUTO_CONFIG_KEYS, HEALTH, STOP_REASON, STOP_KIND, REMEDY_NOTE]

    def __init__(self, overrides_of, params: list[str] | None = None, **kwargs):
        super().__init__(**kwargs)
        self._overrides_of = overrides_of
        self._params = params or []
        self._segment: dict = {}  # trial → the restart its logging actor logs (0: before any remedy)
        self._ended_segments: dict = {}  # logging future of a previous segment's run → (its actor, its queue)
        self._told_to_end: set = set()  # trials whose logging actor was told to finish its run

    def setup(self, *args, **kwargs) -> None:
        # Ray asks for an API key unless the WANDB_MODE variable says offline: an offline sweep needs none.
        if self.kwargs.get("mode") in ("offline", "disabled"):
            os.environ["WANDB_MODE"] = self.kwargs["mode"]
        super().setup(*args, **kwargs)

    def _start_run(self, trial) -> None:
        # WandbLoggerCallback passes self.kwargs to wandb.init after its own arguments, so these win.
        number = optuna_number(trial)
        remedies = list(trial.config.get(REMEDIES, ()))
        done = restarts(remedies)
        restart = done[-1].number if done else 0
        if trial in self._trial_logging_futures and self._segment.get(trial, 0) != restart:
            self._end_segment(trial)  # a remedy restarted the trial: its next steps go to a new run
        self._segment[trial] = restart
        searched = {label: trial.config.get(key) for key, label in param_labels(self._params).items()}
        suffix = f"-r{restart}" if restart else ""
        config = {**self._overrides_of(trial.config), "trial_number": number, "searched": searched}
        if restart:
            config.update(restart=restart, from_step=done[-1].from_step,
                          parent_run=trial.trial_id + (f"-r{restart - 1}" if restart > 1 else ""),
                          remedy_schedule=schedule_line(remedies))
        self.kwargs["config"] = config
        self.kwargs["id"] = trial.trial_id + suffix
        self.kwargs["resume"] = "allow"  # a trial `sweep resume` continues logs to its run (Ray passes False)
        self.kwargs["name"] = " ".join([f"{self.group} #{trial.trial_id if number is None else number}{suffix}",
                                        *(f"{label}={short(value)}" for label, value in searched.items())])
        self.kwargs["tags"] = [t for t in self.kwargs.get("tags") or [] if t != "remedied"] + (
            ["remedied"] if restart else [])
        super().log_trial_start(trial)

    def _signal_logging_actor_stop(self, trial) -> None:
        """Ray's (put END on the trial's queue: the actor finishes its run), remembered for
        :meth:`on_experiment_end`."""
        self._told_to_end.add(trial)
        super()._signal_logging_actor_stop(trial)

    def log_trial_start(self, trial) -> None:
        self._start_run(trial)
        self._told_to_end.discard(trial)  # its new run's actor has not been told to end

    def _end_segment(self, trial) -> None:
        """Tell the trial's logging actor to finish its run, and forget it as the trial's: the run is flushed and
        its actor released by :meth:`_cleanup_logging_actors` once ``wandb.finish`` returned."""
        self._signal_logging_actor_stop(trial)
        future = self._trial_logging_futures.pop(trial)
        self._logging_future_to_trial.pop(future)
        self._ended_segments[future] = (self._trial_logging_actors.pop(trial), self._trial_queues.pop(trial))

    def _cleanup_logging_actors(self, timeout: int = 0, kill_on_timeout: bool = False) -> None:
        """Ray's cleanup (release the actors whose run finished; at the sweep's end wait up to ``timeout`` s for
        the others), for the ended segments' actors too."""
        if self._ended_segments:
            futures = list(self._ended_segments)
            done, remaining = ray.wait(futures, num_returns=len(futures), timeout=timeout)
            for future in [*done, *(remaining if kill_on_timeout else [])]:
                ray.kill(self._ended_segments.pop(future)[0])
        super()._cleanup_logging_actors(timeout=timeout, kill_on_timeout=kill_on_timeout)

    def on_experiment_end(self, trials, **info) -> None:
        """End every W&B run, waiting at most :data:`INTERRUPTED_FLUSH_S` when the experiment ended with trials
        still running (Ctrl-C, SIGTERM), else up to ``upload_timeout``.

        Ray's callback ends a trial's run in ``log_trial_end``. An interrupted trial never ends, so Ray's
        ``on_experiment_end`` would wait ``upload_timeout`` (Ray Train's sync timeout, 1800 s:
        ray/air/integrations/wandb.py) for a logging actor that was never told to finish. Here each such actor is
        told to finish its run (``wandb.finish``, then :class:`_FlushingWandbLoggingActor`'s teardown), so its
        offline run file is complete and ``wandb sync`` uploads it; an actor not done within the bound is killed."""
        # not by trial status: Tune's cleanup marks every live trial TERMINATED before this call (tune_controller.py)
        unfinished = [trial for trial in list(self._trial_logging_actors) if trial not in self._told_to_end]
        for trial in unfinished:
            self._signal_logging_actor_stop(trial)
        timeout = min(self._upload_timeout, INTERRUPTED_FLUSH_S) if unfinished else self._upload_timeout
        self._cleanup_logging_actors(timeout=timeout, kill_on_timeout=True)

    def _start_logging_actor(self, trial, exclude_results: list[str], **wandb_init_kwargs) -> None:
        """Ray's, with the logging actor class built without ``max_restarts=-1``.

        One constructor argument is the trial's ``Queue`` actor handle, which lives in the object store. Ray logs an
        error for an actor with restarts whose constructor arguments are in the object store, since a restart would
        fail (ray#53727: "core_worker.cc: Actor with class name: '_FlushingWandbLoggingActor' ... has constructor
        arguments in the object store and max_restarts > 0"). A restarted logging actor would also call
        ``wandb.init`` again with the run's id, after losing the results it had taken from the queue. So a logging
        actor that dies ends its run's logging, never the sweep."""
        if self._remote_logger_class is None:
            # as WandbLoggerCallback._start_logging_actor: the API key (when in the environment) for the actor
            env_vars = {WANDB_ENV_VAR: os.environ[WANDB_ENV_VAR]} if WANDB_ENV_VAR in os.environ else {}
            on_this_node = cast(dict[str, Any], _force_on_current_node())  # the options dict when given no class
            self._remote_logger_class = ray.remote(  # type: ignore[assignment]  # Ray's attribute starts as None
                num_cpus=0, **on_this_node, runtime_env={"env_vars": env_vars})(self._logger_actor_cls)
        super()._start_logging_actor(trial, exclude_results, **wandb_init_kwargs)


def wandb_callback(sweep: Sweep, out_dir: Path) -> VerlWandbCallback | None:
    """The W&B callback of ``sweep.wandb``, or None with a warning when ``mode: online`` has no credentials.

    ``mode: online`` with credentials but no route to W&B's server (:func:`unreachable`, within
    :data:`PROBE_TIMEOUT_S` seconds) logs offline instead, and says so: online, every trial would wait on W&B and
    none of its data would reach it.

    The project defaults to the sweep name; the group is the sweep name; the tags are the sweep name, algorithm and
    trainer. W&B never stops a sweep.

    W&B run files go to ``$WANDB_DIR`` as the driver sees it, else to ``out_dir/wandb/offline-run-*``. The logging
    actors are Ray workers: once Ray runs, they do not inherit the driver's environment. Without a directory they
    would write into their own working directory.
    """
    if sweep.wandb.mode == "online" and not _has_credentials():
        print("warning: wandb.mode is online but no W&B credentials were found (WANDB_API_KEY or `wandb login`): "
              "the sweep runs without W&B; use wandb.mode: offline to log locally and `wandb sync` later",
              file=sys.stderr)
        return None
    mode = sweep.wandb.mode
    if mode == "online":
        url = _base_url()
        why = unreachable(url)
        if why is not None:  # each trial's run would wait on W&B, slowly, and reach nothing
            mode = "offline"
            where = Path(os.environ.get("WANDB_DIR") or out_dir) / "wandb"
            print(f"warning: wandb.mode is online but W&B at {url} cannot be reached from this machine ({why}): "
                  f"the sweep logs offline to {where}; upload the runs later with `wandb sync {where}/offline-run-*`",
                  file=sys.stderr)
    kwargs = {"project": sweep.wandb.project or sweep.name, "group": sweep.name, "mode": mode,
              "dir": os.environ.get("WANDB_DIR") or str(out_dir), "tags": [sweep.name, sweep.algorithm, sweep.trainer]}
    if sweep.wandb.entity:
        kwargs["entity"] = sweep.wandb.entity
    return VerlWandbCallback(functools.partial(overrides_of, sweep), list(parameters(sweep)), **kwargs)


#: Seconds an online sweep waits for W&B's server (name lookup and TCP connection) before it logs offline.
PROBE_TIMEOUT_S = 3.0


def unreachable(url: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """Why W&B's server at ``url`` cannot be reached from here, or None when a TCP connection to its host and port
    opens within ``timeout`` seconds (the name lookup included: it runs in a thread that is not waited for)."""
    parts = urllib.parse.urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    outcome: dict[str, str] = {}

    def connect() -> None:
        try:
            socket.create_connection((parts.hostname or "", port), timeout=timeout).close()
            outcome["ok"] = ""
        except OSError as e:
            outcome["error"] = e.strerror or str(e) or type(e).__name__

    probe = threading.Thread(target=connect, name="wandb-probe", daemon=True)
    probe.start()
    probe.join(timeout)
    if "ok" in outcome:
        return None
    return outcome.get("error") or f"no answer within {timeout:g} s"


def _base_url() -> str:
    """W&B's server: ``WANDB_BASE_URL``, else the one wandb's settings hold (``wandb login --host``)."""
    import wandb

    return os.environ.get("WANDB_BASE_URL") or str(wandb.setup().settings.base_url)


def _has_credentials() -> bool:
    import wandb

    try:
        return bool(wandb.login(prompt=False, verify=False))
    except Exception:  # a broken W&B setup is a warning, never a failed sweep
        return False
