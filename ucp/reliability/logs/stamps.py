"""Timestamps of any common layout, learned per source from the stamps themselves.

A stamp is read as its runs of digits and letters (``2016/05/01 00:00:00.000``
-> ``2016 05 01 00 00 00 000``; ``Jun 14 15:16:01`` -> ``Jun 14 15 16 01``).
:func:`learn_layout` finds, from a sample of one source's stamps, which run is
the year, month, day, hour, minute, second, fraction and zone: the time of day
is the run written ``hh:mm[:ss]`` (or a compact ``hhmmss`` after a date), a
month is a month name or a date part; where the order of the date parts is
ambiguous (``17/06/09``: y/m/d, d/m/y or m/d/y), every order that gives valid
dates for the whole sample is tried and the one under which time runs forward
most often wins (logs are written in time order). Seconds since the epoch
(10 digits) and milliseconds (13) are stamps too.

Stamps without a year (syslog, logcat) get the year the caller gives; without
one, the latest year that does not put the stamp in the future, and the caller
is told (:attr:`StampLayout.has_year` is False) so it can count the guess.

Example::

    >>> layout = learn_layout(["2016/05/01 00:00:00.000", "2016/05/01 00:00:01.250"])
    >>> layout.convert("2016/05/01 00:00:01.250")
    1462060801.25
    >>> learn_layout(["Jun 14 15:16:01"]).has_year
    False
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

_RUNS = re.compile(r"\d+|[A-Za-z]+")
_MONTHS = {m.lower(): i for i, m in enumerate(calendar.month_abbr) if m}
_MONTHS.update({m.lower(): i for i, m in enumerate(calendar.month_name) if m})
_CLOCK = re.compile(r"(?<!\d)(\d{1,2}):(\d\d)(?::(\d\d))?(?:[.,:](\d{1,9}))?")
_ZONE = re.compile(r"(?:(Z)|(?<=\d)([+-])(\d\d):?(\d\d))\]?$")
_FIELDS = ("year", "month", "day", "hour", "minute", "second", "fraction")
_DAY = 86400.0


@dataclass(frozen=True)
class StampLayout:
    """Which run of a stamp is which field (indices into :func:`runs`); ``epoch`` for epoch stamps.

    ``convert(text)`` gives POSIX seconds (UTC; a zone in the stamp is applied)
    or None when the text does not fit the layout. ``year`` fills stamps that
    have none.
    """

    roles: tuple[tuple[str, int], ...]  # (field, run index)
    runs: int  # how many runs a stamp of this layout has
    epoch: int = 0  # 1: seconds since the epoch, 1000: milliseconds; 0: a calendar stamp
    two_digit_year: bool = False
    year: int | None = None
    _days: dict = field(default_factory=dict, compare=False, repr=False)
    _stamps: dict = field(default_factory=dict, compare=False, repr=False)
    _dates: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def has_year(self) -> bool:
        return self.epoch > 0 or any(name == "year" for name, _ in self.roles)

    def with_year(self, year: int | None) -> "StampLayout":
        return StampLayout(self.roles, self.runs, self.epoch, self.two_digit_year, year)

    def fields(self, text: str) -> dict | None:
        parts = _RUNS.findall(text)
        if len(parts) < self.runs:
            return None
        out = {}
        for name, index in self.roles:
            value = parts[index]
            if name == "month" and not value.isdigit():
                month = _MONTHS.get(value.lower())
                if month is None:
                    return None
                out[name] = month
            elif not value.isdigit():
                return None
            elif name == "fraction":
                out[name] = float("0." + value)
            else:
                out[name] = int(value)
        return out

    def convert(self, text: str) -> float | None:
        cache = self._stamps
        hit = cache.get(text)
        if hit is not None:
            return hit
        ts = self._convert(text)
        if ts is not None:
            if len(cache) > 50_000:
                cache.clear()
            cache[text] = ts  # stamps repeat (many lines per second): one parse each
        return ts

    @cached_property
    def _runs_at(self) -> tuple | None:
        """``(date roles, hour's run, minute's, second's, fraction's)``; None if a role is none of these."""
        roles = dict(self.roles)
        if not set(roles) <= set(_FIELDS):
            return None
        return (tuple((name, i) for name, i in self.roles if name in ("year", "month", "day")),
                *(roles.get(name) for name in ("hour", "minute", "second", "fraction")))

    def _convert(self, text: str) -> float | None:
        if self.epoch:
            digits = text.strip("[]() ,:")
            if not digits.isdigit():
                return None
            return int(digits) / self.epoch
        runs_at = self._runs_at
        if runs_at is None:
            return self._convert_fields(text)
        # Stamps with fractions rarely repeat and merged logs jump in time: a date's midnight is worked out
        # once, the time of day is integer slicing (the same sums in the same order as _convert_fields, so
        # the result is bit for bit the same).
        parts = _RUNS.findall(text)
        if len(parts) < self.runs:
            return None
        date, hour_at, minute_at, second_at, fraction_at = runs_at
        key = tuple([parts[i] for _, i in date])
        base = self._dates.get(key, -1.0)
        if base == -1.0:
            base = self._date_start(dict(zip([name for name, _ in date], key)))
            if len(self._dates) > 10_000:
                self._dates.clear()
            self._dates[key] = base
        if base is None:
            return None
        clock = [0, 0, 0]
        for k, at in enumerate((hour_at, minute_at, second_at)):
            if at is not None:
                run = parts[at]
                if not run.isdigit():
                    return None
                clock[k] = int(run)
        hour, minute, second = clock
        fraction = 0.0
        if fraction_at is not None:
            run = parts[fraction_at]
            if not run.isdigit():
                return None
            fraction = float("0." + run)
        if hour > 23 or minute > 59 or second > 60:
            return None
        return self._zoned(text, base + hour * 3600 + minute * 60 + second + fraction)

    def _date_start(self, runs: dict) -> float | None:
        f = {}
        for name, value in runs.items():
            if name == "month" and not value.isdigit():
                month = _MONTHS.get(value.lower())
                if month is None:
                    return None
                f[name] = month
            elif not value.isdigit():
                return None
            else:
                f[name] = int(value)
        year = f.get("year", self.year)
        if year is None:
            return None
        if self.two_digit_year:
            year += 2000 if year < 70 else 1900
        if not 1970 <= year <= 2100:  # a pid or a count, not a year
            return None
        return self._day((year, f.get("month", 1), f.get("day", 1)))

    def _day(self, key: tuple) -> float | None:
        base = self._days.get(key, -1.0)
        if base == -1.0:
            try:
                base = float(calendar.timegm((*key, 0, 0, 0, 0, 0, 0))) if _valid_date(*key) else None
            except (OverflowError, ValueError):
                base = None
            if len(self._days) > 10_000:
                self._days.clear()
            self._days[key] = base
        return base

    @staticmethod
    def _zoned(text: str, ts: float) -> float:
        # A zone ends the stamp and is at most 7 characters ("+02:00]") after the digit before it: the tail
        # holds every match, and searching it alone costs nothing per character of the stamp.
        zone = _ZONE.search(text[-8:])
        if zone is not None and zone.group(2):
            sign = -1 if zone.group(2) == "+" else 1  # 10:00+02:00 is 08:00 UTC
            ts += sign * (int(zone.group(3)) * 3600 + int(zone.group(4)) * 60)
        return ts

    def _convert_fields(self, text: str) -> float | None:
        f = self.fields(text)
        if f is None:
            return None
        year = f.get("year", self.year)
        if year is None:
            return None
        if self.two_digit_year:
            year += 2000 if year < 70 else 1900
        if not 1970 <= year <= 2100:  # a pid or a count, not a year
            return None
        base = self._day((year, f.get("month", 1), f.get("day", 1)))
        hour, minute, second = f.get("hour", 0), f.get("minute", 0), f.get("second", 0)
        if base is None or hour > 23 or minute > 59 or second > 60:
            return None
        return self._zoned(text, base + hour * 3600 + minute * 60 + second + f.get("fraction", 0.0))


def _valid_date(year: int, month: int, day: int) -> bool:
    return 1 <= month <= 12 and 1 <= day <= calendar.monthrange(year, month)[1] if 1 <= year <= 9999 else False


def _epoch_layout(text: str) -> StampLayout | None:
    digits = text.strip("[]() ,:")
    if digits.isdigit() and len(digits) == 10 and 0.9e9 <= int(digits) <= 2.2e9:
        return StampLayout((), 1, epoch=1)
    if digits.isdigit() and len(digits) == 13 and 0.9e12 <= int(digits) <= 2.2e12:
        return StampLayout((), 1, epoch=1000)
    return None


def _candidates(text: str) -> list[StampLayout]:
    """Every reading of one stamp's runs as calendar fields (several where the date order is ambiguous)."""
    spans = [(m.start(), m.end(), m.group()) for m in _RUNS.finditer(text)]
    roles: dict[str, int] = {}
    used: set[int] = set()
    clock = _CLOCK.search(text)
    if clock is not None:
        for name, group in (("hour", 1), ("minute", 2), ("second", 3), ("fraction", 4)):
            if clock.group(group) is not None:
                index = next(i for i, s in enumerate(spans) if s[0] == clock.start(group))
                roles[name] = index
                used.add(index)
    month_name = None
    for i, (_, _, run) in enumerate(spans):
        if not run.isdigit():
            used.add(i)  # weekday names, "T", "Z", "UTC": not fields
            if run.lower() in _MONTHS and month_name is None:
                month_name = i
    if spans and _ZONE.search(text) and _ZONE.search(text).group(2):
        used.update(i for i, s in enumerate(spans) if s[0] >= _ZONE.search(text).start(3) - 1)
    rest = [i for i, (_, _, run) in enumerate(spans) if i not in used and run.isdigit()]
    digits = [spans[i][2] for i in rest]
    layouts: list[tuple[dict, bool]] = []
    if clock is None:  # compact time of day after a compact date: "081109 203615", "20240501123000"
        if len(digits) == 2 and len(digits[0]) in (6, 8) and len(digits[1]) == 6:
            date_len = len(digits[0])
            return [_compact(rest, date_len)]
        if len(digits) == 1 and len(digits[0]) == 14:
            return []
        if len(digits) == 1 and len(digits[0]) in (6, 8):
            return [_compact(rest[:1] + [None], len(digits[0]))]
    if month_name is not None:
        roles["month"] = month_name
        four = [i for i in rest if len(spans[i][2]) == 4]
        short = [i for i in rest if len(spans[i][2]) <= 2]
        if short:
            fields = dict(roles, day=short[0])
            if four:
                fields["year"] = four[0]
            layouts.append((fields, False))
    elif len(rest) >= 3:
        a, b, c = rest[:3]
        la, lc = len(spans[a][2]), len(spans[c][2])
        if la == 4:
            layouts.append((dict(roles, year=a, month=b, day=c), False))
        elif lc == 4:
            layouts += [(dict(roles, day=a, month=b, year=c), False), (dict(roles, month=a, day=b, year=c), False)]
        else:
            layouts += [(dict(roles, year=a, month=b, day=c), True), (dict(roles, day=a, month=b, year=c), True),
                        (dict(roles, month=a, day=b, year=c), True)]
    elif len(rest) == 2:
        a, b = rest
        if len(spans[a][2]) == 8:
            layouts.append((dict(roles), False))
        else:
            layouts += [(dict(roles, month=a, day=b), False), (dict(roles, day=a, month=b), False)]
    elif len(rest) == 1 and len(spans[rest[0]][2]) == 8 and clock is not None:
        return [_compact([rest[0], None], 8, roles)]
    elif clock is None:
        return []
    else:
        layouts.append((dict(roles), False))  # a time of day alone: no date
    return [StampLayout(tuple(sorted(f.items(), key=lambda kv: _FIELDS.index(kv[0]))), len(spans), 0, two)
            for f, two in layouts if "day" in f or "hour" in f]


def _compact(rest: list, date_len: int, roles: dict | None = None) -> StampLayout:
    # yymmdd / yyyymmdd and hhmmss as one run each: split by fixed offsets.
    return _CompactLayout((("date", rest[0]),) + ((("clock", rest[1]),) if rest[1] is not None else ()) +
                          tuple((roles or {}).items()), rest[0] + 1 if rest[1] is None else rest[1] + 1,
                          0, date_len == 6)


class _CompactLayout(StampLayout):
    """``yymmdd hhmmss`` / ``yyyymmdd``: dates and times written without separators."""

    @property
    def _runs_at(self) -> None:  # the clock is one run: every stamp is read whole
        return None

    def fields(self, text: str) -> dict | None:
        parts = _RUNS.findall(text)
        if len(parts) < self.runs:
            return None
        out: dict = {}
        for name, index in self.roles:
            run = parts[index]
            if not run.isdigit():
                return None
            if name == "date":
                y = len(run) - 4
                out.update(year=int(run[:y]), month=int(run[y:y + 2]), day=int(run[y + 2:]))
            elif name == "clock":
                out.update(hour=int(run[:2]), minute=int(run[2:4]), second=int(run[4:6]))
            elif name == "fraction":
                out[name] = float("0." + run)
            else:
                out[name] = int(run)
        return out

    @property
    def has_year(self) -> bool:
        return True

    def with_year(self, year):
        return self


def learn_layout(texts: Sequence[str], *, year: int | None = None) -> StampLayout | None:
    """The layout under which every stamp in ``texts`` is a valid date and time runs forward most often."""
    texts = [t for t in texts if t]
    if not texts:
        return None
    epoch = _epoch_layout(texts[0])
    if epoch is not None:
        return epoch if all(epoch.convert(t) is not None for t in texts) else None
    probe = 2000 if year is None else year  # a leap year: "Feb 29" stays valid while the order is chosen
    best, best_score = None, -1.0
    for layout in _candidates(texts[0]):
        trial = layout.with_year(probe)
        stamps = [trial.convert(t) for t in texts]
        if any(s is None for s in stamps):
            continue
        forward = sum(b >= a for a, b in zip(stamps, stamps[1:]))
        score = forward / max(1, len(stamps) - 1)
        if score > best_score:
            best, best_score = layout, score
    return best
