"""The failure forecaster: discriminates and is calibrated on held-out traces, and learns online."""

from __future__ import annotations

import numpy as np
import pytest

from ucp.replication.forecast import (FEATURES, FailureForecaster, evaluate_forecasts, expected_calibration_error,
                                  trace_features)
from ucp.replication.scenarios import family_trace


@pytest.fixture(scope="module")
def forecaster():
    return FailureForecaster.pretrained([family_trace("lemon", intervals=1500, seed=901),
                                         family_trace("independent", intervals=1500, seed=902)], seed=0)


def test_features_use_only_the_past():
    trace = family_trace("independent", intervals=300, seed=5)
    feats = trace_features(trace)
    assert feats.shape == (300, 16, len(FEATURES))
    assert not feats[0, :, :12].any()  # nothing logged before the first interval
    changed = trace.monitor.copy()
    changed[150:] = 0  # forget the future: features up to 150 must not move
    from dataclasses import replace
    assert np.array_equal(trace_features(replace(trace, monitor=changed))[:151], feats[:151])


@pytest.mark.parametrize("family, min_auc", [("lemon", 0.75), ("independent", 0.62)])
def test_held_out_auc_and_calibration(forecaster, family, min_auc):
    trace = family_trace(family, intervals=1500, seed=77)  # a seed the forecaster never saw
    probs = forecaster.copy().forecast_trace(trace)
    quality = evaluate_forecasts(trace.failure_matrix(), probs)
    assert quality["roc_auc"] > min_auc
    assert quality["mean_forecast"] == pytest.approx(quality["base_rate"], rel=0.5)
    if family == "lemon":  # where failures are predictable, better than knowing only the base rate
        flat = evaluate_forecasts(trace.failure_matrix(), np.full(probs.shape, quality["base_rate"]))
        assert quality["brier"] < flat["brier"]


def test_online_updates_learn_a_new_signal(forecaster):
    online = forecaster.copy()
    feats = np.zeros((4000, len(FEATURES)))
    feats[:2000, FEATURES.index("infra_last_1")] = 2.0  # a channel that, here, always precedes a failure
    labels = np.r_[np.ones(2000), np.zeros(2000)]
    before = online.predict(feats[:1])[0]
    for chunk in np.array_split(np.random.default_rng(0).permutation(4000), 20):
        online.update(feats[chunk], labels[chunk])
    assert online.predict(feats[:1])[0] > before + 0.2
    assert forecaster.predict(feats[:1])[0] == pytest.approx(before)  # the copy learned, not the original


def test_calibration_error_of_perfect_and_biased_forecasts():
    rng = np.random.default_rng(0)
    p = rng.uniform(0, 0.2, 20000)
    y = (rng.random(20000) < p).astype(int)
    assert expected_calibration_error(y, p) < 0.01
    assert expected_calibration_error(y, np.minimum(p * 3, 1)) > 0.1
