"""The analytical ETTR model and the optimal checkpoint intervals.

ETTR (effective training time ratio) is productive training time divided by
wall-clock time. For a job on ``N`` nodes that each fail at ``r_f`` failures
per node-day, restart cost ``u0``, optional queue wait ``q`` after each
failure, checkpoint interval ``dt`` and blocking save time ``w``
(Kokolis et al. 2024, "Revisiting Reliability in Large-Scale Machine
Learning Research Clusters", with ``q`` added to the per-failure downtime):

    E[ETTR] ~= (1 - N * r_f * (u0 + q + dt / 2)) / (1 + w / dt)

Every time here is in **seconds** and ``r_f`` is converted from per node-day
to per node-second before it meets them: the formula mixes a rate with times,
so the units must agree (see docs/ETTR.md, "Units").

Example::

    >>> job = JobReliability.from_per_1000_node_days(2000, 6.5, restart_s=300.0)
    >>> round(expected_ettr(job, interval_s=3600.0), 2)
    0.68
    >>> round(expected_ettr(job, interval_s=300.0), 2)
    0.93
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy.optimize import minimize_scalar

from ucp.errors import UcpError

__all__ = [
    "ETTRInputError",
    "InfeasibleJobError",
    "JobReliability",
    "expected_ettr",
    "young_interval_s",
    "daly_interval_s",
    "optimal_interval_s",
    "closed_form_optimal_interval_s",
    "SECONDS_PER_DAY",
]

SECONDS_PER_DAY = 86400.0


class ETTRInputError(UcpError, ValueError):
    """A reliability parameter is missing, negative or inconsistent."""


class InfeasibleJobError(ETTRInputError):
    """The job loses more time to failures than it has: E[ETTR] is 0 at every checkpoint interval."""


def _check_non_negative(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ETTRInputError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def _check_nodes(nodes: object) -> int:
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise ETTRInputError(f"nodes must be a positive integer, got {nodes!r}")
    return nodes


@dataclass(frozen=True, kw_only=True)
class JobReliability:
    """What the ETTR model needs to know about one job.

    ``failures_per_node_day`` is the per-node failure rate; the job fails at
    ``nodes`` times that rate (independent nodes, any one failure stops the
    job). ``save_blocking_s`` is the time training stalls per checkpoint.

    >>> job = JobReliability(nodes=2000, failures_per_node_day=0.0065, restart_s=300.0)
    >>> round(job.mttf_s / 3600, 2)
    1.85
    """

    nodes: int
    failures_per_node_day: float
    restart_s: float = 0.0
    queue_s: float = 0.0
    save_blocking_s: float = 0.0

    def __post_init__(self) -> None:
        _check_nodes(self.nodes)
        _check_non_negative("failures_per_node_day", self.failures_per_node_day)
        if self.failures_per_node_day == 0:
            raise ETTRInputError("failures_per_node_day must be > 0 (a job that never fails needs no checkpoints)")
        _check_non_negative("restart_s", self.restart_s)
        _check_non_negative("queue_s", self.queue_s)
        _check_non_negative("save_blocking_s", self.save_blocking_s)

    @classmethod
    def from_per_1000_node_days(cls, nodes: int, rate: float, **options: float) -> JobReliability:
        """Build from the rate as papers quote it: failures per 1000 node-days."""
        return cls(nodes=nodes, failures_per_node_day=_check_non_negative("rate", rate) / 1000.0, **options)

    @classmethod
    def from_mttf_hours(cls, nodes: int, mttf_hours: float, **options: float) -> JobReliability:
        """Build from the *job* MTTF in hours (all ``nodes`` together)."""
        if isinstance(mttf_hours, bool) or not isinstance(mttf_hours, (int, float)) or not 0 < mttf_hours < math.inf:
            raise ETTRInputError(f"mttf_hours must be a finite number > 0, got {mttf_hours!r}")
        _check_nodes(nodes)
        return cls(nodes=nodes, failures_per_node_day=24.0 / (mttf_hours * nodes), **options)

    @property
    def job_failure_rate_per_s(self) -> float:
        """N * r_f, in failures per second of wall-clock time."""
        return self.nodes * self.failures_per_node_day / SECONDS_PER_DAY

    @property
    def mttf_s(self) -> float:
        """Job mean time to failure, 1 / (N * r_f), in seconds."""
        return 1.0 / self.job_failure_rate_per_s

    @property
    def downtime_s(self) -> float:
        """Time lost to each failure before training runs again: restart plus queue."""
        return self.restart_s + self.queue_s


def expected_ettr(job: JobReliability, *, interval_s: float) -> float:
    """The first-order expected ETTR at checkpoint interval ``interval_s``.

    Clipped at 0: past that point the approximation has no meaning (the job
    fails more often than it can make progress).

    >>> job = JobReliability(nodes=1, failures_per_node_day=1.0, save_blocking_s=60.0)
    >>> round(expected_ettr(job, interval_s=3600.0), 4)
    0.9631
    """
    interval_s = _check_non_negative("interval_s", interval_s)
    if interval_s == 0:
        raise ETTRInputError("interval_s must be > 0")
    lost_fraction = job.job_failure_rate_per_s * (job.downtime_s + interval_s / 2.0)
    return max(0.0, (1.0 - lost_fraction) / (1.0 + job.save_blocking_s / interval_s))


def young_interval_s(job: JobReliability) -> float:
    """Young (1974): sqrt(2 * w * MTTF), the first-order optimum for small w."""
    return math.sqrt(2.0 * job.save_blocking_s * job.mttf_s)


def daly_interval_s(job: JobReliability) -> float:
    """Daly (2006), the higher-order estimate of the optimum compute interval.

    For w < 2M: sqrt(2wM) * (1 + sqrt(w/(2M))/3 + (w/(2M))/9) - w; otherwise M.
    """
    w, m = job.save_blocking_s, job.mttf_s
    if w >= 2.0 * m:
        return m
    ratio = w / (2.0 * m)
    return math.sqrt(2.0 * w * m) * (1.0 + math.sqrt(ratio) / 3.0 + ratio / 9.0) - w


def closed_form_optimal_interval_s(job: JobReliability) -> float:
    """The stationary point of :func:`expected_ettr`, solved by hand.

    d/d(dt) of (c - b*dt) * dt / (dt + w) = 0 with c = 1 - lambda*(u0+q),
    b = lambda/2 gives dt = -w + sqrt(w^2 + c*w/b). Used as a test oracle
    for :func:`optimal_interval_s`, and it shows the link to Young: with
    c ~= 1 and w << dt it is sqrt(2*w*MTTF).
    """
    lam, w = job.job_failure_rate_per_s, job.save_blocking_s
    c = 1.0 - lam * job.downtime_s
    if c <= 0:
        raise ETTRInputError("the job fails faster than it can restart: N*r_f*(restart+queue) >= 1")
    return -w + math.sqrt(w * w + 2.0 * c * w / lam)


def optimal_interval_s(job: JobReliability, *, min_interval_s: float = 1.0) -> float:
    """The interval that maximises :func:`expected_ettr`, found numerically.

    Numerical so that the model can grow terms without re-deriving by hand;
    bounded between ``min_interval_s`` and the MTTF (past one MTTF the model
    has no meaning). With no blocking save cost, the shortest interval wins.

    >>> job = JobReliability.from_mttf_hours(1, 24.0, save_blocking_s=60.0)
    >>> round(optimal_interval_s(job) / young_interval_s(job), 2)
    0.98
    """
    upper = job.mttf_s
    if min_interval_s >= upper:
        return upper
    if job.save_blocking_s == 0:
        return min_interval_s
    # Search in log space: the optimum spans seconds to days across inputs.
    result = minimize_scalar(
        lambda log_dt: -expected_ettr(job, interval_s=math.exp(log_dt)),
        bounds=(math.log(min_interval_s), math.log(upper)),
        method="bounded",
        options={"xatol": 1e-6},
    )
    return float(math.exp(result.x))
