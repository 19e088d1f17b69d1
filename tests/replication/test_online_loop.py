"""The online loop: a placement is kept until a forecast moves past the tolerance or the cluster changes."""

from __future__ import annotations

import dataclasses
import math

import pytest

from ucp.replication.cluster import ClusterSpec
from ucp.replication.evaluate import EvalOptions
from ucp.replication.online_loop import ForecastTriggered, evaluate_online
from ucp.replication.placement import ClusterView, PlacementRequest
from ucp.replication.policies import GreedyForecast

SPEC = ClusterSpec(nodes=4, rack_size=2)


def test_replaces_when_a_forecast_moves_past_the_tolerance_or_a_node_leaves():
    held = ForecastTriggered(GreedyForecast(), tolerance=0.5)
    request = PlacementRequest.one_per_node(SPEC, replicas=1)
    first = held.place(request, ClusterView.uniform(SPEC, [0.01] * 4))
    assert held.moved_bytes == 4 * SPEC.shard_bytes  # the first placement sends every copy
    assert held.place(request, ClusterView.uniform(SPEC, [0.014, 0.01, 0.01, 0.01])) is first  # 29% < 50%
    assert held.place(request, ClusterView.uniform(SPEC, [0.05, 0.01, 0.01, 0.01])) is not first  # 80% > 50%
    assert held.replacements == 2
    view = ClusterView.uniform(SPEC, [0.05, 0.01, 0.01, 0.01])
    gone = dataclasses.replace(view, nodes=(view.nodes[0], dataclasses.replace(view.nodes[1], alive=False),
                                            *view.nodes[2:]))
    smaller = PlacementRequest(tuple(f for f in request.fragments if f.owner != 1), replicas=1)
    held.place(smaller, gone)
    assert held.replacements == 3
    never = ForecastTriggered(GreedyForecast(), tolerance=math.inf)
    never.place(request, ClusterView.uniform(SPEC, [0.01] * 4))
    never.place(request, ClusterView.uniform(SPEC, [0.9, 0.01, 0.01, 0.01]))
    assert never.replacements == 1


def test_evaluate_online_pairs_tolerances_on_the_same_scenarios():
    options = EvalOptions(intervals=30, families=("lemon",), seeds=2, rl_online=False, pretrain_intervals=200)
    out = evaluate_online(options, tolerances=(0.0, math.inf), policy_names=("greedy",))
    every, never = out["lemon"]["greedy"]["0"], out["lemon"]["greedy"]["inf"]
    assert every["replacements_per_interval"] == 1.0 and every["lost_s_diff"] == 0.0
    assert never["replacements_per_interval"] < 0.1 and never["moved_bytes_per_interval"] < every[
        "moved_bytes_per_interval"]
    assert never["lost_s_diff"] == pytest.approx(never["lost_s"] - every["lost_s"])
