"""Envelopes learned from the data, stamps of any layout, templates that keep their constants, binary input."""

from __future__ import annotations

import calendar
import json
import random

import pytest

from ucp.reliability.logs.envelope import learn_envelope, learn_json
from ucp.reliability.logs.errors import LogInputError
from ucp.reliability.logs.header import split_header
from ucp.reliability.logs.inputs import expand_paths
from ucp.reliability.logs.miner import group_sequences
from ucp.reliability.logs.readers import LineReader
from ucp.reliability.logs.stamps import learn_layout
from ucp.reliability.logs.templates import parse_templates

MESSAGES = ["session opened for user root", "session closed for user root", "Accepted password for alice",
            "Failed password for invalid user bob", "Connection closed by 10.0.0.%d", "disk sda%d failed"]


def _messages(n=60):
    return [MESSAGES[i % len(MESSAGES)].replace("%d", str(i)) for i in range(n)]


_RNG = random.Random(0)
_HOSTS = [_RNG.randrange(4) for _ in range(60)]  # hosts independent of the messages


def _t(i):  # 2024-05-01 10:00:00 UTC plus i seconds
    return calendar.timegm((2024, 5, 1, 10, 0, 0)) + i


ENVELOPES = {
    "rsyslog forwarding a syslog line": lambda i, m: (
        f"2024-05-01T10:00:{i % 60:02d}.{i:06d}+00:00 relay-{'ab'[i % 2]} May  1 10:00:{i % 60:02d} node{i % 3} "
        f"sshd[{100 + i}]: {m}"),
    "slashed date, host, app[pid], level": lambda i, m: (
        f"2024/05/01 10:00:{i % 60:02d}.000 mgmt-alpha app[4000] INFO {m}"),
    "RFC 5424": lambda i, m: f"<{134 + i % 3}>1 2024-05-01T10:00:{i % 60:02d}.000Z host{_HOSTS[i]} app {i} - - {m}",
    "Kubernetes CRI prefix": lambda i, m: f"2024-05-01T10:00:{i % 60:02d}.{i:09d}Z stdout F {m}",
    "epoch and a label column": lambda i, m: f"{'-' if i % 7 else 'ALERT'} {_t(i % 60)} 2024.05.01 node{i % 5} {m}",
    "logfmt": lambda i, m: f'ts=2024-05-01T10:00:{i % 60:02d}.000Z caller=main.go:{40 + i} level=info msg="{m}"',
}


@pytest.mark.parametrize("name", list(ENVELOPES))
def test_an_envelope_no_reader_knows_is_learned_and_stripped(name, tmp_path):
    lines = [ENVELOPES[name](i, m) for i, m in enumerate(_messages())]
    reader = LineReader(default_year=2024)
    reader.start_file("x.log")
    reader.learn(lines)
    for i, line in enumerate(lines):
        ts, node, _job, message, source = reader.parse("x.log", i + 1, line)
        assert (source, split_header(message)[1]) == ("learned", _messages()[i]), line
        assert ts == pytest.approx(_t(i % 60), abs=1.0)
    path = tmp_path / "x.log"
    path.write_text("\n".join(lines) + "\n")
    plain = tmp_path / "plain.log"
    plain.write_text("\n".join(_messages()) + "\n")
    assert list(parse_templates([str(path)]).lines) == list(parse_templates([str(plain)]).lines)


def test_the_innermost_host_with_most_values_is_the_node_and_the_relay_is_not():
    lines = [ENVELOPES["rsyslog forwarding a syslog line"](i, m) for i, m in enumerate(_messages())]
    env = learn_envelope(lines, year=2024)
    assert env.split(lines[4])[1] == "node1"


def test_json_lines_are_records_and_their_level_is_kept():
    lines = [json.dumps({"time": f"2024-05-01T10:00:{i % 60:02d}Z", "host": f"n{i % 2}", "level": "error",
                         "message": m}) for i, m in enumerate(_messages())]
    record = learn_json(lines)
    assert (record.message, record.time, record.host, record.level) == ("message", "time", "host", "level")
    reader = LineReader()
    reader.start_file("j.log")
    reader.learn(lines)
    ts, node, _job, message, _ = reader.parse("j.log", 1, lines[3])
    assert (ts, node, message) == (_t(3), "n1", "ERROR " + _messages()[3])


def test_a_line_that_does_not_fit_the_learned_envelope_keeps_its_text():
    lines = [ENVELOPES["slashed date, host, app[pid], level"](i, m) for i, m in enumerate(_messages())]
    reader = LineReader(default_year=2024)
    reader.start_file("x.log")
    reader.learn(lines + ["Traceback (most recent call last):"])
    assert reader.parse("x.log", 61, "Traceback (most recent call last):")[3] == "Traceback (most recent call last):"


def test_plain_messages_have_no_envelope():
    assert learn_envelope(_messages()) is None


def test_stamps_without_a_year_are_not_placed_in_the_future_and_the_guess_is_reported():
    # Regression: "Dec 10" read on 4 December was placed on 10 December of the current year, in the future.
    now = calendar.timegm((2026, 12, 4, 14, 0, 0))
    lines = [f"Dec 10 06:55:{i % 60:02d} LabSZ sshd[{i}]: {m}" for i, m in enumerate(_messages())]
    reader = LineReader(now=now)
    reader.start_file("auth.log")
    reader.learn(lines)
    ts = reader.parse("auth.log", 1, lines[0])[0]
    assert ts == calendar.timegm((2025, 12, 10, 6, 55, 0))
    assert reader.counters.year_assumed == ["auth.log"]
    given = LineReader(default_year=2026, now=now)
    given.start_file("auth.log")
    given.learn(lines)
    assert given.parse("auth.log", 1, lines[0])[0] == calendar.timegm((2026, 12, 10, 6, 55, 0))
    assert given.counters.year_assumed == []


def test_fixed_syslog_reader_does_not_place_stamps_in_the_future_either():
    reader = LineReader(now=calendar.timegm((2026, 12, 4, 14, 0, 0)))
    ts = reader.parse("kern.log", 1, "Dec 10 06:55:46 LabSZ sshd[24200]: Invalid user webmaster")[0]
    assert ts == calendar.timegm((2025, 12, 10, 6, 55, 46))
    assert reader.counters.year_assumed == ["kern.log"]


@pytest.mark.parametrize("stamps,expected", [
    (["17/06/09 20:10:40", "17/06/10 01:00:00"], (2017, 6, 9, 20, 10, 40)),   # yy/mm/dd: the order that runs forward
    (["081109 203615", "081109 203807"], (2008, 11, 9, 20, 36, 15)),           # compact yymmdd hhmmss
    (["[Sun Dec 04 04:47:44 2005]"], (2005, 12, 4, 4, 47, 44)),
    (["20171223-22:15:29:606"], (2017, 12, 23, 22, 15, 29.606)),
    (["2024-03-05T10:00:01.5+02:00"], (2024, 3, 5, 8, 0, 1.5)),
    (["1131566461"], (2005, 11, 9, 20, 1, 1)),
])
def test_stamp_layouts_are_learned_from_the_stamps(stamps, expected):
    *date, second = expected
    want = calendar.timegm((*date, int(second))) + (second - int(second))
    assert learn_layout(stamps).convert(stamps[0]) == pytest.approx(want)


def test_short_messages_are_grouped_by_their_words_not_their_length():
    counts = {("suspendAutohide",): 23, ("notifyWindowsChanged",): 5, ("VM", "Started"): 3, ("VM", "Stopped"): 2,
              ("<*>",): 4}
    grouped = group_sequences(counts)
    assert grouped[("suspendAutohide",)] == ("suspendAutohide",)
    assert grouped[("notifyWindowsChanged",)] == ("notifyWindowsChanged",)
    assert grouped[("VM", "Started")] != grouped[("VM", "Stopped")]


def test_a_token_becomes_a_wildcard_only_where_lines_differ():
    counts = {("RAS", "KERNEL", "INFO", "instruction", "cache", "parity", "error", "corrected"): 40,
              ("RAS", "KERNEL", "INFO", "generating", "<*>"): 30,
              ("RAS", "KERNEL", "INFO", "<*>", "double-hummer", "alignment", "exceptions"): 20,
              ("RAS", "KERNEL", "INFO", "CE", "sym", "<*>", "at", "<*>"): 10}
    grouped = group_sequences(counts)
    assert len(set(grouped.values())) == 4
    assert all(any(t != "<*>" and t not in ("RAS", "KERNEL", "INFO") for t in v) for v in grouped.values())


def test_a_binary_file_is_refused_not_analyzed(tmp_path):
    path = tmp_path / "model.pt"
    path.write_bytes(b"PK\x03\x04" + bytes(range(256)) * 8)
    with pytest.raises(LogInputError) as err:
        expand_paths([str(path)])
    assert str(err.value) == (f"{str(path)!r} is binary data, not a text log (e.g. a checkpoint or an archive); "
                              "pass log files (plain text or .gz)")


def test_the_cli_refuses_a_binary_file_with_exit_2(tmp_path, capsys):
    from ucp.tools.cli import main

    path = tmp_path / "model.pt"
    path.write_bytes(b"\x80\x04\x95" + b"\x00" * 200)
    assert main(["logs", "analyze", str(path), "--quiet"]) == 2
    assert "is binary data, not a text log" in capsys.readouterr().err


def test_logfmt_messages_are_unquoted_and_unescaped():
    lines = [f'ts=2024-05-01T10:00:{i:02d}Z host=n{i % 2} level=error msg="disk \\"sda{i}\\" slow\\\\fast"'
             for i in range(20)]
    record = learn_json(lines)
    assert (record.kind, record.message, record.time, record.host, record.level) == ("logfmt", "msg", "ts", "host",
                                                                                     "level")
    assert record.split(lines[3]) == (_t(3), "n1", "error", 'disk "sda3" slow\\fast')
    assert record.split("plain text, not pairs") is None
