"""Reliability metrics: failure rates per 1000 node-days, MTTF fits, job MTTF by job size.

Failures are fatal incidents (see :mod:`ucp.reliability.logs.incidents`); the times
between consecutive ones are fitted by maximum likelihood to an exponential
(closed form, chi-square interval) and a Weibull (profile likelihood in the
shape, Wald intervals from the observed information in log-parameters).
Kolmogorov-Smirnov statistics say how well each fits; their p-values are
optimistic because the parameters were fitted to the same data (Lilliefors).

Example::

    fits = fit_interarrivals([3.1, 0.4, 7.9, 2.2, 5.0])   # hours
    fits["exponential"]["mttf_hours"], fits["weibull"]["shape"]
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, special, stats

_Z95 = 1.959963984540054
MIN_GAP_HOURS = 1.0 / 3600.0  # simultaneous failures: one second apart, so Weibull's log stays finite


def failure_rates(*, fatal_roots: list[str], nodes: int, span_s: float) -> dict:
    """The ``rates`` object of the JSON report (docs/LOGS.md)."""
    node_days = nodes * span_s / 86400.0
    failures = len(fatal_roots)
    per = (lambda n: 1000.0 * n / node_days) if node_days > 0 else (lambda n: 0.0)
    by_cat: dict[str, int] = {}
    for path in fatal_roots:
        by_cat[path] = by_cat.get(path, 0) + 1
    return {
        "failures_per_1000_node_days": per(failures),
        "node_days": node_days,
        "nodes": nodes,
        "failures": failures,
        "by_category": {k: per(v) for k, v in sorted(by_cat.items())},
    }


def fit_exponential(hours: np.ndarray) -> dict:
    """MLE of the mean time between failures with its exact 95% interval (chi-square)."""
    n = len(hours)
    mean = float(hours.mean())
    lo = 2 * n * mean / stats.chi2.ppf(0.975, 2 * n)
    hi = 2 * n * mean / stats.chi2.ppf(0.025, 2 * n)
    loglik = float(-n * math.log(mean) - hours.sum() / mean)
    ks = stats.kstest(hours, "expon", args=(0.0, mean))
    return {"mttf_hours": mean, "ci95_hours": [float(lo), float(hi)], "rate_per_hour": 1.0 / mean,
            "loglik": loglik, "aic": 2 * 1 - 2 * loglik, "n": n,
            "ks": {"statistic": float(ks.statistic), "p_value": float(ks.pvalue)}}


def _weibull_loglik(log_k: float, log_lam: float, x: np.ndarray, logx: np.ndarray) -> float:
    k, lam = math.exp(log_k), math.exp(log_lam)
    z = x / lam
    return float(len(x) * (log_k - k * log_lam) + (k - 1) * logx.sum() - np.power(z, k).sum())


MAX_SHAPE = 1e3


class WeibullDiverges(ValueError):
    """The Weibull fit has no finite shape for these gaps (all equal, or nearly)."""


def fit_weibull(hours: np.ndarray) -> dict:
    """MLE of Weibull shape and scale; 95% Wald intervals from the observed information."""
    x = hours
    logx = np.log(x)
    n = len(x)

    # The shape's equation is scale-free: solve it on gaps divided by their largest, so that x**k
    # neither overflows nor underflows to 0/0 for large k.
    logy = logx - logx.max()

    def shape_equation(k: float) -> float:
        # d/dk of the profile log-likelihood, zero at the MLE (the usual Weibull score).
        yk = np.exp(k * logy)
        return float((yk * logy).sum() / yk.sum() - 1.0 / k - logy.mean())

    lo, hi = 1e-3, 1.0
    while shape_equation(hi) < 0 and hi < MAX_SHAPE:
        hi *= 2.0
    if not shape_equation(hi) >= 0:  # equal gaps: the likelihood grows without bound in the shape
        raise WeibullDiverges(f"the Weibull shape has no finite maximum-likelihood value (over {MAX_SHAPE:g}): "
                              "the gaps are (nearly) all equal")
    k = float(optimize.brentq(shape_equation, lo, hi, xtol=1e-10))
    lam = float(np.power(np.power(x, k).mean(), 1.0 / k))
    theta = np.array([math.log(k), math.log(lam)])
    # Observed information by central differences of the log-likelihood in (log k, log lambda).
    h = 1e-4
    f = lambda a, b: _weibull_loglik(a, b, x, logx)  # noqa: E731
    hess = np.empty((2, 2))
    for i in range(2):
        for j in range(2):
            ei, ej = np.eye(2)[i] * h, np.eye(2)[j] * h
            hess[i, j] = (f(*(theta + ei + ej)) - f(*(theta + ei - ej)) - f(*(theta - ei + ej))
                          + f(*(theta - ei - ej))) / (4 * h * h)
    try:
        cov = np.linalg.inv(-hess)
        se = np.sqrt(np.clip(np.diag(cov), 0.0, None))
    except np.linalg.LinAlgError:
        se = np.array([math.nan, math.nan])
    loglik = _weibull_loglik(theta[0], theta[1], x, logx)
    mttf = lam * math.gamma(1.0 + 1.0 / k)
    ks = stats.kstest(x, "weibull_min", args=(k, 0.0, lam))
    return {
        "shape": k, "scale_hours": lam, "mttf_hours": mttf,
        "shape_ci95": [k * math.exp(-_Z95 * se[0]), k * math.exp(_Z95 * se[0])],
        "scale_ci95_hours": [lam * math.exp(-_Z95 * se[1]), lam * math.exp(_Z95 * se[1])],
        "loglik": loglik, "aic": 2 * 2 - 2 * loglik, "n": n,
        "ks": {"statistic": float(ks.statistic), "p_value": float(ks.pvalue)},
    }


def fit_interarrivals(hours) -> dict:
    """The ``fits`` object: exponential, Weibull, KS table and the preferred model (lower AIC).

    With fewer than 2 gaps the fits are ``None`` and ``note`` says why.
    """
    x = np.maximum(np.asarray(hours, dtype=float), MIN_GAP_HOURS)
    if len(x) < 2:
        return {"exponential": None, "weibull": None, "ks": {}, "preferred": None, "n": int(len(x)),
                "note": "need at least 3 failures (2 gaps between them) to fit"}
    expo = fit_exponential(x)
    try:
        weib = fit_weibull(x)
    except WeibullDiverges as err:
        return {"exponential": expo, "weibull": None,
                "ks": {"exponential": expo["ks"], "note": "p-values are optimistic: parameters were fitted to "
                                                          "the same data"},
                "preferred": "exponential", "n": int(len(x)), "note": str(err)}
    return {
        "exponential": expo,
        "weibull": weib,
        "ks": {"exponential": expo["ks"], "weibull": weib["ks"],
               "note": "p-values are optimistic: parameters were fitted to the same data"},
        "preferred": "weibull" if weib["aic"] < expo["aic"] else "exponential",
        "n": int(len(x)),
    }


def job_mttf_projection(*, failures: int, node_hours: float, gpus_per_node: int, weibull: dict | None,
                        cluster_nodes: int, job_gpus=(8, 64, 512, 1024, 4096, 16384)) -> list[dict]:
    """MTTF of a job spanning G GPUs, assuming nodes fail independently.

    Exponential: a job on n nodes fails n times as often as one node.
    Weibull: the cluster-wide gaps are read as the minimum over ``cluster_nodes``
    identical nodes, so a node's scale is ``scale * N**(1/k)`` and a job on n
    nodes has scale ``scale_node * n**(-1/k)``. Both are approximations.
    """
    rows = []
    node_mttf = node_hours / failures if failures else math.inf
    for gpus in job_gpus:
        n = max(1, math.ceil(gpus / gpus_per_node))
        row = {"gpus": gpus, "nodes": n, "mttf_hours_exponential": node_mttf / n}
        if weibull:
            k, lam = weibull["shape"], weibull["scale_hours"]
            scale_job = lam * (cluster_nodes / n) ** (1.0 / k)
            row["mttf_hours_weibull"] = scale_job * special.gamma(1.0 + 1.0 / k)
        rows.append(row)
    return rows
