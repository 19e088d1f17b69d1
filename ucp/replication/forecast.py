"""Per-node failure forecasting from monitoring events and failure history (scikit-learn).

Features of node ``i`` before interval ``t`` use only what was known then
(intervals ``< t``): events per monitoring channel in the last 1, 6 and 36
intervals, link events on the node's rack, the node's time since its last
failure (its age: a failed node is replaced), and its slot's failure count in the
last 200 intervals (lemon slots). The label: node ``i`` fails during ``t``.

The model is a logistic regression trained by SGD (``SGDClassifier(loss="log_loss")``)
on standardized features; :meth:`FailureForecaster.update` folds new outcomes in
with ``partial_fit`` (online, mini-batches of ``batch_intervals``).
:func:`evaluate_forecasts` reports ROC-AUC, the Brier score and the expected
calibration error on held-out traces.

Example::

    >>> from ucp.replication.scenarios import family_trace
    >>> train = family_trace("lemon", intervals=400, seed=11)
    >>> forecaster = FailureForecaster.pretrained([train], seed=0)
    >>> probs = forecaster.forecast_trace(family_trace("lemon", intervals=200, seed=12))
    >>> probs.shape
    (200, 16)
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from ucp.replication.failures import CHANNELS, Trace

WINDOWS = (1, 6, 36)
HISTORY_WINDOW = 200
FEATURES = tuple(
    [f"{ch}_last_{w}" for ch in CHANNELS for w in WINDOWS]
    + ["rack_network_last_1", "rack_network_last_6", "log_age", "slot_failures_last_200"])


def _trailing(counts: np.ndarray, window: int) -> np.ndarray:
    """``out[t] = counts[t - window : t].sum(axis=0)`` (strictly before ``t``)."""
    csum = np.concatenate([np.zeros((1,) + counts.shape[1:], dtype=float), np.cumsum(counts, axis=0, dtype=float)])
    t = np.arange(counts.shape[0])
    return csum[t] - csum[np.maximum(t - window, 0)]


def trace_features(trace: Trace) -> np.ndarray:
    """``(T, N, F)`` features for every interval and node, in :data:`FEATURES` order."""
    spec = trace.spec
    monitor = trace.monitor.astype(float)
    parts = [np.log1p(_trailing(monitor[:, :, c], w)) for c in range(len(CHANNELS)) for w in WINDOWS]
    rack_of = np.arange(spec.nodes) // spec.rack_size
    net = monitor[:, :, CHANNELS.index("network")]
    rack_net = np.zeros_like(net)
    for r in range(spec.racks):
        members = rack_of == r
        rack_net[:, members] = net[:, members].sum(axis=1, keepdims=True) / members.sum()
    parts += [np.log1p(_trailing(rack_net, 1)), np.log1p(_trailing(rack_net, 6))]
    failed = trace.failure_matrix().astype(float)
    age = np.zeros_like(failed)
    running = np.zeros(spec.nodes)
    for t in range(trace.intervals):  # intervals since the last failure before t (or since the trace began)
        age[t] = running
        running = np.where(failed[t] > 0, 0.0, running + 1.0)
    parts += [np.log1p(age), np.log1p(_trailing(failed, HISTORY_WINDOW))]
    return np.stack(parts, axis=-1)


@dataclass
class FailureForecaster:
    """A calibrated-by-construction (log-loss) linear forecaster that keeps learning online.

    Mutable on purpose: it is a learner. :meth:`copy` before a scenario so every
    policy sees the same forecasts and scenarios do not leak into one another.
    """

    model: object
    scaler: object
    batch_intervals: int = 50

    @classmethod
    def pretrained(cls, traces: list[Trace], *, seed: int = 0, epochs: int = 5, batch_intervals: int = 50,
                   online_eta: float = 0.002) -> "FailureForecaster":
        """Fit on complete traces (the training seeds; never the evaluated ones)."""
        from sklearn.linear_model import SGDClassifier
        from sklearn.preprocessing import StandardScaler

        x = np.concatenate([trace_features(t).reshape(-1, len(FEATURES)) for t in traces])
        y = np.concatenate([t.failure_matrix().reshape(-1) for t in traces])
        scaler = StandardScaler().fit(x)
        model = SGDClassifier(loss="log_loss", alpha=1e-4, learning_rate="adaptive", eta0=0.01,
                              random_state=seed)
        xs = scaler.transform(x)
        rng = np.random.default_rng(seed)
        for _ in range(epochs):
            order = rng.permutation(len(y))
            for chunk in np.array_split(order, max(1, len(order) // 4096)):
                model.partial_fit(xs[chunk], y[chunk], classes=np.array([0, 1]))
        # online steps smaller than pretraining ones: a few new outcomes must not undo many old ones
        model.set_params(eta0=online_eta)
        return cls(model, scaler, batch_intervals)

    def copy(self) -> "FailureForecaster":
        return copy.deepcopy(self)

    def predict(self, features: np.ndarray) -> np.ndarray:
        """Failure probabilities for rows of features (any leading shape)."""
        flat = features.reshape(-1, features.shape[-1])
        return self.model.predict_proba(self.scaler.transform(flat))[:, 1].reshape(features.shape[:-1])

    def update(self, features: np.ndarray, labels: np.ndarray) -> None:
        """Learn from new outcomes (rows of features with 0/1 labels)."""
        flat = features.reshape(-1, features.shape[-1])
        self.model.partial_fit(self.scaler.transform(flat), labels.reshape(-1), classes=np.array([0, 1]))

    def forecast_trace(self, trace: Trace) -> np.ndarray:
        """``(T, N)`` forecasts made interval by interval, learning online from each outcome.

        The forecast for ``t`` uses the model as updated with outcomes of intervals
        before ``t`` only (in mini-batches of ``batch_intervals``); the forecaster itself
        ends updated with the whole trace.
        """
        feats, labels = trace_features(trace), trace.failure_matrix()
        out = np.zeros(labels.shape)
        for start in range(0, trace.intervals, self.batch_intervals):
            stop = min(start + self.batch_intervals, trace.intervals)
            out[start:stop] = self.predict(feats[start:stop])
            self.update(feats[start:stop], labels[start:stop])
        return out


def expected_calibration_error(labels: np.ndarray, probs: np.ndarray, *, bins: int = 10) -> float:
    """Mean |observed rate - mean forecast| over equal-count bins, weighted by bin size."""
    order = np.argsort(probs, kind="stable")
    total = 0.0
    for chunk in np.array_split(order, bins):
        if len(chunk):
            total += len(chunk) * abs(labels[chunk].mean() - probs[chunk].mean())
    return float(total / len(labels))


def evaluate_forecasts(labels: np.ndarray, probs: np.ndarray) -> dict:
    """ROC-AUC, Brier score, expected calibration error, base rate and mean forecast."""
    from sklearn.metrics import brier_score_loss, roc_auc_score

    labels, probs = labels.reshape(-1), probs.reshape(-1)
    auc = float(roc_auc_score(labels, probs)) if 0 < labels.sum() < len(labels) else float("nan")
    return {"roc_auc": auc, "brier": float(brier_score_loss(labels, probs)),
            "ece": expected_calibration_error(labels, probs), "base_rate": float(labels.mean()),
            "mean_forecast": float(probs.mean()), "samples": int(len(labels)), "positives": int(labels.sum())}
