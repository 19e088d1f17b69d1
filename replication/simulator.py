"""Replay one scenario under one policy: place every checkpoint, recover from every failure.

A :class:`Scenario` is a trace plus the failure forecasts made for it (computed
once, so every policy sees the very same views). Each interval ``t``: the job
checkpoints; the policy places replicas of every node's shard (the previous
checkpoint's replicas are dropped); then the interval's failure events happen in
order, each recovered from checkpoint ``t`` (:mod:`replication.recovery`), with
replicas on nodes lost earlier in the interval already gone. A failed node is
replaced at once by a spare.

Example::

    >>> from replication.scenarios import family_trace
    >>> from replication.policies import StaticRandom
    >>> trace = family_trace("correlated-rack", intervals=100, seed=5)
    >>> result = simulate(StaticRandom(seed=0), Scenario.without_forecasts(trace))
    >>> sorted(result.summary())
    ['data_loss_events', 'mean_recovery_s', 'remote_share', 'storage_bytes', 'storage_utilization']
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from replication.failures import Trace
from replication.placement import (ClusterView, LearningPolicy, Placement, PlacementPolicy, PlacementRequest,
                                   validate_placement)
from replication.recovery import Recovery, recover


@dataclass(frozen=True, eq=False)
class Scenario:
    """A trace, the ``(T, N)`` forecasts every policy is shown, and the replica budget."""

    trace: Trace
    forecasts: np.ndarray
    replicas: int = 2

    @classmethod
    def without_forecasts(cls, trace: Trace, *, replicas: int = 2) -> "Scenario":
        """Flat forecasts (every node at the trace's mean failure rate)."""
        rate = trace.failure_matrix().mean()
        return cls(trace, np.full((trace.intervals, trace.spec.nodes), rate), replicas)

    def request(self, t: int) -> PlacementRequest:
        spec = self.trace.spec
        return PlacementRequest.one_per_node(spec, replicas=self.replicas,
                                             intervals_since_remote=t % spec.remote_every)

    def view(self, t: int) -> ClusterView:
        return ClusterView.uniform(self.trace.spec, self.forecasts[t])


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
    """Running totals of one policy on one scenario (mutable while it accumulates)."""

    policy: str
    recoveries: list[Recovery] = field(default_factory=list)
    held_bytes: float = 0.0
    useful_bytes: float = 0.0
    intervals: int = 0

    def summary(self) -> dict:
        """The five numbers ``ucp place eval --json`` reports per family and policy."""
        n = len(self.recoveries)
        return {
            "mean_recovery_s": float(np.mean([r.seconds for r in self.recoveries])) if n else 0.0,
            "remote_share": sum(r.remote for r in self.recoveries) / n if n else 0.0,
            "data_loss_events": sum(r.data_loss for r in self.recoveries),
            "storage_bytes": self.held_bytes / max(self.intervals, 1),
            "storage_utilization": self.useful_bytes / self.held_bytes if self.held_bytes else 0.0,
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
        recoveries.append(recover(request, placement, spec=scenario.trace.spec, lost=lost, unavailable=gone))
    return IntervalOutcome(t, request, view, placement, events, tuple(recoveries))


def simulate(policy: PlacementPolicy, scenario: Scenario, *, progress=None) -> PolicyResult:
    """Run ``policy`` over every interval; learning policies are shown each outcome (closed loop)."""
    result = PolicyResult(policy.name)
    learns = isinstance(policy, LearningPolicy)
    for t in range(scenario.trace.intervals):
        outcome = run_interval(policy, scenario, t)
        result.intervals += 1
        result.held_bytes += outcome.placement.replica_bytes(outcome.request)
        result.recoveries.extend(outcome.recoveries)
        result.useful_bytes += sum(r.useful_bytes for r in outcome.recoveries)
        if learns:
            policy.observe(outcome)
        if progress is not None:
            progress()
    return result
