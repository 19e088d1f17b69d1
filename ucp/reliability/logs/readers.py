"""Readers: take a log line apart into timestamp, node, job and message, auto-detecting the format.

A line is an *envelope* (the framing a logging system adds: syslog, Slurm's
``[ISO]``, Python logging, dmesg, loghub's HPC and Thunderbird columns,
OpenStack, Kubernetes event JSON) around a *message*. Each envelope is one
compiled regex; the reader tries the envelope that matched the file's previous
line first, so detection costs one regex per line in the common case. Fields
the envelope lacks (a node named inside a Slurm or NCCL message, a job id)
are then looked for in the message. A line that fits no envelope keeps its
whole text as the message and inherits the file's last timestamp and node,
which is what a traceback's continuation lines need. :meth:`LineReader.shape`
records where the fields of a line sit, so that lines of the same shape (equal
up to their digits) can be read by slicing instead of matching.

Example::

    reader = LineReader(default_year=2024)
    ts, node, job, message, source = reader.parse("kern.log", 1,
        "Jun 14 15:16:01 gpu-07 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, ...")
    assert (node, source) == ("gpu-07", "syslog")
"""

from __future__ import annotations

import calendar
import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone

from ucp.reliability.logs.envelope import Envelope, learn_envelope, learn_json
from ucp.reliability.logs.header import has_component_column, level_of
from ucp.reliability.logs.records import InputCounters, LogRecord

COMPONENT_SAMPLE = 500  # first lines of a file that decide whether its messages have a component column
_MONTHS = {m: i for i, m in enumerate(calendar.month_abbr) if m}
_ISO = r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?"
_ISO_PARTS = re.compile(r"(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)([.,]\d+)?(Z|[+-]\d\d:?\d\d)?$")

ENVELOPES: list[tuple[str, re.Pattern]] = [
    # loghub HPC: "<id> <node> <component> <event> <epoch> <flag> <message>"
    ("hpc", re.compile(r"(\d+) (\S+) (\S+) (\S+) (\d{9,10}) (-?\d+) (.*)")),
    # Blue Gene/L RAS (CFDR/loghub): "<label> <epoch> <yyyy.mm.dd> <location> <yyyy-mm-dd-hh.mm.ss.micro>
    # <location> RAS KERNEL FATAL <message>". The first field is the data set's alert label: never read.
    ("bluegene", re.compile(r"\S+ (\d{9,10}) \d{4}\.\d\d\.\d\d (\S+) \d{4}-\d\d-\d\d-\d\d\.\d\d\.\d\d\.\d+ \S+ (.*)")),
    # loghub Thunderbird, Spirit, Liberty: "<label> <epoch> <yyyy.mm.dd> <node> <Mon d hh:mm:ss> <node/node> <message>"
    # (the label is the data set's answer: never read)
    ("thunderbird", re.compile(r"(\S+) (\d{9,10}) \d{4}\.\d\d\.\d\d (\S+) \w{3} +\d+ \d\d:\d\d:\d\d \S+ (.*)")),
    # Slurm slurmctld/slurmd: "[2024-05-01T12:00:00.123] message"
    ("slurm", re.compile(r"\[(" + _ISO + r")\] (.*)")),
    # OpenStack (loghub): "<file> <yyyy-mm-dd hh:mm:ss.mmm> <pid> <LEVEL> <message>"
    ("openstack", re.compile(r"\S+\.log\S* (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+) \d+ (\w+ .*)")),
    # ISO-stamped: rsyslog high precision, Python logging, torchrun ("[ts] msg" or "ts msg")
    ("iso", re.compile(r"\[?(" + _ISO + r")\]?:? +(.*)")),
    # classic syslog / kern.log: "Jun 14 15:16:01 host message"
    ("syslog", re.compile(r"(\w{3}) +(\d{1,2}) (\d\d:\d\d:\d\d) (\S+) (.*)")),
    # dmesg -T: "[Mon Jun 14 15:16:01 2024] message"
    ("dmesg", re.compile(r"\[\w{3} (\w{3}) +(\d{1,2}) (\d\d:\d\d:\d\d) (\d{4})\] (.*)")),
    # plain dmesg: "[  123.456789] message" (seconds since boot: no wall-clock time)
    ("dmesg-relative", re.compile(r"\[ *\d+\.\d+\] (.*)")),
    # Kubernetes event JSON, one object per line
    ("kubernetes", re.compile(r"(\{.*\})\s*")),
]

# Which first characters (digit "0", letter "a", else itself) each envelope can start with; None: any.
_FIRST_CHARS: dict[str, str | None] = {
    "hpc": "0", "bluegene": None, "thunderbird": None, "slurm": "[", "openstack": "a0", "iso": "0[",
    "syslog": "a", "dmesg": "[", "dmesg-relative": "[", "kubernetes": "{",
}

# "host:pid:tid [dev] NCCL WARN ..." names the host; so does "[rank3]:[E ...]" context.
_NCCL_HOST = re.compile(r"(?:\[rank\d+\]:)?([A-Za-z][\w.-]*):\d+:\d+ \[\d+\]")
_MSG_NODE = re.compile(r"(?:\b[Nn]odes? |\bnode=|NodeList=|failure of node |[Hh]ost(?:name)?[=: ]+)([A-Za-z][\w-]*\d[\w.-]*)")
_MSG_JOB = re.compile(r"(?:JobId=|[Jj]ob[ _]?[Ii][Dd][=: ]+|SLURM_JOB_ID=|\b[Jj]ob |\bStepId=)(\d+)")
_PATH_JOB = re.compile(r"(?:slurm|job)[-_]?(\d+)", re.IGNORECASE)
_SYSLOG_TAG = re.compile(r"[\w./()-]+(?:\[\d+\])?:")


def _utc(year: int, month: int, day: int, hour: int, minute: int, second: int) -> float:
    return float(calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0)))


@dataclass(frozen=True)
class LineShape:
    """How to read every line of one shape: spans instead of regexes (see :meth:`LineReader.shape`).

    ``ts`` is None (no envelope: inherit the file's last stamp), False (an
    envelope without wall-clock time) or ``(convert, start, end)``; ``node``
    is a span or None (inherit the file's last node); ``msg_start`` is where
    the message starts (None when the envelope rebuilds it, as loghub HPC does:
    then ``msg_parts`` holds the spans it is rebuilt from, see :func:`rebuilt_message`).
    """

    source: str
    ts: tuple | bool | None
    node: tuple[int, int] | None
    msg_start: int | None
    keeps_node: bool  # the node read becomes the file's last node (not for Slurm's controller log)
    prefers_last_node: bool = False  # no envelope: the file's last node wins over one in the message
    msg_parts: tuple[int, int, int, int, int] | None = None

    def message_of(self, text: str) -> str | None:
        """The message of a line of this shape (None when the shape cannot say)."""
        if self.msg_start is not None:
            return text[self.msg_start:]
        return None if self.msg_parts is None else rebuilt_message(text, self.msg_parts)


def rebuilt_message(text: str, parts: tuple[int, int, int, int, int]) -> str:
    """loghub HPC's message: component and event as a bracketed context, then the text."""
    a, b, c, d, e = parts
    return f"[{text[a:b]} {text[c:d]}] {text[e:]}"


class _StampCache:
    """Timestamp text -> POSIX seconds, cached per hour: the minute and second are integer slicing.

    A log repeats an hour many times, even merged from several machines or
    read out of order (a per-minute cache missed on ~40% of a merged log's
    stamps). Whole seconds are exact in a float, so the hour's start plus
    the minute and second is the value the full parser gives; a fraction is
    added last, as the full parser adds it, so the result is bit for bit the same.
    """

    def __init__(self, reader: "LineReader"):
        self._reader = reader
        self._iso_hours: dict[str, float | None] = {}
        self._syslog_hours: dict[str, float | None] = {}

    def iso(self, text: str) -> float | None:
        # "2024-05-01T12:34:56[.123]": hour "2024-05-01T12"
        hour = text[:13]
        base = self._iso_hours.get(hour, -1.0)
        if base == -1.0:
            base = self._reader._iso(hour + ":00:00") if len(text) >= 19 and text[13:14] == ":" else None
            if len(self._iso_hours) > 100_000:
                self._iso_hours.clear()
            self._iso_hours[hour] = base
        clock = text[14:19]
        tail = text[19:]
        if base is None or clock[2:3] != ":" or not clock[:2].isdigit() or not clock[3:].isdigit() \
                or (tail and tail[0] not in ".,"):
            return self._reader._iso(text)  # odd seconds, time zones, bad dates: the full parser
        minute, second = int(clock[:2]), int(clock[3:])
        if minute > 59 or second > 60:
            return None
        if not tail:
            return base + minute * 60 + second
        if tail[1:].isdigit():
            return base + minute * 60 + second + float("0." + tail[1:])
        return self._reader._iso(text)

    def syslog(self, text: str) -> float | None:
        # "Jun 14 15:16:01" or "Jun  3 15:16:01": hour "Jun 14 15"
        hour = text[:-6]
        base = self._syslog_hours.get(hour, -1.0)
        if base == -1.0:
            mon, day, hh = hour.split()
            base = self._reader._month_day(mon, day, hh + ":00:00", self._reader.default_year)
            if len(self._syslog_hours) > 100_000:
                self._syslog_hours.clear()
            self._syslog_hours[hour] = base
        minute, second = text[-5:-3], text[-2:]
        if base is None or not minute.isdigit() or not second.isdigit():
            return None
        minute, second = int(minute), int(second)
        if minute > 59 or second > 60:
            return None
        return base + minute * 60 + second


class LineReader:
    """Parses lines into ``(timestamp, node, job, message, source)`` with per-file context.

    One instance per analysis run; it remembers, per file, the envelope that
    matched last and the last timestamp and node seen (for continuation lines).
    ``default_year`` fills in syslog stamps, which carry none.
    """

    def __init__(self, *, default_year: int | None = None, counters: InputCounters | None = None,
                 now: float | None = None):
        self.year_given = default_year is not None
        self.now = now  # "now" for stamps without a year (None: the clock); tests pin it
        self.default_year = default_year or datetime.fromtimestamp(
            now if now is not None else datetime.now(timezone.utc).timestamp(), timezone.utc).year
        self._learned: list = []  # envelopes learned from the current file's first lines (see learn())
        self.counters = counters if counters is not None else InputCounters()
        self._day_cache: dict[tuple[int, int, int], float | None] = {}
        self.current_file: str | None = None
        self._file_job: str | None = None
        self.components = True  # the last parsed line's source names a component after its level
        self._components: dict = {}  # envelope index -> whether its messages have a component column
        self.last_ts: float | None = None
        self.last_node: str | None = None
        # Candidate envelopes by the line's first character, most recently matched first.
        self._orders: dict[str, list[int]] = {}
        self._handlers: list[Callable] = [getattr(self, "_env_" + name.replace("-", "_")) for name, _ in ENVELOPES]
        self._stamp = _StampCache(self)

    # -- timestamps (cached: logs repeat the same second many times) -----------------
    def _day(self, year: int, month: int, day: int) -> float | None:
        key = (year, month, day)
        base = self._day_cache.get(key, -1.0)
        if base == -1.0:
            try:
                datetime(year, month, day)  # validates the calendar date
                base = _utc(year, month, day, 0, 0, 0)
            except ValueError:
                base = None
            if len(self._day_cache) > 100_000:
                self._day_cache.clear()
            self._day_cache[key] = base
        return base

    def _iso(self, text: str) -> float | None:
        # Midnight of each date is cached; the time of day is integer slicing.
        # A stamp in a random order (merged logs) then costs no datetime parse.
        try:
            base = self._day(int(text[0:4]), int(text[5:7]), int(text[8:10]))
            hour, minute, second = int(text[11:13]), int(text[14:16]), int(text[17:19])
        except ValueError:
            return None
        if base is None or hour > 23 or minute > 59 or second > 60:
            return None
        ts = base + hour * 3600 + minute * 60 + second
        tail = text[19:]
        if not tail:
            return ts
        if tail[0] in ".," and tail[1:].isdigit():  # the common case, without a regex
            return ts + float("0." + tail[1:])
        m = _ISO_PARTS.match(text)
        if m is None:
            return None
        if m.group(7):
            ts += float("0." + m.group(7)[1:])
        tz = m.group(8)
        if tz and tz != "Z":
            sign = -1 if tz[0] == "+" else 1  # 10:00+02:00 is 08:00 UTC
            digits = tz[1:].replace(":", "")
            ts += sign * (int(digits[:2]) * 3600 + int(digits[2:4]) * 60)
        return ts

    def _month_day(self, mon: str, day: str, hms: str, year: int) -> float | None:
        month = _MONTHS.get(mon)
        if month is None:
            return None
        try:
            base = self._day(year, month, int(day))
            hour, minute, second = int(hms[0:2]), int(hms[3:5]), int(hms[6:8])
        except ValueError:
            return None
        if base is None or hour > 23 or minute > 59 or second > 60:
            return None
        return base + hour * 3600 + minute * 60 + second

    # -- envelopes: each returns (timestamp, node, message) or None --------------------
    def _env_hpc(self, m):
        # component and event as a bracketed context: "[node status] not responding"
        return float(m.group(5)), m.group(2), rebuilt_message(m.string, (*m.span(3), *m.span(4), m.start(7)))

    def _env_bluegene(self, m):
        return float(m.group(1)), m.group(2), m.group(3)

    def _env_thunderbird(self, m):
        return float(m.group(2)), m.group(3), m.group(4)

    def _env_slurm(self, m):
        return self._iso(m.group(1)), None, m.group(2)

    def _env_openstack(self, m):
        return self._iso(m.group(1)), None, m.group(2)

    def _env_iso(self, m):
        rest = m.group(2)
        host, _, after = rest.partition(" ")
        # rsyslog: "ts host tag: msg"; Python logging: "ts LEVEL msg" (no host)
        if after and _SYSLOG_TAG.match(after) and not host.isupper():
            return self._iso(m.group(1)), host, after
        return self._iso(m.group(1)), None, rest

    def _env_syslog(self, m):
        if m.group(1) not in _MONTHS:
            return None
        ts = self._month_day(m.group(1), m.group(2), m.group(3), self.default_year)
        if not self.year_given and ts is not None:
            now = self.now if self.now is not None else datetime.now(timezone.utc).timestamp()
            if ts > now + 86400:  # no year in the stamp, none given: not in the future, the year before
                ts = self._month_day(m.group(1), m.group(2), m.group(3), self.default_year - 1)
            if self.current_file not in self.counters.year_assumed:
                self.counters.year_assumed.append(self.current_file)
        return ts, m.group(4), m.group(5)

    def _env_dmesg(self, m):
        return self._month_day(m.group(1), m.group(2), m.group(3), int(m.group(4))), None, m.group(5)

    def _env_dmesg_relative(self, m):
        return False, None, m.group(1)

    def _env_kubernetes(self, m):
        try:
            obj = json.loads(m.group(1))
        except ValueError:
            return None
        if not isinstance(obj, dict) or not ("reason" in obj or obj.get("kind") == "Event"):
            return None
        involved = obj.get("involvedObject") or {}
        meta = obj.get("metadata") or {}
        stamp = obj.get("lastTimestamp") or obj.get("eventTime") or obj.get("firstTimestamp") \
            or meta.get("creationTimestamp")
        ts = self._iso(str(stamp)) if stamp else False
        node = (obj.get("source") or {}).get("host")
        if involved.get("kind") == "Node":
            node = involved.get("name") or node
        message = f"{obj.get('reason', '')}: {obj.get('message', '')} ({involved.get('kind', '')})"
        if obj.get("type") == "Warning":  # the event's severity, read as a level by the header parser
            message = f"Warning {message}"
        return ts, node, message

    # -- the public surface ------------------------------------------------------------
    def start_file(self, file: str) -> None:
        self.current_file = file
        self._learned = []
        m = _PATH_JOB.search(file)
        self._file_job = m.group(1) if m else None
        self.last_ts = None
        self.last_node = None
        self._components = {}
        self.components = True

    def learn(self, texts: list) -> None:
        """Learn the current file's envelopes from its first lines (:mod:`ucp.reliability.logs.envelope`).

        Up to three: the one most lines share, then one among the lines that
        do not fit it, and so on (several formats in one file). Lines that fit
        none are read by the fixed envelopes below.
        """
        lines = [t for t in texts[:2000] if t]
        year = self.default_year if self.year_given else None
        learned: list = []
        record = learn_json(lines, year=year)
        if record is not None:
            inner = learn_envelope([s[3] for s in map(record.split, lines) if s is not None], year=year,
                                   now=self.now)
            learned.append((record, inner))
            lines = [t for t in lines if record.split(t) is None]
        for _ in range(3):
            env = learn_envelope(lines, year=year, now=self.now)
            if env is None:
                break
            learned.append(env)
            lines = [t for t in lines if env.split(t) is None]
        for env in learned:
            envelope = env[1] if isinstance(env, tuple) else env
            if envelope is not None and envelope.year_assumed and self.current_file not in self.counters.year_assumed:
                self.counters.year_assumed.append(self.current_file)
        self._learned = learned
        # Whether each source's messages carry a component column after their level (header.py); a source is
        # the envelope that takes its lines (a file may mix several).
        by_envelope: dict = {}
        for text in texts[:COMPONENT_SAMPLE]:
            if text:
                idx, _, result = self._envelope(text, learn=False)
                by_envelope.setdefault(idx, []).append(text if result is None else result[2])
        self._components = {idx: has_component_column(messages) for idx, messages in by_envelope.items()}

    def _learned_split(self, text: str):
        """``(k, match or None, (ts, node, message))`` of the first learned envelope ``text`` fits."""
        for k, env in enumerate(self._learned):
            if isinstance(env, Envelope):
                m = env.regex.match(text)
                if m is None:
                    continue
                stamp = m.group("ts")
                ts = env.convert(stamp) if stamp else False
                return k, m, (ts, m.group("host") or None, text[m.start("msg"):] if m.group("msg") else "")
            record, inner = env
            found = record.split(text)
            if found is None:
                continue
            ts, host, level, message = found
            if inner is not None:
                peeled = inner.split(message)
                if peeled is not None:
                    stamp, inner_host, message = peeled
                    if ts is None and stamp:
                        ts = inner.convert(stamp)
                    host = inner_host or host
            if level is not None and level_of(level.upper()) is not None:
                message = f"{level.upper()} {message}"  # the record's level, read as one by the header parser
            return k, None, (ts if ts is not None else False, host, message)
        return None

    def _order_for(self, first: str) -> list[int]:
        # Characters of one class share one list, so move-to-front learns per class.
        key = "0" if first.isdigit() else ("a" if first.isalpha() else first)
        order = self._orders.get(key)
        if order is None:
            order = self._orders[key] = [i for i, (name, _) in enumerate(ENVELOPES)
                                         if _FIRST_CHARS[name] is None or key in _FIRST_CHARS[name]]
        self._orders[first] = order
        return order

    def _envelope(self, text: str, *, learn: bool = True):
        """``(index, match, fields)`` of the first envelope that takes ``text``, or ``(None, None, None)``."""
        if self._learned:
            found = self._learned_split(text)
            if found is not None:
                return -1 - found[0], found[1], found[2]
        first = text[:1]
        order = self._orders.get(first)
        if order is None:
            order = self._order_for(first)
        for i, idx in enumerate(order):
            m = ENVELOPES[idx][1].fullmatch(text)
            if m is not None:
                result = self._handlers[idx](m)
                if result is not None:
                    if i and learn:  # this format first next time
                        order.insert(0, order.pop(i))
                    return idx, m, result
        return None, None, None

    # -- shapes: lines that differ only in their digits are read alike -----------------
    def shape(self, text: str) -> "LineShape | None":
        """How to re-read any line shaped like ``text`` (same text up to its ASCII digits), or None.

        Every envelope and message regex here tests digits by class (``\\d``),
        never by value, so lines that share :func:`~ucp.reliability.logs.inputs.shape_key`
        match the same envelope with the same group spans. The shape records
        those spans; re-reading a line is then slicing plus a cached timestamp
        conversion. Kubernetes JSON and rare envelopes give None (parse each line).
        """
        idx, m, _ = self._envelope(text, learn=False)
        return self._shape_of(idx, m, text)

    def _shape_of(self, idx: int | None, m, text: str) -> "LineShape | None":
        if idx is not None and idx < 0:
            if m is None:  # a JSON record: its message is rebuilt, not a slice
                return None
            env = self._learned[-1 - idx]
            # the layout's own converter (Envelope.convert only adds a call when there is one)
            convert = env.convert if env.layout is None else env.layout.convert
            ts = (convert, *m.span("ts")) if m.group("ts") else False
            node = m.span("host") if m.group("host") else None
            return LineShape(source="learned", ts=ts, node=node, msg_start=m.start("msg") if m.group("msg") else
                             len(text), keeps_node=True, prefers_last_node=False)
        name = "generic" if idx is None else ENVELOPES[idx][0]
        stamp = self._stamp
        parts = None
        if name == "generic":
            ts, node, msg_start = None, None, 0
        elif name in ("hpc", "thunderbird", "bluegene"):
            group = {"hpc": 5, "thunderbird": 2, "bluegene": 1}[name]
            ts = (float, m.start(group), m.end(group))
            node = m.span({"hpc": 2, "thunderbird": 3, "bluegene": 2}[name])
            msg_start = None if name == "hpc" else m.start(4 if name == "thunderbird" else 3)
            if name == "hpc":
                parts = (*m.span(3), *m.span(4), m.start(7))
        elif name in ("slurm", "openstack"):
            ts, node, msg_start = (stamp.iso, *m.span(1)), None, m.start(2)
        elif name == "iso":
            ts, node, msg_start = (stamp.iso, *m.span(1)), None, m.start(2)
            host, _, after = m.group(2).partition(" ")
            if after and _SYSLOG_TAG.match(after) and not host.isupper():
                node, msg_start = (m.start(2), m.start(2) + len(host)), m.start(2) + len(host) + 1
        elif name == "syslog":
            ts, node, msg_start = (stamp.syslog, m.start(1), m.end(3)), m.span(4), m.start(5)
        elif name == "dmesg-relative":
            ts, node, msg_start = False, None, m.start(1)
        else:
            return None
        if msg_start is not None and (node is None or name == "slurm"):
            message = text[msg_start:]
            found = _NCCL_HOST.match(message)
            if found is None and ("node" in message or "Node" in message or "ost" in message):
                found = _MSG_NODE.search(message)
            if found is not None:
                node = (msg_start + found.start(1), msg_start + found.end(1))
        elif msg_start is None and node is None:
            return None
        return LineShape(source=name, ts=ts, node=node, msg_start=msg_start, keeps_node=name != "slurm",
                         prefers_last_node=name == "generic", msg_parts=parts)

    def parse(self, file: str, lineno: int, text: str):
        """``(timestamp, node, job, message, source)`` for one line of ``file``."""
        return self.parse_shaped(file, lineno, text, want_shape=False)[:5]

    def parse_shaped(self, file: str, lineno: int, text: str, *, want_shape: bool = True):
        """:meth:`parse`'s tuple plus the line's :meth:`shape` (None if it has none), from one envelope match."""
        if file != self.current_file:
            self.start_file(file)
        idx, m, result = self._envelope(text)
        self.components = self._components.get(idx, True)
        shape = self._shape_of(idx, m, text) if want_shape else None
        counters = self.counters
        if result is None:
            source = "generic"
            ts, node, message = self.last_ts, self.last_node, text
        else:
            source = ENVELOPES[idx][0] if idx >= 0 else "learned"
            ts, node, message = result
            if ts is None:
                counters.bad_timestamp += 1
                ts = self.last_ts
            elif ts is False:
                ts = self.last_ts
            else:
                self.last_ts = ts
        if ts is None:
            counters.no_timestamp += 1
        if node is None or source == "slurm":
            m = _NCCL_HOST.match(message)
            if m is None and ("node" in message or "Node" in message or "ost" in message):
                m = _MSG_NODE.search(message)
            if m is not None:
                node = m.group(1)
            elif node is None:
                node = self.last_node
        if node is not None and source != "slurm":
            self.last_node = node
        return ts, node, self.job_of(message), message, source, shape

    def job_of(self, message: str) -> str | None:
        """The job id a message names (``JobId=``, ``StepId=``...), else the one in the file's name."""
        span = job_span(message)
        return self._file_job if span is None else message[span[0]:span[1]]

    @property
    def file_job(self) -> str | None:
        """The job id the current file's name holds (``slurm-1234.out``), if any."""
        return self._file_job


def job_span(message: str) -> tuple[int, int] | None:
    """Where the job id a message names sits (``JobId=``, ``StepId=``...), or None.

    The pattern reads digits by class, so messages equal up to their digits have it at one place.
    """
    if "ob" in message or "tepId" in message or "JOB_ID" in message:
        m = _MSG_JOB.search(message)
        if m is not None:
            return m.span(1)
    return None


def parse_lines(lines: Iterable[tuple[str, int, str]], *, default_year: int | None = None,
                counters: InputCounters | None = None) -> Iterator[LogRecord]:
    """:class:`LogRecord` for each ``(file, line, text)``; convenient, slower than the raw tuples.

    >>> recs = list(parse_lines([("x.log", 1, "[2024-05-01T00:00:00] error: Nodes gpu-3 not responding")]))
    >>> (recs[0].node, recs[0].source)
    ('gpu-3', 'slurm')
    """
    reader = LineReader(default_year=default_year, counters=counters)
    for file, lineno, text in lines:
        ts, node, job, message, source = reader.parse(file, lineno, text)
        yield LogRecord(file=file, line=lineno, timestamp=ts, node=node, job=job,
                        message=message, source=source)
