"""The terminal summary: incidents first (ranked), then categories, lemon nodes, fits and bad input.

Example::

    render_summary(analysis, console=rich.console.Console())
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timezone

from rich.console import Console
from rich.table import Table

from ucp.reliability.logs.analyze import LogAnalysis


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _num(x, fmt: str = "{:.3g}") -> str:
    return "-" if x is None else fmt.format(x)


def ranked_incidents(incidents) -> list:
    """Incidents in the order an operator reads them: fatal first, then the rarest kind of root cause.

    A root cause that recurs in many incidents (a monitoring daemon's warning every minute) is a known,
    standing condition; one seen once is news. Then the incidents that touched more nodes, then more events.
    """
    recurs = Counter(i.root_category for i in incidents)
    return sorted(incidents, key=lambda i: (not i.fatal, recurs[i.root_category], -len(i.nodes), -i.event_count,
                                            i.id))


def incident_table(result: LogAnalysis, *, top: int = 10) -> Table:
    """The operator's first table: incidents (not lines), ranked by :func:`ranked_incidents`."""
    recurs = Counter(i.root_category for i in result.incidents)
    incs = Table(title=f"Incidents, rarest root cause first (top {top} of {len(result.incidents)})")
    for col in ("id", "start (UTC)", "root cause", "root node", "job", "events", "nodes", "same root"):
        incs.add_column(col, justify="right" if col in ("id", "events", "nodes", "same root") else "left")
    for inc in ranked_incidents(result.incidents)[:top]:
        incs.add_row(str(inc.id), _when(inc.start), inc.root_category, inc.root_node or "-",
                     inc.root_job or "-", str(inc.event_count), str(len(inc.nodes)), str(recurs[inc.root_category]))
    return incs


def render_summary(result: LogAnalysis, *, console: Console, top: int = 10) -> None:
    """Print the summary tables for ``result`` to ``console``."""
    d = result.to_dict()
    s = d["summary"]
    console.print(f"[bold]{s['lines']:,}[/] lines, {s['failure_lines']:,} failure-related, "
                  f"{s['normal_lines']:,} normal, {s['unclassified_lines']:,} unclassified; "
                  f"{s['incidents']} incidents on {s['nodes']} nodes; {_when(s['first_timestamp'])} .. "
                  f"{_when(s['last_timestamp'])} UTC")

    console.print(incident_table(result, top=top))

    cats = Table(title="Failure categories (lines)")
    cats.add_column("category")
    cats.add_column("lines", justify="right")
    cats.add_column("per 1000 node-days (incidents)", justify="right")
    for path, n in list(d["categories"].items())[:top * 2]:
        cats.add_row(path, f"{n:,}", _num(d["rates"]["by_category"].get(path)))
    console.print(cats)

    if result.discovered:
        mined = Table(title="Mined categories (no taxonomy category knows these; keep them with --taxonomy-out)")
        for col in ("category", "lines", "nodes", "domain (confidence)", "example"):
            mined.add_column(col, justify="right" if col in ("lines", "nodes") else "left")
        for c in result.discovered[:top]:
            mined.add_row(c.path, f"{c.lines:,}", str(len(c.nodes)), f"{c.domain} ({c.domain_confidence:.2f})",
                          (c.examples[0] if c.examples else "")[:80])
        console.print(mined)

    if result.lemons:
        lem = Table(title="Lemon nodes (repeat root causes)")
        for col in ("node", "incidents", "expected", "p-value", "categories"):
            lem.add_column(col)
        for n in result.lemons[:top]:
            lem.add_row(n.node, str(n.incidents), f"{n.expected:.2f}", f"{n.p_value:.2g}",
                        ", ".join(f"{k} x{v}" for k, v in n.categories.items()))
        console.print(lem)

    rates, fits = d["rates"], d["fits"]
    fit = Table(title=f"Reliability: {rates['failures']} failures over {rates['node_days']:.4g} node-days "
                      f"= {rates['failures_per_1000_node_days']:.4g} per 1000 node-days")
    for col in ("model", "MTTF (h)", "95% CI", "parameters", "KS D", "KS p"):
        fit.add_column(col)
    e, w = fits.get("exponential"), fits.get("weibull")
    if e:
        fit.add_row("exponential", _num(e["mttf_hours"]), f"{_num(e['ci95_hours'][0])} .. {_num(e['ci95_hours'][1])}",
                    f"rate {_num(e['rate_per_hour'])}/h", _num(e["ks"]["statistic"]), _num(e["ks"]["p_value"]))
    if w:
        fit.add_row("weibull", _num(w["mttf_hours"]), "-",
                    f"shape {_num(w['shape'])} [{_num(w['shape_ci95'][0])}, {_num(w['shape_ci95'][1])}], "
                    f"scale {_num(w['scale_hours'])} h", _num(w["ks"]["statistic"]), _num(w["ks"]["p_value"]))
    if not (e or w):
        fit.add_row("-", "-", "-", fits.get("note", ""), "-", "-")
    console.print(fit)

    c = d["input"]
    console.print(f"input: {c['files']} files, {c['lines']:,} lines; skipped binary {c['binary_skipped']}, "
                  f"truncated {c['truncated']}, encoding fallback {c['encoding_fallback']}, "
                  f"bad timestamps {c['bad_timestamp']}, no timestamp {c['no_timestamp']}, "
                  f"empty {c['empty']}, unreadable files {len(c['unreadable_files'])}")
    if c.get("year_assumed"):
        console.print(f"[yellow]warning:[/] stamps without a year in {len(c['year_assumed'])} file(s) "
                      f"({', '.join(c['year_assumed'][:3])}): placed in the latest year that is not in the "
                      "future; pass --year YYYY if that is wrong")
