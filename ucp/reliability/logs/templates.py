"""Log parsing alone: the template of every line (``ucp logs templates``), as the benchmarks score it.

Each line is taken apart by the readers (envelope), its header is split off
(:func:`~ucp.reliability.logs.header.split_header`), its content is masked into
template tokens, and the run's distinct token sequences are mined into
templates (:class:`~ucp.reliability.logs.miner.TemplateMiner`) - the same steps
``ucp logs analyze`` uses, so both give a line the same template.

Example::

    report = parse_templates(["../shared/data/loghub/HDFS_2k.log"])
    report.to_dict()["templates"][0]   # {'id': 1, 'template': 'Receiving block <*> src: <*> dest: <*>', 'count': 292}
    report.lines[:3]                   # template id of the first three lines
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from dataclasses import dataclass

from ucp.reliability.logs.header import split_header
from ucp.reliability.logs.inputs import expand_paths, iter_line_blocks
from ucp.reliability.logs.masking import template_tokens
from ucp.reliability.logs.miner import TemplateMiner
from ucp.reliability.logs.readers import LineReader
from ucp.reliability.logs.records import InputCounters
from ucp.reliability.logs.template_state import TemplateSet

NO_TEMPLATE = 0  # the id of a line that was skipped (binary) or is blank


@dataclass(frozen=True)
class TemplateReport:
    """Templates of a run and the template id of every input line, in input order."""

    templates: TemplateSet
    lines: array  # unsigned ints, one per input line (NO_TEMPLATE for blank or binary lines)
    counters: InputCounters

    def to_dict(self) -> dict:
        """``{"templates": [{"id", "template", "count"}], "lines": [id, ...]}`` (docs/LOGS.md)."""
        return {"templates": [{"id": t.id, "template": t.text, "count": t.count} for t in self.templates
                              if t.count],
                "lines": self.lines.tolist()}


def parse_templates(paths: Iterable[str], *, known: TemplateSet | None = None,
                    default_year: int | None = None) -> TemplateReport:
    """Mine the templates of every line of the files ``paths`` names (files in their listed order)."""
    counters = InputCounters()
    reader = LineReader(default_year=default_year, counters=counters)
    index: dict[tuple, int] = {}  # token sequence -> position in ``order``
    order: list[tuple] = []
    counts: list[int] = []
    per_line = array("l")
    cache: dict[str, int] = {}
    for path in expand_paths(paths):
        counters.files += 1
        reader.start_file(path)
        for first, texts, _keys in iter_line_blocks(path, counters):
            if first == 1:
                reader.learn(texts)
            for lineno, text in enumerate(texts, start=first):
                if text is None or not text.strip():
                    per_line.append(-1)
                    continue
                _ts, _node, _job, message, _source = reader.parse(path, lineno, text)
                slot = cache.get(message)
                if slot is None:
                    tokens = template_tokens(split_header(message, components=reader.components)[1])
                    slot = index.get(tokens)
                    if slot is None:
                        slot = index[tokens] = len(order)
                        order.append(tokens)
                        counts.append(0)
                    if len(cache) < 500_000:
                        cache[message] = slot
                counts[slot] += 1
                per_line.append(slot)
    templates = known if known is not None else TemplateSet()
    ids = TemplateMiner(known=templates).fit(dict(zip(order, counts)))
    slot_ids = [ids[tokens] for tokens in order]
    lines = array("L", (NO_TEMPLATE if slot < 0 else slot_ids[slot] for slot in per_line))
    return TemplateReport(templates=templates, lines=lines, counters=counters)
