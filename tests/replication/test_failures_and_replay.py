"""Failure processes (seeded, with the statistics they promise) and replay of `ucp logs analyze --json`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ucp.replication.cluster import ClusterSpec
from ucp.replication.errors import FailureLogError, PlacementInputError
from ucp.replication.failures import CHANNELS, FailureModel, Lifetime, generate_trace
from ucp.replication.replay import load_report, trace_from_report
from ucp.replication.scenarios import family_trace
from ucp.tools.cli import main

DATA = Path(__file__).parent / "data"
SPEC = ClusterSpec(nodes=16, rack_size=4)


def test_same_seed_same_trace_other_seed_other_trace():
    a, b = (family_trace("correlated-rack", intervals=400, seed=3) for _ in range(2))
    c = family_trace("correlated-rack", intervals=400, seed=4)
    assert a.failures == b.failures and np.array_equal(a.monitor, b.monitor)
    assert a.failures != c.failures


def test_exponential_rate_matches_its_mttf():
    model = FailureModel(lifetime=Lifetime(kind="exponential", mttf_intervals=100.0), precursor_share=0.0)
    trace = generate_trace(SPEC, model, intervals=5000, seed=0, family="x")
    rate = trace.failure_matrix().mean()
    assert rate == pytest.approx(1 - np.exp(-1 / 100), rel=0.1)


def test_weibull_infant_mortality_fails_young_nodes_more():
    young = Lifetime(kind="weibull", mttf_intervals=200.0, shape=0.6).interval_probability(np.array([0.0, 1000.0]))
    assert young[0] > 5 * young[1]
    flat = Lifetime(kind="weibull", mttf_intervals=200.0, shape=1.0).interval_probability(np.array([0.0, 1000.0]))
    assert flat[0] == pytest.approx(flat[1])


def test_rack_failures_take_whole_racks_and_lemons_fail_more():
    rack = family_trace("correlated-rack", intervals=2000, seed=1)
    multi = [e for events in rack.failures for e in events if len(e) > 1]
    assert multi and all(e == frozenset(range(min(e), min(e) + 4)) and min(e) % 4 == 0 for e in multi)
    lemon = family_trace("lemon", intervals=2000, seed=1)
    per_node = np.sort(lemon.failure_matrix().sum(0))
    assert per_node[-2:].min() > 4 * np.median(per_node)  # the two lemon slots


def test_degraded_nodes_warn_before_failing():
    trace = family_trace("independent", intervals=3000, seed=2)
    hw = trace.monitor[:, :, CHANNELS.index("hardware")]
    fails = trace.failure_matrix()
    before = [hw[t - 3:t, i].sum() for t, i in zip(*np.nonzero(fails)) if t >= 3]
    assert np.mean(before) > 5 * 3 * hw.mean()


def test_failure_model_rejects_bad_parameters():
    with pytest.raises(PlacementInputError, match=r"^lifetime kind 'gamma': use exponential or weibull$"):
        Lifetime(kind="gamma")
    with pytest.raises(PlacementInputError, match=r"^failure model: precursor_share must be in \[0, 1\]$"):
        FailureModel(precursor_share=2.0)


# -- log replay ----------------------------------------------------------------------------------
def test_fixture_is_what_the_real_analyzer_says(tmp_path):
    out = tmp_path / "a.json"
    assert main(["logs", "analyze", str(DATA / "synthetic-cluster.log"), "--json", str(out), "--quiet"]) == 0
    fresh, fixture = json.loads(out.read_text()), load_report(DATA / "synthetic-analysis.json")
    strip = lambda r: [(i["start"], i["root_cause"]["node"], i["root_cause"]["category"], i["fatal"])  # noqa: E731
                       for i in r["incidents"]]
    assert strip(fresh) == strip(fixture)
    assert [(e["timestamp"], e["node"], e["category"]) for e in fresh["events"]] == \
        [(e["timestamp"], e["node"], e["category"]) for e in fixture["events"]]


def test_replay_keeps_who_fails_and_the_warnings():
    report = load_report(DATA / "synthetic-analysis.json")
    trace = trace_from_report(report, spec=ClusterSpec(nodes=8, rack_size=4), intervals=500)
    fatal = [i for i in report["incidents"] if i["fatal"]]
    assert trace.event_count() == len(fatal) == 10  # 7 GPU failures, 2 IB links, 1 host OOM
    per_slot = trace.failure_matrix().sum(0)
    # gpu-03, the lemon, is the node with the most failures (4 of the 7 Xid 79)
    assert per_slot.max() == 4 and per_slot.argmax() == trace.failure_matrix().sum(0).argmax()
    hw = trace.monitor[:, :, CHANNELS.index("hardware")]
    assert hw.sum() == 21 + 7  # corrected ECC warnings and the Xid 79 lines
    assert trace.node_hazard is None


def test_replay_folds_many_nodes_onto_the_cluster():
    report = load_report(DATA / "synthetic-analysis.json")
    trace = trace_from_report(report, spec=ClusterSpec(nodes=4, rack_size=2), intervals=100)
    assert trace.event_count() == 10 and trace.monitor.shape == (100, 4, len(CHANNELS))


def test_replay_refuses_what_is_not_an_analysis(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": 3}')
    with pytest.raises(FailureLogError) as err:
        load_report(bad)
    assert str(err.value) == f"{bad}: schema_version must be 1 or 2; expected the output of `ucp logs analyze --json`"
    bad.write_text("{not json")
    with pytest.raises(FailureLogError, match=r"not JSON"):
        load_report(bad)
    empty = {"schema_version": 1, "events": [], "incidents": []}
    with pytest.raises(FailureLogError) as err:
        trace_from_report(empty, spec=SPEC, intervals=10, where="x.json")
    assert str(err.value) == "x.json: no fatal incident with a timestamp and a root-cause node to replay"


@pytest.mark.parametrize("incident, event, why", [
    ({"fatal": True, "start": "soon", "root_cause": {"node": "n1"}}, None, "ValueError: could not convert string"),
    ({"fatal": True, "start": float("nan"), "root_cause": {"node": "n1"}}, None, "timestamp nan is not a finite"),
    ({"fatal": True, "start": 1.0, "root_cause": {"node": ["n1"]}}, None, "TypeError: expected a string"),
    ({"fatal": True, "start": 1.0, "root_cause": "n1"}, None, "AttributeError"),
    ({"fatal": True, "start": 1.0, "root_cause": {"node": "n1"}}, {"timestamp": 2.0, "node": "n1"}, "KeyError"),
])
def test_replay_refuses_malformed_incidents_by_file(incident, event, why):
    report = {"schema_version": 2, "incidents": [incident], "events": [event] if event else []}
    with pytest.raises(FailureLogError) as err:
        trace_from_report(report, spec=SPEC, intervals=10, where="x.json")
    assert str(err.value).startswith("x.json: a malformed incident or event (") and why in str(err.value)
    assert str(err.value).endswith("expected the output of `ucp logs analyze --json`")


def test_replay_refuses_a_fifo_without_blocking(tmp_path):
    import os

    os.mkfifo(tmp_path / "fifo.json")
    with pytest.raises(FailureLogError, match="is a FIFO, not a regular file"):
        load_report(tmp_path / "fifo.json")


def test_bursts_take_nodes_anywhere_and_are_weighted_for_training():
    from ucp.replication.rl_env import SimulatedEpisodes
    from ucp.replication.simulator import Scenario

    trace = family_trace("burst", intervals=1500, seed=2)
    bursts = [e for events in trace.failures for e in events if len(e) > 1]
    assert bursts and all(len(e) == 3 for e in bursts)
    assert any(len({n // 4 for n in e}) > 1 for e in bursts)  # not rack failures
    request, view, cases = SimulatedEpisodes([Scenario.without_forecasts(trace)]).sample(np.random.default_rng(0))
    assert sum(len(c.lost) == 3 for c in cases) == 4
