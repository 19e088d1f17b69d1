"""Held-out envelope generators: written before any run of them, never used while building the detection.

They are reported apart from :data:`ucp.tools.bench.logs_envelopes.DEVELOPMENT`
(``logs_generalize.py --held-out``), as a check of what a new envelope does.

Example::

    ctx = EnvelopeContext.for_file("HDFS", seed=1)
    HELD_OUT["bsd-relay"].line("081109 203615 148 INFO dfs...: x", {"Content": "x"}, 0, ctx)
"""

from __future__ import annotations

import json

from ucp.tools.bench.logs_envelopes import Envelope, EnvelopeContext, _content, _iso  # noqa: F401


def bsd_relay(raw, row, i, ctx):
    # RFC 3164 relay: PRI, a BSD stamp without a year, the relay's name, then the original line.
    t = ctx.tick()
    return f"<{ctx.rng.choice((13, 14, 11))}>{t.strftime('%b')} {t.day:2d} {t.strftime('%H:%M:%S')} {ctx.host()} {raw}"


def access_stamp(raw, row, i, ctx):
    # An Apache-access-like stamp in brackets, a host, the level in brackets.
    t = ctx.tick()
    return f"[{t.strftime('%d/%b/%Y:%H:%M:%S')} +0000] {ctx.host()} [{ctx.level(row).lower()}] {_content(row)}"


def docker_json(raw, row, i, ctx):
    # Docker's json-file driver: the container's original line in "log", with its newline.
    return json.dumps({"log": raw + "\n", "stream": "stdout", "time": _iso(ctx.tick(), 6, "Z")})


def epoch_tabs(raw, row, i, ctx):
    # Milliseconds since the epoch, tab-separated columns.
    t = ctx.tick()
    return f"{int(t.timestamp() * 1000)}\t{ctx.host()}\t{ctx.level(row)}\t{_content(row)}"


def glog(raw, row, i, ctx):
    # glog/absl: level letter fused with MMDD, time, thread id, file:line].
    t = ctx.tick()
    letter = ctx.level(row)[:1] if ctx.level(row)[:1] in "IWEF" else "I"
    return (f"{letter}{t.strftime('%m%d %H:%M:%S')}.{t.microsecond:06d} {ctx.rng.randrange(1000, 99999):5d} "
            f"main.cc:{ctx.rng.randrange(10, 900)}] {_content(row)}")


# Written 2026-12-04 23:58 UTC, before any run of them (a second batch of held-out envelopes).
_PRIORITY = {"FATAL": 2, "ERROR": 3, "WARN": 4, "WARNING": 4, "NOTICE": 5, "INFO": 6, "DEBUG": 7}


def journal_short_iso(raw, row, i, ctx):
    # `journalctl -o short-iso`: ISO stamp with a numeric zone, host, identifier[pid]:, the message.
    t = ctx.tick()
    return f"{t.strftime('%Y-%m-%dT%H:%M:%S')}+0000 {ctx.host()} {ctx.apps[0]}[{4000 + i % 5}]: {_content(row)}"


def journal_json(raw, row, i, ctx):
    # `journalctl -o json`: one object per entry, microseconds since the epoch as a string, PRIORITY a digit.
    t = ctx.tick()
    return json.dumps({"__CURSOR": f"s=6f1b;i={1000 + i:x};b=9a3c;m={i:x};t=5f0;x=77", "__REALTIME_TIMESTAMP":
                       str(int(t.timestamp() * 1_000_000)), "_HOSTNAME": ctx.host(),
                       "PRIORITY": str(_PRIORITY.get(ctx.level(row), 6)), "SYSLOG_IDENTIFIER": ctx.apps[0],
                       "_PID": str(4000 + i % 5), "MESSAGE": _content(row)})


def slurmd(raw, row, i, ctx):
    # slurmd's log file: the ISO stamp with milliseconds in brackets; errors and debug lines say so after it.
    t = ctx.tick()
    level = ctx.level(row)
    mark = "error: " if level in ("ERROR", "FATAL") else "debug:  " if level == "DEBUG" else ""
    return f"[{t.strftime('%Y-%m-%dT%H:%M:%S')}.{t.microsecond // 1000:03d}] {mark}{_content(row)}"


def nccl(raw, row, i, ctx):
    # NCCL's debug prefix: host:pid:tid [device] NCCL INFO|WARN, no time stamp.
    level = "WARN" if ctx.level(row) in ("WARN", "WARNING", "ERROR", "FATAL") else "INFO"
    host = ("gpu-node03", "gpu-node11", "gpu-node17")[i % 3]
    return f"{host}:{21000 + i % 4}:{21100 + i % 9} [{i % 8}] NCCL {level} {_content(row)}"


def logfmt(raw, row, i, ctx):
    # go-kit/logfmt: key=value pairs, the message quoted with its quotes and backslashes escaped.
    msg = _content(row).replace("\\", "\\\\").replace('"', '\\"')
    return (f"ts={_iso(ctx.tick(), 3, 'Z')} caller=main.go:{40 + i % 30} level={ctx.level(row).lower()} "
            f'msg="{msg}"')


HELD_OUT: dict[str, Envelope] = {e.name: e for e in (
    Envelope("bsd-relay", bsd_relay, "forwarded"),
    Envelope("access-stamp", access_stamp, "rewritten"),
    Envelope("docker-json", docker_json, "forwarded"),
    Envelope("epoch-tabs", epoch_tabs, "rewritten"),
    Envelope("glog", glog, "rewritten"),
    Envelope("journal-short-iso", journal_short_iso, "rewritten"),
    Envelope("journal-json", journal_json, "rewritten"),
    Envelope("slurmd", slurmd, "rewritten"),
    Envelope("nccl", nccl, "rewritten"),
    Envelope("logfmt", logfmt, "rewritten"),
)}
