"""A save policy that sets the checkpoint interval from measurements.

:class:`AdaptiveIntervalPolicy` implements the checkpoint manager's
``SavePolicy`` protocol (``should_save(*, step, seconds_since_save)``). Its
interval is the ETTR-optimal one (:func:`ucp.reliability.ettr.model.optimal_interval_s`)
for the *measured* blocking save cost and the failure rate, and it re-decides
whenever a measurement arrives:

* save cost: an exponentially weighted mean of the blocking time of each save
  (a prior until the first one); an asynchronous save's background time is a
  floor, so saves never queue behind each other;
* failure rate: a Gamma prior (from ``ucp logs analyze --json`` or a guess,
  worth ``prior_node_days`` of evidence) updated with the failures and
  node-time this job has seen.

Example::

    >>> policy = AdaptiveIntervalPolicy(nodes=2000, failures_per_node_day=0.0065,
    ...                                 restart_s=300.0, prior_save_s=30.0)
    >>> round(policy.interval_s)
    588
    >>> policy.observe_save(blocking_s=120.0)       # saves cost more than assumed
    >>> policy.interval_s > 588
    True
    >>> policy.should_save(step=10, seconds_since_save=60.0)
    False
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

from ucp.reliability.ettr.model import SECONDS_PER_DAY, ETTRInputError, JobReliability, optimal_interval_s

__all__ = ["AdaptiveIntervalPolicy", "failures_per_node_day_from_report", "load_logs_report"]

# `ucp logs analyze --json` reports are kilobytes; anything near this is not one.
LOGS_REPORT_LIMIT = 64 << 20


def load_logs_report(path: str | os.PathLike) -> dict:
    """Read the JSON that ``ucp logs analyze --json`` prints."""
    from ucp.confined import read_regular_file

    try:
        data = json.loads(read_regular_file(path, limit=LOGS_REPORT_LIMIT, what="a logs report"))
    except FileNotFoundError:
        raise ETTRInputError(f"{path}: no such logs report (make one with `ucp logs analyze --json`)") from None
    except (OSError, ValueError, RecursionError) as err:  # unreadable, not a regular file, not UTF-8 JSON
        raise ETTRInputError(f"{path}: not a readable JSON logs report: {err}") from None
    if not isinstance(data, dict):
        raise ETTRInputError(f"{path}: a logs report is a JSON object, got {type(data).__name__}")
    return data


def failures_per_node_day_from_report(report: Mapping) -> float:
    """The per-node failure rate in a ``ucp logs analyze --json`` report.

    Prefers ``rates.failures_per_1000_node_days``; otherwise converts the
    fitted exponential MTTF (``fits.exponential.mttf_hours``, the MTTF of the
    ``rates.nodes`` nodes the logs cover) to a per-node rate.

    >>> failures_per_node_day_from_report({"rates": {"failures_per_1000_node_days": 6.5, "nodes": 100}})
    0.0065
    >>> failures_per_node_day_from_report({"rates": {"nodes": 10}, "fits": {"exponential": {"mttf_hours": 24.0}}})
    0.1
    """
    rates = report.get("rates") or {}
    per_1000 = rates.get("failures_per_1000_node_days")
    if isinstance(per_1000, (int, float)) and per_1000 > 0:
        return float(per_1000) / 1000.0
    mttf_hours = ((report.get("fits") or {}).get("exponential") or {}).get("mttf_hours")
    nodes = rates.get("nodes")
    if isinstance(mttf_hours, (int, float)) and mttf_hours > 0 and isinstance(nodes, int) and nodes > 0:
        return 24.0 / (float(mttf_hours) * nodes)
    raise ETTRInputError(
        "logs report has no usable failure rate: expected rates.failures_per_1000_node_days > 0, "
        "or fits.exponential.mttf_hours with rates.nodes"
    )


class AdaptiveIntervalPolicy:
    """Save when the ETTR-optimal interval has passed; learn it as the job runs.

    Mutable on purpose (it learns), unlike the dataclass policies in
    ``ucp.policies``; ``interval_s`` is always the current decision.
    """

    def __init__(
        self,
        *,
        nodes: int,
        failures_per_node_day: float,
        restart_s: float = 300.0,
        queue_s: float = 0.0,
        prior_save_s: float = 10.0,
        prior_node_days: float = 1000.0,
        smoothing: float = 0.3,
        min_interval_s: float = 10.0,
        max_interval_s: float = 24 * 3600.0,
    ) -> None:
        # Validate everything through the model's own checks.
        JobReliability(nodes=nodes, failures_per_node_day=failures_per_node_day, restart_s=restart_s, queue_s=queue_s)
        if not 0 < smoothing <= 1:
            raise ETTRInputError(f"smoothing must be in (0, 1], got {smoothing!r}")
        if not 0 < min_interval_s <= max_interval_s:
            raise ETTRInputError(
                f"need 0 < min_interval_s <= max_interval_s, got {min_interval_s!r}, {max_interval_s!r}"
            )
        if not prior_save_s >= 0 or not prior_node_days > 0:
            raise ETTRInputError("prior_save_s must be >= 0 and prior_node_days > 0")
        self.nodes = nodes
        self.restart_s = float(restart_s)
        self.queue_s = float(queue_s)
        self.min_interval_s = float(min_interval_s)
        self.max_interval_s = float(max_interval_s)
        self._smoothing = float(smoothing)
        self._prior_failures = failures_per_node_day * prior_node_days
        self._prior_node_days = float(prior_node_days)
        self._failures_seen = 0
        self._node_days_seen = 0.0
        self.save_blocking_s = float(prior_save_s)
        self.save_background_s = 0.0
        self.saves_observed = 0
        self._interval_s = self._decide()

    @classmethod
    def from_logs_report(cls, report: Mapping | str | os.PathLike, *, nodes: int, **options) -> AdaptiveIntervalPolicy:
        """Take the failure-rate prior from a ``ucp logs analyze --json`` report (dict or file)."""
        if not isinstance(report, Mapping):
            report = load_logs_report(report)
        return cls(nodes=nodes, failures_per_node_day=failures_per_node_day_from_report(report), **options)

    # -- what the checkpoint manager calls --------------------------------------
    def should_save(self, *, step: int, seconds_since_save: float) -> bool:
        return seconds_since_save >= self._interval_s

    @property
    def interval_s(self) -> float:
        """The current checkpoint interval, in seconds of wall-clock training."""
        return self._interval_s

    @property
    def failures_per_node_day(self) -> float:
        """Posterior mean failure rate (Gamma prior + what this job saw)."""
        return (self._prior_failures + self._failures_seen) / (self._prior_node_days + self._node_days_seen)

    # -- measurements -------------------------------------------------------------
    def observe_save(self, *, blocking_s: float, background_s: float = 0.0) -> None:
        """One save's measured cost; the first replaces the prior outright."""
        if not (blocking_s >= 0 and background_s >= 0):
            raise ETTRInputError(f"save times must be >= 0, got {blocking_s!r}, {background_s!r}")
        if self.saves_observed == 0:
            self.save_blocking_s, self.save_background_s = float(blocking_s), float(background_s)
        else:
            a = self._smoothing
            self.save_blocking_s = (1 - a) * self.save_blocking_s + a * float(blocking_s)
            self.save_background_s = (1 - a) * self.save_background_s + a * float(background_s)
        self.saves_observed += 1
        self._interval_s = self._decide()

    def observe_exposure(self, *, failures: int, wall_s: float) -> None:
        """This job's totals so far: failures (restarts) and wall-clock seconds on ``nodes``.

        Totals, not increments, so calling it with every tracker reading is safe.
        """
        if failures < 0 or not wall_s >= 0:
            raise ETTRInputError(f"failures and wall_s must be >= 0, got {failures!r}, {wall_s!r}")
        self._failures_seen = int(failures)
        self._node_days_seen = self.nodes * float(wall_s) / SECONDS_PER_DAY
        self._interval_s = self._decide()

    def observe_tracker(self, summary) -> None:
        """Feed an :class:`~ucp.reliability.ettr.tracker.ETTRSummary` (restarts, wall time)."""
        self.observe_exposure(failures=summary.restarts, wall_s=summary.wall_s)

    def _decide(self) -> float:
        job = JobReliability(
            nodes=self.nodes,
            failures_per_node_day=self.failures_per_node_day,
            restart_s=self.restart_s,
            queue_s=self.queue_s,
            save_blocking_s=self.save_blocking_s,
        )
        best = optimal_interval_s(job, min_interval_s=self.min_interval_s)
        # An async save still in flight would make the next one wait.
        best = max(best, self.save_background_s)
        return float(min(self.max_interval_s, max(self.min_interval_s, best)))

    def __repr__(self) -> str:
        return (
            f"AdaptiveIntervalPolicy(interval_s={self._interval_s:.1f}, save_blocking_s={self.save_blocking_s:.2f}, "
            f"failures_per_node_day={self.failures_per_node_day:.3g}, nodes={self.nodes})"
        )

    def to_dict(self) -> dict:
        """The current decision and what it rests on (for logs and --json)."""
        return {
            "interval_s": self._interval_s,
            "save_blocking_s": self.save_blocking_s,
            "save_background_s": self.save_background_s,
            "failures_per_node_day": self.failures_per_node_day,
            "nodes": self.nodes,
            "saves_observed": self.saves_observed,
            "failures_seen": self._failures_seen,
        }


