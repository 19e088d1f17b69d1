"""Failure processes on the checkpoint-interval grid, and the trace they produce.

A :class:`Trace` is what one scenario *is*: for every checkpoint interval, the
failure events (each a set of nodes lost together), the monitoring events each
node logged by channel, and - for synthetic processes - the true per-interval
failure probabilities (used only to train the RL policy, never shown to a policy).

The synthetic process (:class:`FailureModel`) combines:

- a per-node lifetime, exponential or Weibull in the node's age (intervals since
  it was last replaced; a failed node is replaced at once by a fresh one);
- a share of node failures preceded by a *degraded* phase that logs hardware
  warnings (ECC, Xid) - the signal a forecaster can learn - and false alarms
  that log the same warnings but end without a failure;
- correlated rack failures (a ToR switch or PDU takes all nodes of a rack), a
  share of them preceded by link flaps on every node of the rack;
- lemon nodes: slots whose hardware fails far more often and logs more noise;
- bursts: a cluster-wide cause (a file-system or scheduler outage) takes
  ``burst_size`` nodes anywhere in the cluster at once, unannounced.

Example::

    >>> from ucp.replication.cluster import ClusterSpec
    >>> model = FailureModel(lifetime=Lifetime(kind="weibull", mttf_intervals=200, shape=0.8))
    >>> trace = generate_trace(ClusterSpec(), model, intervals=50, seed=1, family="demo")
    >>> trace.intervals, trace.monitor.shape
    (50, (50, 16, 4))
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ucp.replication.cluster import ClusterSpec
from ucp.replication.errors import PlacementInputError

CHANNELS = ("hardware", "network", "software", "infra")  # monitoring event channels
_HW, _NET = 0, 1


@dataclass(frozen=True)
class Lifetime:
    """A node's time to failure, in checkpoint intervals: ``exponential`` or ``weibull``."""

    kind: str = "exponential"
    mttf_intervals: float = 200.0
    shape: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in ("exponential", "weibull"):
            raise PlacementInputError(f"lifetime kind '{self.kind}': use exponential or weibull")
        if not (self.mttf_intervals > 0 and self.shape > 0):
            raise PlacementInputError("lifetime: mttf_intervals and shape must be > 0")

    def interval_probability(self, age: np.ndarray) -> np.ndarray:
        """P(fail during the next interval | survived to ``age``), elementwise."""
        if self.kind == "exponential":
            return np.full(np.shape(age), -math.expm1(-1.0 / self.mttf_intervals))
        scale = self.mttf_intervals / math.gamma(1.0 + 1.0 / self.shape)
        age = np.asarray(age, dtype=float)
        cumulative = lambda a: (a / scale) ** self.shape  # noqa: E731 - Weibull cumulative hazard
        return -np.expm1(-(cumulative(age + 1.0) - cumulative(age)))


@dataclass(frozen=True)
class FailureModel:
    """A synthetic failure process (see the module docstring for the parts)."""

    lifetime: Lifetime = field(default_factory=Lifetime)
    precursor_share: float = 0.5  # node failures that go through a logged degraded phase
    degraded_intervals: float = 6.0  # mean length of that phase
    warning_rate: float = 2.0  # warnings per interval while degraded
    false_alarm_rate: float = 0.002  # per node and interval: warnings that end without a failure
    noise_rate: float = 0.05  # background events per node, channel and interval
    rack_mttf_intervals: float = 0.0  # 0: no rack failures
    rack_precursor_share: float = 0.3
    lemon_fraction: float = 0.0
    lemon_factor: float = 10.0  # hazard multiplier of a lemon slot
    lemon_noise_factor: float = 4.0
    burst_mttf_intervals: float = 0.0  # 0: no bursts
    burst_size: int = 3

    def __post_init__(self) -> None:
        for name in ("precursor_share", "rack_precursor_share", "lemon_fraction"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise PlacementInputError(f"failure model: {name} must be in [0, 1]")
        if self.degraded_intervals < 1.0 or self.rack_mttf_intervals < 0 or self.lemon_factor < 1.0:
            raise PlacementInputError(
                "failure model: degraded_intervals >= 1, rack_mttf_intervals >= 0, lemon_factor >= 1")


@dataclass(frozen=True, eq=False)
class Trace:
    """One scenario on the interval grid (arrays are read-only by convention).

    ``failures[t]``: failure events during interval ``t`` in order, each the frozenset
    of nodes lost together. ``monitor[t, i, c]``: events node ``i`` logged on channel
    ``c`` during ``t``. ``node_hazard[t, i]`` / ``rack_hazard[t, r]`` / ``burst_hazard[t]``:
    true probability that node ``i`` alone / rack ``r`` / a burst of ``burst_size`` random
    nodes fails during ``t`` (``None`` for replayed logs).
    """

    family: str
    spec: ClusterSpec
    failures: tuple[tuple[frozenset, ...], ...]
    monitor: np.ndarray
    node_hazard: np.ndarray | None = None
    rack_hazard: np.ndarray | None = None
    burst_hazard: np.ndarray | None = None
    burst_size: int = 0

    @property
    def intervals(self) -> int:
        return len(self.failures)

    def failure_matrix(self) -> np.ndarray:
        """``(T, N)`` 0/1: node ``i`` was lost in some event of interval ``t`` (forecast labels)."""
        out = np.zeros((self.intervals, self.spec.nodes), dtype=np.int8)
        for t, events in enumerate(self.failures):
            for nodes in events:
                out[t, list(nodes)] = 1
        return out

    def event_count(self) -> int:
        return sum(len(events) for events in self.failures)


def generate_trace(spec: ClusterSpec, model: FailureModel, *, intervals: int, seed: int, family: str) -> Trace:
    """Simulate ``model`` on ``spec`` for ``intervals`` intervals, reproducibly from ``seed``."""
    if intervals < 1:
        raise PlacementInputError("intervals must be >= 1")
    rng = np.random.default_rng(seed)
    n, racks = spec.nodes, spec.racks
    rack_of = np.arange(n) // spec.rack_size
    lemon = np.zeros(n, dtype=bool)
    lemon[rng.permutation(n)[: int(round(model.lemon_fraction * n))]] = True
    factor = np.where(lemon, model.lemon_factor, 1.0)
    noise = np.full((n, len(CHANNELS)), model.noise_rate)
    noise[lemon, _HW] *= model.lemon_noise_factor
    leave = 1.0 / model.degraded_intervals  # geometric phase length: leave with this probability
    rack_p = -math.expm1(-1.0 / model.rack_mttf_intervals) if model.rack_mttf_intervals else 0.0
    burst_p = -math.expm1(-1.0 / model.burst_mttf_intervals) if model.burst_mttf_intervals else 0.0

    age = rng.integers(0, int(model.lifetime.mttf_intervals), size=n).astype(float)  # not all new at t=0
    degraded = np.zeros(n, dtype=bool)  # heading for a failure
    alarm = np.zeros(n, dtype=bool)  # false alarm: warns, then recovers
    rack_degraded = np.zeros(racks, dtype=bool)
    failures, monitor = [], np.zeros((intervals, n, len(CHANNELS)), dtype=np.int32)
    node_hazard = np.zeros((intervals, n))
    rack_hazard = np.zeros((intervals, racks))
    for t in range(intervals):
        base = np.minimum(model.lifetime.interval_probability(age) * factor, 0.5)
        sudden = base * (1.0 - model.precursor_share)
        onset = base * model.precursor_share
        node_hazard[t] = np.where(degraded, leave, sudden)
        rack_hazard[t] = np.where(rack_degraded, leave, rack_p * (1.0 - model.rack_precursor_share))
        # monitoring: what nodes log during t (warnings of phases already under way, noise)
        counts = rng.poisson(noise)
        counts[:, _HW] += rng.poisson(model.warning_rate * (degraded | alarm))
        counts[:, _NET] += rng.poisson(model.warning_rate * rack_degraded[rack_of])
        monitor[t] = counts
        # failures during t
        node_fail = rng.random(n) < node_hazard[t]
        rack_fail = rng.random(racks) < rack_hazard[t]
        events = [frozenset(np.flatnonzero(rack_of == r).tolist()) for r in np.flatnonzero(rack_fail)]
        events += [frozenset([int(i)]) for i in np.flatnonzero(node_fail & ~rack_fail[rack_of])]
        if burst_p and rng.random() < burst_p:
            events.append(frozenset(rng.choice(n, size=min(model.burst_size, n), replace=False).tolist()))
        order = rng.permutation(len(events))
        failures.append(tuple(events[k] for k in order))
        # state for t + 1
        lost = node_fail | rack_fail[rack_of]
        for event in events:
            lost[list(event)] = True
        age = np.where(lost, 0.0, age + 1.0)
        degraded = np.where(lost, False, degraded | (rng.random(n) < onset))
        alarm = np.where(alarm, rng.random(n) >= leave, rng.random(n) < model.false_alarm_rate) & ~degraded
        rack_degraded = np.where(rack_fail, False,
                                 rack_degraded | (rng.random(racks) < rack_p * model.rack_precursor_share))
    monitor.flags.writeable = False
    burst_hazard = np.full(intervals, burst_p)
    return Trace(family, spec, tuple(failures), monitor, node_hazard, rack_hazard, burst_hazard, model.burst_size)
