"""Why grouping fell in some envelopes: one test per cause (each failed before its fix)."""

from __future__ import annotations

from ucp.reliability.logs.header import split_header
from ucp.reliability.logs.masking import PARAM, template_tokens
from ucp.reliability.logs.miner import TemplateMiner, group_sequences
from ucp.reliability.logs.template_state import TemplateSet
from ucp.reliability.logs.templates import parse_templates


def _groups(report) -> list[set[int]]:
    by_id: dict[int, set[int]] = {}
    for i, tid in enumerate(report.lines):
        by_id.setdefault(tid, set()).add(i)
    return sorted(by_id.values(), key=min)


def test_a_tab_after_the_level_separates_it_from_the_content():
    # Tab-separated columns: the level the envelope leaves in front was glued to the first word ("INFO\tambient=30")
    assert split_header("INFO\tambient=30") == (1, "ambient=30")
    assert split_header("WARN\tdisk sda full") == (2, "disk sda full")


def test_tab_separated_epoch_lines_group_by_their_messages(tmp_path):
    # one-word messages under one level: with the level glued on they were "INFO <*>", one template
    messages = ["ambient=%d", "normal", "running", "boot (command %d)", "warning", "halted", "idle"]
    lines = [f"{1711129577921 + 977 * i}\tnode{i % 4}\tINFO\t{messages[i % 7]}".replace("%d", str(i))
             for i in range(70)]
    path = tmp_path / "tabs.log"
    path.write_text("\n".join(lines) + "\n")
    report = parse_templates([str(path)])
    assert _groups(report) == [set(range(k, 70, 7)) for k in range(7)]


def test_an_address_at_the_start_of_the_content_is_not_a_stamp():
    # "182.254.114.110:80 open ..." was skipped as a stamp, so those lines lost their first token
    assert split_header("- 182.254.114.110:80 open through proxy p.example.org:5070 HTTPS") == (
        None, "182.254.114.110:80 open through proxy p.example.org:5070 HTTPS")
    assert split_header('INFO 10.11.21.122,10.11.10.1 "GET /v2 HTTP/1.1" status: 200')[1] == (
        '10.11.21.122,10.11.10.1 "GET /v2 HTTP/1.1" status: 200')
    assert split_header("081109 203615 148 INFO dfs.DataNode: ok") == (1, "ok")  # stamps still skipped


def test_a_bound_before_a_number_is_a_value_and_a_versioned_name_a_constant():
    assert template_tokens("lifetime <1 sec") == ("lifetime", PARAM)
    assert template_tokens("lifetime 00:01") == ("lifetime", PARAM)
    assert template_tokens("open through proxy p:5070 SOCKS5") == ("open", "through", "proxy", "p:" + PARAM, "SOCKS5")
    assert template_tokens("node node3 up") == ("node", PARAM, "up")
    assert template_tokens("host SRV01 up") == ("host", PARAM, "up")  # zero-padded: a counter, not a version


def test_protocol_names_keep_two_events_apart():
    counts = {("h:<*>", "open", "through", "proxy", "proxy.example.org:<*>", "HTTPS"): 50,
              ("g:<*>", "open", "through", "proxy", "proxy.example.org:<*>", "HTTPS"): 40,
              ("k:<*>", "open", "through", "proxy", "socks.example.org:<*>", "SOCKS5"): 2}
    templates = set(group_sequences(counts).values())
    assert len(templates) == 2


def test_values_of_different_lengths_join_one_template():
    # "0 bytes sent" and "1268 bytes (1.23 KB) sent": one event whose value takes one token or two
    lines = ["close, 0 bytes sent, 0 bytes received, lifetime 00:01",
             "close, 1268 bytes (1.23 KB) sent, 6274 bytes (6.12 KB) received, lifetime <1 sec",
             "close, 451 bytes sent, 18846 bytes (18.4 KB) received, lifetime <1 sec",
             "close, 1165 bytes (1.13 KB) sent, 815 bytes received, lifetime 02:13",
             "open through proxy p:5070 HTTPS", "open through proxy q:5070 HTTPS"]
    counts = {template_tokens(line): 1 for line in lines}
    result = group_sequences(counts)
    assert len({result[template_tokens(line)] for line in lines[:4]}) == 1
    assert result[template_tokens(lines[0])] == (
        "close,", PARAM, "bytes", PARAM, "sent,", PARAM, "bytes", PARAM, "received,", "lifetime", PARAM)
    assert result[template_tokens(lines[4])] != result[template_tokens(lines[0])]


def test_a_later_run_puts_a_value_of_another_length_under_the_known_template():
    known = TemplateSet()
    first = TemplateMiner(known=known).fit({template_tokens("close, 0 bytes sent, lifetime 00:01"): 3,
                                            template_tokens("close, 5 bytes (1 KB) sent, lifetime 00:02"): 2})
    (tid,) = set(first.values())
    later = TemplateMiner(known=known).fit({template_tokens("close, 7 bytes (7 KB) sent, lifetime <1 sec"): 1})
    assert set(later.values()) == {tid}
    assert len([t for t in known if t.count]) == 1


def test_different_constants_never_join():
    counts = {("session", "opened", "for", "user", PARAM): 3, ("session", "closed", "for", "user", PARAM): 3,
              ("session", PARAM, "opened", "for", "user", PARAM): 1}
    result = group_sequences(counts)
    assert result[("session", "opened", "for", "user", PARAM)] != result[("session", "closed", "for", "user", PARAM)]


def test_a_cri_stream_field_is_not_the_host():
    # "<stamp> stdout F <line>": the container's stream is a flag of the runtime, not the machine that wrote the line
    from ucp.reliability.logs.readers import LineReader

    lines = [f"2024-05-01T10:00:{i % 60:02d}.{i:09d}Z {'stdout' if i % 5 else 'stderr'} F worker {i} step done"
             for i in range(60)]
    reader = LineReader(default_year=2024)
    reader.start_file("cri.log")
    reader.learn(lines)
    ts, node, _job, message, source = reader.parse("cri.log", 1, lines[1])
    assert (source, node, message) == ("learned", None, "worker 1 step done")


def test_a_first_word_with_a_colon_after_the_level_is_content_where_the_source_has_no_component_column(tmp_path):
    # Android's content re-written under "stamp host app[pid] LEVEL": "getTasks: caller ..." lost "getTasks:" as if
    # it were a logger's component, so events that differ only in that word merged
    contents = ["getTasks: caller %d does not hold REAL_GET_TASKS", "getRecentTasks: caller %d does not hold REAL_GET_TASKS",
                "Skipping %d frames", "Displayed app for %d ms", "no window for token %d", "Start proc %d for activity"]
    lines = [f"2016/05/01 00:00:{i % 60:02d}.000 mgmt-alpha app[4000] INFO {contents[i % 6]}".replace("%d", str(i))
             for i in range(60)]
    path = tmp_path / "rewritten.log"
    path.write_text("\n".join(lines) + "\n")
    assert _groups(parse_templates([str(path)])) == [set(range(k, 60, 6)) for k in range(6)]
    # a logger's component column (every line names one) is still header, not content
    hdfs = [f"081109 2036{i % 60:02d} {100 + i} INFO dfs.DataNode$PacketResponder: Received block blk_{i} of size 9"
            for i in range(30)]
    assert split_header(hdfs[0]) == (1, "Received block blk_0 of size 9")
    path = tmp_path / "hdfs.log"
    path.write_text("\n".join(hdfs) + "\n")
    report = parse_templates([str(path)])
    assert report.templates.get(report.lines[0]).text == "Received block <*> of size <*>"


def test_a_source_location_after_the_level_is_header_even_without_a_component_column():
    # glog/c10's "E0601 12:00:01.500000 4242 ProcessGroupNCCL.cpp:1234]": a file and line, not a message's first word
    line = "E0601 12:00:01.500000 4242 ProcessGroupNCCL.cpp:1234] [PG 0 Rank 3] Watchdog caught collective timeout"
    assert split_header(line, components=False) == split_header(line) == (3, "Watchdog caught collective timeout")
