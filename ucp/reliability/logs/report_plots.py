"""Plots of the HTML report as base64 PNG (matplotlib, Agg): categories, timeline, MTTF fit, heat map.

Example::

    for name, (caption, png_base64) in plots(analyze_logs(["logs/"])).items():
        ...
"""

from __future__ import annotations

import base64
import io

import numpy as np

from ucp.reliability.logs.analyze import LogAnalysis


def _figure_png(fig) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def plots(result: LogAnalysis) -> dict[str, tuple[str, str]]:
    """name -> (caption, base64 PNG) for the four plots of the report."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    d = result.to_dict()
    out: dict[str, tuple[str, str]] = {}

    mined = {c.path for c in result.discovered}
    cats = list(d["categories"].items())[:20][::-1]
    fig, ax = plt.subplots(figsize=(8, max(2.5, 0.3 * len(cats) + 1)))
    ax.barh([c for c, _ in cats] or ["(none)"], [n for _, n in cats] or [0],
            color=["#e0a030" if c in mined else "#c0504d" for c, _ in cats] or ["#c0504d"])
    ax.set_xlabel("failure lines (orange: mined categories)")
    ax.set_title("Category breakdown")
    out["categories"] = ("failure lines per category", _figure_png(fig))

    starts = np.array([i.start for i in result.incidents if i.start is not None and i.fatal])
    fig, ax = plt.subplots(figsize=(8, 3))
    if len(starts):
        # Dates on the axis (UTC), not days since the first failure: an operator matches them to other records.
        dates = (starts * 1e6).astype("int64").astype("datetime64[us]")
        ax.hist(mdates.date2num(dates), bins=min(50, max(5, len(starts) // 2)), color="#4f81bd")
        ax.xaxis.set_major_locator(mdates.AutoDateLocator())
        ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(ax.xaxis.get_major_locator()))
        ax.set_xlabel("date (UTC)")
    ax.set_ylabel("incidents")
    ax.set_title("Failures over time")
    out["timeline"] = ("fatal incidents over time", _figure_png(fig))

    fig, ax = plt.subplots(figsize=(6, 4))
    fits = d["fits"]
    if fits.get("exponential"):
        gaps = np.sort(np.maximum(np.diff(np.sort(starts)) / 3600.0, 1.0 / 3600.0))
        surv = 1.0 - np.arange(1, len(gaps) + 1) / (len(gaps) + 1)
        ax.step(gaps, surv, where="post", label="empirical", color="black")
        grid = np.linspace(0, gaps.max(), 200)
        e, w = fits["exponential"], fits["weibull"]
        ax.plot(grid, np.exp(-grid / e["mttf_hours"]), label=f"exponential (MTTF {e['mttf_hours']:.3g} h)")
        if w:  # None when the shape diverges (equal gaps)
            ax.plot(grid, np.exp(-np.power(grid / w["scale_hours"], w["shape"])),
                    label=f"Weibull (k={w['shape']:.2f}, MTTF {w['mttf_hours']:.3g} h)")
        ax.legend()
    else:
        ax.text(0.5, 0.5, fits.get("note", "no fit"), ha="center", transform=ax.transAxes)
    ax.set_xlabel("hours between failures")
    ax.set_ylabel("P(no failure yet)")
    ax.set_title("MTTF fit")
    out["mttf"] = ("time between fatal incidents against the exponential and Weibull fits", _figure_png(fig))

    timed = [e for e in result.events if e.node is not None and e.timestamp is not None]
    by_node: dict[str, int] = {}
    for ev in timed:
        by_node[ev.node] = by_node.get(ev.node, 0) + 1
    top = sorted(by_node, key=lambda n: -by_node[n])[:30]
    fig, ax = plt.subplots(figsize=(8, max(2.5, 0.25 * len(top) + 1)))
    if top:
        t0 = min(e.timestamp for e in timed)
        t1 = max(e.timestamp for e in timed)
        bins = 40
        grid = np.zeros((len(top), bins))
        row = {n: i for i, n in enumerate(top)}
        for ev in timed:
            if ev.node in row:
                col = min(bins - 1, int((ev.timestamp - t0) / max(t1 - t0, 1e-9) * bins))
                grid[row[ev.node], col] += 1
        lo, hi = mdates.date2num((np.array([t0, max(t1, t0 + 1)]) * 1e6).astype("int64").astype("datetime64[us]"))
        im = ax.imshow(np.log1p(grid), aspect="auto", cmap="Reds", extent=(lo, hi, len(top) - 0.5, -0.5))
        ax.set_yticks(range(len(top)), top, fontsize=7)
        ax.xaxis.set_major_locator(mdates.AutoDateLocator())
        ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(ax.xaxis.get_major_locator()))
        ax.set_xlabel(f"date (UTC); {(t1 - t0) / 3600.0 / bins:.3g} h per column")
        fig.colorbar(im, ax=ax, label="log(1 + events)")
    ax.set_title("Failure events per node over time")
    out["heatmap"] = ("failure lines per node (30 busiest) over time", _figure_png(fig))
    return out
