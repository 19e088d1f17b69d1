"""The map step: read one partition of the input and summarise it, ready to be merged.

A partition is a file or a byte range of a big plain file
(:func:`plan_partitions`; the ranges depend only on file sizes, never on how
many workers run, so any number of workers sees the same partitions). A scan
reads every line, parses it (:mod:`ucp.reliability.logs.readers`), masks it
(:func:`~ucp.reliability.logs.masking.mask`) and counts it under its masked key.
Each key is judged once, on its first line in the partition: header
(severity, content), template tokens, taxonomy rule, text evidence. Lines of
keys that may be failures are kept as drafts; every other line is only
counted. The reduce step (:mod:`ucp.reliability.logs.analyze`) decides.

Speed comes from *line shapes*: lines equal up to their ASCII digits parse
alike, so only the first line of each shape goes through the full reader and
masker; the rest are read by slicing (see :class:`_Shapes`).

Example::

    parts = plan_partitions(["/var/log/slurm"])
    scans = [scan_partition(p, taxonomy=load_taxonomy()) for p in parts]
"""

from __future__ import annotations

import gc
import os
from operator import itemgetter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from ucp.reliability.logs.detect import LineEvidence, line_evidence
from ucp.reliability.logs.header import split_header
from ucp.reliability.logs.inputs import expand_paths, is_compressed, iter_line_blocks, shape_key
from ucp.reliability.logs.masking import kept_spans, mask, may_keep_numbers, template_tokens
from ucp.reliability.logs.readers import LineReader, LineShape, job_span, rebuilt_message
from ucp.reliability.logs.records import InputCounters
from ucp.reliability.logs.taxonomy import NORMAL, Taxonomy

DEFAULT_SPLIT_BYTES = 256 << 20
MAX_KEY_NODES = 64  # nodes remembered per key: enough to tell "a few nodes" from "everywhere"
_MESSAGE_SHAPE_CACHE_MAX = 200_000
_SHAPE_CACHE_MAX = 200_000  # ~50 MB at most: GB-scale runs stay in bounded memory


@dataclass(frozen=True)
class Partition:
    """Lines of ``path`` that start in bytes [start, end) (the whole file when ``end`` is None)."""

    index: int
    path: str
    start: int = 0
    end: int | None = None


def plan_partitions(paths: Iterable[str], *, split_bytes: int = DEFAULT_SPLIT_BYTES) -> list[Partition]:
    """Partitions of every file ``paths`` names; plain files over ``split_bytes`` become byte ranges.

    >>> plan_partitions(["-"])
    [Partition(index=0, path='-', start=0, end=None)]
    """
    parts: list[Partition] = []
    for path in expand_paths(paths):
        size = 0
        if path != "-" and not is_compressed(path):
            try:
                size = os.path.getsize(path)
            except OSError:
                size = 0
        if size > split_bytes:
            for start in range(0, size, split_bytes):
                parts.append(Partition(len(parts), path, start, min(start + split_bytes, size)))
        else:
            parts.append(Partition(len(parts), path))
    return parts


@dataclass
class KeyInfo:
    """One masked key as seen in a partition: the verdicts of its first line and its counts.

    Mutable: the scan bumps ``count`` and adds ``nodes`` as lines stream in.
    """

    key: str  # the masked message
    message: str  # the first line's message: representative text, example
    first_line: int
    severity: int | None
    tokens: tuple[str, ...]  # template tokens of the content
    rule: str | None  # category of the taxonomy rule or template that matched, if any
    evidence: LineEvidence
    candidate: bool  # whether lines of this key are kept as drafts (may be failures)
    count: int = 0
    nodes: set = field(default_factory=set)


@dataclass
class PartialScan:
    """What one partition contributed; merged in partition order by the reduce step."""

    partition: Partition
    counters: InputCounters
    lines: int  # lines in the partition (for the line-number offset of later ranges of the file)
    nodes: set
    first_timestamp: float | None
    last_timestamp: float | None
    keys: dict  # masked key -> KeyInfo, in order of first sight
    drafts: list  # (file, line within partition, ts, node, job, key, message[:500]) of candidate keys


def judge_key(masked: str, message: str, *, taxonomy: Taxonomy, first_line: int, components: bool = True) -> KeyInfo:
    """Everything the text of one line says (run once per masked key); ``components``: see split_header."""
    severity, content = split_header(message, components=components)
    tokens = template_tokens(content)
    # Words are judged on the template text: words inside paths and values ("/Logs/CrashReporter") do not
    # count; error codes (HRESULT = 0x8..., status: 503) on the content, which still has its values.
    evidence = line_evidence(" ".join(tokens), severity=severity, raw=content)
    rule = taxonomy.match_rule(message)
    if rule is None:
        rule = taxonomy.match_template(masked)
    candidate = rule != NORMAL and (rule is not None or evidence.any)
    return KeyInfo(key=masked, message=message, first_line=first_line, severity=severity, tokens=tokens, rule=rule,
                   evidence=evidence, candidate=candidate)


_EMPTY = ("empty",)  # shape markers, compared by identity in the hot loop
_SLOW = ("slow",)
_EMPTY_ENTRY = (None, 0, 0, None, None, False, _EMPTY, None, False, None, None)
_SLOW_ENTRY = (None, 0, 0, None, None, False, _SLOW, None, False, None, None)


def _picker(spans: tuple[tuple[int, int], ...]):
    """A function from a line to the text at ``spans``, as one C call (a string for one span, a tuple for more)."""
    if not spans:
        return lambda text: ()
    return itemgetter(*(slice(a, b) for a, b in spans))


class _Shapes:
    """Shape key -> how to read lines of that shape, learned from each shape's first line.

    An entry is ``(convert, ts_start, ts_end, node_start, node_end, keeps_node,
    hit, message, prefers_last_node, kept, job)``: the slices and stamp converter of
    :class:`LineShape`, and the shape's key ``hit`` (None when the key depends on the numbers the
    mask keeps - those live in :attr:`by_numbers`, by ``kept(text)``, the text of the kept digits);
    ``job`` is where the message names a job (a span of the line; None: it names none). Every shape is checked on
    its first line against the full parser; a shape that disagrees is read
    slowly ever after, so the fast path never changes an answer.
    """

    def __init__(self, reader: LineReader):
        self.reader = reader
        self.known: dict[bytes, tuple] = {}
        self.by_numbers: dict[tuple, KeyInfo] = {}

    def learn(self, key: bytes, file: str, lineno: int, text: str, read_slowly):
        reader = self.reader
        if not text.strip():
            reader.counters.empty += 1
            self._remember(key, _EMPTY_ENTRY)
            return None
        before_ts, before_node = reader.last_ts, reader.last_node
        ts, node, message, hit, shape, kept = read_slowly(file, lineno, text, True)
        entry = _SLOW_ENTRY
        if shape is not None and self._agrees(shape, text, before_ts, before_node, ts, node, message):
            # Only digits the mask keeps make a shape's key depend on values; a shape's first line has them
            # exactly where all its lines do ("status" alone, with no number after it, keeps none).
            decisive = bool(kept)
            if not decisive or shape.msg_start is not None:  # kept digits are read from the message's text
                convert, ts_start, ts_end = (None, 0, 0) if shape.ts is None or shape.ts is False else shape.ts
                node_start, node_end = shape.node if shape.node is not None else (None, None)
                kept = _picker(kept_spans(text, shape.msg_start)) if decisive else None
                # where the message is: a start to slice from, or (loghub HPC) the spans it is rebuilt from
                where = shape.msg_start if shape.msg_start is not None else shape.msg_parts
                job = None
                if shape.msg_start is not None:  # the job's place, as for the stamp and the node (see job_span)
                    span = job_span(message)
                    job = None if span is None else (where + span[0], where + span[1])
                entry = (convert, ts_start, ts_end, node_start, node_end, shape.keeps_node,
                         None if decisive else hit, where, shape.prefers_last_node, kept, job)
                if decisive:
                    self.by_numbers[(key, kept(text))] = hit
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
        if shape.message_of(text) not in (None, message):
            return False
        return want_ts == ts and want_node == node


@contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for a block, then back as it was.

    A scan and the reduce step allocate millions of small objects (key infos,
    draft tuples, events) that all live until the report is built and form no
    cycles: every full collection walks all of them and frees nothing, which
    cost ~15% of a run. Reference counting still frees everything as usual.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def scan_partition(partition: Partition, *, taxonomy: Taxonomy, default_year: int | None = None) -> PartialScan:
    """Read one partition (see the module docstring); pure given the partition's bytes."""
    with gc_paused():
        return _scan(partition, taxonomy=taxonomy, default_year=default_year)


def _scan(partition: Partition, *, taxonomy: Taxonomy, default_year: int | None) -> PartialScan:
    counters = InputCounters(files=1 if partition.start == 0 else 0)
    reader = LineReader(default_year=default_year, counters=counters)
    parse = reader.parse_shaped
    by_message_shape: dict = {}  # message shape (+ kept digits) -> KeyInfo: messages equal but for digits
    keys: dict[str, KeyInfo] = {}
    nodes: set[str] = set()
    drafts: list[tuple] = []
    file = partition.path

    def read_slowly(file: str, lineno: int, text: str, want_shape: bool = False):
        # Every step of the pipeline: candidate lines, first lines of a shape, odd lines.
        ts, node, job, message, _source, shape = parse(file, lineno, text, want_shape=want_shape)
        kept = tuple(message[a:b] for a, b in kept_spans(message)) if may_keep_numbers(message) else ()
        shaped = (shape_key(message), kept) if kept else shape_key(message)
        hit = by_message_shape.get(shaped)
        if hit is None:
            masked = mask(message)
            hit = keys.get(masked)
            if hit is None:
                hit = keys[masked] = judge_key(masked, message, taxonomy=taxonomy, first_line=lineno,
                                               components=reader.components)
            if len(by_message_shape) >= _MESSAGE_SHAPE_CACHE_MAX:
                by_message_shape.clear()
            by_message_shape[shaped] = hit
        if hit.candidate:
            drafts.append((file, lineno, ts, node, job, hit.key, message[:500]))
        return ts, node, message, hit, shape, kept

    shapes = _Shapes(reader)
    known = shapes.known
    by_numbers = shapes.by_numbers
    lo, hi = float("inf"), float("-inf")
    lines = 0
    reader.start_file(file)
    file_job = reader.file_job
    for first, texts, line_keys in iter_line_blocks(file, counters, start=partition.start, end=partition.end):
        if first == 1:  # the envelope of this file (or byte range), from its first lines
            reader.learn(texts)
        lines = first + len(texts) - 1
        for lineno, text, key in zip(range(first, first + len(texts)), texts, line_keys):
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
                if hit is None:  # the key depends on the numbers the mask keeps ("Xid 79")
                    numbers = (key, shape[9](text))
                    hit = by_numbers.get(numbers)
                    if hit is None:
                        ts, node, _, hit, _, _ = read_slowly(file, lineno, text)
                        if len(by_numbers) >= _SHAPE_CACHE_MAX:
                            by_numbers.clear()
                        by_numbers[numbers] = hit
                        shape = None
                elif hit is _EMPTY:
                    counters.empty += 1
                    continue
                if shape is None:
                    pass
                elif hit is _SLOW or (hit.candidate and shape[7] is None):  # no message without the parser
                    ts, node, _, hit, _, _ = read_slowly(file, lineno, text)
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
                    if hit.candidate:
                        where = shape[7]
                        if where.__class__ is int:
                            message = text[where:]
                            job = shape[10]
                            job = file_job if job is None else text[job[0]:job[1]]
                        else:
                            message = rebuilt_message(text, where)
                            job = reader.job_of(message)
                        drafts.append((file, lineno, ts, node, job, hit.key, message[:500]))
            hit.count += 1
            if node is not None:
                nodes.add(node)
                if hit.candidate and len(hit.nodes) < MAX_KEY_NODES:
                    hit.nodes.add(node)
            if ts is not None:
                if ts < lo:
                    lo = ts
                if ts > hi:
                    hi = ts
    return PartialScan(partition=partition, counters=counters, lines=lines, nodes=nodes,
                       first_timestamp=lo if lo != float("inf") else None,
                       last_timestamp=hi if hi != float("-inf") else None, keys=keys, drafts=drafts)

