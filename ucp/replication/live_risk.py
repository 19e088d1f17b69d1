"""Failure forecasts for a live job: the forecaster's features computed from ``ucp logs analyze --json``.

The simulator shows a policy per-node forecasts; a live :class:`~ucp.replication.replicas.ReplicaManager`
gets them from here. :class:`LogRisk` turns a logs report (its events and fatal
incidents, docs/LOGS.md) into the very features the forecaster was trained on
(:data:`ucp.replication.forecast.FEATURES`: events per monitoring channel in the last 1, 6
and 36 checkpoint intervals, link events on the node's rack, intervals since the
node's last fatal incident, its fatal incidents in the last 200 intervals, which is
what makes a lemon node stand out) as of ``now``, and asks the forecaster for the
probability that each node fails during the next interval. A node the report never
mentions has no events and no failures: the quiet baseline.

Example::

    >>> import json, pathlib
    >>> from ucp.replication.scenarios import pretrained_forecaster
    >>> report = json.loads(pathlib.Path("tests/replication/data/synthetic-analysis.json").read_text())
    >>> risk = LogRisk(pretrained_forecaster(intervals=300), interval_s=600.0)
    >>> stamps = [e["timestamp"] for e in report["events"]]
    >>> probs = risk.probabilities(report, ["node-quiet", report["events"][0]["node"]], now=max(stamps))
    >>> 0.0 < probs["node-quiet"] < 1.0
    True
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ucp.replication.failures import CHANNELS
from ucp.replication.forecast import FEATURES, HISTORY_WINDOW, WINDOWS
from ucp.replication.replay import _checked, channel_of

_NETWORK = CHANNELS.index("network")


@dataclass
class LogRisk:
    """Per-node failure probabilities from a logs report, with a pretrained :class:`FailureForecaster`."""

    forecaster: object
    interval_s: float = 600.0
    quiet_age: float = 1000.0  # intervals since the last failure of a node the report never saw fail

    def features(self, report: dict, nodes: Sequence[str], *, now: float,
                 racks: Mapping[str, int] | None = None) -> np.ndarray:
        """``(len(nodes), len(FEATURES))`` in the forecaster's order, from what was logged before ``now``."""
        report = _checked(report, "logs report")
        index = {node: i for i, node in enumerate(nodes)}
        ago = lambda stamp: (now - float(stamp)) / self.interval_s  # noqa: E731 - intervals before now
        counts = np.zeros((len(nodes), len(CHANNELS), len(WINDOWS)))
        for event in report["events"]:
            i, stamp = index.get(event.get("node")), event.get("timestamp")
            if i is None or stamp is None or not 0 <= ago(stamp):
                continue
            for w, window in enumerate(WINDOWS):
                if ago(stamp) < window:
                    counts[i, channel_of(str(event.get("category", ""))), w] += 1
        age = np.full(len(nodes), self.quiet_age)
        recent = np.zeros(len(nodes))
        for incident in report["incidents"]:
            node = (incident.get("root_cause") or {}).get("node")
            i, stamp = index.get(node), incident.get("start")
            if not incident.get("fatal") or i is None or stamp is None or ago(stamp) < 0:
                continue
            age[i] = min(age[i], math.floor(ago(stamp)))
            recent[i] += ago(stamp) < HISTORY_WINDOW
        rack_of = racks or {}
        rack_net = np.zeros((len(nodes), 2))
        for i, node in enumerate(nodes):
            peers = [index[n] for n in nodes if rack_of.get(n, n) == rack_of.get(node, node)]
            rack_net[i] = counts[peers, _NETWORK, :2].mean(axis=0)
        parts = [np.log1p(counts[:, c, w]) for c in range(len(CHANNELS)) for w in range(len(WINDOWS))]
        parts += [np.log1p(rack_net[:, 0]), np.log1p(rack_net[:, 1]), np.log1p(age), np.log1p(recent)]
        out = np.stack(parts, axis=-1)
        assert out.shape[1] == len(FEATURES)
        return out

    def probabilities(self, report: dict, nodes: Sequence[str], *, now: float,
                      racks: Mapping[str, int] | None = None) -> dict[str, float]:
        """Node name -> P(it fails during the next checkpoint interval)."""
        probs = self.forecaster.predict(self.features(report, nodes, now=now, racks=racks))
        return {node: float(p) for node, p in zip(nodes, probs)}
