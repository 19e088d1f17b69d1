"""Scenario families: the failure processes the policies are evaluated (and trained) on.

``independent``: Weibull node lifetimes (shape 0.8: infant mortality), half of the
failures announced by hardware warnings. ``correlated-rack``: exponential node
lifetimes plus rack-wide failures (a ToR switch or PDU), some announced by link
flaps. ``lemon``: two of sixteen slots fail twelve times as often and log more
noise. ``log-replay``: the fatal incidents and events of a ``ucp logs analyze
--json`` report (by default the shipped analysis of the loghub HPC sample).
``published`` / ``published-x100``: node failures at the rate Meta reports for its
research clusters and rack events at Llama 3's switch/cable share
(:mod:`ucp.replication.published_rates`), at that rate or 100 times it.
``log-thunderbird``: the Thunderbird sample of loghub, replayed like ``log-replay``.
``hetero-rack``, ``hetero-lemon`` (trained on) and ``hetero-x100``, ``hetero-thunderbird``
(held out): a base family's failures on a heterogeneous cluster (per-node speed and capacity,
shards of different sizes, nodes leaving and coming back; :mod:`ucp.replication.heterogeneity`).
``burst`` (RL training only, never evaluated): exponential lifetimes plus bursts of
three nodes anywhere in the cluster at once (a file-system or scheduler outage).

The first three (and ``burst``) are accelerated (a failure every ~10-15 intervals) and
are what the RL policy and the forecaster train on; the ``HELD_OUT`` families are never
trained on and are the only ones a headline may come from (docs/REPLICATION.md).

Example::

    >>> trace = family_trace("correlated-rack", intervals=300, seed=3)
    >>> trace.family, trace.intervals
    ('correlated-rack', 300)
"""

from __future__ import annotations

from importlib import resources

from ucp.replication.cluster import ClusterSpec
from ucp.replication.errors import PlacementInputError
from ucp.replication.failures import FailureModel, Lifetime, Trace, generate_trace
from ucp.replication.heterogeneity import HeteroModel
from ucp.replication.replay import load_report, trace_from_report

FAMILIES = ("independent", "correlated-rack", "lemon", "log-replay", "published", "published-x100",
            "log-thunderbird", "hetero-rack", "hetero-lemon", "hetero-x100", "hetero-thunderbird")
SYNTHETIC = FAMILIES[:3]
# Never trained on (the RL policy and the forecaster's pretraining use SYNTHETIC + TRAINING_ONLY +
# HETERO_TRAINING): the families a headline may come from.
HELD_OUT = ("published", "published-x100", "log-replay", "log-thunderbird", "hetero-x100", "hetero-thunderbird")
# Heterogeneous clusters (ucp.replication.heterogeneity) over a base family's failures. The held-out
# ones draw their clusters from a distribution the training ones do not use (more and slower slow
# nodes, other capacities, faster churn), over failures the policy never trained on.
HETERO = {
    "hetero-rack": ("correlated-rack", HeteroModel(churn_mtbl_intervals=400.0)),
    "hetero-lemon": ("lemon", HeteroModel()),
    "hetero-x100": ("published-x100", HeteroModel(slow_fraction=0.375, slow_speed=0.2,
                                                  memory_shards=(0.5, 1.0, 1.5, 2.0), disk_shards=(1.0, 3.0),
                                                  churn_mtbl_intervals=300.0, away_intervals=20.0)),
    "hetero-thunderbird": ("log-thunderbird", HeteroModel(slow_fraction=0.375, slow_speed=0.2,
                                                          memory_shards=(0.5, 1.0, 1.5, 2.0),
                                                          disk_shards=(1.0, 3.0), churn_mtbl_intervals=300.0,
                                                          away_intervals=20.0)),
}
HETERO_TRAINING = ("hetero-rack", "hetero-lemon")
# Published rates make coincident failures rare: these are evaluated by expectation over the true
# hazards (simulator.simulate_expected), not by sampling failures; hetero-x100 too, so that its
# paired differences carry no sampling noise at all.
EXPECTED = ("published", "hetero-x100")
LOGS = {"log-replay": "loghub-hpc-analysis.json", "log-thunderbird": "loghub-thunderbird-analysis.json"}
# Trained on, never evaluated: correlated failures that respect no rack (the RL policy's training mix).
TRAINING_ONLY = ("burst",)

MODELS = {
    "independent": FailureModel(lifetime=Lifetime(kind="weibull", mttf_intervals=200.0, shape=0.8)),
    "correlated-rack": FailureModel(lifetime=Lifetime(kind="exponential", mttf_intervals=300.0),
                                    rack_mttf_intervals=250.0),
    "lemon": FailureModel(lifetime=Lifetime(kind="exponential", mttf_intervals=300.0),
                          lemon_fraction=0.125, lemon_factor=12.0),
    "burst": FailureModel(lifetime=Lifetime(kind="exponential", mttf_intervals=300.0),
                          burst_mttf_intervals=100.0, burst_size=3),
}


def default_report_path(family: str = "log-replay"):
    """The shipped ``ucp logs analyze --json`` of a loghub sample (HPC, Thunderbird): a real failure sequence."""
    return resources.files("ucp.replication") / "data" / LOGS[family]


def family_trace(family: str, *, intervals: int, seed: int, spec: ClusterSpec | None = None,
                 report_path=None) -> Trace:
    """The trace of one scenario family; synthetic families are reproducible from ``seed``."""
    spec = spec or ClusterSpec()
    if family in HETERO:  # the base family's failures; the cluster is attached by build_scenario
        import dataclasses

        base = family_trace(HETERO[family][0], intervals=intervals, seed=seed, spec=spec, report_path=report_path)
        return dataclasses.replace(base, family=family)
    if family in LOGS:
        path = (report_path if family == "log-replay" else None) or default_report_path(family)
        # the seed shuffles which cluster slot (and so which rack) each log node lands on
        return trace_from_report(load_report(path), spec=spec, intervals=intervals, where=str(path),
                                 seed=seed, family=family)
    if family in ("published", "published-x100"):
        from ucp.replication.published_rates import published_model

        model = published_model(spec, acceleration=100.0 if family == "published-x100" else 1.0)
        return generate_trace(spec, model, intervals=intervals, seed=seed, family=family)
    if family not in MODELS:
        raise PlacementInputError(f"unknown scenario family '{family}'; choose from {', '.join(FAMILIES)}")
    return generate_trace(spec, MODELS[family], intervals=intervals, seed=seed, family=family)


# Seeds of the traces each stage uses, far apart so that no stage sees another's data.
FORECAST_PRETRAIN_SEED = 10_000
RL_TRAIN_SEED = 20_000


def pretrained_forecaster(*, spec: ClusterSpec | None = None, intervals: int = 3000):
    """The forecaster every stage starts from: fitted on the synthetic families' pretraining seeds."""
    from ucp.replication.forecast import FailureForecaster

    traces = [family_trace(f, intervals=intervals, seed=FORECAST_PRETRAIN_SEED + i, spec=spec)
              for i, f in enumerate(SYNTHETIC)]
    return FailureForecaster.pretrained(traces, seed=0)


def family_hetero(family: str, *, intervals: int, seed: int, spec: ClusterSpec | None = None):
    """The heterogeneous cluster of a ``hetero-*`` family's scenario ``seed`` (None for the others)."""
    if family not in HETERO:
        return None
    return HETERO[family][1].draw(spec or ClusterSpec(), intervals=intervals, seed=1_000_003 + seed)


def build_scenario(family: str, *, intervals: int, seed: int, forecaster, spec: ClusterSpec | None = None,
                   replicas: int = 2, report_path=None, io=None):
    """A trace with the forecasts a copy of ``forecaster`` makes for it online.

    ``hetero-*`` families get their drawn cluster (absent nodes cannot fail); ``io`` is the
    measured cost model read times come from (None: the cluster spec's constants).
    """
    from ucp.replication.simulator import Scenario

    trace = family_trace(family, intervals=intervals, seed=seed, spec=spec, report_path=report_path)
    hetero = family_hetero(family, intervals=intervals, seed=seed, spec=spec)
    if hetero is not None:
        trace = hetero.restrict(trace)
    return Scenario(trace, forecaster.copy().forecast_trace(trace), replicas, hetero=hetero, io=io)
