"""Plots of the ETTR model and of where the simulator says it breaks down.

Regenerate the figures in docs/img with::

    .venv/bin/python -m ucp.reliability.ettr.plots --out docs/img

matplotlib runs on the Agg backend (no display needed); it is imported only
when a plot is drawn.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from ucp.reliability.ettr.model import JobReliability, daly_interval_s, expected_ettr, optimal_interval_s, young_interval_s
from ucp.reliability.ettr.simulator import FailureLaw, simulate_grid

__all__ = ["plot_interval_curve", "plot_model_vs_simulation", "main"]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # headless: CLIs and CI have no display
    import matplotlib.pyplot as plt

    return plt


def plot_interval_curve(
    job: JobReliability,
    *,
    intervals_s: Sequence[float],
    path: str | os.PathLike,
    marks_s: Mapping[str, float] | None = None,
    title: str | None = None,
) -> Path:
    """ETTR against checkpoint interval (minutes), with vertical marks (optimum, Young, ...)."""
    plt = _pyplot()
    minutes = np.asarray(intervals_s, dtype=float) / 60.0
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(minutes, [expected_ettr(job, interval_s=t) for t in intervals_s], color="C0", label="model E[ETTR]")
    for index, (name, seconds) in enumerate((marks_s or {}).items()):
        ax.axvline(seconds / 60.0, color=f"C{index + 1}", linestyle="--", label=f"{name}: {seconds / 60.0:.1f} min")
    ax.set_xscale("log")
    ax.set_xlabel("checkpoint interval (minutes)")
    ax.set_ylabel("expected ETTR")
    ax.set_ylim(0, 1)
    ax.grid(True, alpha=0.3)
    ax.set_title(title or f"{job.nodes} nodes, job MTTF {job.mttf_s / 3600:.2f} h")
    ax.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def plot_model_vs_simulation(path: str | os.PathLike, *, runs: int = 200, seed: int = 0) -> Path:
    """Two panels: ETTR vs interval/MTTF (exponential), and vs Weibull shape."""
    plt = _pyplot()
    job = JobReliability.from_per_1000_node_days(2000, 6.5, restart_s=300.0, save_blocking_s=30.0)
    mttf = job.mttf_s
    ratios = np.geomspace(0.01, 2.0, 30)
    intervals = ratios * mttf
    simulated = simulate_grid(job, intervals_s=intervals, runs=runs, seed=seed)
    model = [expected_ettr(job, interval_s=t) for t in intervals]

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    left.plot(ratios, model, label="model (Kokolis et al.)", color="C0")
    left.errorbar(
        ratios, [r.ettr for r in simulated], yerr=[2 * r.stderr for r in simulated],
        fmt="o", ms=3, color="C1", label="simulation, exponential (±2 s.e.)",
    )
    left.set_xscale("log")
    left.set_xlabel("checkpoint interval / job MTTF")
    left.set_ylabel("ETTR")
    left.set_ylim(0, 1)
    left.grid(True, alpha=0.3)
    left.set_title(f"16k GPUs (2000 nodes), MTTF {mttf / 3600:.2f} h, u0 5 min, w 30 s")
    left.legend(fontsize=8)

    shapes = np.array([0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.25, 1.5, 2.0])
    interval = 1800.0
    horizon = 30 * 86400.0  # a month-long job
    curves = {}
    for label, fresh in (("fresh nodes at start", True), ("stationary (aged) nodes", False)):
        curves[label] = [
            simulate_grid(
                job, intervals_s=[interval], runs=max(20, runs // 4), seed=seed, horizon_s=horizon,
                law=FailureLaw(weibull_shape=float(k), fresh_nodes=fresh),
            )[0].ettr
            for k in shapes
        ]
    right.axhline(expected_ettr(job, interval_s=interval), color="C0", label="model (shape-free)")
    for index, (label, values) in enumerate(curves.items()):
        right.plot(shapes, values, "o-", ms=3, color=f"C{index + 1}", label=f"simulation, {label}")
    right.set_xlabel("Weibull shape of per-node failures (1 = exponential)")
    right.set_ylabel("ETTR")
    right.set_ylim(0, 1)
    right.grid(True, alpha=0.3)
    right.set_title("interval 30 min, 30-day job, same mean rate")
    right.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ucp.reliability.ettr.plots", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/img", help="directory for the PNG files (default docs/img)")
    parser.add_argument("--runs", type=int, default=200, help="Monte-Carlo runs per point (default 200)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    job = JobReliability.from_per_1000_node_days(2000, 6.5, restart_s=300.0, save_blocking_s=60.0)
    marks = {
        "ETTR-optimal": optimal_interval_s(job),
        "Young": young_interval_s(job),
        "Daly": daly_interval_s(job),
    }
    made = [
        plot_interval_curve(
            job, intervals_s=np.geomspace(60, 4 * 3600, 200), path=out / "ettr_interval_curve.png", marks_s=marks,
            title="16k GPUs (2000 nodes x 8), r_f 6.5/1000 node-days, u0 5 min, w 1 min",
        ),
        plot_model_vs_simulation(out / "ettr_model_vs_simulation.png", runs=args.runs),
    ]
    for path in made:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
