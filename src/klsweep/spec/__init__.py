"""The sweep file: schema (pydantic), loading with command-line overrides, checks, and the search space."""

from klsweep.spec.load import load_sweep
from klsweep.spec.schema import Budget, Choice, Constant, Objective, Range, Sampler, Scheduler, Sweep

__all__ = ["Budget", "Choice", "Constant", "Objective", "Range", "Sampler", "Scheduler", "Sweep", "load_sweep"]
