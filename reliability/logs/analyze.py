"""The pipeline: stream lines -> parse -> mask -> template + category (cached) -> events -> incidents -> metrics.

Speed comes from *line shapes*: lines equal up to their ASCII digits parse
alike, so only the first line of each shape goes through the full reader and
masker; the rest are read by slicing (see :class:`_Shapes`). Normal lines are
counted, never turned into objects.

Example::

    result = analyze_logs(["/var/log/slurm", "kern.log.gz"], state_path="templates.drain3")
    result.rates["failures_per_1000_node_days"], len(result.incidents)
    json.dump(result.to_dict(), open("report.json", "w"))
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from reliability.logs.incidents import Incident, LemonNode, build_incidents, lemon_nodes
from reliability.logs.inputs import iter_blocks
from reliability.logs.masking import kept_numbers, mask, may_keep_numbers
from reliability.logs.metrics import failure_rates, fit_interarrivals, job_mttf_projection
from reliability.logs.readers import LineReader, LineShape
from reliability.logs.records import Classification, Event, InputCounters
from reliability.logs.taxonomy import NORMAL, Taxonomy, load_taxonomy
from reliability.logs.templates import TemplateStore

SCHEMA_VERSION = 1
_EXACT_CACHE_MAX = 200_000
_MASK_CACHE_MAX = 1_000_000
_SHAPE_CACHE_MAX = 200_000  # ~50 MB at most: GB-scale runs stay in bounded memory


@dataclass(frozen=True)
class AnalysisOptions:
    """Knobs of one analysis; every field has a default that suits a GPU training cluster."""

    window_s: float = 900.0  # NCCL's default watchdog is 600 s: its timeouts land inside this
    lemon_min_incidents: int = 3
    lemon_p_value: float = 0.01
    gpus_per_node: int = 8
    default_year: int | None = None


@lru_cache(maxsize=4)
def _trained_model(taxonomy: Taxonomy):
    # Training takes about a second; runs in one process (tests, notebooks) share it.
    from reliability.logs.classifier import TemplateClassifier  # sklearn only when needed

    return TemplateClassifier.train(taxonomy)


class TemplateJudge:
    """Masked line -> (template id, classification): rules, then taxonomy templates, then the model.

    Rules see every new masked line; the model sees each drain3 template once
    (its text at first sight), because one prediction costs milliseconds.
    """

    def __init__(self, taxonomy: Taxonomy, store: TemplateStore):
        self.taxonomy = taxonomy
        self.store = store
        self._by_template: dict[int, Classification] = {}
        self.method_counts: dict[str, int] = {}

    def judge(self, masked: str, message: str) -> tuple[int, str, float, bool]:
        tid = self.store.template_id(masked)
        verdict = self.classify(masked, message, template_id=tid)
        self.method_counts[verdict.method] = self.method_counts.get(verdict.method, 0) + 1
        return tid, verdict.category, verdict.confidence, verdict.is_failure

    def classify(self, masked: str, message: str, *, template_id: int | None = None) -> Classification:
        path = self.taxonomy.match_rule(message)
        if path is not None:
            return Classification(path, 1.0, "rule")
        path = self.taxonomy.match_template(masked)
        if path is not None:
            return Classification(path, 1.0, "template")
        verdict = self._by_template.get(template_id) if template_id is not None else None
        if verdict is None:
            verdict = _trained_model(self.taxonomy).classify(masked)
            if template_id is not None:
                self._by_template[template_id] = verdict
        return verdict


# A failure line while the run streams: the fields of Event but its incident, built
# as a cheap tuple; the frozen Event is made once, when the incident is known.
_Draft = namedtuple("_Draft", [f for f in Event.__dataclass_fields__ if f != "incident_id"])

_EMPTY = ("empty",)  # shape markers, compared by identity in the hot loop
_SLOW = ("slow",)
_EMPTY_ENTRY = (None, 0, 0, None, None, False, _EMPTY, None, False)
_SLOW_ENTRY = (None, 0, 0, None, None, False, _SLOW, None, False)


class _Shapes:
    """Shape key -> how to read lines of that shape, learned from each shape's first line.

    An entry is ``(convert, ts_start, ts_end, node_start, node_end, keeps_node,
    hit, msg_start, prefers_last_node)``: the slices and stamp converter of :class:`LineShape`, and
    the shape's verdict ``hit`` (None when the verdict depends on the numbers the
    mask keeps - those verdicts live in :attr:`by_numbers`). Every shape is
    checked on its first line against the full parser; a shape that disagrees
    is read slowly ever after, so the fast path never changes an answer.
    """

    def __init__(self, reader: LineReader):
        self.reader = reader
        self.known: dict[bytes, tuple] = {}
        self.by_numbers: dict[tuple, tuple] = {}

    def learn(self, key: bytes, file: str, lineno: int, text: str, read_slowly):
        reader = self.reader
        if not text.strip():
            reader.counters.empty += 1
            self._remember(key, _EMPTY_ENTRY)
            return None
        before_ts, before_node = reader.last_ts, reader.last_node
        shape = reader.shape(text)
        ts, node, message, hit = read_slowly(file, lineno, text)
        entry = _SLOW_ENTRY
        if shape is not None and self._agrees(shape, text, before_ts, before_node, ts, node, message):
            decisive = may_keep_numbers(message)
            if not decisive or shape.msg_start is not None:
                convert, ts_start, ts_end = (None, 0, 0) if shape.ts is None or shape.ts is False else shape.ts
                node_start, node_end = shape.node if shape.node is not None else (None, None)
                entry = (convert, ts_start, ts_end, node_start, node_end, shape.keeps_node,
                         None if decisive else hit, shape.msg_start, shape.prefers_last_node)
                if decisive:
                    self.by_numbers[(key, kept_numbers(text, shape.msg_start))] = hit
        self._remember(key, entry)
        return ts, node, hit

    def _remember(self, key: bytes, entry: tuple) -> None:
        if len(self.known) >= _SHAPE_CACHE_MAX:
            self.known.clear()
            self.by_numbers.clear()
        self.known[key] = entry

    @staticmethod
    def _agrees(shape: LineShape, text: str, before_ts, before_node, ts, node, message) -> bool:
        if shape.ts is None or shape.ts is False:
            want_ts = before_ts
        else:
            convert, start, end = shape.ts
            want_ts = convert(text[start:end])
            if want_ts is None:
                want_ts = before_ts
        if shape.node is None or (shape.prefers_last_node and before_node is not None):
            want_node = before_node
        else:
            want_node = text[shape.node[0]:shape.node[1]]
        if shape.msg_start is not None and text[shape.msg_start:] != message:
            return False
        return want_ts == ts and want_node == node


@dataclass(frozen=True)
class LogAnalysis:
    """Everything one run found; :meth:`to_dict` is the JSON report (docs/LOGS.md)."""

    events: tuple[Event, ...]
    incidents: tuple[Incident, ...]
    lemons: tuple[LemonNode, ...]
    line_categories: dict
    counters: InputCounters
    nodes: tuple[str, ...]
    first_timestamp: float | None
    last_timestamp: float | None
    rates: dict
    fits: dict
    job_projection: tuple[dict, ...]
    templates: dict
    classification_methods: dict
    options: AnalysisOptions

    def to_dict(self) -> dict:
        failures = {k: v for k, v in self.line_categories.items() if k not in (NORMAL, "unclassified")}
        return {
            "schema_version": SCHEMA_VERSION,
            "summary": {
                "lines": self.counters.lines,
                "failure_lines": sum(failures.values()),
                "normal_lines": self.line_categories.get(NORMAL, 0),
                "unclassified_lines": self.line_categories.get("unclassified", 0),
                "incidents": len(self.incidents),
                "nodes": len(self.nodes),
                "first_timestamp": self.first_timestamp,
                "last_timestamp": self.last_timestamp,
                "templates": len(self.templates),
            },
            "input": self.counters.to_dict(),
            "categories": dict(sorted(failures.items(), key=lambda kv: -kv[1])),
            "line_categories": dict(self.line_categories),
            "events": [e.to_dict() for e in self.events],
            "incidents": [i.to_dict() for i in self.incidents],
            "lemon_nodes": [n.to_dict() for n in self.lemons],
            "rates": self.rates,
            "fits": self.fits,
            "job_mttf": list(self.job_projection),
            "templates": {str(k): v for k, v in sorted(self.templates.items())},
            "classification_methods": dict(self.classification_methods),
            "options": {k: getattr(self.options, k) for k in self.options.__dataclass_fields__},
        }


def analyze_logs(paths: Iterable[str], *, taxonomy: Taxonomy | None = None, state_path: str | None = None,
                 options: AnalysisOptions = AnalysisOptions(),
                 progress: Callable[[int], None] | None = None) -> LogAnalysis:
    """Analyze the logs ``paths`` names (files, directories, globs, ``.gz``, ``-`` for stdin)."""
    taxonomy = taxonomy or load_taxonomy()
    store = TemplateStore(state_path=state_path)
    judge = TemplateJudge(taxonomy, store)
    counters = InputCounters()
    reader = LineReader(default_year=options.default_year, counters=counters)
    parse = reader.parse
    exact: dict[str, tuple] = {}
    by_mask: dict[str, tuple] = {}
    line_categories: dict[str, int] = {}
    nodes: set[str] = set()
    events: list[_Draft] = []

    def read_slowly(file: str, lineno: int, text: str):
        # Every step of the pipeline: failure lines, first lines of a shape, odd lines.
        ts, node, job, message, _source = parse(file, lineno, text)
        hit = exact.get(message)
        if hit is None:
            masked = mask(message)
            hit = by_mask.get(masked)
            if hit is None:
                if len(by_mask) >= _MASK_CACHE_MAX:
                    by_mask.clear()
                hit = by_mask[masked] = judge.judge(masked, message)
            if len(exact) < _EXACT_CACHE_MAX:
                exact[message] = hit
        if hit[3]:
            events.append(_Draft(file=file, line=lineno, timestamp=ts, node=node, job=job, category=hit[1],
                                 template_id=hit[0], confidence=hit[2], message=message[:500]))
        return ts, node, message, hit

    shapes = _Shapes(reader)
    known = shapes.known
    by_numbers = shapes.by_numbers
    lo, hi = float("inf"), float("-inf")
    seen = 0
    for file, first, texts, keys in iter_blocks(paths, counters=counters):
        if file != reader.current_file:
            reader.start_file(file)
        for lineno, text, key in zip(range(first, first + len(texts)), texts, keys):
            if text is None:
                continue
            shape = known.get(key)
            if shape is None:  # the first line of its shape: read slowly, and learn the shape
                learned = shapes.learn(key, file, lineno, text, read_slowly)
                if learned is None:
                    continue
                ts, node, hit = learned
            else:
                hit = shape[6]
                if hit is None:  # the category depends on the numbers the mask keeps ("Xid 79")
                    numbers = (key, kept_numbers(text, shape[7]))
                    hit = by_numbers.get(numbers)
                    if hit is None:
                        ts, node, _, hit = read_slowly(file, lineno, text)
                        if len(by_numbers) >= _SHAPE_CACHE_MAX:
                            by_numbers.clear()
                        by_numbers[numbers] = hit
                        shape = None
                elif hit is _EMPTY:
                    counters.empty += 1
                    continue
                if shape is None:
                    pass
                elif hit is _SLOW or (hit[3] and shape[7] is None):
                    ts, node, _, hit = read_slowly(file, lineno, text)
                else:  # a line of a known shape: slices and a cached stamp, no envelope regex, no mask
                    convert = shape[0]
                    if convert is None:
                        ts = reader.last_ts
                    else:
                        ts = convert(text[shape[1]:shape[2]])
                        if ts is None:
                            counters.bad_timestamp += 1
                            ts = reader.last_ts
                        else:
                            reader.last_ts = ts
                    if ts is None:
                        counters.no_timestamp += 1
                    if shape[3] is None or (shape[8] and reader.last_node is not None):
                        node = reader.last_node
                    else:
                        node = text[shape[3]:shape[4]]
                        if shape[5]:
                            reader.last_node = node
                    if hit[3]:
                        message = text[shape[7]:]
                        events.append(_Draft(file=file, line=lineno, timestamp=ts, node=node,
                                             job=reader.job_of(message), category=hit[1], template_id=hit[0],
                                             confidence=hit[2], message=message[:500]))
            category = hit[1]
            line_categories[category] = line_categories.get(category, 0) + 1
            if node is not None:
                nodes.add(node)
            if ts is not None:
                if ts < lo:
                    lo = ts
                if ts > hi:
                    hi = ts
            seen += 1
            if progress is not None and not seen & 0xFFFF:
                progress(seen)
    store.save()
    return _summarize(events, taxonomy=taxonomy, store=store, judge=judge, counters=counters,
                      line_categories=line_categories, nodes=nodes,
                      first=lo if lo != float("inf") else None, last=hi if hi != float("-inf") else None,
                      options=options)


def _summarize(events, *, taxonomy, store, judge, counters, line_categories, nodes, first, last,
               options) -> LogAnalysis:
    incidents, member = build_incidents(events, taxonomy=taxonomy, window_s=options.window_s)
    events = tuple(Event(*e, member[i]) for i, e in enumerate(events))
    span_s = (last - first) if first is not None and last is not None else 0.0
    fatal = sorted((i for i in incidents if i.fatal and i.start is not None), key=lambda i: i.start)
    rates = failure_rates(fatal_roots=[i.root_category for i in incidents if i.fatal],
                          nodes=len(nodes), span_s=span_s)
    gaps_h = np.diff([i.start for i in fatal]) / 3600.0 if len(fatal) > 1 else np.array([])
    fits = fit_interarrivals(gaps_h)
    projection = job_mttf_projection(
        failures=rates["failures"], node_hours=rates["node_days"] * 24.0, gpus_per_node=options.gpus_per_node,
        weibull=fits.get("weibull"), cluster_nodes=max(len(nodes), 1))
    lemons = lemon_nodes(incidents, nodes_seen=len(nodes), min_incidents=options.lemon_min_incidents,
                         p_threshold=options.lemon_p_value)
    used = {e.template_id for e in events}
    templates = {tid: store.template(tid) for tid in used}
    return LogAnalysis(
        events=events, incidents=tuple(incidents), lemons=tuple(lemons), line_categories=line_categories,
        counters=counters, nodes=tuple(sorted(nodes)), first_timestamp=first, last_timestamp=last,
        rates=rates, fits=fits, job_projection=tuple(projection), templates=templates,
        classification_methods=dict(judge.method_counts), options=options,
    )
