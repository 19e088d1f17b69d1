"""ETTR: the analytical model, a Monte-Carlo simulator, a live tracker and an adaptive save policy.

Example::

    >>> from ucp.reliability.ettr import JobReliability, expected_ettr
    >>> job = JobReliability.from_per_1000_node_days(2000, 6.5, restart_s=300.0)
    >>> round(expected_ettr(job, interval_s=300.0), 2)
    0.93
"""

from ucp.reliability.ettr.adaptive import AdaptiveIntervalPolicy, failures_per_node_day_from_report, load_logs_report
from ucp.reliability.ettr.model import (
    ETTRInputError,
    InfeasibleJobError,
    JobReliability,
    closed_form_optimal_interval_s,
    daly_interval_s,
    expected_ettr,
    optimal_interval_s,
    young_interval_s,
)
from ucp.reliability.ettr.report import compute_report, job_from_inputs, plot_report
from ucp.reliability.ettr.tracker import ETTRSummary, ETTRTracker, TrackerStateError, read_summary

__all__ = [
    "AdaptiveIntervalPolicy",
    "ETTRInputError",
    "InfeasibleJobError",
    "ETTRSummary",
    "ETTRTracker",
    "JobReliability",
    "TrackerStateError",
    "closed_form_optimal_interval_s",
    "compute_report",
    "daly_interval_s",
    "expected_ettr",
    "failures_per_node_day_from_report",
    "job_from_inputs",
    "load_logs_report",
    "optimal_interval_s",
    "plot_report",
    "read_summary",
    "young_interval_s",
]
