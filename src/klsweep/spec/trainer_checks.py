"""Checks that depend on the trainer: a verl trial's GPUs (on one node, or one job over several), a tabular
sweep's table, and fate stopping's signals (what the trainer logs).

Each problem is ``(path, message)`` with ``path`` the tuple of the sweep-file field it concerns.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from klsweep.errors import KlsweepError, TraceReadError
from klsweep.spec.key_checks import Problem, label
from klsweep.spec.schema import Choice, Constant, Sweep
from klsweep.trainers.tabular import header_mismatch, load_table, read_header, recorded_for
from klsweep.verl.config import compose
from klsweep.verl.late_failures import ray_cpus
from klsweep.verl.metrics import PROXY_GAP

#: The keys that size a verl trial's GPUs: verl's ResourcePoolManager asks Ray for nnodes × n_gpus_per_node.
_GPU_KEYS = ("trainer.nnodes", "trainer.n_gpus_per_node")


@functools.lru_cache(maxsize=None)
def _verl_default(key: str) -> Any:
    from omegaconf import OmegaConf  # on use: ~0.25 s to import, more than klsweep.spec

    return OmegaConf.select(compose({}), key)


def verl_resources(sweep: Sweep, fixed: dict, params: dict, names: dict[str, str]) -> Iterator[Problem]:
    """Check that a ``trainer: verl`` trial reserves the GPUs its verl asks for.

    Takes the fixed overrides, the searched parameters and each searched key's parameter name (``names``).
    A single-node trial (``trainer.nnodes`` 1) runs on the GPUs Ray reserves for it (``budget.resources.gpu``; the
    launcher sets ``CUDA_VISIBLE_DEVICES``). Its verl asks its own local Ray for ``trainer.n_gpus_per_node`` GPUs
    (verl's ``ResourcePoolManager``; the default is 8). Fewer reserved than asked fails every trial ("Total
    available GPUs ... is less than total desired GPUs ..."); more idles them. A fraction of one GPU is fine for a
    one-GPU trial. Yields an error for each mismatch, or for a searched GPU key; then the CPUs of the trial's own Ray
    (:func:`_inner_ray_cpus`) and the vLLM memory of trials that share a GPU (:func:`_shared_gpu`).

    A multi-node trial (``trainer.nnodes`` > 1) is one Ray job on the sweep's cluster that reserves its GPUs itself
    (:mod:`klsweep.launchers.multinode`): its Tune actor holds no GPU (:func:`_multinode`).
    """
    searched = [key for key in _GPU_KEYS if key in params]
    for key in searched:
        yield ("parameters", names[key]), (
            f"{key} is searched, but every trial reserves the same budget.resources.gpu GPUs "
            f"({sweep.budget.resources.gpu:g}): the GPU count is a resource, not a hyperparameter. Fix {key} in "
            "overrides and set budget.resources.gpu to match")
    if searched:
        return
    nnodes, per_node = (fixed.get(key, _verl_default(key)) for key in _GPU_KEYS)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (nnodes, per_node)):
        return  # not a whole number: no GPU count to compare (verl itself fails on it)
    if nnodes != 1:
        yield from _multinode(sweep, fixed, nnodes, per_node)
        return
    gpu = sweep.budget.resources.gpu
    yield from _inner_ray_cpus(sweep, fixed, per_node)
    if per_node == 1 and 0 < gpu < 1:
        yield from _shared_gpu(sweep, fixed, params, names)
    if gpu == per_node or (per_node == 1 and 0 < gpu < 1):
        return
    origin = "verl's default" if "trainer.n_gpus_per_node" not in fixed else "set in overrides"
    if gpu < per_node:
        why = (f"verl fails every trial at start (\"Total available GPUs {math.ceil(gpu)} is less than total "
               f"desired GPUs {per_node}\")")
    else:
        why = f"{gpu - per_node:g} of the reserved GPUs would sit idle in every trial"
    if gpu >= 1 and gpu == int(gpu):
        fix = f"Set budget.resources.gpu: {per_node}, or trainer.n_gpus_per_node: {int(gpu)} in overrides"
    else:
        fix = (f"Set budget.resources.gpu: {per_node}, or trainer.n_gpus_per_node: 1 in overrides with "
               "budget.resources.gpu: 1 (or a fraction of 1 to share one GPU between trials)")
    yield ("budget", "resources", "gpu"), (
        f"budget.resources.gpu is {gpu:g} but each verl trial uses trainer.nnodes × trainer.n_gpus_per_node = "
        f"1 × {per_node} = {per_node} GPU{'s' * (per_node != 1)} (n_gpus_per_node {per_node} is {origin}): a trial "
        f"sees only the GPUs Ray reserves for it, so {why}. {fix}")


def _multinode(sweep: Sweep, fixed: dict[str, Any], nnodes: int, per_node: int) -> Iterator[Problem]:
    """A multi-node trial (``trainer.nnodes`` > 1) that reserves GPUs for its Tune actor, or starts its own Ray.

    Its verl is one Ray job on the sweep's cluster that places ``nnodes`` groups of ``per_node`` GPUs itself
    (:mod:`klsweep.launchers.multinode`). GPUs reserved for the trial's own actor would sit idle and count against
    the cluster twice. ``ray_kwargs.ray_init.address=local`` would start a one-node Ray instead of joining the
    cluster, and wait for the other nodes' GPUs for ever."""
    if nnodes < 1:
        yield ("overrides", "trainer.nnodes"), f"trainer.nnodes={nnodes}: a verl trial runs on at least 1 node"
        return
    gpu = sweep.budget.resources.gpu
    if gpu != 0:
        yield ("budget", "resources", "gpu"), (
            f"budget.resources.gpu is {gpu:g} but a trial of trainer.nnodes={nnodes} is one Ray job on the sweep's "
            f"cluster, and verl reserves its {nnodes} × {per_node} GPUs itself with one placement group per node: "
            "GPUs reserved for the trial's own actor would sit idle and count twice. Set budget.resources.gpu: 0 "
            "(klsweep caps budget.max_concurrent to the trials the cluster holds)")
    address = _fixed_or_default(fixed, "ray_kwargs.ray_init.address")
    if address == "local":
        yield ("overrides", "ray_kwargs.ray_init.address"), (
            f"ray_kwargs.ray_init.address=local starts a private one-node Ray, but trainer.nnodes={nnodes} needs "
            "the sweep's cluster: verl would wait for the other nodes' GPUs for ever. Remove the key")


def verl_default(key: str) -> Any:
    """The value of ``key`` in verl's default ``ppo_trainer`` config (None when absent)."""
    return _verl_default(key)
#: The share of one GPU the vLLM engines of trials that share it may ask for together: the rest holds each trial's
#: actor (weights, gradients, optimizer state while vLLM sleeps) and CUDA contexts.
SHARED_GPU_MEMORY = 0.8


def inner_ray_cpus(fixed: dict[str, Any], gpus: int) -> tuple[int, str]:
    """The CPUs a verl trial of ``gpus`` GPUs reserves in Ray, and how that number is made up
    (:func:`klsweep.verl.late_failures.ray_cpus` of the fixed overrides over verl's defaults)."""
    return ray_cpus(functools.partial(_fixed_or_default, fixed), gpus)


def _fixed_or_default(fixed: dict[str, Any], key: str) -> Any:
    return fixed.get(key, fixed.get(f"+{key}", _verl_default(key)))


def _inner_ray_cpus(sweep: Sweep, fixed: dict[str, Any], per_node: int) -> Iterator[Problem]:
    """A trial's CPUs below what its verl's own Ray reserves (:func:`inner_ray_cpus`).

    verl waits for its placement groups with no timeout: a trial whose node (or whose ``ray_kwargs.ray_init.num_cpus``)
    has fewer CPUs hangs silently, holding its GPUs. ``budget.resources.cpu`` is what Ray reserves for a trial, and
    what ``sweep run`` checks a node can hold; below the need, Ray also starts more trials on a node than its CPUs
    serve."""
    need, parts = inner_ray_cpus(fixed, per_node)
    cpu = sweep.budget.resources.cpu
    if cpu < need:
        yield ("budget", "resources", "cpu"), (
            f"budget.resources.cpu is {cpu:g} but each verl trial's own Ray reserves {need} CPUs ({parts}; "
            "verl/single_controller/ray/base.py, transfer_queue): Ray would start more trials on a node than its "
            "CPUs serve, and on a node with fewer than "
            f"{need} CPUs verl waits for its placement groups for ever, silently, holding the trial's GPUs. "
            f"Set budget.resources.cpu: {need}")
    ray_cpus = fixed.get("ray_kwargs.ray_init.num_cpus")
    if isinstance(ray_cpus, (int, float)) and not isinstance(ray_cpus, bool) and ray_cpus < need:
        yield ("overrides", "ray_kwargs.ray_init.num_cpus"), (
            f"ray_kwargs.ray_init.num_cpus={ray_cpus:g} gives the trial's own Ray fewer CPUs than verl reserves in "
            f"it ({need}: {parts}): the trial waits for ever, silently. Set it to {need} or more, or remove it")


def _shared_gpu(sweep: Sweep, fixed: dict[str, Any], params: dict, names: dict[str, str]) -> Iterator[Problem]:
    """vLLM engines of trials that share one GPU (``budget.resources.gpu`` < 1) asking for more than it holds.

    Each engine checks at start that ``gpu_memory_utilization`` × the GPU's memory is free (vLLM's
    ``gpu_worker``); verl's default is 0.5 (verl/trainer/config/rollout/rollout.yaml). Together the shares of the
    trials that can run on one GPU at once, ``min(budget.max_concurrent, 1 // budget.resources.gpu)``, must stay
    within :data:`SHARED_GPU_MEMORY`, leaving the rest to the trials' actors."""
    gpu, concurrent = sweep.budget.resources.gpu, sweep.budget.max_concurrent
    sharing = min(concurrent, math.floor(1 / gpu + 1e-9))
    if sharing < 2:
        return
    key = "actor_rollout_ref.rollout.gpu_memory_utilization"
    p = params.get(key)
    values = (p.values if isinstance(p, Choice) else [p.value] if isinstance(p, Constant) else [p.max]) if p else \
        [_fixed_or_default(fixed, key)]
    util = max((v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)), default=None)
    if util is None or sharing * util <= SHARED_GPU_MEMORY + 1e-9:
        return
    fit = math.floor(SHARED_GPU_MEMORY / sharing * 100) / 100
    path: tuple[Any, ...] = (("parameters", names[key]) if p else ("overrides", key) if key in fixed
                             and key in sweep.overrides else ("budget", "resources", "gpu"))
    origin = " (verl's default)" if not p and key not in sweep.overrides else ""
    yield path, (
        f"{key} is {util:g}{origin} and budget.resources.gpu is {gpu:g}: up to {sharing} trials share one GPU "
        f"(budget.max_concurrent {concurrent}), whose vLLM engines ask for {sharing} × {util:g} = {sharing * util:g} "
        "of its memory; each engine checks at start that its share is free (vLLM's gpu_worker), so a second trial "
        "fails to start while the first holds its share and its actor. The shares must sum to at most "
        f"{SHARED_GPU_MEMORY:g}. Set {key}: {fit} in overrides ({SHARED_GPU_MEMORY:g} / {sharing} trials), or give "
        "each trial a whole GPU (budget.resources.gpu: 1)")


def table_problems(sweep: Sweep, params: dict, names: dict[str, str], fixed: dict[str, Any]) -> Iterator[Problem]:
    """Check that a ``trainer: tabular`` sweep's table was recorded for this sweep and its searched values.

    Takes the searched parameters, each searched key's parameter name (``names``) and the fixed overrides.
    A table recorded for another sweep is one error. Such a table has other searched keys or training settings, or
    none of a searched category's values. The error names the sweep the header was recorded for, and the table of
    its folder that fits.
    Else each searched categorical value the table did not record (its header's ``grid``) is an error. The trainer
    would refuse such trials at run time (:meth:`klsweep.trainers.tabular.Table.nearest`) or serve another sweep's
    runs. A table that cannot be read is one error. Yields nothing for another trainer.
    """
    if sweep.trainer != "tabular" or sweep.tabular is None:
        return
    try:
        header = load_table(sweep.tabular.table).header
    except TraceReadError as e:  # a problem of the file like the others: the rest of the sweep is still checked
        yield ("tabular", "table"), str(e)
        return
    why = header_mismatch(header, list(params), fixed)
    if why:
        yield _other_sweeps_table(sweep.tabular.table, header, why, params, fixed)
        return
    for key, p in params.items():
        axis = header["parameters"].get(key, {})
        grid = axis.get("grid", axis.get("values"))
        if not isinstance(p, Choice) or axis.get("scale") != "categorical" or grid is None:
            continue
        kept = [v for v in p.values if v in grid]
        name = names[key]
        if not kept:
            why = f"none of the values this sweep searches for {name} ({p.values}) was recorded (it holds {grid})"
            yield _other_sweeps_table(sweep.tabular.table, header, why, params, fixed)
            return
        if len(kept) < len(p.values):
            yield ("parameters", name), (
                f"{label(name, key)} searches {[v for v in p.values if v not in grid]}, which the table "
                f"{sweep.tabular.table} did not record (it holds {grid}): those trials would fail. Search only the "
                f"recorded values (add the override 'parameters.{name}={{values: [{', '.join(map(str, kept))}]}}') "
                "or generate a table with them (benchmarks/tabular/README.md)")


def _other_sweeps_table(path: str, header: dict, why: str, params: dict, fixed: dict[str, Any]) -> Problem:
    """The one problem of a table recorded for another sweep.

    It says what the header says the table was recorded for, and why it does not fit (``why``). The fix is a table
    of its folder that fits (:func:`klsweep.trainers.tabular.header_mismatch`), else generating one."""
    def shown(p: Path) -> str:
        return str(p.relative_to(Path.cwd())) if p.is_relative_to(Path.cwd()) else str(p)

    table, fits = Path(path), []
    for other in sorted(table.parent.glob("*.jsonl.gz")):
        try:
            if other != table and header_mismatch(read_header(other), list(params), fixed) is None:
                fits.append(shown(other))
        except TraceReadError:
            continue
    fix = (f"use {' or '.join(fits)}" if fits else
           "generate a table from this sweep file (benchmarks/tabular/generate.py, benchmarks/tabular/README.md)")
    return ("tabular", "table"), (f"{shown(table)} was recorded for {recorded_for(header)}, but {why}: every trial "
                                  f"would fail or be served another sweep's runs. Fix: {fix}")


def replay_shorter_than_budget(sweep: Sweep) -> Iterator[Problem]:
    """``budget.max_steps`` past the last step of the log a replay sweep plays back: every trial ends at the log's
    last step, and the budget's steps past it are neither run nor saved. A log that cannot be read is left to the
    trainer's own error."""
    if sweep.kind.name != "replay" or sweep.replay is None:
        return
    from klsweep.trainers.replay import last_step

    try:
        steps = last_step(sweep.replay.trace, sweep.replay.run)
    except (KlsweepError, OSError):
        return
    if steps < sweep.budget.max_steps:
        yield ("budget", "max_steps"), (
            f"{sweep.budget.max_steps} is longer than the replayed log {sweep.replay.trace}, whose last step is "
            f"{steps}: every trial ends at step {steps}, and the budget's steps past it are neither run nor saved. "
            f"Lower budget.max_steps to {steps}, or replay a longer log")


def recorded_metrics(sweep: Sweep) -> frozenset[str] | None:
    """The metric names a ``replay`` or ``tabular`` sweep's trials report: every name of the replayed log, or of the
    table's runs. None for another trainer, or for a log or table that cannot be read (its own check reports it)."""
    try:
        if sweep.kind.name == "replay" and sweep.replay is not None:
            from klsweep.health.readers import read_trace
            from klsweep.trainers.replay import played_reports  # on use: it imports Ray

            reports = played_reports(read_trace(Path(sweep.replay.trace), run=sweep.replay.run).reports, None)
            return frozenset(name for _, metrics in reports for name in metrics)
        if sweep.kind.name == "tabular" and sweep.tabular is not None:
            runs = load_table(sweep.tabular.table).runs.values()
            return frozenset(name for run in runs for _, metrics in run for name in metrics)
    except (KlsweepError, OSError):
        return None
    return None


def fate_unread(sweep: Sweep, embedded: frozenset[str]) -> Iterator[Problem]:
    """``stopping.fate`` with no signal a trial logs: the stopper would have nothing to read.

    ``kl`` needs a KL placement. ``proxy_gap`` needs both scores of :data:`PROXY_GAP`, logged where the trainer's
    metrics have them: the embedded trainer's (``embedded``, the names it logs), a replayed log's or a table's
    (:func:`recorded_metrics`). A trainer whose trials are verl's own ``main_ppo`` logs verl's metrics, no gold
    score. A log or table that cannot be read is given the benefit of the doubt."""
    fate, kind = sweep.stopping.fate, sweep.kind
    if fate is None:
        return
    logged = embedded if kind.name == "embedded" else frozenset() if kind.runs_verl else recorded_metrics(sweep)
    no_kl, no_gold = sweep.placement == "none", logged is not None and not set(PROXY_GAP) <= logged
    if ("kl" in fate.signals and not no_kl) or ("proxy_gap" in fate.signals and not no_gold):
        return
    recorded = {"replay": f"the replayed log {sweep.replay and sweep.replay.trace} holds",
                "tabular": f"the table {sweep.tabular and sweep.tabular.table} holds"}
    source = recorded.get(kind.name, f"the {kind.name} trainer logs")
    gold = (f"{source} no gold score (proxy_gap is {' − '.join(PROXY_GAP)}, which the embedded trainer logs, and the "
            "logs and tables recorded from it)")
    shown = f"signals [{', '.join(fate.signals)}]"
    if "proxy_gap" not in fate.signals:
        fix = "Add proxy_gap (read where the trainer logs a gold score, as the embedded trainer does)" if not no_gold \
            else f"proxy_gap cannot replace it: {gold}. Set kl_placement: loss or reward"
        message = (f"{shown} on a sweep without a reference KL (kl_placement none): fate stopping would have nothing "
                   f"to read. {fix}")
    elif "kl" in fate.signals:
        message = (f"{shown} on a sweep without a reference KL (kl_placement none), and {gold}: fate stopping would "
                   "have nothing to read. Set kl_placement: loss or reward")
    else:
        fix = (f"Use signals: [kl] (the reference KL of kl_placement {sweep.placement})" if not no_kl else
               "Set kl_placement: loss or reward and signals: [kl]")
        message = f"{shown}, but {gold}: fate stopping would have nothing to read. {fix}"
    yield ("stopping", "fate", "signals"), f"{message}, or turn stopping.fate off"
