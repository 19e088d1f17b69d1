"""Discovered categories: failure templates no taxonomy category knows, grouped and named.

Lines the detector flags that no rule, taxonomy template or confident model
answer places go here, never to ``normal``. Their templates are grouped by
two signals (:class:`Grouping`): the words they share (Jaccard similarity of
their constant words) and whether they *fire together* - on the same node,
within ``window_s`` seconds of each other. Two templates are one category when

- their words are nearly the same (Jaccard >= ``same_words``, 0.8); or
- their words are alike (>= ``similar_words``, 0.5) and they do fire together
  some of the time, or there are too few timed lines to tell: alike words
  that never meet on a node ("Lustre mount failed" and "NFS mount failed",
  each on its own nodes and times) are two kinds of failure, not one;
- or, whatever their words, they fire together: most lines of each have a
  line of the other on the same node within the window (``together``, 0.7),
  as the messages of one failure do ("kernel terminated" and the
  "rts: bad message header" that always follows it) - and far more often
  than chance would put them there (at most ``chance`` of that share, 0.5:
  on one busy host, a template that fires every minute is "near" everything;
  chance is what lines spread evenly over the run's timed span would give).

Templates are taken largest first and join the first category whose largest
template they go with, so the result does not depend on input order. Each
category becomes ``<domain>/discovered/<name>``: the name is made of the
words around the failure word of its largest template, the domain (hardware,
infra, software, user) is guessed by a model trained on the taxonomy's own
examples, with its probability as confidence. :meth:`DiscoveredCategory.taxonomy_entry`
writes one in the taxonomy file format, so a site can review, rename and keep it
(``ucp logs analyze --taxonomy-out FILE``).

Example::

    found = discover_categories([FlaggedTemplate(7, "data TLB error interrupt", 41, ("R02-M1",), ("...",))],
                                domain_of=lambda text: ("hardware", 0.81))
    found[0].path   # 'hardware/discovered/data-tlb-error-interrupt'
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from ucp.reliability.logs.detect import failure_phrase

MAX_EXAMPLES = 5
MAX_NODES = 20
MAX_OCCURRENCES = 2000  # timed lines kept per template: enough to tell whether two fire together
_WORD = re.compile(r"[A-Za-z][A-Za-z_-]*[A-Za-z]|[A-Za-z]")
_STOP = frozenset("a an the of on in at to for from by with and or is are was were be been has have had this "
                  "that it its as".split())


@dataclass(frozen=True)
class FlaggedTemplate:
    """A template whose lines were flagged as failures but fit no known category."""

    template_id: int
    text: str
    lines: int
    nodes: tuple[str, ...]
    examples: tuple[str, ...]
    occurrences: tuple[tuple[float, str], ...] = ()  # (timestamp, node) of its timed lines, in time order


@dataclass(frozen=True)
class Grouping:
    """When two flagged templates make one category (see the module docstring)."""

    same_words: float = 0.8
    similar_words: float = 0.5
    together: float = 0.7
    chance: float = 0.5  # the share chance would give, at most this fraction of the observed share
    window_s: float = 60.0
    min_occurrences: int = 3  # timed lines each template needs before timing decides anything


@dataclass(frozen=True)
class DiscoveredCategory:
    """A mined category: its path, readable name, domain guess, and what it covers."""

    path: str
    name: str
    domain: str
    domain_confidence: float
    templates: tuple[str, ...]
    template_ids: tuple[int, ...]
    lines: int
    nodes: tuple[str, ...]
    examples: tuple[str, ...]
    joined_by: tuple[str, ...] = ()  # per template: "lead" (the largest), "words" or "time"

    def to_dict(self) -> dict:
        return {"path": self.path, "name": self.name, "domain": self.domain,
                "domain_confidence": self.domain_confidence, "templates": list(self.templates),
                "template_ids": list(self.template_ids), "joined_by": list(self.joined_by), "lines": self.lines,
                "nodes": list(self.nodes), "examples": list(self.examples)}

    def taxonomy_entry(self) -> dict:
        """This category as an entry of a taxonomy file (docs/LOGS.md), ready to review and merge."""
        return {"description": f"Discovered from the logs: {self.name} ({self.lines} lines on "
                               f"{len(self.nodes)} nodes; domain guessed {self.domain} with confidence "
                               f"{self.domain_confidence:.2f}). Review, rename and keep.",
                "patterns": [], "templates": list(self.templates), "examples": list(self.examples),
                "symptom": False, "fatal": True}


def words(text: str) -> list[str]:
    """The constant words of a template, lower case, without stop words or values.

    >>> words("ciod: Error reading message prefix on CioStream socket to <*>, Link has been severed")
    ['ciod', 'error', 'reading', 'message', 'prefix', 'cio', 'stream', 'socket', 'link', 'severed']
    """
    out = []
    for token in text.split():
        if "<*>" in token:
            continue
        for word in _WORD.findall(token):
            # camelCase parts are words too: "CioStream" -> "cio", "stream"
            for part in re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])", word) or [word]:
                part = part.lower()
                if part not in _STOP and len(part) > 1:
                    out.append(part)
    return out


def slug(text: str, *, max_words: int = 5) -> str:
    """A readable, path-safe name from a template's first words.

    >>> slug("data TLB error interrupt (dear=<*>)")
    'data-tlb-error-interrupt'
    """
    picked = words(text)[:max_words]
    return "-".join(picked) or "unnamed"


def _jaccard(a: frozenset, b: frozenset) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


class _Timelines:
    """Timed lines of many templates, each as one sorted array of ``node index * stride + seconds``.

    The stride exceeds the run's span plus two windows, so "a line of the other
    template on the same node within the window" is one ``searchsorted`` per
    pair of templates, whatever the number of nodes.
    """

    def __init__(self, occurrences: dict[int, Sequence[tuple[float, str]]], *, window_s: float):
        stamps = [ts for lines in occurrences.values() for ts, _ in lines]
        self.t0 = min(stamps, default=0.0)
        self.span_s = max(stamps, default=0.0) - self.t0
        self.window_s = window_s
        stride = self.span_s + 4 * window_s + 1.0
        node_ids: dict[str, int] = {}
        self.keys: dict[int, np.ndarray] = {}
        self.nodes: dict[int, np.ndarray] = {}
        self.per_node: dict[int, np.ndarray] = {}
        for tid, lines in occurrences.items():
            ids = np.array([node_ids.setdefault(node, len(node_ids)) for _, node in lines], dtype=np.int64)
            keys = ids * stride + (np.array([ts for ts, _ in lines], dtype=float) - self.t0)
            self.keys[tid] = np.sort(keys)
            self.nodes[tid] = ids
        for tid, ids in self.nodes.items():
            self.per_node[tid] = np.bincount(ids, minlength=len(node_ids))

    def near(self, a: int, b: int) -> float:
        """Share of ``a``'s lines with a line of ``b`` on the same node within the window."""
        mine, theirs = self.keys[a], self.keys[b]
        if not len(mine) or not len(theirs):
            return 0.0
        w = self.window_s
        i = np.searchsorted(theirs, mine - w, side="left")
        inside = i < len(theirs)
        hits = np.zeros(len(mine), dtype=bool)
        hits[inside] = theirs[i[inside]] <= mine[inside] + w
        return float(hits.mean())

    def by_chance(self, a: int, b: int) -> float:
        """The share :meth:`near` would give if ``b``'s lines on each node were spread evenly over the span."""
        mine = self.nodes[a]
        if not len(mine):
            return 0.0
        if self.span_s <= 0:
            return 1.0  # no time to spread over: anything is near anything
        counts = self.per_node[b]
        return float(np.minimum(1.0, 2 * self.window_s * counts[mine] / self.span_s).mean())


def co_occurrence(lines: Sequence[tuple[float, str]], other: Sequence[tuple[float, str]], *,
                  window_s: float) -> float:
    """Share of ``lines`` ((timestamp, node)) with a line of ``other`` on the same node within ``window_s``.

    >>> co_occurrence([(10.0, "n1"), (500.0, "n1"), (10.0, "n2")], [(12.0, "n1")], window_s=60)
    0.3333333333333333
    """
    return _Timelines({0: lines, 1: other}, window_s=window_s).near(0, 1)


def chance_co_occurrence(lines: Sequence[tuple[float, str]], other: Sequence[tuple[float, str]], *,
                         window_s: float) -> float:
    """The share :func:`co_occurrence` would give if ``other``'s lines on each node were spread evenly over
    the span of both.

    >>> chance_co_occurrence([(0.0, "n1"), (3600.0, "n2")], [(1.0, "n1"), (2.0, "n1"), (3.0, "n1")], window_s=60)
    0.05
    """
    return _Timelines({0: lines, 1: other}, window_s=window_s).by_chance(0, 1)


class _Affinity:
    """Whether two flagged templates make one category, and why (the rules of :class:`Grouping`)."""

    def __init__(self, templates: Sequence[FlaggedTemplate], grouping: Grouping):
        self.grouping = grouping
        self.bags = {t.template_id: frozenset(words(t.text)) for t in templates}
        self.timelines = _Timelines({t.template_id: t.occurrences for t in templates
                                     if len(t.occurrences) >= grouping.min_occurrences},
                                    window_s=grouping.window_s)

    def _timed(self, a: int, b: int) -> bool:
        return a in self.timelines.keys and b in self.timelines.keys

    def _fire_together(self, a: int, b: int) -> bool:
        # Most lines of each near a line of the other, and far more often than chance would give.
        g, lines = self.grouping, self.timelines
        for x, y in ((a, b), (b, a)):
            share = lines.near(x, y)
            if share < g.together or lines.by_chance(x, y) > g.chance * share:
                return False
        return True

    def link(self, lead: int, other: int) -> str | None:
        g = self.grouping
        alike = _jaccard(self.bags[lead], self.bags[other])
        if alike >= g.same_words:
            return "words"
        timed = self._timed(lead, other)
        if alike >= g.similar_words and (not timed or self.timelines.near(lead, other) > 0.0):  # met once
            return "words"
        if timed and self._fire_together(lead, other):
            return "time"
        return None


def discover_categories(flagged: Iterable[FlaggedTemplate], *, domain_of: Callable[[str], tuple[str, float]],
                        grouping: Grouping = Grouping(), taken: Iterable[str] = ()) -> list[DiscoveredCategory]:
    """Group ``flagged`` templates into named categories (see the module docstring)."""
    ordered = sorted(flagged, key=lambda t: (-t.lines, t.template_id))
    affinity = _Affinity(ordered, grouping)
    clusters: list[list[tuple[FlaggedTemplate, str]]] = []
    for template in ordered:
        for members in clusters:
            why = affinity.link(members[0][0].template_id, template.template_id)
            if why is not None:
                members.append((template, why))
                break
        else:
            clusters.append([(template, "lead")])
    used = set(taken)
    return [_category([t for t, _ in members], tuple(why for _, why in members), domain_of=domain_of, used=used)
            for members in clusters]


def _category(members: list[FlaggedTemplate], joined_by: tuple[str, ...], *,
              domain_of: Callable[[str], tuple[str, float]], used: set) -> DiscoveredCategory:
    lead = members[0]
    domain, confidence = domain_of(" ".join(t.examples[0] if t.examples else t.text for t in members[:3]))
    # Named after what went wrong: the words around the first failure word, else the first words.
    phrase = failure_phrase(lead.text) or lead.text
    name = slug(phrase)
    path = f"{domain}/discovered/{name}"
    n = 2
    while path in used:
        path = f"{domain}/discovered/{name}-{n}"
        n += 1
    used.add(path)
    nodes = sorted({node for t in members for node in t.nodes})
    examples: list[str] = []
    for t in members:
        for ex in t.examples:
            if ex not in examples and len(examples) < MAX_EXAMPLES:
                examples.append(ex)
    return DiscoveredCategory(
        path=path, name=" ".join(words(phrase)[:8]) or lead.text[:60], domain=domain,
        domain_confidence=round(float(confidence), 4), templates=tuple(t.text for t in members),
        template_ids=tuple(t.template_id for t in members), lines=sum(t.lines for t in members),
        nodes=tuple(nodes[:MAX_NODES]), examples=tuple(examples), joined_by=joined_by)


def write_taxonomy(categories: Iterable[DiscoveredCategory], path: str) -> None:
    """Write discovered categories as a taxonomy file (``--taxonomy-out``), loadable with ``--taxonomy``."""
    import json

    data = {"version": 1, "categories": {c.path: c.taxonomy_entry() for c in categories}}
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=1)
        handle.write("\n")
