"""The ETTR report of a job: expected ETTR over checkpoint intervals, the optimum, Young's and Daly's.

What ``ucp ettr`` prints, as a library: :func:`job_from_inputs` builds the job
from the units people quote (minutes; failures per 1000 node-days, a job MTTF
in hours, or a ``ucp logs analyze --json`` report), :func:`compute_report`
evaluates it as a plain dict, :func:`plot_report` draws the curve::

    >>> job = job_from_inputs(gpus=16000, failures_per_1000_node_days=6.5, restart_min=5, save_min=1)
    >>> report = compute_report(job)
    >>> report["nodes"], round(report["optimal_interval_min"], 1), round(report["ettr_at_optimal"], 3)
    (2000, 13.6, 0.832)
"""

from __future__ import annotations

import math
import os

from ucp.reliability.ettr.model import (
    ETTRInputError,
    InfeasibleJobError,
    JobReliability,
    daly_interval_s,
    expected_ettr,
    optimal_interval_s,
    young_interval_s,
)

__all__ = ["job_from_inputs", "interval_grid_s", "compute_report", "plot_report"]

# Checkpoint intervals people actually choose, in minutes.
_COMMON_INTERVALS_MIN = (1, 2, 5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 240, 360, 480, 720, 1440)


def job_from_inputs(*, nodes: int | None = None, gpus: int | None = None, gpus_per_node: int = 8,
                    failures_per_1000_node_days: float | None = None, mttf_hours: float | None = None,
                    logs_report: str | os.PathLike | None = None, save_min: float = 0.0,
                    restart_min: float = 5.0, queue_min: float = 0.0) -> JobReliability:
    """A job from its size (``nodes``, or ``gpus`` / ``gpus_per_node`` rounded up) and one failure rate.

    The rate is ``failures_per_1000_node_days``, ``mttf_hours`` (of the whole job) or
    ``logs_report`` (the path of ``ucp logs analyze --json`` output); times in minutes.
    """
    if (nodes is None) == (gpus is None):
        raise ETTRInputError("give exactly one of nodes and gpus")
    if sum(x is not None for x in (failures_per_1000_node_days, mttf_hours, logs_report)) != 1:
        raise ETTRInputError("give exactly one of failures_per_1000_node_days, mttf_hours and logs_report")
    if gpus is not None:
        if gpus < 1 or gpus_per_node < 1:
            raise ETTRInputError("--gpus and --gpus-per-node must be positive integers")
        nodes = math.ceil(gpus / gpus_per_node)
    for flag, value in (("--restart-min", restart_min), ("--queue-min", queue_min), ("--save-min", save_min)):
        if not (math.isfinite(value) and value >= 0):
            raise ETTRInputError(f"{flag} must be >= 0 minutes, got {value!r}")
    times = {"restart_s": restart_min * 60.0, "queue_s": queue_min * 60.0, "save_blocking_s": save_min * 60.0}
    if failures_per_1000_node_days is not None:
        if not failures_per_1000_node_days > 0:
            raise ETTRInputError("--failures-per-1000-node-days must be > 0")
        return JobReliability.from_per_1000_node_days(nodes, failures_per_1000_node_days, **times)
    if mttf_hours is not None:
        return JobReliability.from_mttf_hours(nodes, mttf_hours, **times)
    from ucp.reliability.ettr.adaptive import failures_per_node_day_from_report, load_logs_report

    rate = failures_per_node_day_from_report(load_logs_report(logs_report))
    return JobReliability(nodes=nodes, failures_per_node_day=rate, **times)


def interval_grid_s(job: JobReliability, extra_s: list[float]) -> list[float]:
    """Common intervals up to the job's MTTF (past it the model means nothing), plus ``extra_s``."""
    grid = [m * 60.0 for m in _COMMON_INTERVALS_MIN]
    grid = [t for t in grid if t <= job.mttf_s] or [min(60.0, job.mttf_s)]
    return sorted(set(grid) | {round(t, 6) for t in extra_s})


def compute_report(job: JobReliability, *, interval_s: float | None = None, simulate: bool = False) -> dict:
    """Everything ``ucp ettr`` prints, as a plain dict (minutes, as the CLI speaks).

    ``interval_s`` adds that interval (and ``ettr_at_interval``); ``simulate`` adds a seeded
    Monte-Carlo column (``simulated_ettr``, ``simulated_stderr``) to each row.
    """
    if interval_s is not None and not (math.isfinite(interval_s) and interval_s > 0):
        raise ETTRInputError(f"--interval-min must be > 0, got {interval_s / 60.0!r}")
    optimal = optimal_interval_s(job)
    if expected_ettr(job, interval_s=optimal) <= 0.0:
        raise InfeasibleJobError(
            f"this job cannot make progress: it fails every {job.mttf_s / 60.0:.3g} min on average (job MTTF), and "
            f"each failure costs {job.downtime_s / 60.0:.3g} min of restart and queue plus the work since the last "
            "checkpoint, so E[ETTR] is 0 at every checkpoint interval and no interval is optimal; shorten the "
            "restart (--restart-min, --queue-min), use fewer nodes, or lower the failure rate")
    young, daly = young_interval_s(job), daly_interval_s(job)
    wanted = [optimal] + ([interval_s] if interval_s is not None else [])
    grid = interval_grid_s(job, wanted)
    rows = [{"interval_min": t / 60.0, "ettr": expected_ettr(job, interval_s=t)} for t in grid]
    if simulate:
        from ucp.reliability.ettr.simulator import simulate_grid

        for row, result in zip(rows, simulate_grid(job, intervals_s=grid, runs=100, seed=0)):
            row["simulated_ettr"] = result.ettr
            row["simulated_stderr"] = result.stderr
    report = {
        "nodes": job.nodes,
        "failures_per_1000_node_days": job.failures_per_node_day * 1000.0,
        "job_mttf_hours": job.mttf_s / 3600.0,
        "save_min": job.save_blocking_s / 60.0,
        "restart_min": job.restart_s / 60.0,
        "queue_min": job.queue_s / 60.0,
        "optimal_interval_min": optimal / 60.0,
        "ettr_at_optimal": expected_ettr(job, interval_s=optimal),
        "young_interval_min": young / 60.0,
        "ettr_at_young": expected_ettr(job, interval_s=young) if young > 0 else None,
        "daly_interval_min": daly / 60.0,
        "ettr_at_daly": expected_ettr(job, interval_s=daly) if daly > 0 else None,
        "intervals": rows,
    }
    if interval_s is not None:
        report["interval_min"] = interval_s / 60.0
        report["ettr_at_interval"] = expected_ettr(job, interval_s=interval_s)
    return report


def plot_report(job: JobReliability, report: dict, path: str | os.PathLike) -> None:
    """Draw E[ETTR] against the interval (log scale) with the report's intervals marked, as a PNG."""
    from ucp.reliability.ettr.plots import plot_interval_curve

    marks = {"ETTR-optimal": report["optimal_interval_min"] * 60.0}
    if report["save_min"] > 0:
        marks["Young"] = report["young_interval_min"] * 60.0
        marks["Daly"] = report["daly_interval_min"] * 60.0
    if "interval_min" in report:
        marks["T"] = report["interval_min"] * 60.0
    low = min(30.0, report["optimal_interval_min"] * 60.0 / 3)
    grid = [low * (job.mttf_s / low) ** (i / 199) for i in range(200)]
    plot_interval_curve(job, intervals_s=grid, path=path, marks_s=marks)
