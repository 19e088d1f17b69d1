"""Incidents: fold failure events into what actually happened, and flag lemon nodes.

One GPU falling off the bus is followed, minutes later, by every rank's NCCL
watchdog timing out. Those thousand lines are one incident, and its root cause
is the GPU fault. Events are walked in time order; an event joins an open
incident (last event no more than ``window_s`` earlier) that shares its job or
node (an event without a node counts as its file's: a log without host names
is one machine's or one stream's), and a *symptom* (a category the taxonomy marks ``symptom``, e.g. NCCL
timeouts) joins the most recent open incident even without a shared job or
node, because cascades cross nodes. The same message (template and category) on other nodes within
:data:`SIMULTANEOUS_S` of its first line in an incident joins that incident: five nodes' sendmail
saying the same thing in the same minute is one event of a shared cause, not five incidents. A failure
of another category joins its node's
incident only within ``window_s`` of the incident's start (a storm of one message that
fires for hours keeps its incident open, but does not swallow what else happens on
that node). The root cause is the earliest event of the
most causal kind: non-symptoms before symptoms, then the taxonomy's
``root_cause_order`` (hardware, infra, user, software), then time.

Example::

    incidents, assignment = build_incidents(events, taxonomy=tax, window_s=900)
    lemons = lemon_nodes(incidents, nodes_seen=512)
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from scipy.stats import poisson

from ucp.reliability.logs.records import Event
from ucp.reliability.logs.taxonomy import Taxonomy

# Lines of one message on several nodes this close together report one cause (a shared server, a pushed
# configuration); the same span discover.py uses for templates that fire together on a node.
SIMULTANEOUS_S = 60.0


@dataclass(frozen=True)
class Incident:
    """One failure, with the event judged its root cause and the events folded into it."""

    id: int
    start: float | None
    end: float | None
    root_category: str
    root_node: str | None
    root_job: str | None
    root_file: str
    root_line: int
    root_message: str
    fatal: bool
    event_count: int
    categories: dict
    nodes: tuple[str, ...]
    jobs: tuple[str, ...]

    def to_dict(self) -> dict:
        return {
            "id": self.id, "start": self.start, "end": self.end,
            "root_cause": {"category": self.root_category, "node": self.root_node, "job": self.root_job,
                           "file": self.root_file, "line": self.root_line, "message": self.root_message},
            "fatal": self.fatal, "event_count": self.event_count, "categories": dict(self.categories),
            "nodes": list(self.nodes), "jobs": list(self.jobs),
        }


def build_incidents(events: list[Event], *, taxonomy: Taxonomy,
                    window_s: float = 900.0) -> tuple[list[Incident], list[int]]:
    """Incidents over ``events`` and, per event (same order as given), its incident id."""
    # Time order; untimed events last, by file and line. Keys built in one pass: no call per comparison.
    keys = [(e.timestamp is None, e.timestamp or 0.0, e.file, e.line) for e in events]
    order = sorted(range(len(events)), key=keys.__getitem__)
    # Incidents under construction as columns (one list per attribute, indexed by incident id): most
    # incidents hold one event, and an object per incident cost more than the folding itself.
    members: list[list] = []  # events of each incident
    starts: list[float] = []
    ends: list[float] = []
    kinds: list[set] = []  # categories
    only_symptoms: list[bool] = []
    member: list[int] = [0] * len(events)
    # O(1) per event: the latest incident per job and per node, the latest
    # incident overall, and the latest one holding only symptoms.
    by_job: dict[str, int] = {}
    by_node: dict = {}
    by_node_category: dict[tuple, int] = {}
    by_message: dict[tuple, tuple[int, float]] = {}  # (template, category) -> (incident, its first line there)
    latest: int | None = None
    latest_symptomatic: int | None = None
    untimed_by_file: dict[str, int] = {}
    symptom_of: dict[str, bool] = {}
    for i in order:
        ev = events[i]
        category, t, node, job = ev.category, ev.timestamp, ev.node, ev.job
        symptom = symptom_of.get(category)
        if symptom is None:
            symptom = symptom_of[category] = taxonomy.is_symptom(category)
        if t is None:
            # No clock to fold by: untimed events of one file are one incident.
            gid = untimed_by_file.get(ev.file)
            if gid is None:
                gid = untimed_by_file[ev.file] = len(members)
                members.append([])
                starts.append(0.0)
                ends.append(0.0)
                kinds.append(set())
                only_symptoms.append(True)
        else:
            gid = None
            if job is not None:
                g = by_job.get(job)
                if g is not None and t - ends[g] <= window_s:
                    gid = g
            # A line without a host is its file's: a log with no host names is one machine's, or one stream
            source = node if node is not None else (ev.file,)
            if gid is None:
                g = by_node_category.get((source, category))  # the node's incident of this kind first
                if g is not None and t - ends[g] <= window_s:
                    gid = g
            if gid is None:
                g = by_node.get(source)
                # Another kind of failure on the node joins only near the incident's start: a storm of one
                # message every minute for hours would otherwise fold every later failure of its node.
                if g is not None and t - ends[g] <= window_s and (
                        category in kinds[g] or t - starts[g] <= window_s):
                    gid = g
            if gid is None:
                seen = by_message.get((ev.template_id, category))  # the same message on another node, at once
                if seen is not None and t - seen[1] <= SIMULTANEOUS_S:
                    gid = seen[0]
            if gid is None:
                if symptom:
                    if latest is not None and t - ends[latest] <= window_s:
                        gid = latest
                elif latest_symptomatic is not None and t - ends[latest_symptomatic] <= window_s \
                        and only_symptoms[latest_symptomatic]:
                    gid = latest_symptomatic
            if gid is None:
                gid = len(members)
                members.append([])
                starts.append(t)
                ends.append(t)
                kinds.append(set())
                only_symptoms.append(True)
            elif t > ends[gid]:
                ends[gid] = t
            latest = gid
            seen = by_message.get((ev.template_id, category))
            if seen is None or seen[0] != gid:
                by_message[ev.template_id, category] = (gid, t)
            by_node[source] = gid
            by_node_category[source, category] = gid
            if job is not None:
                by_job[job] = gid
        members[gid].append(ev)
        kinds[gid].add(category)
        if only_symptoms[gid]:
            only_symptoms[gid] = symptom
            if symptom and t is not None:
                latest_symptomatic = gid
        member[i] = gid
    # a category's rank as a root cause, once per category rather than once per event
    rank = {c: (symptom, taxonomy.root_rank(c)) for c, symptom in symptom_of.items()}
    fatal = {c: taxonomy.is_fatal(c) for c in symptom_of}
    incidents = [_finish(gid, evs, rank, fatal) for gid, evs in enumerate(members)]
    return incidents, member


def _finish(gid: int, events: list, rank: dict, fatal: dict) -> Incident:
    if len(events) == 1:  # most incidents: skip the ranking and counting
        root = events[0]
        start = end = root.timestamp
        return Incident(
            id=gid, start=start, end=end,
            root_category=root.category, root_node=root.node, root_job=root.job, root_file=root.file,
            root_line=root.line, root_message=root.message[:300], fatal=fatal[root.category],
            event_count=1, categories={root.category: 1},
            nodes=() if root.node is None else (root.node,), jobs=() if root.job is None else (root.job,))
    root = min(events, key=lambda e: (*rank[e.category],
                                      e.timestamp if e.timestamp is not None else math.inf, e.file, e.line))
    stamps = [e.timestamp for e in events if e.timestamp is not None]
    start, end = (min(stamps), max(stamps)) if stamps else (None, None)
    categories: dict = {}
    nodes, jobs = set(), set()
    for e in events:  # a plain dict: Counter's constructor costs more than this loop here
        categories[e.category] = categories.get(e.category, 0) + 1
        nodes.add(e.node)
        jobs.add(e.job)
    nodes.discard(None)
    jobs.discard(None)
    return Incident(
        id=gid, start=start, end=end,
        root_category=root.category, root_node=root.node, root_job=root.job, root_file=root.file,
        root_line=root.line, root_message=root.message[:300], fatal=fatal[root.category],
        event_count=len(events), categories=categories,
        nodes=tuple(nodes) if len(nodes) < 2 else tuple(sorted(nodes)),
        jobs=tuple(jobs) if len(jobs) < 2 else tuple(sorted(jobs)),
    )


@dataclass(frozen=True)
class LemonNode:
    """A node that is the root cause of more incidents than chance explains."""

    node: str
    incidents: int
    expected: float
    p_value: float
    categories: dict

    def to_dict(self) -> dict:
        return {"node": self.node, "incidents": self.incidents, "expected": self.expected,
                "p_value": self.p_value, "categories": dict(self.categories)}


def lemon_nodes(incidents: list[Incident], *, nodes_seen: int, min_incidents: int = 3,
                p_threshold: float = 0.01) -> list[LemonNode]:
    """Repeat offenders: >= ``min_incidents`` root-caused incidents and a Poisson tail p < ``p_threshold``.

    The expectation is the cluster's mean incidents per node; the p-value is
    P(X >= count) for X ~ Poisson(mean), i.e. how surprising this node's count is.
    """
    by_node: dict[str, list[Incident]] = {}
    for inc in incidents:
        if inc.root_node is not None:
            by_node.setdefault(inc.root_node, []).append(inc)
    total = sum(len(v) for v in by_node.values())
    mean = total / max(nodes_seen, len(by_node), 1)
    lemons = []
    # most nodes have too few incidents to need a tail probability; the rest get theirs in one scipy call
    counted = [(node, incs) for node, incs in by_node.items() if len(incs) >= min_incidents]
    tails = poisson.sf([len(incs) - 1 for _, incs in counted], mean) if mean > 0 and counted else None
    for k, (node, incs) in enumerate(counted):
        count = len(incs)
        p = float(tails[k]) if tails is not None else 0.0
        if p < p_threshold:
            lemons.append(LemonNode(node=node, incidents=count, expected=mean, p_value=p,
                                    categories=dict(Counter(i.root_category for i in incs))))
    return sorted(lemons, key=lambda n: (-n.incidents, n.node))
