"""Four tests that share a module fixture, run only by ``tests/test_suite_grouping.py`` (the file name is not a test
file's, so the suite does not collect it). Each setup of the fixture and each test appends its pytest-xdist worker
to the file ``$KLSWEEP_GROUPING_LOG``."""

from __future__ import annotations

import os

import pytest


def _log(event: str) -> None:
    with open(os.environ["KLSWEEP_GROUPING_LOG"], "a") as f:
        f.write(f"{event} {os.environ.get('PYTEST_XDIST_WORKER', 'main')}\n")


@pytest.fixture(scope="module")
def shared() -> None:
    _log("setup")


@pytest.mark.parametrize("i", range(4))
def test_uses_the_shared_fixture(shared, i):
    _log("test")
