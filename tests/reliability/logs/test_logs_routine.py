"""Routine recurring warnings are not failures; the same text with something worse after it stays one."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from ucp.reliability.logs.analyze import AnalysisOptions, analyze_logs
from ucp.reliability.logs.taxonomy import load_taxonomy

T0 = datetime(2024, 5, 1, 10, 0, 0, tzinfo=timezone.utc)
POLL = "node-admin gmetad[1682]: data_thread() got not answer from any [cluster_{}] datasource"


@pytest.fixture(scope="module")
def taxonomy():
    return load_taxonomy()


def _line(seconds: float, text: str) -> str:
    return f"{(T0 + timedelta(seconds=seconds)).strftime('%Y-%m-%dT%H:%M:%S')}Z {text}"


def _write(tmp_path, lines) -> str:
    path = tmp_path / "messages.log"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _polls(minutes: int = 40):
    # a monitoring daemon failing to poll three data sources every 15 s, for 40 minutes
    return [(s, POLL.format("ABC"[s // 15 % 3])) for s in range(0, minutes * 60, 15)]


def _others():
    return [(s, f"node{s % 7} sshd[{100 + s}]: session opened for user alice") for s in range(7, 2400, 60)]


def test_a_daemons_steady_warning_with_nothing_after_it_is_not_a_failure(tmp_path, taxonomy):
    rows = sorted(_polls() + _others())
    result = analyze_logs([_write(tmp_path, [_line(s, t) for s, t in rows])], taxonomy=taxonomy,
                          options=AnalysisOptions(default_year=2024))
    assert [e.message for e in result.events if "data_thread" in e.message] == []
    assert result.classification_methods.get("routine") == 3  # one key per data source name
    assert result.incidents == ()


def test_the_same_warning_followed_by_a_fatal_line_of_its_daemon_stays_a_failure(tmp_path, taxonomy):
    rows = sorted(_polls() + _others() + [(2390, "node-admin gmetad[1682]: fatal: segmentation fault, core dumped")])
    result = analyze_logs([_write(tmp_path, [_line(s, t) for s, t in rows])], taxonomy=taxonomy,
                          options=AnalysisOptions(default_year=2024))
    assert len([e for e in result.events if "data_thread" in e.message]) == len(_polls())
    assert "routine" not in result.classification_methods


def test_a_burst_is_not_routine(tmp_path, taxonomy):
    # the same count of lines within two minutes: a storm, not a steady poll
    rows = sorted([(s / 15, t) for s, t in _polls()] + _others())
    result = analyze_logs([_write(tmp_path, [_line(s, t) for s, t in rows])], taxonomy=taxonomy,
                          options=AnalysisOptions(default_year=2024))
    assert len([e for e in result.events if "data_thread" in e.message]) == len(_polls())


def test_a_warning_from_many_nodes_is_not_one_daemons_routine(tmp_path, taxonomy):
    rows = sorted([(s, t.replace("node-admin", f"node-{s // 15 % 5}")) for s, t in _polls()] + _others())
    result = analyze_logs([_write(tmp_path, [_line(s, t) for s, t in rows])], taxonomy=taxonomy,
                          options=AnalysisOptions(default_year=2024))
    assert len([e for e in result.events if "data_thread" in e.message]) == len(_polls())


def test_the_report_plots_put_dates_on_the_time_axes(tmp_path, taxonomy, monkeypatch):
    # item 5 of the envelope issue: days since the first failure told an operator nothing to match records by
    from ucp.reliability.logs import report_plots

    rows = sorted(_polls() + _others() + [(60 * k + 3, f"node{k % 3} kernel: Kernel panic - not syncing: fatal")
                                          for k in range(0, 40, 4)])
    result = analyze_logs([_write(tmp_path, [_line(s, t) for s, t in rows])], taxonomy=taxonomy,
                          options=AnalysisOptions(default_year=2024))
    labels = {}

    def capture(fig):
        fig.canvas.draw()
        ax = fig.axes[0]
        ticks = [t.get_text() for t in ax.get_xticklabels()] + [ax.xaxis.get_offset_text().get_text()]
        labels[ax.get_title()] = (ax.get_xlabel(), " ".join(ticks))
        return ""

    monkeypatch.setattr(report_plots, "_figure_png", capture)
    report_plots.plots(result)
    time_axes = {title: v for title, v in labels.items() if "time" in title.lower() or "timeline" in title.lower()}
    assert time_axes
    for xlabel, ticks in time_axes.values():
        assert xlabel.startswith("date (UTC)")
        assert "2024" in ticks  # the date, not a day count
