"""Tables for a :class:`~ucp.tools.bench.core_bench.BenchReport`: rich for the terminal, markdown for docs.

Example::

    for table in render_tables(report):
        Console().print(table)
    Path("docs/BENCHMARKS.md").write_text(render_markdown(report))
"""

from __future__ import annotations

import math

from rich.table import Table

from ucp.tools.bench.core_bench import TARGETS, BenchReport
from ucp.tools.bench.state_recipe import GIB

RSS_TARGET = 0.10


def _fmt_s(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _fmt_rate(nbytes: int, seconds: float | None) -> str:
    return "-" if not seconds else f"{nbytes / GIB / seconds:.2f}"


def _fmt_range(report: BenchReport, metric: str, method: str, directory: str) -> str:
    value = report.value(metric, method, directory)
    if value is None:
        return "-"
    low, high = report.value(metric, method, directory, "min"), report.value(metric, method, directory, "max")
    return f"{value:.3f} ({low:.3f}-{high:.3f})"


def _rows_times(report: BenchReport, directory: str) -> list[list[str]]:
    rows = []
    for method in report.methods():
        save = report.value("save", method, directory)
        load = report.value("load", method, directory)
        if save is None:
            continue
        rows.append([method, _fmt_range(report, "save", method, directory), _fmt_rate(report.state_bytes, save),
                     _fmt_range(report, "load", method, directory), _fmt_rate(report.state_bytes, load)])
    return rows


def _rows_targets(report: BenchReport) -> list[list[str]]:
    rows = []
    for directory in report.directories():
        for target in TARGETS:
            ratio = report.ratio(target.metric, target.ours, target.peers, directory)
            if ratio is None or not report.applies(target, directory):
                continue
            goal = "-" if math.isinf(target.limit) else f"<= {target.limit:.2f}"
            verdict = "-" if math.isinf(target.limit) else ("met" if ratio <= target.limit else "MISSED")
            rows.append([target.label, directory, f"{ratio:.2f}", goal, verdict])
    for method, fraction in report.extra_rss_fraction.items():
        goal = f"<= {RSS_TARGET:.2f}" if method == "ucp" else "-"
        verdict = ("met" if fraction <= RSS_TARGET else "MISSED") if method == "ucp" else "-"
        rows.append([f"extra peak RSS, {method} save / state", "(fresh process)", f"{fraction:.3f}", goal, verdict])
    return rows


def _stat_label(report: BenchReport) -> str:
    return (f"best of {report.repeats}" if report.statistic == "min"
            else f"median (min-max) of {report.repeats}, interleaved, order rotated")


TIME_HEADERS = ["method", "save s", "save GiB/s", "load s", "load GiB/s"]  # s: median (min-max)
TARGET_HEADERS = ["comparison", "directory", "ratio", "target", ""]


def render_tables(report: BenchReport) -> list[Table]:
    """One table of times per directory, then one table of ratios against the targets."""
    tables = []
    size = f"{report.state_bytes / GIB:.2f} GiB, {report.tensors} tensors, {_stat_label(report)}"
    for directory in report.directories():
        table = Table(title=f"{directory} ({size})")
        for i, header in enumerate(TIME_HEADERS):
            table.add_column(header, justify="left" if i == 0 else "right")
        for row in _rows_times(report, directory):
            table.add_row(*row)
        tables.append(table)
    ratios = Table(title="ucp vs peers (ratio = ucp / peer; lower is better)")
    for i, header in enumerate(TARGET_HEADERS):
        ratios.add_column(header, justify="right" if i == 2 else "left")
    for row in _rows_targets(report):
        style = "red" if row[-1] == "MISSED" else None
        ratios.add_row(*row, style=style)
    tables.append(ratios)
    return tables


def _markdown(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def render_markdown(report: BenchReport) -> str:
    """The same tables as markdown."""
    parts = []
    for directory in report.directories():
        parts.append(f"**{directory}** ({report.state_bytes / GIB:.2f} GiB, {report.tensors} tensors, "
                     f"{_stat_label(report)})\n")
        parts.append(_markdown(TIME_HEADERS, _rows_times(report, directory)))
    parts.append("**Ratios** (ucp / peer; lower is better)\n")
    parts.append(_markdown(TARGET_HEADERS, _rows_targets(report)))
    return "\n\n".join(parts) + "\n"
