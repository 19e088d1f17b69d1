"""Incident folding, lemon nodes and the MTTF fits."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from ucp.reliability.logs.incidents import SIMULTANEOUS_S, build_incidents, lemon_nodes
from ucp.reliability.logs.metrics import failure_rates, fit_interarrivals, job_mttf_projection
from ucp.reliability.logs.records import Event
from ucp.reliability.logs.taxonomy import load_taxonomy

T0 = 1_717_000_000.0


@pytest.fixture(scope="module")
def taxonomy():
    return load_taxonomy()


def _ev(ts, node, category, job=None, line=1, file="x.log", template=0):
    return Event(file=file, line=line, timestamp=ts, node=node, job=job, category=category,
                 template_id=template, confidence=1.0, message=category)


def test_gpu_fault_then_a_thousand_rank_timeouts_is_one_incident(taxonomy):
    events = [_ev(T0, "gpu-a07", "hardware/gpu/xid-79", line=1)]
    # 1024 ranks on 128 nodes time out ~10 minutes later (NCCL's default watchdog), a few resets too.
    for rank in range(1024):
        events.append(_ev(T0 + 600 + rank * 0.05, f"gpu-{rank // 8:03d}", "software/nccl/timeout", job="4242",
                          line=rank + 2, file="train.log"))
    events += [_ev(T0 + 660, "gpu-010", "software/nccl/connection-reset", line=5000, file="train.log")]
    incidents, member = build_incidents(events, taxonomy=taxonomy, window_s=900)
    assert len(incidents) == 1
    inc = incidents[0]
    assert (inc.root_category, inc.root_node, inc.event_count) == ("hardware/gpu/xid-79", "gpu-a07", 1026)
    assert set(member) == {0}


def test_root_cause_is_the_hardware_event_even_when_logged_after_symptoms(taxonomy):
    events = [_ev(T0, "gpu-001", "software/nccl/timeout"), _ev(T0 + 5, "gpu-002", "software/nccl/timeout"),
              _ev(T0 + 30, "gpu-003", "hardware/network/ib-link"), _ev(T0 + 40, "gpu-003", "user/oom/cuda-oom")]
    incidents, _ = build_incidents(events, taxonomy=taxonomy)
    assert [(i.root_category, i.root_node) for i in incidents] == [("hardware/network/ib-link", "gpu-003")]


def test_independent_faults_stay_apart(taxonomy):
    events = [_ev(T0, "gpu-001", "hardware/gpu/xid-79"),
              _ev(T0 + 60, "gpu-002", "infra/filesystem/lustre"),        # another node, not a symptom
              _ev(T0 + 7200, "gpu-001", "hardware/gpu/xid-79"),          # same node, long after
              _ev(T0 + 7210, "gpu-009", "software/nccl/timeout")]        # symptom: folds into the last
    incidents, member = build_incidents(events, taxonomy=taxonomy, window_s=900)
    assert [i.root_category for i in incidents] == ["hardware/gpu/xid-79", "infra/filesystem/lustre",
                                                    "hardware/gpu/xid-79"]
    assert member == [0, 1, 2, 2]


def test_lemon_node_is_flagged_and_ordinary_nodes_are_not(taxonomy):
    events = [_ev(T0 + d * 86400, "gpu-lemon", "hardware/gpu/xid-48", line=d) for d in range(6)]
    events += [_ev(T0 + d * 86400 + 3600, f"gpu-{d:03d}", "hardware/gpu/xid-79", line=100 + d) for d in range(20)]
    incidents, _ = build_incidents(events, taxonomy=taxonomy)
    lemons = lemon_nodes(incidents, nodes_seen=200)
    assert [(n.node, n.incidents) for n in lemons] == [("gpu-lemon", 6)]
    assert lemons[0].p_value < 1e-6


def test_exponential_fit_recovers_the_mean_within_its_interval():
    rng = np.random.default_rng(7)
    fits = fit_interarrivals(rng.exponential(12.0, size=400))
    lo, hi = fits["exponential"]["ci95_hours"]
    assert lo < 12.0 < hi
    assert fits["exponential"]["ks"]["p_value"] > 0.01


def test_weibull_fit_recovers_shape_and_scale_within_their_intervals():
    rng = np.random.default_rng(3)
    x = stats.weibull_min.rvs(0.7, scale=30.0, size=600, random_state=rng)
    fits = fit_interarrivals(x)
    w = fits["weibull"]
    assert w["shape_ci95"][0] < 0.7 < w["shape_ci95"][1]
    assert w["scale_ci95_hours"][0] < 30.0 < w["scale_ci95_hours"][1]
    ref_shape, _, ref_scale = stats.weibull_min.fit(x, floc=0)
    assert w["shape"] == pytest.approx(ref_shape, rel=1e-4) and w["scale_hours"] == pytest.approx(ref_scale, rel=1e-4)
    assert fits["preferred"] == "weibull"


def test_too_few_failures_to_fit_says_so():
    fits = fit_interarrivals([5.0])
    assert fits["exponential"] is None and fits["note"].startswith("need at least 3 failures")


def test_rates_and_job_projection():
    rates = failure_rates(fatal_roots=["a/b", "a/b", "c/d"], nodes=10, span_s=86400 * 30)
    assert rates["node_days"] == 300 and rates["failures"] == 3
    assert rates["failures_per_1000_node_days"] == pytest.approx(10.0)
    assert rates["by_category"] == {"a/b": pytest.approx(1000 * 2 / 300), "c/d": pytest.approx(1000 / 300)}
    rows = job_mttf_projection(failures=3, node_hours=7200, gpus_per_node=8, weibull=None, cluster_nodes=10,
                               job_gpus=(8, 80))
    assert [(r["nodes"], r["mttf_hours_exponential"]) for r in rows] == [(1, 2400.0), (10, 240.0)]


def test_equal_gaps_keep_the_exponential_fit_and_say_why_weibull_has_none():
    # Failures exactly one minute apart made the Weibull solver raise a raw ValueError (NaN in brentq).
    fits = fit_interarrivals([1 / 60] * 4)
    assert fits["weibull"] is None and fits["preferred"] == "exponential"
    assert fits["exponential"]["mttf_hours"] == pytest.approx(1 / 60)
    assert fits["note"] == ("the Weibull shape has no finite maximum-likelihood value (over 1000): the gaps are "
                            "(nearly) all equal")
    # Large but finite spreads still fit (the shape equation is solved on scaled gaps).
    wide = fit_interarrivals([1e-3, 5e3, 2.0, 40.0, 0.5])
    assert wide["weibull"] is not None and 0 < wide["weibull"]["shape"] < 1


def test_a_long_storm_does_not_fold_unrelated_failures_of_its_node(taxonomy):
    # Regression: ganglia's "data_thread() got not answer" every minute for three hours on the admin node kept
    # one incident open, and sshd, ntpd and syslog-ng failures hours later on that node were folded under it.
    storm = [_ev(T0 + 60 * i, "tbird-admin1", "infra/discovered/got-not-answer", line=i + 1) for i in range(180)]
    later = [_ev(T0 + 7200, "tbird-admin1", "infra/discovered/sshd-fatal", line=500),
             _ev(T0 + 7500, "tbird-admin1", "infra/discovered/ntpd-failed", line=501)]
    incidents, member = build_incidents(storm + later, taxonomy=taxonomy, window_s=900)
    assert len({member[i] for i in range(180)}) == 1  # the storm is one incident
    assert member[180] != member[0] and member[181] != member[0]
    # a failure that starts with the storm on its node is still part of it
    near = [_ev(T0 + 120, "tbird-admin1", "infra/discovered/sshd-fatal", line=600)]
    incidents, member = build_incidents(storm + near, taxonomy=taxonomy, window_s=900)
    assert member[180] == member[0]


def test_the_operator_reads_incidents_first_and_a_recurring_root_ranks_below_a_new_one(taxonomy):
    from ucp.reliability.logs.report_terminal import ranked_incidents

    storms = [_ev(T0 + 3600 * k, "admin1", "infra/discovered/got-not-answer", line=k) for k in range(5)]
    news = [_ev(T0 + 3600 * 6, "gpu-a07", "hardware/gpu/xid-79", line=99)]
    incidents, _ = build_incidents(storms + news, taxonomy=taxonomy, window_s=900)
    assert ranked_incidents(incidents)[0].root_category == "hardware/gpu/xid-79"


def test_failures_without_a_host_fold_by_their_file(taxonomy):
    # A log with no host names (Apache's error log, Windows CBS): each event was its own incident before
    events = [_ev(T0 + 10 * i, None, "software/kernel/panic", line=i + 1, file="error.log") for i in range(5)]
    # (another message: the same one in the same minute would be one event of two machines, see below)
    events += [_ev(T0 + 20, None, "software/kernel/panic", line=1, file="other.log", template=1),
               _ev(T0 + 5000, None, "software/kernel/panic", line=99, file="error.log")]
    incidents, member = build_incidents(events, taxonomy=taxonomy, window_s=900)
    assert member == [0, 0, 0, 0, 0, 1, 2]
    assert [i.nodes for i in incidents] == [(), (), ()]


def test_the_same_message_on_several_nodes_at_once_is_one_incident(taxonomy):
    # Thunderbird: five admin nodes' sendmail wrote "unable to qualify my own domain name" in the same
    # minute, and the operator read five incidents of one cause.
    nodes = ["aadmin1", "badmin1", "cadmin1", "dadmin1", "eadmin1"]
    at_once = [_ev(T0 + 2 * k, node, "infra/discovered/sendmail", line=k, template=7) for k, node in enumerate(nodes)]
    later = [_ev(T0 + 3600, "aadmin1", "infra/discovered/sendmail", line=90, template=7),
             _ev(T0 + 3600 + SIMULTANEOUS_S + 1, "badmin1", "infra/discovered/sendmail", line=91, template=7)]
    other = [_ev(T0 + 5, "fadmin1", "infra/discovered/ntpd", line=95, template=8)]  # another message, same minute
    incidents, member = build_incidents(at_once + later + other, taxonomy=taxonomy, window_s=900)
    assert member[:5] == [0] * 5 and incidents[0].nodes == tuple(nodes)
    # an hour later on one node, and a minute after that elsewhere: not at once, two incidents
    assert len({member[5], member[6], member[0]}) == 3
    assert member[7] not in (member[0], member[5], member[6])
