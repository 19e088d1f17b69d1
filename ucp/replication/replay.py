"""Replay a real failure sequence from ``ucp logs analyze --json`` as a :class:`Trace`.

What is kept from the report (schema_version 1 or 2, docs/LOGS.md): every *fatal*
incident becomes a failure of its root-cause node at the incident's start; every
listed event (fatal or not: ECC, thermal, link flaps, symptoms) becomes a
monitoring event of its node on the channel of its category's domain. What is
changed, on purpose, and documented in docs/REPLICATION.md:

- the clock is scaled linearly so that the log's span covers ``intervals``
  checkpoint intervals (order, relative gaps and who fails are kept; the rate
  becomes the log's failures per interval, whatever its real span);
- log nodes are folded onto the simulated cluster's slots in order of first
  appearance (slot = appearance index mod nodes), so a lemon node stays a lemon
  slot; racks are consecutive slots, as for synthetic traces.

Example::

    >>> import json, pathlib
    >>> from ucp.replication.cluster import ClusterSpec
    >>> report = json.loads(pathlib.Path("tests/replication/data/synthetic-analysis.json").read_text())
    >>> trace = trace_from_report(report, spec=ClusterSpec(nodes=8, rack_size=4), intervals=100)
    >>> trace.intervals, trace.event_count() > 0
    (100, True)
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from ucp.replication.cluster import ClusterSpec
from ucp.replication.errors import FailureLogError
from ucp.replication.failures import CHANNELS, Trace

# Versions 1 and 2 agree on every field read here (events: timestamp, node, category; incidents:
# start, fatal, root_cause.node); 2 added severities and mined categories, which replay ignores.
SCHEMA_VERSIONS = (1, 2)
REPORT_LIMIT = 1 << 30  # far above any real report; refuses a device or a runaway file before reading it


def channel_of(category: str) -> int:
    """Monitoring channel of a taxonomy path: network hardware, other hardware, software/user, infra."""
    if category.startswith("hardware/network"):
        return CHANNELS.index("network")
    domain = category.split("/", 1)[0]
    return CHANNELS.index({"hardware": "hardware", "infra": "infra"}.get(domain, "software"))


def load_report(path: str | Path) -> dict:
    """Read and check a ``ucp logs analyze --json`` report."""
    from ucp.confined import read_regular_file
    from ucp.errors import UnsafePathError

    try:
        report = json.loads(read_regular_file(path, limit=REPORT_LIMIT, what="a `ucp logs analyze --json` report"))
    except json.JSONDecodeError as err:
        raise FailureLogError(f"{path}: not JSON ({err}); expected the output of `ucp logs analyze --json`") from None
    except UnicodeDecodeError as err:
        raise FailureLogError(f"{path}: not UTF-8 ({err.reason}); expected the output of `ucp logs analyze --json`") from None
    except UnsafePathError as err:
        raise FailureLogError(str(err)) from None
    except OSError as err:
        raise FailureLogError(f"{path}: cannot read ({err.strerror})") from None
    return _checked(report, str(path))


def _checked(report, where: str) -> dict:
    if not isinstance(report, dict) or report.get("schema_version") not in SCHEMA_VERSIONS:
        raise FailureLogError(
            f"{where}: schema_version must be 1 or 2; expected the output of `ucp logs analyze --json`")
    for key in ("events", "incidents"):
        if not isinstance(report.get(key), list):
            raise FailureLogError(f"{where}: missing list '{key}'; expected the output of `ucp logs analyze --json`")
    return report


def _stamp(value) -> float:
    stamp = float(value) if not isinstance(value, bool) else math.nan
    if not math.isfinite(stamp):
        raise ValueError(f"timestamp {value!r:.40} is not a finite number")
    return stamp


def _text(value) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r:.40}")
    return value


def trace_from_report(report: dict, *, spec: ClusterSpec, intervals: int, where: str = "report",
                      seed: int | None = None, family: str = "log-replay") -> Trace:
    """The report's fatal incidents and events on ``intervals`` intervals of ``spec``'s cluster."""
    report = _checked(report, where)
    try:  # a report is read back from disk: every field is checked before it is used
        fatal = [(_stamp(i["start"]), _text(i["root_cause"]["node"])) for i in report["incidents"]
                 if i.get("fatal") and i.get("start") is not None and (i.get("root_cause") or {}).get("node")]
        events = [(_stamp(e["timestamp"]), _text(e["node"]), _text(e["category"])) for e in report["events"]
                  if e.get("timestamp") is not None and e.get("node")]
    except (TypeError, KeyError, ValueError, AttributeError) as err:
        raise FailureLogError(f"{where}: a malformed incident or event ({type(err).__name__}: {err}); expected the "
                              "output of `ucp logs analyze --json`") from None
    if not fatal:
        raise FailureLogError(f"{where}: no fatal incident with a timestamp and a root-cause node to replay")
    stamps = [t for t, _ in fatal] + [t for t, _, _ in events]
    first, last = min(stamps), max(stamps)
    span = max(last - first, 1.0)

    def interval_of(stamp: float) -> int:
        return min(int((stamp - first) / span * intervals), intervals - 1)

    slots: dict[str, int] = {}
    for _, node in sorted(fatal + [(t, node) for t, node, _ in events], key=lambda x: x[0]):
        slots.setdefault(node, len(slots) % spec.nodes)
    if seed is not None:  # another seed, another mapping of log nodes to slots (and racks); same sequence
        shuffle = np.random.default_rng(seed).permutation(spec.nodes)
        slots = {node: int(shuffle[slot]) for node, slot in slots.items()}
    failures: list[list[frozenset]] = [[] for _ in range(intervals)]
    for stamp, node in sorted(fatal, key=lambda x: x[0]):
        failures[interval_of(stamp)].append(frozenset([slots[node]]))
    monitor = np.zeros((intervals, spec.nodes, len(CHANNELS)), dtype=np.int32)
    for stamp, node, category in events:
        monitor[interval_of(stamp), slots[node], channel_of(category)] += 1
    monitor.flags.writeable = False
    # one node failing twice in an interval is one loss (it was already replaced by the first)
    merged = tuple(tuple(dict.fromkeys(events_t)) for events_t in failures)
    return Trace(family, spec, merged, monitor)
