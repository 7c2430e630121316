"""Fixtures shared by the whole suite. Every test folder is a package (has __init__.py) so that Ray workers
can import test modules as ``tests.<folder>.<module>``."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests draw the same examples on every run (CI included): a counterexample is found by widening the
# strategy or adding a case, never by luck on one CI run. The edge cases found so far are listed as explicit cases.
settings.register_profile("klsweep", derandomize=True, deadline=None)
settings.load_profile("klsweep")

# A test run started in the background (`pytest &` in a script, some CI runners) inherits SIGINT ignored, and so does
# every process a test starts; a Python process that starts with SIGINT ignored never turns Ctrl-C into
# KeyboardInterrupt. The Ctrl-C tests need it delivered, as in a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

REPO = Path(__file__).resolve().parents[1]
#: Public logs of real verl runs, with their sources and the verdict each must get: tests/data/README.md.
TRACES = REPO / "tests" / "data" / "traces"
#: verl's PPO baseline (Qwen2.5-0.5B, GSM8K, 435 steps): the console log as published, and 23 sampled steps of it.
PPO_CONSOLE = "ppo_qwen05b_gsm8k_console.log"
PPO_JSONL = "ppo_qwen05b_gsm8k_sampled.jsonl"
#: verl's GRPO reference run (Qwen2-7B, GSM8K, 105 steps), every step.
GRPO = "grpo_qwen7b_gsm8k.jsonl"
#: A GRPO run with zero reward on every sample (rllm-org/rllm#54): two reports, no learning signal.
NO_SIGNAL = "grpo_no_signal.jsonl"
#: A GRPO log written by verl's own FileLogger whose losses are NaN/inf (orjson writes them as null) from step 18.
NONFINITE = "grpo_losses_nonfinite_from_step18.jsonl"


def trace(name: str) -> Path:
    """Path of a trace in tests/data/traces; a missing file is an error, never a skip."""
    path = TRACES / name
    if not path.is_file():
        raise FileNotFoundError(f"trace {name} is missing from {TRACES}: it is part of the repository")
    return path


#: The suite's own session fixtures each xdist worker sets up for itself: cheap next to what they let tests share.
PER_WORKER_FIXTURES = frozenset({"ray_local"})


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Runs the modules that hold ``slow`` tests first, and keeps the tests of an expensive shared fixture together.

    The suite runs on pytest-xdist workers (``-n 4 --dist loadgroup``, pyproject.toml), each taking the next test
    when it is free: the long tests start first and the short ones fill the gaps at the end. A module's tests stay
    together and in file order. A test that uses one of the suite's module or session fixtures (a finished sweep, a
    Ray cluster, the GPU smoke run) gets that fixture's ``xdist_group`` (per module for a module fixture), so the
    fixture is set up once, not once per worker. Runs before xdist reads the groups (``tryfirst``)."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)  # stable: a module's tests stay together, in file order
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        for name in item.fixturenames:
            defs = info.name2fixturedefs.get(name)
            if (not defs or name in PER_WORKER_FIXTURES or defs[-1].scope not in ("module", "package", "session")
                    or not defs[-1].func.__module__.startswith("tests.")):  # pytest's and plugins' own fixtures
                continue
            group = name if defs[-1].scope != "module" else f"{item.module.__name__}.{name}"
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(scope="session")
def ray_local():
    """One private local Ray for the session (never joins another cluster; never `ray stop`)."""
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ["TUNE_DISABLE_STRICT_METRIC_CHECKING"] = "1"  # as `sweep run` sets it: validation comes every N steps
    # Ray workers import test modules by name (tests.<dir>.<module>): give them the repo root.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    from klsweep.orchestrate._ray_session import start_local_ray

    if not ray.is_initialized():  # as `sweep run` starts it: once more if Ray's start timed out on a busy machine
        start_local_ray(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield ray
    ray.shutdown()
