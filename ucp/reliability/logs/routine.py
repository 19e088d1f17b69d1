"""Routine recurring warnings: what one daemon repeats steadily, with nothing worse after it, is not a failure.

A monitoring daemon that cannot reach a data source says so on every poll
(ganglia's ``data_thread() got not answer from any [...] datasource``, every
few seconds for hours). Each line has a failure word, but the operator's
question - did something break? - is answered by what follows: nothing.
A template is *routine* when, over the run:

- its lines carry no error-or-worse level, no strong failure word
  ("failed", "panic", "i/o error") and no exception;
- it recurs from one source: at least :data:`MIN_LINES` timed lines, all
  from one node and one daemon (the message's header, ``gmetad[1682]:``,
  digits masked). Lines without a node are never routine: a log without host
  names may merge many machines, and a fault spreading over them is no
  daemon's routine;
- it is steady, not a burst: it lasts at least half an incident window, and
  lines fall in at least :data:`MIN_BUCKETS` of :data:`BUCKETS` equal slices
  of its span;
- nothing worse follows from that source: no line of it with an error-or-worse
  level, a strong failure word, an exception or a fatal taxonomy category
  between the template's first line and one incident window after its last.

Routine lines are counted as normal (classification method ``routine``);
any one condition failing leaves the template to the detector.

Example::

    routine = routine_templates(merged.drafts, merged.keys, template_of, taxonomy=taxonomy, window_s=900.0)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ucp.reliability.logs.header import ERROR, level_of, split_header
from ucp.reliability.logs.masking import mask
from ucp.reliability.logs.taxonomy import Taxonomy

MIN_LINES = 20
BUCKETS = 10
MIN_BUCKETS = 8


def _serious(info, taxonomy: Taxonomy) -> bool:
    evidence = info.evidence
    return bool(evidence.strong or evidence.exception
                or (evidence.severity is not None and evidence.severity >= ERROR)
                or (info.rule is not None and taxonomy.is_fatal(info.rule)))


def _daemon(message: str) -> str:
    """Who is speaking: the syslog tag among the first tokens ("gmetad[1682]:"), else the header in front of
    the content; level words left out (one daemon writes several levels), digits masked."""
    tokens = message.split(None, 4)[:4]
    for i, token in enumerate(tokens):
        if token.endswith(":"):
            head = tokens[:i + 1]
            break
    else:
        content = split_header(message)[1]
        at = message.rfind(content) if content else -1
        head = message[:at].split() if at > 0 else []
    return mask(" ".join(t for t in head if level_of(t, after_tag=True) is None))


def routine_templates(drafts: Sequence[tuple], keys: Mapping, template_of: Mapping, *, taxonomy: Taxonomy,
                      window_s: float) -> set[int]:
    """Ids of the templates whose lines are routine recurring warnings (see the module docstring).

    ``drafts`` are ``(file, line, ts, node, job, key, message)`` of the candidate lines,
    ``keys`` their :class:`~ucp.reliability.logs.scan.KeyInfo` by key, ``template_of`` key -> template id.
    """
    times: dict[int, list[float]] = {}
    sources: dict[int, set] = {}
    excluded: set[int] = set()
    serious: dict[tuple, list[tuple[float, int]]] = {}  # source -> (time, template) of its serious lines
    per_key: dict[str, tuple] = {}  # key -> (template, serious, daemon): lines of one key share them
    for _file, _line, ts, node, _job, key, message in drafts:
        known = per_key.get(key)
        if known is None:
            known = per_key[key] = (template_of[key], _serious(keys[key], taxonomy), _daemon(message))
        tid, is_serious, daemon = known
        if is_serious:
            if ts is not None:
                serious.setdefault((node, daemon), []).append((ts, tid))
            excluded.add(tid)  # a serious template is never routine
            continue
        if ts is None or node is None:
            excluded.add(tid)
            continue
        times.setdefault(tid, []).append(ts)
        sources.setdefault(tid, set()).add((node, daemon))
    routine = set()
    for tid, stamps in times.items():
        if tid in excluded or len(stamps) < MIN_LINES or len(sources[tid]) != 1:
            continue
        first, last = min(stamps), max(stamps)
        span = last - first
        if span < window_s / 2:
            continue
        filled = {min(int((ts - first) / span * BUCKETS), BUCKETS - 1) for ts in stamps}
        if len(filled) < MIN_BUCKETS:
            continue
        (source,) = sources[tid]
        if any(first <= ts <= last + window_s and other != tid for ts, other in serious.get(source, ())):
            continue
        routine.add(tid)
    return routine
