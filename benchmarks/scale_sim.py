"""Scale simulation: replay trials on a simulated N-node × 8-GPU Ray cluster (goal size: 1,000 on 64 × 8).

The cluster is one local Ray with N × 8 logical GPUs (``num_gpus``; nothing runs on a GPU). Each trial asks for 8 GPUs
(one node's worth) and no CPU, so N run at once, and replays verl's GRPO reference run
(``tests/data/traces/grpo_qwen7b_gsm8k.jsonl``: validation at step 0, then steps 1-105) with the replay
trainer at accelerated time (``--speed`` steps per second, ~170 s per step in the real run), truncated at
``--steps``. Everything else is ``sweep run``'s own path in this process (:func:`klsweep.orchestrate.sweep.run_sweep`:
Optuna TPE searcher with its SQLite study, the default health rules on every result, Tune's experiment state,
trials.csv).

Prints: GPU-slot utilisation = Σ over trials of 8 × the trial's own time (Tune's ``time_total_s``) ÷ (N × 8 × the
wall time of the whole ``sweep run`` call: what a user pays for the GPUs), then the same over the trial window only
(first trial's start to the last one's end: it leaves out Ray's start, preflight and the wrap-up, so it flatters);
results per second the driver handled; where the slot time of the trial window went (ramp-up while Ray
starts a worker per slot, gaps between trials on one worker, tail); peak RSS of this driver process (sampled every
0.5 s) and of all Ray processes. The last line is the whole-run utilisation (goal ≥ 0.95) and the driver's peak RSS
(goal < 2 GB).

Scaled down by default to what 2 cores hold in 10 minutes (~330 s): 200 trials on 16 × 8 logical GPUs, steps 0-20
of the trace (21 results per trial) at 1 step/s (a trial lasts ~20 s). Every concurrent trial is a Ray worker process
(~0.2 GB, a few % of a core even while it sleeps), so the full size, 64 at once, needs a machine with cores for 64
workers: ``--trials 1000 --nodes 64`` there.

    python benchmarks/scale_sim.py [--trials 200] [--nodes 16] [--gpus-per-node 8] [--steps 20] [--speed 1]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from pathlib import Path

import psutil
import yaml
from _bench import REPO, machine, trials

TRACE = REPO / "tests" / "data" / "traces" / "grpo_qwen7b_gsm8k.jsonl"  # source: tests/data/README.md
VAL = "val-core/openai/gsm8k/reward/mean@1"


class PeakRss(threading.Thread):
    """Samples the RSS of this process (and, every 10th sample, of all its child processes) until stopped."""

    def __init__(self, every: float = 0.5):
        super().__init__(daemon=True)
        self.every, self.driver, self.tree, self.stopped = every, 0, 0, threading.Event()

    def run(self) -> None:
        me = psutil.Process()
        n = 0
        while not self.stopped.wait(self.every):
            self.driver = max(self.driver, me.memory_info().rss)
            if n % 10 == 0:
                total = me.memory_info().rss
                for child in me.children(recursive=True):
                    try:
                        total += child.memory_info().rss
                    except psutil.Error:
                        pass
                self.tree = max(self.tree, total)
            n += 1


def sweep_file(folder: Path, args) -> Path:
    sweep = {
        "name": "scale_sim",
        "algorithm": "grpo",
        "trainer": "replay",
        "replay": {"trace": str(TRACE), "speed": args.speed},
        "overrides": {"actor_rollout_ref.rollout.n": 5, "trainer.n_gpus_per_node": args.gpus_per_node},
        "parameters": {"kl_coef": {"distribution": "log_uniform_values", "min": 0.0001, "max": 0.01}},
        "objective": {"metric": VAL, "mode": "max"},
        "sampler": "tpe",
        "budget": {"trials": args.trials, "max_concurrent": args.nodes, "max_steps": args.steps,
                   "resources": {"cpu": 0, "gpu": args.gpus_per_node}},
        "health": "default",
    }
    path = folder / "scale_sim.yaml"
    path.write_text(yaml.safe_dump(sweep, sort_keys=False))
    return path


def trial_windows(out: Path) -> list[tuple[float, float, int, int]]:
    """(start, end, results, worker pid) of each trial from its result.json: end = last ``timestamp`` (whole
    seconds), start = end − ``time_total_s``."""
    windows = []
    for result in (out / "tune").glob("*/result.json"):
        rows = result.read_text().splitlines()
        if rows:
            last = json.loads(rows[-1])
            windows.append((last["timestamp"] - last["time_total_s"], float(last["timestamp"]), len(rows), last["pid"]))
    return windows


def slot_losses(windows: list[tuple[float, float, int, int]], slots: int) -> tuple[float, float, float]:
    """Where slot time goes besides trials, in slot-seconds: (ramp-up: each slot's wait from the first trial's start
    to its own first trial, gaps between consecutive trials on one Ray worker, tail: each slot's idle time after its
    last trial until the last trial ends). Workers beyond ``slots`` (a replaced actor) count as the same slots."""
    first, last = min(w[0] for w in windows), max(w[1] for w in windows)
    by_worker: dict[int, list[tuple[float, float]]] = {}
    for start, end, _, pid in windows:
        by_worker.setdefault(pid, []).append((start, end))
    ramp = gaps = tail = 0.0
    for runs in by_worker.values():
        runs.sort()
        ramp += runs[0][0] - first
        gaps += sum(max(0.0, b[0] - a[1]) for a, b in zip(runs, runs[1:]))
        tail += last - runs[-1][1]
    ramp += (slots - len(by_worker)) * (last - first) if len(by_worker) < slots else 0.0
    return ramp, gaps, tail


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--speed", type=float, default=1.0)
    args = parser.parse_args()
    if not TRACE.is_file():
        raise SystemExit(f"{TRACE} not found: it is part of the repository (tests/data/traces)")
    import ray

    from klsweep.orchestrate.sweep import run_sweep

    print(f"machine: {machine()}")
    gpus = args.nodes * args.gpus_per_node
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(address="local", num_cpus=2, num_gpus=gpus, include_dashboard=False, log_to_driver=False,
             logging_level="ERROR")
    rss = PeakRss()
    rss.start()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        start = time.time()
        run_sweep(str(sweep_file(Path(tmp), args)), [], out=str(out), quiet=True)
        wall = time.time() - start
        rss.stopped.set()
        df = trials(out)
        windows = trial_windows(out)
    ray.shutdown()
    busy = args.gpus_per_node * df["wall_s"].sum()
    window = max(w[1] for w in windows) - min(w[0] for w in windows)
    results = sum(w[2] for w in windows)
    ramp, gaps, tail = slot_losses(windows, args.nodes)
    util = busy / (gpus * wall)
    print(f"{len(df)} trials ({df['state'].value_counts().to_dict()}), {results} results, "
          f"{args.nodes} × {args.gpus_per_node} logical GPUs, {args.steps} steps at {args.speed} steps/s")
    print(f"trial window {window:.0f} s, whole sweep run {wall:.0f} s; mean trial {df['wall_s'].mean():.1f} s "
          f"(ideal {args.steps / args.speed:.1f} s)")
    print(f"utilisation over the whole sweep run {util:.3f}; over the trial window only {busy / (gpus * window):.3f}")
    slot_time = args.nodes * window
    print(f"outside the trial window (Ray start, preflight, wrap-up): {1 - window / wall:.3f} of the sweep run")
    print(f"slot time of the trial window lost: ramp-up {ramp / slot_time:.3f} (Ray starting {args.nodes} workers), "
          f"gaps between trials on a worker {gaps / slot_time:.3f} "
          f"(mean {gaps / max(1, len(windows) - args.nodes):.2f} s), tail {tail / slot_time:.3f}")
    print(f"results handled {results / window:.0f}/s; peak RSS driver {rss.driver / 2**30:.2f} GiB, "
          f"driver + Ray processes {rss.tree / 2**30:.1f} GiB")
    print(f"machine after: {machine()}")
    print(f"GPU-slot utilisation over the whole sweep run {util:.3f} (goal ≥ 0.95), "
          f"driver peak RSS {rss.driver / 2**30:.2f} GiB (goal < 2)")


if __name__ == "__main__":
    main()
