"""klsweep.verl.config.format_value: every string comes back unchanged from Hydra's own override parser (the parser
verl's main_ppo runs on its command line), backslashes included."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from klsweep.verl.config import format_overrides, format_value


def _parsed(value):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    (override,) = OverridesParser.create().parse_overrides(format_overrides({"trainer.experiment_name": value}))
    return override.value()


@pytest.mark.parametrize("value", ["C:\\data\\run", "a\\b", "\\", "end\\", "\\\\", "it's", "a\\'b", "q\\'", "\\'",
                                   "x y\\n", "on", "k3+",
                                   "a\n", "x\ny", "\n", "a\tb"])
def test_strings_with_backslashes_round_trip_through_hydras_parser(value):
    assert _parsed(value) == value


def test_a_backslash_is_not_doubled():
    assert format_value("a\\b") == "'a\\b'"
    assert _parsed("a\\b") == "a\\b"  # one backslash, as given (it used to come back as two)


@given(st.text(alphabet="ab \\'\"=,:${}[]\n", max_size=12))
def test_any_string_round_trips(value):
    assert _parsed(value) == value
