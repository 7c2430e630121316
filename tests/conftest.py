"""Fixtures shared by the whole suite. Every test folder is a package (has __init__.py) so that Ray workers
can import test modules as ``tests.<folder>.<module>``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def ray_local():
    """One private local Ray for the session (never joins another cluster; never `ray stop`)."""
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ["TUNE_DISABLE_STRICT_METRIC_CHECKING"] = "1"  # as `sweep run` sets it: validation comes every N steps
    # Ray workers import test modules by name (tests.<dir>.<module>): give them the repo root.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield ray
    ray.shutdown()
