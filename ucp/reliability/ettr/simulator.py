"""A Monte-Carlo simulator of one job's timeline, to check the ETTR model.

The analytical model (:mod:`ucp.reliability.ettr.model`) is a first-order
approximation. This simulator makes none of its simplifications:

* failures come from every node (exponential, or Weibull renewal per node:
  a failed node is replaced by a fresh one while the others keep ageing);
* a failure at any instant - even during a restart - stops the job; it
  restarts (``restart_s`` + ``queue_s``) from the last *committed* checkpoint;
* a save stalls training for ``save_blocking_s`` and then commits
  ``save_background_s`` later (an asynchronous save in flight at the failure
  does not count); if the background part outlasts the interval, the next
  save waits for it;
* ETTR is the training compute that survives, divided by the horizon.

Failure times are drawn once per (job, law, horizon) and reused across
intervals (common random numbers), so a grid of intervals is smooth and fast:
all of it is numpy over (runs, failures) arrays.

Example::

    >>> from ucp.reliability.ettr.model import JobReliability, expected_ettr
    >>> job = JobReliability.from_mttf_hours(1, 24.0, restart_s=300.0)
    >>> result = simulate_ettr(job, interval_s=600.0, runs=100, seed=1)
    >>> abs(result.ettr - expected_ettr(job, interval_s=600.0)) < 0.01
    True
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import gamma as gamma_function

from ucp.reliability.ettr.model import SECONDS_PER_DAY, ETTRInputError, JobReliability

__all__ = ["FailureLaw", "SimulationResult", "sample_failure_times", "ettr_per_run", "simulate_ettr", "simulate_grid"]


@dataclass(frozen=True, kw_only=True)
class FailureLaw:
    """How each node's failures are distributed in time.

    ``weibull_shape`` 1.0 is the exponential law (memoryless: the model's
    assumption); below 1 failures cluster (infant mortality), above 1 they
    come with wear. The mean time between a node's failures is always
    ``1 / failures_per_node_day``. ``fresh_nodes`` starts every node new at
    time 0 (a new allocation); otherwise nodes start at a random age of a
    stationary cluster.

    >>> FailureLaw(weibull_shape=0.7).is_exponential
    False
    """

    weibull_shape: float = 1.0
    fresh_nodes: bool = False

    def __post_init__(self) -> None:
        shape = self.weibull_shape
        if isinstance(shape, bool) or not isinstance(shape, (int, float)) or not math.isfinite(shape) or shape <= 0:
            raise ETTRInputError(f"weibull_shape must be > 0, got {self.weibull_shape!r}")

    @property
    def is_exponential(self) -> bool:
        return self.weibull_shape == 1.0


@dataclass(frozen=True)
class SimulationResult:
    """Mean ETTR over the runs, its standard error, and the mean failure count."""

    interval_s: float
    ettr: float
    stderr: float
    failures_per_run: float
    runs: int


def _pad_by_run(run_index: np.ndarray, times: np.ndarray, runs: int) -> np.ndarray:
    """Scatter (run, time) pairs into a (runs, max_count) array, sorted, padded with inf."""
    order = np.lexsort((times, run_index))
    run_index, times = run_index[order], times[order]
    counts = np.bincount(run_index, minlength=runs)
    width = max(1, int(counts.max()) if counts.size else 1)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    column = np.arange(times.size) - starts[run_index]
    padded = np.full((runs, width), np.inf)
    padded[run_index, column] = times
    return padded


def sample_failure_times(
    job: JobReliability, *, horizon_s: float, runs: int, rng: np.random.Generator, law: FailureLaw = FailureLaw()
) -> np.ndarray:
    """Job failure times in [0, horizon_s): a (runs, k) array, each row sorted, inf-padded."""
    if law.is_exponential:
        # Superposed exponential nodes are one Poisson process at N*r_f.
        counts = rng.poisson(job.job_failure_rate_per_s * horizon_s, size=runs)
        width = max(1, int(counts.max()))
        times = np.sort(rng.uniform(0.0, horizon_s, size=(runs, width)), axis=1)
        times[np.arange(width)[None, :] >= counts[:, None]] = np.inf
        return times
    shape = law.weibull_shape
    node_mean_s = SECONDS_PER_DAY / job.failures_per_node_day
    scale = node_mean_s / gamma_function(1.0 + 1.0 / shape)
    node_run = np.repeat(np.arange(runs), job.nodes)
    if law.fresh_nodes:
        clock = scale * rng.weibull(shape, size=node_run.size)
    else:
        # Residual life of a stationary renewal process: uniform fraction of a
        # length-biased lifetime; (L/scale)^shape is then Gamma(1 + 1/shape).
        length_biased = scale * rng.gamma(1.0 + 1.0 / shape, size=node_run.size) ** (1.0 / shape)
        clock = rng.uniform(size=node_run.size) * length_biased
    found_runs, found_times = [], []
    while True:
        alive = clock < horizon_s
        if not alive.any():
            break
        node_run, clock = node_run[alive], clock[alive]
        found_runs.append(node_run)
        found_times.append(clock)
        clock = clock + scale * rng.weibull(shape, size=clock.size)  # replacement node, new
    if not found_runs:
        return np.full((runs, 1), np.inf)
    return _pad_by_run(np.concatenate(found_runs), np.concatenate(found_times), runs)


def ettr_per_run(
    failure_times: np.ndarray,
    job: JobReliability,
    *,
    interval_s: float,
    horizon_s: float,
    save_background_s: float = 0.0,
) -> np.ndarray:
    """ETTR of each run, given its failure times (from :func:`sample_failure_times`)."""
    if not interval_s > 0:
        raise ETTRInputError(f"interval_s must be > 0, got {interval_s!r}")
    if save_background_s < 0:
        raise ETTRInputError(f"save_background_s must be >= 0, got {save_background_s!r}")
    runs = failure_times.shape[0]
    ends = np.concatenate((failure_times, np.full((runs, 1), np.inf)), axis=1)
    # A segment starts at 0, or one downtime after the failure before it;
    # a failure during that downtime just starts the downtime again.
    starts = np.concatenate((np.zeros((runs, 1)), failure_times + job.downtime_s), axis=1)
    stopped_by_failure = ends < horizon_s
    length = np.clip(np.minimum(ends, horizon_s) - starts, 0.0, None)

    dt, blocking, background = interval_s, job.save_blocking_s, save_background_s
    period = blocking + max(dt, background)  # compute, wait for the previous save, stall
    # Save j's stall ends at j*period; it commits `background` later.
    committed_saves = np.floor(np.clip(length - background, 0.0, None) / period)
    committed_work = committed_saves * dt
    # The segment that reaches the horizon keeps all its compute (the job ends).
    whole_periods = np.floor(length / period)
    computed_work = whole_periods * dt + np.minimum(length - whole_periods * period, dt)
    useful = np.where(stopped_by_failure, committed_work, computed_work)
    return useful.sum(axis=1) / horizon_s


def _default_horizon_s(job: JobReliability) -> float:
    # Long enough for ~200 failures per run, so the start-up edge is negligible.
    return 200.0 * job.mttf_s


def simulate_grid(
    job: JobReliability,
    *,
    intervals_s: Sequence[float],
    runs: int = 200,
    seed: int = 0,
    horizon_s: float | None = None,
    save_background_s: float = 0.0,
    law: FailureLaw = FailureLaw(),
) -> list[SimulationResult]:
    """Simulate every interval on the same failure draws (common random numbers).

    >>> from ucp.reliability.ettr.model import JobReliability
    >>> job = JobReliability.from_mttf_hours(4, 10.0, restart_s=60.0)
    >>> [r.ettr > 0.8 for r in simulate_grid(job, intervals_s=[300.0, 900.0], runs=20)]
    [True, True]
    """
    if runs < 2:
        raise ETTRInputError(f"runs must be >= 2 (for a standard error), got {runs!r}")
    horizon = _default_horizon_s(job) if horizon_s is None else float(horizon_s)
    if not horizon > 0:
        raise ETTRInputError(f"horizon_s must be > 0, got {horizon_s!r}")
    rng = np.random.default_rng(seed)
    failures = sample_failure_times(job, horizon_s=horizon, runs=runs, rng=rng, law=law)
    failures_per_run = float(np.isfinite(failures).sum(axis=1).mean())
    results = []
    for interval in intervals_s:
        per_run = ettr_per_run(
            failures, job, interval_s=float(interval), horizon_s=horizon, save_background_s=save_background_s
        )
        results.append(
            SimulationResult(
                interval_s=float(interval),
                ettr=float(per_run.mean()),
                stderr=float(per_run.std(ddof=1) / math.sqrt(runs)),
                failures_per_run=failures_per_run,
                runs=runs,
            )
        )
    return results


def simulate_ettr(job: JobReliability, *, interval_s: float, **options) -> SimulationResult:
    """Simulate one interval; options as for :func:`simulate_grid`."""
    return simulate_grid(job, intervals_s=[interval_s], **options)[0]
