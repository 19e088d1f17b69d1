"""The pipeline: partitions -> scans (map) -> merge -> templates, detection, categories -> incidents -> metrics.

:mod:`ucp.reliability.logs.scan` reads each partition (a file or a byte range of
one) and counts its lines by masked key; this module merges the scans in
partition order and decides, once per key, with the whole run in view:

1. templates: the keys' template tokens are mined into templates
   (:mod:`ucp.reliability.logs.miner`), keeping the ids of a ``state_path`` file;
2. a key is a failure when a taxonomy rule says so, or when the detector
   (:mod:`ucp.reliability.logs.detect`: severity, failure words, template rarity
   and node spread) does; a rule for ``normal`` wins over the detector;
3. a failure key without a rule gets a category from the taxonomy's model
   when it is confident, else a *discovered* category
   (:mod:`ucp.reliability.logs.discover`) - never ``normal``;
4. failure lines become events; events fold into incidents; rates and fits follow.

Every step after the scans is a function of the merged scans, and the merge
follows partition order, so one worker or many give the same report.

Example::

    result = analyze_logs(["/var/log/slurm", "kern.log.gz"], state_path="templates.json")
    result.rates["failures_per_1000_node_days"], len(result.incidents)
    json.dump(result.to_dict(), open("report.json", "w"))
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields, replace
from functools import lru_cache, partial

import numpy as np

from ucp.reliability.logs.detect import Detector, TemplateStats
from ucp.reliability.logs.discover import MAX_OCCURRENCES, DiscoveredCategory, FlaggedTemplate, discover_categories
from ucp.reliability.logs.header import SEVERITY_NAMES
from ucp.reliability.logs.incidents import Incident, LemonNode, build_incidents, lemon_nodes
from ucp.reliability.logs.masking import mask
from ucp.reliability.logs.metrics import failure_rates, fit_interarrivals, job_mttf_projection
from ucp.reliability.logs.miner import TemplateMiner
from ucp.reliability.logs.parallel import run_in_process
from ucp.reliability.logs.records import Event, InputCounters, events_from
from ucp.reliability.logs.routine import routine_templates
from ucp.reliability.logs.scan import (DEFAULT_SPLIT_BYTES, PartialScan, gc_paused,
                                   plan_partitions, scan_partition)
from ucp.reliability.logs.taxonomy import NORMAL, Taxonomy, load_taxonomy
from ucp.reliability.logs.template_state import TemplateSet

SCHEMA_VERSION = 2


@dataclass(frozen=True)
class AnalysisOptions:
    """Knobs of one analysis; every field has a default that suits a GPU training cluster."""

    window_s: float = 900.0  # NCCL's default watchdog is 600 s: its timeouts land inside this
    lemon_min_incidents: int = 3
    lemon_p_value: float = 0.01
    gpus_per_node: int = 8
    default_year: int | None = None
    split_bytes: int = DEFAULT_SPLIT_BYTES  # plain files larger than this are read as several partitions


@lru_cache(maxsize=4)
def _trained_model(taxonomy: Taxonomy):
    # Read from the shipped file for the built-in taxonomy, fitted (~1 s) for any other; runs in one process
    # (tests, notebooks) share it.
    from ucp.reliability.logs.fitted import fitted_model  # sklearn only when needed

    return fitted_model(taxonomy, "categories")


@lru_cache(maxsize=4)
def _domain_model(taxonomy: Taxonomy):
    from ucp.reliability.logs.fitted import fitted_model

    return fitted_model(taxonomy, "domains")


@dataclass(frozen=True)
class KeyVerdict:
    """The decision on one masked key: its category and how it was reached."""

    category: str
    confidence: float
    method: str  # "rule", "template", "model", "detector" (discovered) or "none"
    discovered: bool = False

    @property
    def is_failure(self) -> bool:
        return self.category not in (NORMAL, "unclassified")


# A failure line before its incident is known: Event's fields but the last, as a cheap tuple.
_Draft = namedtuple("_Draft", [f.name for f in fields(Event) if f.name != "incident_id"])


@dataclass
class MergedScan:
    """The scans of all partitions folded together (partition order); mutable while merging."""

    counters: InputCounters = field(default_factory=InputCounters)
    nodes: set = field(default_factory=set)
    first: float | None = None
    last: float | None = None
    keys: dict = field(default_factory=dict)  # masked key -> KeyInfo of its first partition, counts summed
    drafts: list = field(default_factory=list)  # (file, line, ts, node, job, key, message)


def merge_scans(scans: Iterable[PartialScan]) -> MergedScan:
    """Fold scans in partition order: counters add, first sightings win, line numbers become per-file."""
    merged = MergedScan()
    offsets: dict[str, int] = {}
    for scan in sorted(scans, key=lambda s: s.partition.index):
        c = scan.counters
        for f in fields(InputCounters):
            old = getattr(merged.counters, f.name)
            new = old + getattr(c, f.name)
            setattr(merged.counters, f.name, list(dict.fromkeys(new)) if isinstance(new, list) else new)
        merged.nodes |= scan.nodes
        if scan.first_timestamp is not None:
            merged.first = scan.first_timestamp if merged.first is None else min(merged.first, scan.first_timestamp)
            merged.last = scan.last_timestamp if merged.last is None else max(merged.last, scan.last_timestamp)
        for key, info in scan.keys.items():
            known = merged.keys.get(key)
            if known is None:  # a copy: merging never changes the scans it is given
                merged.keys[key] = replace(info, nodes=set(info.nodes))
            else:
                known.count += info.count
                known.nodes |= info.nodes
                if info.candidate and not known.candidate:  # a rule that only the later text matched
                    known.candidate = True
        offset = offsets.get(scan.partition.path, 0)
        if offset:
            merged.drafts.extend((d[0], d[1] + offset, *d[2:]) for d in scan.drafts)
        else:
            merged.drafts.extend(scan.drafts)
        offsets[scan.partition.path] = offset + scan.lines
    return merged


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
    templates: dict  # id -> text of the templates of failure lines
    template_count: int  # templates known after the run (all lines)
    discovered: tuple[DiscoveredCategory, ...]
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
                "discovered_lines": sum(d.lines for d in self.discovered),
                "incidents": len(self.incidents),
                "nodes": len(self.nodes),
                "first_timestamp": self.first_timestamp,
                "last_timestamp": self.last_timestamp,
                "templates": self.template_count,
                "failure_templates": len(self.templates),
            },
            "input": self.counters.to_dict(),
            "categories": dict(sorted(failures.items(), key=lambda kv: (-kv[1], kv[0]))),
            "line_categories": dict(self.line_categories),
            "discovered_categories": [d.to_dict() for d in self.discovered],
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
                 options: AnalysisOptions = AnalysisOptions(), detector: Detector | None = None,
                 progress: Callable[[int, int], None] | None = None,
                 run: Callable | None = None) -> LogAnalysis:
    """Analyze the logs ``paths`` names (files, directories, globs, ``.gz``, ``-`` for stdin).

    ``run(partitions, scan)`` maps ``scan`` over the partitions and returns the
    scans (any order): :func:`ucp.reliability.logs.parallel.run_on_dask` runs them
    on a Dask cluster; the default runs them here, one after the other.
    ``progress(done, total)`` is called as partitions finish.
    """
    taxonomy = taxonomy or load_taxonomy()
    partitions = plan_partitions(paths, split_bytes=options.split_bytes)
    scan = partial(scan_partition, taxonomy=taxonomy, default_year=options.default_year)
    with gc_paused():
        scans = (run or run_in_process)(partitions, scan, progress=progress)
        known = TemplateSet.load(state_path) if state_path else TemplateSet()
        result = summarize(merge_scans(scans), taxonomy=taxonomy, templates=known, options=options,
                           detector=detector or Detector.load())
    if state_path:
        known.save(state_path)
    return result


def template_stats(merged: MergedScan, *, templates: TemplateSet) -> tuple[dict, dict]:
    """Mine the run's templates; per key its template id and per template its :class:`TemplateStats`."""
    token_counts: dict[tuple, int] = {}
    for info in merged.keys.values():
        token_counts[info.tokens] = token_counts.get(info.tokens, 0) + info.count
    ids_by_tokens = TemplateMiner(known=templates).fit(token_counts)
    template_of = {key: ids_by_tokens[info.tokens] for key, info in merged.keys.items()}
    lines_by_template: dict[int, int] = {}
    nodes_by_template: dict[int, set] = {}
    for key, info in merged.keys.items():
        tid = template_of[key]
        lines_by_template[tid] = lines_by_template.get(tid, 0) + info.count
        if info.candidate:
            nodes_by_template.setdefault(tid, set()).update(info.nodes)
    total_lines, total_nodes = max(merged.counters.lines, 1), len(merged.nodes)
    stats = {tid: TemplateStats(lines=n, nodes=len(nodes_by_template.get(tid, ())), total_lines=total_lines,
                                total_nodes=total_nodes) for tid, n in lines_by_template.items()}
    return template_of, stats


def decide(merged: MergedScan, *, taxonomy: Taxonomy, templates: TemplateSet,
           detector: Detector, window_s: float = 900.0) -> tuple[dict, dict, tuple[DiscoveredCategory, ...], dict]:
    """Per key: template id and verdict; plus the discovered categories and method counts."""
    template_of, stats_of = template_stats(merged, templates=templates)
    routine = routine_templates(merged.drafts, merged.keys, template_of, taxonomy=taxonomy, window_s=window_s)
    verdicts: dict[str, KeyVerdict] = {}
    methods: dict[str, int] = {}
    unknown: dict[int, list] = {}  # template id -> [(key, info, probability)] flagged without a category
    decided: list = []  # (key, info, verdict, or None with the detector's probability: the model decides)
    for key, info in merged.keys.items():
        tid = template_of[key]
        p = None
        if info.rule is not None:
            verdict = KeyVerdict(info.rule, 1.0, "rule")
        elif not info.candidate:
            verdict = KeyVerdict(NORMAL, 1.0, "none")
        elif tid in routine:
            verdict = KeyVerdict(NORMAL, 1.0, "routine")
        else:
            p = detector.probability(info.evidence, stats_of[tid])
            verdict = KeyVerdict(NORMAL, round(1.0 - p, 4), "detector") if p < detector.threshold else None
        decided.append((key, info, verdict, p))
    # The taxonomy's model for every flagged key at once (one sparse product, not one per key).
    asked = [info.key for _, info, verdict, _ in decided if verdict is None]
    guesses = iter(_trained_model(taxonomy).classify_many(asked) if asked else ())
    for key, info, verdict, p in decided:
        if verdict is None:
            guess = next(guesses)
            if guess.is_failure:
                verdict = KeyVerdict(guess.category, round(guess.confidence, 4), "model")
            else:
                unknown.setdefault(template_of[key], []).append((key, info, p))
        if verdict is not None:
            verdicts[key] = verdict
            methods[verdict.method] = methods.get(verdict.method, 0) + 1
    discovered = _discover(unknown, templates=templates, taxonomy=taxonomy, drafts=merged.drafts)
    for cat in discovered:
        for tid in cat.template_ids:
            for key, _info, p in unknown[tid]:
                verdicts[key] = KeyVerdict(cat.path, round(p, 4), "detector", discovered=True)
                methods["detector"] = methods.get("detector", 0) + 1
    return template_of, verdicts, tuple(discovered), methods


def _discover(unknown: dict, *, templates: TemplateSet, taxonomy: Taxonomy,
              drafts: list) -> list[DiscoveredCategory]:
    if not unknown:
        return []
    model = _domain_model(taxonomy)
    # When and where each template's lines fired: mined categories group templates that fire together.
    template_of_key = {key: tid for tid, members in unknown.items() for key, _, _ in members}
    occurrences: dict[int, list] = {}
    for _file, _line, ts, node, _job, key, _message in drafts:
        tid = template_of_key.get(key)
        if tid is not None and ts is not None and node is not None:
            seen = occurrences.setdefault(tid, [])
            if len(seen) < MAX_OCCURRENCES:
                seen.append((ts, node))

    def domain_of(text: str) -> tuple[str, float]:
        probs = model.probabilities(mask(text))
        best = int(probs.argmax())
        return model.classes[best], float(probs[best])

    flagged = []
    for tid, members in unknown.items():
        examples = tuple(dict.fromkeys(info.message for _, info, _ in members))[:5]
        nodes = sorted({n for _, info, _ in members for n in info.nodes})
        flagged.append(FlaggedTemplate(template_id=tid, text=templates.get(tid).text,
                                       lines=sum(info.count for _, info, _ in members), nodes=tuple(nodes),
                                       examples=examples, occurrences=tuple(sorted(occurrences.get(tid, ())))))
    return discover_categories(flagged, domain_of=domain_of, taken=(c.path for c in taxonomy.categories))


def summarize(merged: MergedScan, *, taxonomy: Taxonomy, templates: TemplateSet, options: AnalysisOptions,
              detector: Detector) -> LogAnalysis:
    """Decide every key, build events, incidents, rates and fits (the reduce step)."""
    template_of, verdicts, discovered, methods = decide(merged, taxonomy=taxonomy, templates=templates,
                                                        detector=detector, window_s=options.window_s)
    line_categories: dict[str, int] = {}
    for key, info in merged.keys.items():
        cat = verdicts[key].category
        line_categories[cat] = line_categories.get(cat, 0) + info.count
    # What every failure line of a key shares, worked out once per key rather than per line.
    stamps = {}
    for key, verdict in verdicts.items():
        if verdict.is_failure:
            severity = merged.keys[key].severity
            stamps[key] = (verdict.category, template_of[key], verdict.confidence,
                           None if severity is None else SEVERITY_NAMES[severity], verdict.discovered)
    drafts = [_Draft(file, line, ts, node, job, s[0], s[1], s[2], message, s[3], s[4])
              for file, line, ts, node, job, key, message in merged.drafts if (s := stamps.get(key)) is not None]
    incidents, member = build_incidents(drafts, taxonomy=taxonomy, window_s=options.window_s)
    events = events_from(drafts, member)
    first, last = merged.first, merged.last
    span_s = (last - first) if first is not None and last is not None else 0.0
    fatal = sorted((i for i in incidents if i.fatal and i.start is not None), key=lambda i: i.start)
    nodes = merged.nodes
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
    return LogAnalysis(
        events=events, incidents=tuple(incidents), lemons=tuple(lemons), line_categories=line_categories,
        counters=merged.counters, nodes=tuple(sorted(nodes)), first_timestamp=first, last_timestamp=last,
        rates=rates, fits=fits, job_projection=tuple(projection),
        templates={tid: templates.get(tid).text for tid in used}, template_count=len(templates),
        discovered=discovered,
        classification_methods=methods, options=options,
    )
