"""Analysis of a sweep directory in pandas: trials table, per-step history, Pareto front, figures and the report.

Public API::

    load, load_history, sweep_info,          klsweep.analysis.sweep_dir
    overrides_of
    pareto_front, hypervolume,               klsweep.analysis.pareto
    least_infeasible, kl_scale, feasible
    compute_accounting                       klsweep.analysis.accounting
    klsweep.analysis.frontier_fit            the KL frontier's mathematics: Gao et al. 2022 fits (imported on use)
    klsweep.analysis.frontier                a sweep's KL frontier: sweep_frontier (imported on use)
    klsweep.analysis.figures                 what each figure shows, as data (imported on use); the curves'
    klsweep.analysis.curves                  and the KL frontier's data in their own modules
    klsweep.analysis.frontier_figure
    klsweep.analysis.plots                   plotly figures of that data (imported on use)
    klsweep.analysis.pngs                    matplotlib PNGs of that data (imported on use)
    klsweep.analysis.report.write_report     ``sweep report``
"""

from klsweep.analysis.accounting import compute_accounting
from klsweep.analysis.pareto import (
    EmptyFrontWarning,
    KlScaleWarning,
    feasible,
    hypervolume,
    kl_scale,
    least_infeasible,
    pareto_front,
)
from klsweep.analysis.sweep_dir import load, load_history, overrides_of, sweep_info

__all__ = [
    "EmptyFrontWarning",
    "KlScaleWarning",
    "compute_accounting",
    "feasible",
    "hypervolume",
    "kl_scale",
    "least_infeasible",
    "load",
    "load_history",
    "overrides_of",
    "pareto_front",
    "sweep_info",
]
