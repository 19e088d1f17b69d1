"""Replay one scenario under one policy: place every checkpoint, recover from every failure.

A :class:`Scenario` is a trace plus the failure forecasts made for it (computed
once, so every policy sees the very same views). Each interval ``t``: the job
checkpoints; the policy places replicas of every node's shard (the previous
checkpoint's replicas are dropped); then the interval's failure events happen in
order, each recovered from checkpoint ``t`` (:mod:`ucp.replication.recovery`), with
replicas on nodes lost earlier in the interval already gone. A failed node is
replaced at once by a spare.

Example::

    >>> from ucp.replication.scenarios import family_trace
    >>> from ucp.replication.policies import StaticRandom
    >>> trace = family_trace("correlated-rack", intervals=100, seed=5)
    >>> result = simulate(StaticRandom(seed=0), Scenario.without_forecasts(trace))
    >>> sorted(result.summary())  # doctest: +NORMALIZE_WHITESPACE
    ['data_loss_events', 'downtime_s', 'ettr', 'failures', 'lost_work_s', 'mean_recovery_s', 'remote_share',
     'rollback_s', 'storage_bytes', 'storage_utilization']
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ucp.replication.errors import PlacementInputError
from ucp.replication.failures import Trace
from ucp.replication.placement import (ClusterView, LearningPolicy, Placement, PlacementPolicy, PlacementRequest,
                                   validate_placement)
from ucp.replication.recovery import Recovery, recover


@dataclass(frozen=True, eq=False)
class Scenario:
    """A trace, the ``(T, N)`` forecasts every policy is shown, and the replica budget.

    ``hetero``: per-node speed, capacity, shard sizes and churn
    (:mod:`ucp.replication.heterogeneity`; None: every node alike and always present);
    ``io``: the measured I/O cost model every read time comes from (None: the spec's constants).
    """

    trace: Trace
    forecasts: np.ndarray
    replicas: int = 2
    hetero: object | None = None
    io: object | None = None

    @classmethod
    def without_forecasts(cls, trace: Trace, *, replicas: int = 2) -> "Scenario":
        """Flat forecasts (every node at the trace's mean failure rate)."""
        rate = trace.failure_matrix().mean()
        return cls(trace, np.full((trace.intervals, trace.spec.nodes), rate), replicas)

    def request(self, t: int) -> PlacementRequest:
        spec = self.trace.spec
        if self.hetero is not None:
            return self.hetero.request(spec, t, replicas=self.replicas, intervals_since_remote=t % spec.remote_every)
        return PlacementRequest.one_per_node(spec, replicas=self.replicas,
                                             intervals_since_remote=t % spec.remote_every)

    def view(self, t: int) -> ClusterView:
        if self.hetero is not None:
            return self.hetero.view(self.trace.spec, t, self.forecasts[t], io=self.io)
        view = ClusterView.uniform(self.trace.spec, self.forecasts[t])
        return view if self.io is None else dataclasses.replace(view, io=self.io)


@dataclass(frozen=True)
class IntervalOutcome:
    """What a learning policy is told after an interval: its inputs, its placement, what happened."""

    interval: int
    request: PlacementRequest
    view: ClusterView
    placement: Placement
    events: tuple[frozenset, ...]
    recoveries: tuple[Recovery, ...]


@dataclass
class PolicyResult:
    """Running totals of one policy on one scenario (mutable while it accumulates).

    Every recovery is added with a weight: 1 for a failure that happened (a sampled or
    replayed trace), its probability for a failure case of an expected-value run
    (:func:`simulate_expected`), so both report the same metrics.
    """

    policy: str
    interval_s: float = 600.0
    failures: float = 0.0
    seconds: float = 0.0  # downtime: restart + reads (+ rework, counted again in rework_s)
    rework_s: float = 0.0  # intervals trained again after rollbacks to the remote checkpoint
    remote: float = 0.0
    data_loss: float = 0.0
    held_bytes: float = 0.0
    useful_bytes: float = 0.0
    intervals: int = 0

    def add(self, recovery: Recovery, weight: float = 1.0) -> None:
        self.failures += weight
        self.seconds += weight * recovery.seconds
        self.rework_s += weight * recovery.rework_s
        self.remote += weight * recovery.remote
        self.data_loss += weight * recovery.data_loss
        self.useful_bytes += weight * recovery.useful_bytes

    def summary(self) -> dict:
        """What ``ucp place eval --json`` reports per family and policy (one seed).

        ``lost_work_s``: the work since the last checkpoint, half an interval per failure on
        average (the same for every policy); ``ettr``: trained time over wall time, where
        wall time adds restarts and reads, rollbacks and lost work.
        """
        n = self.failures
        trained = self.intervals * self.interval_s
        lost = n * self.interval_s / 2.0
        wall = trained + self.seconds + lost
        return {
            "mean_recovery_s": self.seconds / n if n else 0.0,
            "remote_share": self.remote / n if n else 0.0,
            "data_loss_events": self.data_loss,
            "storage_bytes": self.held_bytes / max(self.intervals, 1),
            "storage_utilization": self.useful_bytes / self.held_bytes if self.held_bytes else 0.0,
            "failures": n,
            "downtime_s": self.seconds - self.rework_s,
            "rollback_s": self.rework_s,
            "lost_work_s": lost,
            "ettr": trained / wall if wall else 1.0,
        }


def run_interval(policy: PlacementPolicy, scenario: Scenario, t: int) -> IntervalOutcome:
    """Place checkpoint ``t`` and recover from the failures of interval ``t``."""
    request, view = scenario.request(t), scenario.view(t)
    placement = policy.place(request, view)
    validate_placement(request, view, placement)
    events = scenario.trace.failures[t]
    gone: frozenset = frozenset()
    recoveries = []
    for lost in events:
        gone = gone | lost
        recoveries.append(recover(request, placement, spec=scenario.trace.spec, lost=lost, unavailable=gone,
                                  times=view.times))
    return IntervalOutcome(t, request, view, placement, events, tuple(recoveries))


def simulate(policy: PlacementPolicy, scenario: Scenario, *, progress=None) -> PolicyResult:
    """Run ``policy`` over every interval; learning policies are shown each outcome (closed loop)."""
    result = PolicyResult(policy.name, scenario.trace.spec.interval_s)
    learns = isinstance(policy, LearningPolicy)
    for t in range(scenario.trace.intervals):
        outcome = run_interval(policy, scenario, t)
        result.intervals += 1
        result.held_bytes += outcome.placement.replica_bytes(outcome.request)
        for recovery in outcome.recoveries:
            result.add(recovery)
        if learns:
            policy.observe(outcome)
        if progress is not None:
            progress()
    return result


def hazard_cases(trace: Trace, t: int) -> list[tuple[frozenset, float]]:
    """The failure cases of interval ``t`` with their true probabilities: each node alone, each rack."""
    spec = trace.spec
    cases = [(frozenset([i]), float(p)) for i, p in enumerate(trace.node_hazard[t]) if p > 0]
    for r, p in enumerate(trace.rack_hazard[t]):
        if p > 0:
            cases.append((frozenset(range(r * spec.rack_size, min((r + 1) * spec.rack_size, spec.nodes))), float(p)))
    return cases


def simulate_expected(policy: PlacementPolicy, scenario: Scenario, *, progress=None) -> PolicyResult:
    """Like :func:`simulate`, but each interval adds every failure case weighted by its true probability.

    For traces whose failures are too rare to sample (published rates): the metrics are the
    expectation under the trace's hazards, with no sampling noise. Bursts are not expanded
    (the published families have none). Learning policies are not shown outcomes (none happen).
    """
    trace = scenario.trace
    if trace.node_hazard is None:
        raise PlacementInputError(f"family {trace.family}: an expected-value run needs a synthetic trace's hazards")
    result = PolicyResult(policy.name, trace.spec.interval_s)
    for t in range(trace.intervals):
        request, view = scenario.request(t), scenario.view(t)
        placement = policy.place(request, view)
        validate_placement(request, view, placement)
        result.intervals += 1
        result.held_bytes += placement.replica_bytes(request)
        times = view.times
        for lost, weight in hazard_cases(trace, t):
            result.add(recover(request, placement, spec=trace.spec, lost=lost, unavailable=lost, times=times), weight)
        if progress is not None:
            progress()
    return result
