"""The HTML report: one self-contained file, plots inlined as base64 PNG (matplotlib, Agg).

Plots: failure categories, failures over time, the MTTF fit (empirical
survival against the exponential and Weibull fits) and a per-node heat map.

Example::

    write_html(analyze_logs(["logs/"]), "report.html")
"""

from __future__ import annotations

import base64
import html
import io
import json

import numpy as np

from reliability.logs.analyze import LogAnalysis


def _figure_png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _plots(result: LogAnalysis) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    d = result.to_dict()
    out: dict[str, str] = {}

    cats = list(d["categories"].items())[:20][::-1]
    fig, ax = plt.subplots(figsize=(8, max(2.5, 0.3 * len(cats) + 1)))
    ax.barh([c for c, _ in cats] or ["(none)"], [n for _, n in cats] or [0], color="#c0504d")
    ax.set_xlabel("failure-related lines")
    ax.set_title("Category breakdown")
    out["categories"] = _figure_png(fig)

    starts = np.array([i.start for i in result.incidents if i.start is not None and i.fatal])
    fig, ax = plt.subplots(figsize=(8, 3))
    if len(starts):
        days = (starts - starts.min()) / 86400.0
        ax.hist(days, bins=min(50, max(5, len(starts) // 2)), color="#4f81bd")
        ax.set_xlabel("days since first failure")
    ax.set_ylabel("incidents")
    ax.set_title("Failures over time")
    out["timeline"] = _figure_png(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    fits = d["fits"]
    if fits.get("exponential"):
        gaps = np.sort(np.maximum(np.diff(np.sort(starts)) / 3600.0, 1.0 / 3600.0))
        surv = 1.0 - np.arange(1, len(gaps) + 1) / (len(gaps) + 1)
        ax.step(gaps, surv, where="post", label="empirical", color="black")
        grid = np.linspace(0, gaps.max(), 200)
        e, w = fits["exponential"], fits["weibull"]
        ax.plot(grid, np.exp(-grid / e["mttf_hours"]), label=f"exponential (MTTF {e['mttf_hours']:.3g} h)")
        ax.plot(grid, np.exp(-np.power(grid / w["scale_hours"], w["shape"])),
                label=f"Weibull (k={w['shape']:.2f}, MTTF {w['mttf_hours']:.3g} h)")
        ax.legend()
    else:
        ax.text(0.5, 0.5, fits.get("note", "no fit"), ha="center", transform=ax.transAxes)
    ax.set_xlabel("hours between failures")
    ax.set_ylabel("P(no failure yet)")
    ax.set_title("MTTF fit")
    out["mttf"] = _figure_png(fig)

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
        im = ax.imshow(np.log1p(grid), aspect="auto", cmap="Reds")
        ax.set_yticks(range(len(top)), top, fontsize=7)
        ax.set_xlabel(f"time bins ({(t1 - t0) / 3600.0 / bins:.3g} h each)")
        fig.colorbar(im, ax=ax, label="log(1 + events)")
    ax.set_title("Failure events per node over time")
    out["heatmap"] = _figure_png(fig)
    return out


def render_html(result: LogAnalysis) -> str:
    """The report as one HTML string (no external resources)."""
    d = result.to_dict()
    plots = _plots(result)
    esc = html.escape
    rows = "".join(
        f"<tr><td>{i.id}</td><td>{esc(i.root_category)}</td><td>{esc(i.root_node or '-')}</td>"
        f"<td>{esc(i.root_job or '-')}</td><td>{i.event_count}</td><td>{esc(i.root_message[:160])}</td></tr>"
        for i in sorted(result.incidents, key=lambda i: -i.event_count)[:25])
    lemons = "".join(f"<tr><td>{esc(n.node)}</td><td>{n.incidents}</td><td>{n.p_value:.2g}</td></tr>"
                     for n in result.lemons)
    imgs = "".join(f'<figure><img alt="{k}" src="data:image/png;base64,{v}"/><figcaption>{k}</figcaption></figure>'
                   for k, v in plots.items())
    summary = esc(json.dumps({"summary": d["summary"], "rates": d["rates"], "input": d["input"]}, indent=1))
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>ucp logs report</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:2px 6px;font-size:90%}}figure{{display:inline-block}}</style></head>
<body><h1>Cluster log analysis</h1>
<pre>{summary}</pre>
{imgs}
<h2>Top incidents</h2><table><tr><th>id</th><th>root cause</th><th>node</th><th>job</th><th>events</th><th>message</th></tr>{rows}</table>
<h2>Lemon nodes</h2><table><tr><th>node</th><th>incidents</th><th>p-value</th></tr>{lemons}</table>
</body></html>
"""


def write_html(result: LogAnalysis, path: str) -> None:
    """Write :func:`render_html` to ``path``."""
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(render_html(result))
