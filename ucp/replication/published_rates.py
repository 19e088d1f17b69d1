"""Failure rates from published field data, turned into a :class:`~ucp.replication.failures.FailureModel`.

Sources (numbers and derivations in docs/REPLICATION.md, "Failure rates from published data"):

- Kokolis et al., *Revisiting Reliability in Large-Scale Machine Learning Research
  Clusters* (Meta, HPCA 2025, arXiv:2410.21680): about 6.5 node failures per 1000
  node-days on RSC-1 (16k A100s), the rate every node here fails at;
- Llama 3 (*The Llama 3 Herd of Models*, Meta 2024, section 3.3.4 and Table 5): 419
  unexpected interruptions in 54 days on 16,384 H100s (2,048 nodes of 8), of which 35
  (8.4%) were network switches and cables - the events that take more than one node,
  modelled as whole-rack events.

``published_model(spec, acceleration=1)`` is the model at the published rates;
``acceleration=100`` keeps every share and multiplies every rate by 100 (the
"accelerated" mode for sampled simulations, reported separately).

Example::

    >>> from ucp.replication.cluster import ClusterSpec
    >>> model = published_model(ClusterSpec())
    >>> round(model.lifetime.mttf_intervals)   # 600 s intervals: one failure per node in ~154 days
    22154
    >>> round(rack_event_share(model, ClusterSpec()), 3)
    0.084
"""

from __future__ import annotations

from ucp.replication.cluster import ClusterSpec
from ucp.replication.failures import FailureModel, Lifetime

RSC1_FAILURES_PER_1000_NODE_DAYS = 6.5
LLAMA3_UNEXPECTED = 419
LLAMA3_SWITCH_CABLE = 35
LLAMA3_DAYS = 54
LLAMA3_NODES = 2048
_DAY_S = 86_400.0


def node_failure_probability(spec: ClusterSpec, *, acceleration: float = 1.0) -> float:
    """P(a node fails during one checkpoint interval) at the RSC-1 rate."""
    return RSC1_FAILURES_PER_1000_NODE_DAYS / 1000.0 * spec.interval_s / _DAY_S * acceleration


def published_model(spec: ClusterSpec, *, acceleration: float = 1.0) -> FailureModel:
    """Node failures at the RSC-1 rate; rack events at Llama 3's switch/cable share of all events."""
    p = node_failure_probability(spec, acceleration=acceleration)
    share = LLAMA3_SWITCH_CABLE / LLAMA3_UNEXPECTED
    # rack events per interval = share / (1 - share) * node events per interval, spread over the racks
    rack_rate = share / (1.0 - share) * spec.nodes * p / spec.racks
    return FailureModel(lifetime=Lifetime(kind="exponential", mttf_intervals=1.0 / p),
                        rack_mttf_intervals=1.0 / rack_rate)


def rack_event_share(model: FailureModel, spec: ClusterSpec) -> float:
    """The share of failure events that are whole-rack events under ``model`` (for the docs and tests)."""
    node = spec.nodes / model.lifetime.mttf_intervals
    rack = spec.racks / model.rack_mttf_intervals if model.rack_mttf_intervals else 0.0
    return rack / (node + rack)
