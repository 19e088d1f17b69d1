"""Mined categories: templates group by their words and by whether they fire together on a node."""

from __future__ import annotations

import random

from ucp.reliability.logs.analyze import analyze_logs
from ucp.reliability.logs.detect import FEATURES, Detector
from ucp.reliability.logs.discover import (FlaggedTemplate, Grouping, chance_co_occurrence, co_occurrence,
                                       discover_categories)


def _domain(text):
    return "software", 0.6


def _groups(flagged, **grouping):
    found = discover_categories(flagged, domain_of=_domain, grouping=Grouping(**grouping))
    return sorted(sorted(c.template_ids) for c in found), found


def _fired(times, nodes, *, shift=0.0):
    return tuple(sorted((t + shift, n) for t, n in zip(times, nodes)))


TIMES = [1000.0 * i for i in range(1, 9)]
NODES = [f"n{i % 4}" for i in range(8)]


def test_templates_that_always_fire_together_on_a_node_are_one_category():
    # No word in common: only timing joins them (the messages of one failure).
    terminated = FlaggedTemplate(1, "rts: kernel terminated for reason <*>", 8, tuple(NODES), ("a",),
                                 _fired(TIMES, NODES))
    header = FlaggedTemplate(2, "ciod: bad message header from compute chip <*>", 8, tuple(NODES), ("b",),
                             _fired(TIMES, NODES, shift=2.0))
    groups, found = _groups([terminated, header])
    assert groups == [[1, 2]]
    assert found[0].joined_by == ("lead", "time")


def test_firing_together_needs_the_same_node_and_the_window():
    lead = FlaggedTemplate(1, "rts: kernel terminated for reason <*>", 8, tuple(NODES), ("a",), _fired(TIMES, NODES))
    elsewhere = FlaggedTemplate(2, "ciod: bad message header from compute chip <*>", 8, (), ("b",),
                                _fired(TIMES, [f"m{i}" for i in range(8)], shift=2.0))
    later = FlaggedTemplate(3, "torus: sender retransmission stalled <*>", 8, (), ("c",),
                            _fired(TIMES, NODES, shift=600.0))
    assert _groups([lead, elsewhere, later])[0] == [[1], [2], [3]]
    assert _groups([lead, later], window_s=900.0)[0] == [[1, 3]]


def test_templates_that_fire_all_the_time_are_near_each_other_by_chance_only():
    # One busy host: one template every 20 s, another every 30 s. Each has the other within a minute every
    # time, as two streams that are always on do; that is chance, not one failure.
    often = FlaggedTemplate(1, "rts: kernel terminated for reason <*>", 400, ("h",), ("a",),
                            tuple((20.0 * i, "h") for i in range(400)))
    steady = FlaggedTemplate(2, "ciod: bad message header from compute chip <*>", 266, ("h",), ("b",),
                             tuple((5.0 + 30.0 * i, "h") for i in range(266)))
    assert co_occurrence(often.occurrences, steady.occurrences, window_s=60) == 1.0
    assert _groups([often, steady])[0] == [[1], [2]]
    # The same two, each a burst of lines once an hour: together well beyond chance.
    bursts_a = tuple((3600.0 * i + 20.0 * j, "h") for i in range(10) for j in range(3))
    bursts_b = tuple((3600.0 * i + 5.0 + 30.0 * j, "h") for i in range(10) for j in range(2))
    paired = [FlaggedTemplate(1, often.text, 30, ("h",), ("a",), bursts_a),
              FlaggedTemplate(2, steady.text, 20, ("h",), ("b",), bursts_b)]
    assert _groups(paired)[0] == [[1, 2]]


def test_chance_co_occurrence_spreads_the_other_lines_over_the_span():
    assert chance_co_occurrence([(0.0, "a"), (1800.0, "b")], [(5.0, "a")] * 30, window_s=60) == 0.5
    assert chance_co_occurrence([(5.0, "a")], [(5.0, "a")], window_s=60) == 1.0  # no span: all is near
    assert chance_co_occurrence([], [(5.0, "a")], window_s=60) == 0.0


def test_alike_words_that_never_meet_are_two_kinds_of_failure():
    lustre = FlaggedTemplate(1, "lustre mount failed on ionode <*>", 6, (), ("a",),
                             _fired(TIMES[:6], ["io1", "io2", "io3"] * 2))
    nfs = FlaggedTemplate(2, "nfs mount failed on ionode <*>", 5, (), ("b",),
                          _fired(TIMES[:5], ["io4", "io5", "io6", "io4", "io5"], shift=300.0))
    assert _groups([lustre, nfs])[0] == [[1], [2]]
    # Without timed lines the words decide (Jaccard 0.6: alike); meeting once on a node is enough to join.
    untimed = [FlaggedTemplate(t.template_id, t.text, t.lines, (), t.examples) for t in (lustre, nfs)]
    assert _groups(untimed)[0] == [[1, 2]]
    met = FlaggedTemplate(2, nfs.text, 5, (), ("b",), nfs.occurrences[:4] + ((TIMES[0] + 5.0, "io1"),))
    assert _groups([lustre, met])[0] == [[1, 2]]


def test_grouping_does_not_depend_on_input_order():
    flagged = [FlaggedTemplate(i, text, 10 - i, (), ("x",), _fired(TIMES, NODES, shift=shift))
               for i, (text, shift) in enumerate([("rts: kernel terminated for reason <*>", 0.0),
                                                  ("ciod: bad message header <*>", 1.0),
                                                  ("lustre mount failed on ionode <*>", 5000.0),
                                                  ("nfs mount failed on ionode <*>", 9500.0)], start=1)]
    first = _groups(flagged)[0]
    for seed in range(5):
        random.Random(seed).shuffle(flagged)
        assert _groups(flagged)[0] == first
    assert first == [[1, 2], [3], [4]]


def test_co_occurrence_counts_lines_with_a_partner_nearby():
    assert co_occurrence([], [(1.0, "n1")], window_s=60) == 0.0
    other = [(40.0, "n1"), (161.0, "n1"), (161.0, "n2"), (100.0, "n3")]
    assert co_occurrence([(100.0, "n1"), (100.0, "n2")], other, window_s=60) == 0.5
    assert co_occurrence([(100.0, "n1"), (100.0, "n2")], other, window_s=61) == 1.0  # the window's edge counts


def test_analysis_groups_mined_templates_that_fire_together(tmp_path):
    # Two messages no taxonomy knows, always one second apart on one node, and a third, worded like
    # neither, on its own: the first two become one mined category.
    lines = []
    for i in range(12):
        ts = 3600 * i
        node = f"cn{i % 3:02d}"
        stamp = lambda t: f"2024-06-0{1 + t // 86400}T{t % 86400 // 3600:02d}:{t % 3600 // 60:02d}:{t % 60:02d}"  # noqa: E731
        lines.append(f"{stamp(ts)} {node} quaxd[7]: ERROR: wibbler spindle jammed at stage {i}")
        lines.append(f"{stamp(ts + 1)} {node} frobd[9]: ERROR: gorp relay failed, code {i}")
        lines.append(f"{stamp(ts + 1800)} {node} zembd[3]: ERROR: blonk buffer overflowed in pass {i}")
    path = tmp_path / "cluster.log"
    path.write_text("\n".join(lines) + "\n")
    detector = Detector(weights=dict.fromkeys(FEATURES, 0.0) | {"bias": -1.0, "sev_error": 3.0})
    result = analyze_logs([str(path)], detector=detector)
    mined = sorted((c.templates, c.joined_by) for c in result.discovered)
    assert mined == [(("blonk buffer overflowed in pass <*>",), ("lead",)),
                     (("wibbler spindle jammed at stage <*>", "gorp relay failed, code <*>"), ("lead", "time"))]
