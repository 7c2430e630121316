"""The suite's own scheduling: the tests of a module fixture run on one pytest-xdist worker, which builds it once.

``tests/conftest.py`` gives them one ``xdist_group`` and ``--dist loadgroup`` (pyproject.toml) keeps a group on one
worker. With pytest 9.2, pytest-xdist 3.8 groups nothing (pytest-dev/pytest-xdist#1386) and every worker that draws
one of the tests builds the fixture again: a finished sweep, a Ray cluster, the GPU smoke run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_tests_of_a_module_fixture_run_on_one_worker_that_builds_it_once(tmp_path):
    log = tmp_path / "log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")} | {"KLSWEEP_GROUPING_LOG": str(log)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
                           "tests/grouped_fixture.py"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    events = [line.split() for line in log.read_text().splitlines()]
    assert [e for e, _ in events].count("test") == 4, events
    assert [e for e, _ in events].count("setup") == 1, events  # one build of the fixture
    assert len({worker for _, worker in events}) == 1, events  # on the one worker that ran its tests
