"""The online loop, evaluated: re-place only when forecasts move, as the live path does.

The simulator asks a policy for a new placement every interval. A live job does
what :meth:`~ucp.replication.replicas.ReplicaManager.replace_if_forecasts_changed`
does: it keeps the placement it has and places again only when some node's forecast
moved by more than ``tolerance`` times the larger of the two values (or the cluster
changed: a node left or came back). :class:`ForecastTriggered` wraps any policy with
that rule, so one scenario can be replayed with ``tolerance`` 0 (re-place every
interval), 0.5 (the live default) and infinity (re-place only when the cluster changes),
and :func:`evaluate_online` reports what each costs in ETTR and what it saves in
re-placements and bytes moved (copies sent to holders the previous placement did not use).

Example::

    >>> from ucp.replication.policies import GreedyForecast
    >>> from ucp.replication.cluster import ClusterSpec
    >>> from ucp.replication.placement import ClusterView, PlacementRequest
    >>> spec = ClusterSpec(nodes=4, rack_size=2)
    >>> held = ForecastTriggered(GreedyForecast(), tolerance=0.5)
    >>> request = PlacementRequest.one_per_node(spec, replicas=1)
    >>> first = held.place(request, ClusterView.uniform(spec, [0.01, 0.01, 0.01, 0.01]))
    >>> held.place(request, ClusterView.uniform(spec, [0.012, 0.01, 0.01, 0.01])) is first   # moved 17%: kept
    True
    >>> held.replacements
    1
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ucp.replication.placement import ClusterView, Placement, PlacementRequest


@dataclass
class ForecastTriggered:
    """``policy``'s placement, kept until a forecast moves by more than ``tolerance`` or the cluster changes.

    Mutable on purpose: it remembers the last placement and counts ``replacements`` and
    ``moved_bytes`` (bytes of the copies on holders the previous placement did not use).
    """

    policy: object
    tolerance: float = 0.5
    replacements: int = 0
    moved_bytes: float = 0.0
    _last: tuple | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return self.policy.name

    def place(self, request: PlacementRequest, view: ClusterView) -> Placement:
        shape = (tuple(request.fragments), request.replicas,
                 tuple((s.alive, s.memory_free_bytes, s.disk_free_bytes, s.speed) for s in view.nodes))
        probs = np.array([s.failure_probability for s in view.nodes])
        if self._last is not None:
            last_shape, last_probs, placement = self._last
            moved = np.abs(probs - last_probs) > self.tolerance * np.maximum(np.maximum(probs, last_probs), 1e-12)
            if last_shape == shape and not (math.isfinite(self.tolerance) and moved.any()):
                return placement
        placement = self.policy.place(request, view)
        before = {} if self._last is None else self._last[2].sites
        size = {f.fragment_id: f.nbytes for f in request.fragments}
        self.moved_bytes += sum(size[fid] for fid, sites in placement.sites.items()
                                for s in sites if s not in before.get(fid, ()))
        self.replacements += 1
        self._last = (shape, probs, placement)
        return placement


def evaluate_online(options, *, tolerances=(0.0, 0.5, math.inf), policy_names=("greedy", "rl"), progress=None) -> dict:
    """``{family: {policy: {tolerance: metrics}}}`` over ``options.seeds`` seeds (``EvalOptions``).

    Metrics: mean ETTR and downtime + rollbacks with Student-t 95% intervals, the per-seed
    difference of downtime + rollbacks against the first tolerance (every tolerance of one seed
    sees the same scenario), re-placements per interval and bytes moved per interval.
    """
    from ucp.replication.evaluate import ci95, make_policies
    from ucp.replication.scenarios import EXPECTED, build_scenario, pretrained_forecaster
    from ucp.replication.simulator import simulate, simulate_expected

    forecaster = pretrained_forecaster(spec=options.spec, intervals=options.pretrain_intervals)
    io = options.io_model()
    out: dict = {}
    for family in options.families:
        rows: dict = {}
        for k in range(options.seeds):
            seed = options.family_seed(family, k)
            scenario = build_scenario(family, intervals=options.intervals, seed=seed, forecaster=forecaster,
                                      spec=options.spec, replicas=options.replicas, report_path=options.report_path,
                                      io=io)
            run = simulate_expected if family in EXPECTED else simulate
            for tolerance in tolerances:
                for policy in make_policies(options, seed):
                    if policy.name not in policy_names:
                        continue
                    held = ForecastTriggered(policy, tolerance=tolerance)
                    summary = run(held, scenario).summary()
                    summary.update(replacements=held.replacements / options.intervals,
                                   moved_bytes=held.moved_bytes / options.intervals)
                    rows.setdefault(policy.name, {}).setdefault(_key(tolerance), []).append(summary)
            if progress is not None:
                progress(family, k + 1, options.seeds)
        out[family] = {name: {tol: _aggregate(runs, by_tol[_key(tolerances[0])], ci95) for tol, runs in by_tol.items()}
                       for name, by_tol in rows.items()}
    return out


def _key(tolerance: float) -> str:
    return "inf" if math.isinf(tolerance) else f"{tolerance:g}"


def _aggregate(runs: list[dict], first: list[dict], ci95) -> dict:
    """Means and intervals; ``lost_s_diff``: per seed, minus the first tolerance's run of the same scenario."""
    lost = [r["downtime_s"] + r["rollback_s"] for r in runs]
    diff = [a - (b["downtime_s"] + b["rollback_s"]) for a, b in zip(lost, first)]
    return {"ettr": float(np.mean([r["ettr"] for r in runs])), "ettr_ci95": ci95([r["ettr"] for r in runs]),
            "lost_s": float(np.mean(lost)), "lost_s_ci95": ci95(lost),
            "lost_s_diff": float(np.mean(diff)), "lost_s_diff_ci95": ci95(diff),
            "replacements_per_interval": float(np.mean([r["replacements"] for r in runs])),
            "moved_bytes_per_interval": float(np.mean([r["moved_bytes"] for r in runs]))}
