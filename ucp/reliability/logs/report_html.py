"""The HTML report: one self-contained page a person reads (plots inlined as base64 PNG, no network).

Summary cards first (lines, failure lines, incidents, nodes, failure rate,
MTTF), then the failure categories (known and mined), the mined categories
with example lines, the largest incidents with their cascades, lemon nodes,
the plots (categories, failures over time, MTTF fit, per-node heat map) and
what the input stage skipped or repaired.

Example::

    write_html(analyze_logs(["logs/"]), "report.html")
"""

from __future__ import annotations

import html
from datetime import datetime, timezone

from ucp.reliability.logs.analyze import LogAnalysis
from ucp.reliability.logs.report_plots import plots

_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:0;background:#f4f6f8;color:#1d2733}
header{background:#1d2733;color:#fff;padding:18px 32px}header h1{margin:0;font-size:22px}
header p{margin:4px 0 0;color:#b8c4d0;font-size:14px}main{padding:20px 32px;max-width:1280px}
section{background:#fff;border-radius:8px;padding:16px 20px;margin:0 0 18px;box-shadow:0 1px 2px rgba(0,0,0,.08)}
h2{font-size:17px;margin:0 0 10px}.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(170px,1fr));gap:12px;
margin:0 0 18px}.card{background:#fff;border-radius:8px;padding:12px 16px;box-shadow:0 1px 2px rgba(0,0,0,.08)}
.card .v{font-size:24px;font-weight:600}.card .l{font-size:12px;color:#5b6b7b;text-transform:uppercase;letter-spacing:.04em}
table{border-collapse:collapse;width:100%;font-size:13px}th{text-align:left;color:#5b6b7b;font-weight:600}
td,th{border-bottom:1px solid #e3e8ee;padding:5px 8px;vertical-align:top}td.n{text-align:right;white-space:nowrap}
.tag{display:inline-block;padding:1px 7px;border-radius:10px;font-size:11px;margin-left:6px}
.known{background:#e4efe7;color:#22643a}.mined{background:#fdf0d9;color:#8a5a00}
pre{background:#f4f6f8;padding:6px 8px;border-radius:4px;white-space:pre-wrap;word-break:break-all;font-size:12px;margin:4px 0}
.muted{color:#5b6b7b;font-size:13px}figure{display:inline-block;margin:6px 12px 6px 0;vertical-align:top}
figure img{max-width:600px}figcaption{font-size:12px;color:#5b6b7b}details summary{cursor:pointer}
"""


def _when(ts: float | None) -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _num(x, fmt: str = "{:,.3g}") -> str:
    return "-" if x is None else fmt.format(x)


def _cards(result: LogAnalysis, d: dict) -> str:
    s, rates, fits = d["summary"], d["rates"], d["fits"]
    preferred = fits.get("preferred")
    mttf = fits[preferred]["mttf_hours"] if preferred and fits.get(preferred) else None
    share = s["failure_lines"] / s["lines"] if s["lines"] else 0.0
    cards = [("lines read", f"{s['lines']:,}"), ("failure lines", f"{s['failure_lines']:,} ({share:.1%})"),
             ("mined-category lines", f"{s['discovered_lines']:,}"), ("incidents", f"{s['incidents']:,}"),
             ("fatal incidents", f"{rates['failures']:,}"), ("nodes", f"{s['nodes']:,}"),
             ("failures / 1000 node-days", _num(rates["failures_per_1000_node_days"])),
             (f"MTTF ({preferred or 'no fit'})", "-" if mttf is None else f"{mttf:,.3g} h"),
             ("templates", f"{s['templates']:,} ({s['failure_templates']:,} with failures)"),
             ("lemon nodes", f"{len(result.lemons)}")]
    return '<div class="cards">' + "".join(
        f'<div class="card"><div class="v">{html.escape(v)}</div><div class="l">{html.escape(k)}</div></div>'
        for k, v in cards) + "</div>"


def _categories(result: LogAnalysis, d: dict) -> str:
    mined = {c.path for c in result.discovered}
    roots: dict[str, int] = {}
    for inc in result.incidents:
        roots[inc.root_category] = roots.get(inc.root_category, 0) + 1
    rows = "".join(
        f"<tr><td>{html.escape(path)}<span class='tag {'mined' if path in mined else 'known'}'>"
        f"{'mined' if path in mined else 'taxonomy'}</span></td><td class='n'>{n:,}</td>"
        f"<td class='n'>{roots.get(path, 0):,}</td><td class='n'>{_num(d['rates']['by_category'].get(path))}</td></tr>"
        for path, n in d["categories"].items())
    return ("<section><h2>Failure categories</h2><table><tr><th>category</th><th>lines</th><th>incidents rooted "
            "here</th><th>per 1000 node-days</th></tr>" + (rows or "<tr><td colspan=4>no failures found</td></tr>")
            + "</table></section>")


def _mined(result: LogAnalysis) -> str:
    if not result.discovered:
        return ("<section><h2>Mined categories</h2><p class='muted'>Every failure line matched a taxonomy "
                "category.</p></section>")
    blocks = []
    for c in result.discovered:
        examples = "".join(f"<pre>{html.escape(e)}</pre>" for e in c.examples[:3])
        templates = "".join(f"<li><code>{html.escape(t)}</code></li>" for t in c.templates[:5])
        blocks.append(
            f"<details open><summary><b>{html.escape(c.name)}</b> &mdash; <code>{html.escape(c.path)}</code>, "
            f"{c.lines:,} lines on {len(c.nodes)} nodes; domain <b>{html.escape(c.domain)}</b> "
            f"(confidence {c.domain_confidence:.2f})</summary><ul>{templates}</ul>{examples}</details>")
    return ("<section><h2>Mined categories</h2><p class='muted'>Failure lines that no taxonomy category "
            "knows, grouped by their templates. Keep them with <code>--taxonomy-out FILE</code>.</p>"
            + "".join(blocks) + "</section>")


def _incidents(result: LogAnalysis, top: int = 20) -> str:
    rows = []
    for inc in sorted(result.incidents, key=lambda i: (-i.event_count, i.id))[:top]:
        cascade = ", ".join(f"{html.escape(k)} &times;{v}" for k, v in
                            sorted(inc.categories.items(), key=lambda kv: -kv[1]))
        rows.append(f"<tr><td class='n'>{inc.id}</td><td>{_when(inc.start)}</td><td>"
                    f"{html.escape(inc.root_category)}<pre>{html.escape(inc.root_message[:200])}</pre></td>"
                    f"<td>{html.escape(inc.root_node or '-')}</td><td class='n'>{inc.event_count:,}</td>"
                    f"<td class='n'>{len(inc.nodes)}</td><td>{cascade}</td></tr>")
    return (f"<section><h2>Largest incidents ({len(result.incidents):,} in all)</h2><table><tr><th>id</th>"
            "<th>start</th><th>root cause</th><th>root node</th><th>events</th><th>nodes</th><th>cascade</th></tr>"
            + ("".join(rows) or "<tr><td colspan=7>none</td></tr>") + "</table></section>")


def _lemons(result: LogAnalysis) -> str:
    if not result.lemons:
        return "<section><h2>Lemon nodes</h2><p class='muted'>No node fails more often than chance explains.</p></section>"
    rows = "".join(f"<tr><td>{html.escape(n.node)}</td><td class='n'>{n.incidents}</td><td class='n'>"
                   f"{n.expected:.2f}</td><td class='n'>{n.p_value:.2g}</td><td>"
                   f"{html.escape(', '.join(f'{k} x{v}' for k, v in n.categories.items()))}</td></tr>"
                   for n in result.lemons[:30])
    return ("<section><h2>Lemon nodes</h2><table><tr><th>node</th><th>incidents</th><th>expected</th>"
            "<th>p-value</th><th>root causes</th></tr>" + rows + "</table></section>")


def render_html(result: LogAnalysis) -> str:
    """The report as one HTML string (no external resources)."""
    d = result.to_dict()
    figures = "".join(f'<figure><img alt="{k}" src="data:image/png;base64,{v}"/><figcaption>{caption}</figcaption>'
                      f"</figure>" for k, (caption, v) in plots(result).items())
    c = d["input"]
    repairs = (f"{c['files']} files, {c['lines']:,} lines; skipped binary {c['binary_skipped']}, truncated "
               f"{c['truncated']}, encoding fallback {c['encoding_fallback']}, bad timestamps {c['bad_timestamp']}, "
               f"no timestamp {c['no_timestamp']}, empty {c['empty']}, unreadable files {len(c['unreadable_files'])}")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Cluster log analysis</title><style>{_CSS}</style></head>
<body><header><h1>Cluster log analysis</h1>
<p>{_when(result.first_timestamp)} &ndash; {_when(result.last_timestamp)} &middot; {len(result.nodes):,} nodes
&middot; made by <code>ucp logs analyze</code></p></header>
<main>{_cards(result, d)}{_categories(result, d)}{_mined(result)}{_incidents(result)}{_lemons(result)}
<section><h2>Plots</h2>{figures}</section>
<section><h2>Input</h2><p class="muted">{html.escape(repairs)}</p></section></main></body></html>
"""


def write_html(result: LogAnalysis, path: str) -> None:
    """Write :func:`render_html` to ``path``."""
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(render_html(result))
