"""Envelopes learned from the data: which leading fields of a source's lines are framing, not message.

No list of known formats: the leading whitespace- (or ``|``-) separated
columns of a sample of one source's lines are classed by what they hold in
at least 90% of the lines - a time (digits with separators, a month or
weekday name, seconds since the epoch, a column of valid compact dates), a
level word, a syslog priority ``<13>``, a number (pid, thread, sequence), a
lone dash - or nothing in common. The envelope is the longest run of leading
columns that ends in a time, level or priority column (the *strong* ones),
extended by the numbers, dashes and flags that follow, and by a host column
where the next column is a ``tag:``. Stacked envelopes (a forwarder's stamp
and host in front of the original line's own stamp and host) are one longer
run, peeled in one pass: the innermost host is kept (the origin, not the
relay), the most complete stamp is kept (one with a year over one without).

What the envelope says is kept: the stamp (its layout learned by
:mod:`ucp.reliability.logs.stamps`), the host, and the level, which stays in
front of the message when it is the envelope's last column so that the
header parser reads it as the line's severity. A line that does not fit the
learned envelope (a traceback line, a second format in the same file) is
left to the other readers.

JSON lines are read as records: the message, time, host and level fields by
their usual names; the message may itself carry an envelope (Docker's
``log`` field holds the container's line), which is learned over the
messages the same way.

Example::

    >>> env = learn_envelope(["2016/05/01 00:00:%02d.000 mgmt-alpha app[4000] INFO job %d started" % (i, i)
    ...                       for i in range(10)])
    >>> env.split("2016/05/01 00:00:09.000 mgmt-alpha app[4000] INFO job 9 started")[2]
    'INFO job 9 started'
"""

from __future__ import annotations

import json
import math
import re
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from ucp.reliability.logs.header import level_of
from ucp.reliability.logs.stamps import StampLayout, learn_layout

MAX_COLUMNS = 14  # how far into a line an envelope may reach
MIN_SHARE = 0.9  # share of sample lines a column's class must hold in
SAMPLE_LINES = 2000  # lines a source's envelope is learned from
MIN_LINES = 8  # fewer sample lines than this: too few to tell framing from message
_TOKEN = re.compile(r"[^\s|]+")
_DIGITS = re.compile(r"\d+")
_SEP = r"(?:[ \t]*\|[ \t]*|[ \t]+)"
_NAMES = ("jan feb mar apr may jun jul aug sep oct nov dec mon tue wed thu fri sat sun").split()
_NAME = re.compile(r"[\[(]?(?:" + "|".join(n.title() for n in _NAMES) + r")[\])]?,?")
_TIMEISH = re.compile(r"[\[(]?\d{1,8}(?:[-/.:T_,]\d{1,9})+(?:Z|[+-]\d\d:?\d\d)?[\])]?[,:]?"
                      r"|[\[(]?\d\d?/[A-Z][a-z]{2}/\d{4}(?::\d\d){0,3}[\])]?|[+-]\d{4}[\])]?")
_IPV4 = re.compile(r"[\[(]?\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?[\])]?[,:]?")
_NUMBER = re.compile(r"[\[(<]?[-+]?\d+[\])>]?[:,]?")
_PRI = re.compile(r"<\d{1,3}>\d?")
_DASH = re.compile(r"[^\w\s]{1,2}")
_HOSTLIKE = re.compile(r"[A-Za-z0-9][\w.-]*")
_TAG = re.compile(r"\S+:")
_JSON_MESSAGE = ("message", "msg", "log", "MESSAGE", "text", "short_message", "body", "Message")
_JSON_TIME = ("time", "timestamp", "@timestamp", "ts", "date", "datetime", "eventTime", "__REALTIME_TIMESTAMP")
_JSON_HOST = ("host", "hostname", "node", "nodename", "_HOSTNAME", "Hostname")
_JSON_LEVEL = ("level", "severity", "lvl", "loglevel", "levelname", "PRIORITY", "Level")
STRONG = frozenset("TELP")
# The two output streams a container runtime or shipper names (CRI, Docker, fluentd): a flag, never a host.
_STREAMS = frozenset(("stdout", "stderr"))


def token_class(token: str) -> str:
    """One column value's class: T time, E epoch, L level, P priority, N number, D dash or flag, H host-like, W word.

    >>> [token_class(t) for t in ("2016-05-01", "Jun", "1131566461", "INFO", "<13>1", "4000", "-", "stdout", "dn228",
    ...                           "ok:")]
    ['T', 'T', 'E', 'L', 'P', 'N', 'D', 'D', 'H', 'W']
    """
    if _NAME.fullmatch(token):
        return "T"
    if token[:1].isdigit() or token[:1] in "[(<+-":
        if _PRI.fullmatch(token):
            return "P"
        digits = token.strip("[](),:")
        if digits.isdigit() and len(digits) in (10, 13) and token == digits:
            return "E"
        if _IPV4.fullmatch(token):
            return "H"
        if _NUMBER.fullmatch(token):
            return "N"
        if _TIMEISH.fullmatch(token):
            return "T"
    if _DASH.fullmatch(token) or token in _STREAMS:
        return "D"
    if level_of(token) is not None:
        return "L"
    if len(token) == 1 and token.isupper():
        return "L"  # logcat's "D", the CRI "F" flag: one upper-case letter in a column of them
    return "H" if _HOSTLIKE.fullmatch(token) else "W"


@dataclass(frozen=True)
class Envelope:
    """A learned envelope: a regex for its columns, and where its stamp, host and message are."""

    regex: re.Pattern
    columns: tuple[str, ...]  # classes, for reports and tests
    layout: StampLayout | None
    year_assumed: bool  # the stamps carry no year and none was given: the year was chosen, not read

    def split(self, text: str) -> tuple[str | None, str | None, str] | None:
        """``(stamp text, host, message)`` of a line that fits, else None."""
        m = self.regex.match(text)
        if m is None:
            return None
        return m.group("ts"), m.group("host"), text[m.start("msg"):]

    def convert(self, stamp: str) -> float | None:
        return None if self.layout is None else self.layout.convert(stamp)


def _column_kinds(rows: list[list[str]]) -> list[str]:
    kinds = []
    for c in range(MAX_COLUMNS):
        values = [row[c] for row in rows if len(row) > c]
        if len(values) < MIN_SHARE * len(rows):
            break
        classes = {v: token_class(v) for v in set(values)}  # a column repeats its values (hosts, months)
        counts = Counter(classes[v] for v in values)
        if counts["E"] and counts["E"] + counts["N"] == len(values):
            counts["E"] += counts.pop("N", 0)
        kind, n = counts.most_common(1)[0]
        if kind in "HW" and counts["H"] + counts["W"] >= MIN_SHARE * len(values):
            kind, n = "H" if counts["H"] >= counts["W"] else "W", counts["H"] + counts["W"]
        if kind == "N" and _compact_dates(values):
            kind = "T"
        if kind == "L" and not _levels_say_something(values):
            kind = "D"  # a one-valued letter column (CRI's "F"): a flag, not a severity
        kinds.append(kind if n >= MIN_SHARE * len(values) else "X")
    return kinds


def _compact_dates(values: list[str]) -> bool:
    # "081109 203615": a column of same-width digit runs that all read as dates or times of day
    widths = {len(v) for v in values}
    if widths not in ({6}, {8}) or not all(v.isdigit() for v in values):
        return False
    if learn_layout(values[:50], year=2000) is not None:
        return True
    return all(int(v[:2]) < 24 and int(v[2:4]) < 60 and int(v[4:6]) <= 60 for v in values) if widths == {6} else False


def _levels_say_something(values: list[str]) -> bool:
    distinct = set(values)
    return len(distinct) > 1 or any(len(v) > 1 for v in distinct)


def _end(kinds: list[str], rows: list[list[str]]) -> int:
    """How many leading columns are envelope (0: none)."""
    last = max((i for i, k in enumerate(kinds) if k in STRONG), default=-1)
    if last < 0:
        return 0
    end = last + 1
    while end < len(kinds) and (kinds[end] in "NDP" or (kinds[end] in STRONG and kinds[end] != "L")):
        end += 1
    while end + 1 < len(kinds) and kinds[end] in "HW" and kinds[last] != "L":  # after a level: the message
        # "stamp host tag: message": a host-like column followed by a syslog tag
        tags = sum(1 for row in rows if len(row) > end + 1 and row[end + 1].endswith(":"))
        own_tags = sum(1 for row in rows if len(row) > end and row[end].endswith(":"))
        if own_tags >= MIN_SHARE * len(rows):
            break  # a "tag:" column: the header parser reads it as the component
        j = end + 1
        while j < len(kinds) and kinds[j] in "NDP":
            j += 1
        flags = {row[j - 1] for row in rows if len(row) >= j} if j > end + 1 else set()
        if (kinds[end] == "H" and tags >= MIN_SHARE * len(rows)) or _independent(rows, kinds, end) or (
                kinds[j - 1] == "D" and len(flags) <= 2):  # "stdout F", "app 4000 - -": a name, then flags
            end += 1
            while end < len(kinds) and kinds[end] in "NDP":
                end += 1
        else:
            break
    return end


def _entropy(counts: Counter) -> float:
    total = sum(counts.values())
    return -sum(n / total * math.log2(n / total) for n in counts.values() if n)


def _independent(rows: list[list[str]], kinds: list[str], c: int) -> bool:
    """Whether column ``c`` varies without telling anything about the token after it (a host, an app name).

    A message's first word predicts its next word ("session" -> "opened"); a
    relay's name or a randomly assigned app does not. Normalised mutual
    information of the column and the next token (digits masked) below 0.2,
    with both varying: a constant column or a constant next token tells nothing.
    """
    def constant(i):
        return len({row[i] for row in rows[:200] if len(row) > i}) <= 1

    # the next column that can tell something: not a pid, dash, stamp or level, not one constant
    r = next((i for i in range(c + 1, len(kinds)) if kinds[i] not in "NDPTEL" and not constant(i)), c + 1)
    pairs = [(row[c], _DIGITS.sub("0", row[r])) for row in rows if len(row) > r]
    if len(pairs) < MIN_SHARE * len(rows):
        return False
    hv, hr = _entropy(Counter(v for v, _ in pairs)), _entropy(Counter(r for _, r in pairs))
    if hv < 0.5 or hr < 0.5:
        return False
    mutual = hv + hr - _entropy(Counter(pairs))
    return mutual / min(hv, hr) < 0.2


def _fits(found: str, kind: str) -> bool:
    return found == kind or (kind == "T" and found in "NE") or (kind == "E" and found == "N")


def _column_pattern(kind: str, values: list[str]) -> str:
    distinct = set(values)
    if kind == "L" or (kind == "D" and len(distinct) <= 8):
        return "(?:" + "|".join(re.escape(v) for v in sorted(distinct, key=lambda v: (-len(v), v))) + ")"
    if kind == "T":
        # the shapes the column's stamps take (digits as a class): "Jun" fits a column of names, not of dates
        shapes = {_DIGITS.sub("\ue000", v) for v in values}
        names = any(_NAME.fullmatch(v) for v in values)
        if len(shapes) <= 16:
            alternatives = sorted({re.escape(x).replace("\ue000", r"\d+") for x in shapes if not _NAME.fullmatch(x)})
            return "(?:" + "|".join(alternatives + ([_NAME.pattern] if names else [])) + ")"
        return r"(?:[^\s|]*\d[^\s|]*" + ("|" + _NAME.pattern if names else "") + ")"
    if kind == "E":
        return r"\d{10}(?:\d{3})?"
    if kind == "N":
        return r"[\[(<]?[-+]?\d+[\])>]?[:,]?"
    if kind == "P":
        return r"<\d{1,3}>\d?"
    return r"[^\s|]+"


def _runs(kinds: list[str], end: int) -> list[tuple[int, int]]:
    # Runs of stamp columns: start at a T (or one E) and end at a T, numbers may sit inside ("Nov 9 12:01:01");
    # or end at the number after them, which may be the year ("Sun Dec 04 04:47:44 2005").
    runs, c = [], 0
    while c < end:
        if kinds[c] == "E":
            runs.append((c, c + 1))
        elif kinds[c] == "T":
            d = c
            while d + 1 < end and kinds[d + 1] in "TN":
                d += 1
            if kinds[d] == "N":
                runs.append((c, d + 1))
            last = d
            while kinds[d] != "T":
                d -= 1
            runs.append((c, d + 1))
            c = last
        c += 1
    return runs


def learn_envelope(lines: Sequence[str], *, year: int | None = None, now: float | None = None) -> Envelope | None:
    """The envelope most of ``lines`` (one source's first lines) share, or None when they share none."""
    sample = [line for line in lines if line.strip()][:SAMPLE_LINES]
    if len(sample) < MIN_LINES:
        return None
    rows = [_TOKEN.findall(line[:400]) for line in sample]
    kinds = _column_kinds(rows)
    end = _end(kinds, rows)
    if end == 0:
        return None
    level_last = kinds[end - 1] == "L" and end - 1 == max(i for i, k in enumerate(kinds[:end]) if k in STRONG)
    cut = end - 1 if level_last else end  # a level as the last column stays: the header parser reads it
    if cut == 0:
        return None
    # The lines that show the envelope: the others (a traceback line, another format) shape none of it.
    strong = [c for c in range(cut) if kinds[c] in STRONG]
    rows = [row for row in rows if len(row) > cut and all(_fits(token_class(row[c]), kinds[c]) for c in strong)]
    for c in strong:  # and their stamps' shapes: a syslog "Jun  3" among ISO dates is another format
        shapes = Counter(_DIGITS.sub("0", row[c]) for row in rows)
        common = {x for x, n in shapes.items() if n >= 0.1 * len(rows)}
        rows = [row for row in rows if _DIGITS.sub("0", row[c]) in common]
    if len(rows) < MIN_LINES:
        return None
    layout, chosen = None, None
    for start, stop in _runs(kinds, end):
        texts = [" ".join(row[start:stop]) for row in rows if len(row) >= stop]
        found = learn_layout(texts[:200], year=year)
        if found is not None and (layout is None or (found.has_year and not layout.has_year)):
            layout, chosen = found, (start, stop)
    # The host: the host-like column with the most distinct values (a cluster's nodes, not its one relay);
    # on a tie the innermost, the original line's own.
    hosts = sorted((c for c in range(cut) if kinds[c] == "H"),
                   key=lambda c: (len({row[c] for row in rows if len(row) > c}), c))
    year_assumed = False
    if layout is not None and not layout.has_year:
        if year is None:
            year, year_assumed = _latest_past_year(layout, [" ".join(r[chosen[0]:chosen[1]]) for r in rows], now)
        layout = layout.with_year(year)
    parts = []
    for c in range(cut):
        values = [row[c] for row in rows if len(row) > c]
        pattern = _column_pattern(kinds[c], values)
        if chosen is not None and c == chosen[0]:
            parts.append("(?P<ts>" + pattern)
        else:
            parts.append(pattern)
        if chosen is not None and c == chosen[1] - 1:
            parts[-1] += ")"
        if hosts and c == hosts[-1]:
            parts[-1] = "(?P<host>" + parts[-1] + ")"
        parts.append(_SEP)
    if chosen is None:
        parts.insert(0, "(?P<ts>)")
    if not hosts:
        parts.insert(0, "(?P<host>)?")
    regex = re.compile("".join(parts) + r"(?P<msg>\S.*)?\Z", re.DOTALL)
    env = Envelope(regex=regex, columns=tuple(kinds[:cut]), layout=layout, year_assumed=year_assumed)
    fits = sum(1 for line in sample if env.split(line) is not None)
    return env if fits >= MIN_SHARE * len(sample) else None


def _latest_past_year(layout: StampLayout, stamps: list[str], now: float | None) -> tuple[int, bool]:
    """The latest year under which none of ``stamps`` lies more than a day in the future."""
    now = time.time() if now is None else now
    year = time.gmtime(now).tm_year
    trial = layout.with_year(year)
    latest = max((ts for ts in map(trial.convert, stamps) if ts is not None), default=None)
    if latest is not None and latest > now + 86400:
        year -= 1
    return year, True


# -- records: JSON lines and logfmt ----------------------------------------------------------------------------
_LOGFMT_PAIR = re.compile(r'([A-Za-z_][\w.@/-]*)=("(?:[^"\\]|\\.)*"|[^\s"]*)(?:\s+|\Z)')
_LOGFMT_ESCAPE = re.compile(r"\\(.)")
_UNESCAPE = {"n": "\n", "t": "\t", "r": "\r"}


def _logfmt(text: str) -> dict | None:
    """The pairs of a logfmt line (``ts=... level=info msg="a quoted message"``), or None if it is not one."""
    pairs, pos = {}, 0
    for m in _LOGFMT_PAIR.finditer(text):
        if m.start() != pos:
            return None
        value = m.group(2)
        if value.startswith('"'):
            value = _LOGFMT_ESCAPE.sub(lambda e: _UNESCAPE.get(e.group(1), e.group(1)), value[1:-1])
        pairs[m.group(1)] = value
        pos = m.end()
    return pairs if pos == len(text) and len(pairs) >= 2 else None


def _record(text: str, kind: str) -> dict | None:
    if kind == "logfmt":
        return _logfmt(text)
    if not text.startswith("{"):
        return None
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


@dataclass(frozen=True)
class JsonRecord:
    """Field names of a source of records - JSON lines or logfmt - where its message, stamp, host and level are."""

    message: str
    time: str | None
    host: str | None
    level: str | None
    layout: StampLayout | None
    kind: str = "json"  # or "logfmt": key=value pairs, values quoted where they hold blanks

    def split(self, text: str) -> tuple[float | None, str | None, str | None, str] | None:
        """``(seconds, host, level, message)`` of one line, or None when it is not such a record."""
        obj = _record(text, self.kind)
        if obj is None or not isinstance(obj.get(self.message), str):
            return None
        stamp = obj.get(self.time) if self.time else None
        ts = self.layout.convert(str(stamp)) if self.layout is not None and stamp is not None else None
        host = obj.get(self.host) if self.host else None
        level = obj.get(self.level) if self.level else None
        return ts, str(host) if host is not None else None, str(level) if level is not None else None, \
            obj[self.message].rstrip("\n")


def learn_json(lines: Sequence[str], *, year: int | None = None) -> JsonRecord | None:
    """The record layout of a source whose lines are JSON objects or logfmt pairs with a message field, or None.

    >>> learn_json(['ts=2024-05-01T10:00:%02dZ level=warn msg="disk %d slow"' % (i, i) for i in range(9)]).kind
    'logfmt'
    """
    sample = [line for line in lines if line.strip()][:500]
    for kind in ("json", "logfmt"):
        objects = [obj for obj in (_record(line.strip(), kind) for line in sample) if obj is not None]
        if len(sample) >= MIN_LINES and len(objects) >= MIN_SHARE * len(sample):
            return _record_layout(objects, kind, year)
    return None


def _record_layout(objects: list[dict], kind: str, year: int | None) -> JsonRecord | None:

    def common(names, want=str):
        for name in names:
            if sum(isinstance(o.get(name), want) for o in objects) >= MIN_SHARE * len(objects):
                return name
        return None

    message = common(_JSON_MESSAGE)
    if message is None:
        return None
    stamp = common(_JSON_TIME, (str, int, float))
    layout = learn_layout([str(o[stamp]) for o in objects[:200]], year=year) if stamp else None
    return JsonRecord(message=message, time=stamp if layout is not None else None, host=common(_JSON_HOST),
                      level=common(_JSON_LEVEL), layout=layout, kind=kind)
