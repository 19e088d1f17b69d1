"""Envelope generators: the same loghub messages written the way other machines and shippers write them.

Each generator turns one loghub line into the text another setup would log
for it: ``line(raw, row, i, ctx)`` gets the original line, its row of the
structured CSV (``Content`` is the message without loghub's header, ``Level``
where the system has one), its 0-based index and a per-file context (a seeded
``random.Random``, a monotone clock, forwarding hosts). Two kinds:

- *forwarded*: a prefix in front of the original line (stacked envelopes:
  rsyslog, a Kubernetes CRI prefix);
- *rewritten*: the message content under a header of another layout (RFC 5424,
  JSON lines, a vendor layout with slashes in the date).

``DEVELOPMENT`` are the generators the header detection was built beside;
``HELD_OUT`` (:mod:`ucp.tools.bench.logs_envelopes_heldout`) were written before
any run of them and are reported apart.

Example::

    ctx = EnvelopeContext.for_file("HDFS", seed=0)
    DEVELOPMENT["rsyslog-iso"].line("081109 203615 148 INFO dfs...: x", {"Content": "x"}, 0, ctx)
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

_LEVELS = {"I": "INFO", "D": "DEBUG", "W": "WARN", "E": "ERROR", "V": "DEBUG", "F": "FATAL",
           "notice": "NOTICE", "error": "ERROR", "warn": "WARN", "info": "INFO", "Info": "INFO",
           "combo": "INFO", "-": "INFO"}


@dataclass
class EnvelopeContext:
    """Per-file state of a generator: seeded randomness, a clock that only moves forward, hosts."""

    rng: random.Random
    clock: datetime
    hosts: tuple[str, ...]
    apps: tuple[str, ...]
    extra: dict = field(default_factory=dict)

    @classmethod
    def for_file(cls, system: str, *, seed: int = 0) -> "EnvelopeContext":
        rng = random.Random(f"{system}/{seed}")
        start = datetime(2024, 3, 1, tzinfo=timezone.utc) + timedelta(seconds=rng.randrange(86400 * 30))
        hosts = tuple(rng.sample(["relay-alpha", "relay-beta", "logfwd", "ingest-7", "mgmt-alpha", "mgmt02",
                                  "aggregator.dc1.example.net", "10.2.0.14"], 3))
        apps = tuple(rng.sample(["app", "svc-main", "collector", "worker", "agent"], 2))
        return cls(rng=rng, clock=start, hosts=hosts, apps=apps)

    def tick(self) -> datetime:
        self.clock += timedelta(microseconds=self.rng.randrange(0, 3_000_000))
        return self.clock

    def host(self) -> str:
        return self.rng.choice(self.hosts)

    def level(self, row: dict) -> str:
        raw = (row.get("Level") or "").strip()
        return _LEVELS.get(raw, raw.upper() or "INFO")


@dataclass(frozen=True)
class Envelope:
    """A named way of writing a loghub line; ``systems`` limits it (None: every system)."""

    name: str
    line: Callable[[str, dict, int, EnvelopeContext], str]
    kind: str  # "forwarded" or "rewritten" or "original"
    systems: tuple[str, ...] | None = None


def _iso(t: datetime, digits: int = 6, zone: str = "+00:00") -> str:
    base = t.strftime("%Y-%m-%dT%H:%M:%S")
    frac = f"{t.microsecond:06d}"[:digits] if digits else ""
    return base + ("." + frac if frac else "") + zone


def _content(row: dict) -> str:
    return row["Content"]


def original(raw, row, i, ctx):
    return raw


def no_label(raw, row, i, ctx):
    # Thunderbird/BGL as the machine wrote it: loghub's alert label column dropped.
    return raw.split(" ", 1)[1]


def rsyslog_iso(raw, row, i, ctx):
    # rsyslog's RSYSLOG_ForwardFormat-like prefix: high-precision stamp and the relay, then the original line.
    return f"{_iso(ctx.tick())} {ctx.host()} {raw}"


def rewrite_slash(raw, row, i, ctx):
    t = ctx.tick()
    return (f"{t.strftime('%Y/%m/%d %H:%M:%S')}.{t.microsecond // 1000:03d} {ctx.host()} "
            f"{ctx.apps[0]}[{4000 + i % 7}] {ctx.level(row)} {_content(row)}")


def rfc5424(raw, row, i, ctx):
    pri = ctx.rng.choice((134, 131, 14, 30))
    return (f"<{pri}>1 {_iso(ctx.tick(), 3, 'Z')} {ctx.host()} {ctx.rng.choice(ctx.apps)} "
            f"{ctx.rng.randrange(100, 40000)} - - {_content(row)}")


def json_lines(raw, row, i, ctx):
    return json.dumps({"time": _iso(ctx.tick(), 3, "Z"), "host": ctx.host(), "level": ctx.level(row).lower(),
                       "message": _content(row)})


def cri(raw, row, i, ctx):
    # Kubernetes container runtime (CRI) log line: RFC 3339 nanoseconds, stream, P/F tag, the container's line.
    t = ctx.tick()
    return f"{t.strftime('%Y-%m-%dT%H:%M:%S')}.{t.microsecond:06d}{ctx.rng.randrange(1000):03d}Z stdout F {raw}"


DEVELOPMENT: dict[str, Envelope] = {e.name: e for e in (
    Envelope("original", original, "original"),
    Envelope("no-label", no_label, "original", systems=("Thunderbird", "BGL")),
    Envelope("rsyslog-iso", rsyslog_iso, "forwarded"),
    Envelope("rewrite-slash", rewrite_slash, "rewritten"),
    Envelope("rfc5424", rfc5424, "rewritten"),
    Envelope("jsonl", json_lines, "rewritten"),
    Envelope("cri", cri, "forwarded"),
)}
