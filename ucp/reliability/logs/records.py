"""Plain data that flows through log analysis: one parsed line, counters of bad input.

Example::

    rec = LogRecord(file="kern.log", line=3, timestamp=1.7e9, node="gpu-07",
                    job=None, message="NVRM: Xid (PCI:0000:3b:00): 79, ...", source="syslog")
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields


@dataclass(frozen=True)
class LogRecord:
    """One log line after a reader took it apart.

    ``timestamp`` is POSIX seconds (UTC) or None when the line and its file
    gave none; ``line`` is 1-based; ``source`` names the reader that matched.
    """

    file: str
    line: int
    timestamp: float | None
    node: str | None
    job: str | None
    message: str
    source: str


@dataclass(frozen=True)
class Classification:
    """The taxonomy's verdict on one template: a category path and how it was reached."""

    category: str  # "hardware/gpu/xid-79", "normal" or "unclassified"
    confidence: float
    method: str  # "rule", "template", "model" or "threshold"

    @property
    def is_failure(self) -> bool:
        return self.category not in ("normal", "unclassified")


@dataclass(frozen=True)
class Event:
    """A failure-related line: what the JSON report lists under ``events``."""

    file: str
    line: int
    timestamp: float | None
    node: str | None
    job: str | None
    category: str
    template_id: int
    confidence: float
    message: str
    severity: str | None = None  # the level the line's header names ("error", "critical", ...), if any
    discovered: bool = False  # the category was mined from the logs, not taken from the taxonomy
    incident_id: int | None = None

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


_EVENT_FIELDS = tuple(f.name for f in fields(Event))


def events_from(rows: Iterable[tuple], incident_ids: Iterable[int | None]) -> tuple[Event, ...]:
    """``Event(*row, incident_id)`` for each row (Event's fields but the last) and its incident id.

    The same events as calling :class:`Event`, made without its frozen ``__init__``, which sets
    each of the 12 fields through ``object.__setattr__``: a log's tens of thousands of events
    took ~4% of a run there. Every field is given, and Event has no ``__post_init__``.
    """
    names, new, out = _EVENT_FIELDS, object.__new__, []
    for row, incident_id in zip(rows, incident_ids):
        event = new(Event)
        event.__dict__.update(zip(names, (*row, incident_id)))
        out.append(event)
    return tuple(out)


@dataclass
class InputCounters:
    """Mutable tallies of what the input stage saw, skipped or repaired.

    Mutable on purpose: the streaming reader bumps these per line, and a
    frozen copy per line would cost more than the parsing itself.
    """

    files: int = 0
    lines: int = 0
    binary_skipped: int = 0
    truncated: int = 0
    encoding_fallback: int = 0
    bad_timestamp: int = 0
    no_timestamp: int = 0
    empty: int = 0
    unreadable_files: list = field(default_factory=list)
    year_assumed: list = field(default_factory=list)  # files whose stamps carry no year: the year was assumed

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}
