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


HELD_OUT: dict[str, Envelope] = {e.name: e for e in (
    Envelope("bsd-relay", bsd_relay, "forwarded"),
    Envelope("access-stamp", access_stamp, "rewritten"),
    Envelope("docker-json", docker_json, "forwarded"),
    Envelope("epoch-tabs", epoch_tabs, "rewritten"),
    Envelope("glog", glog, "rewritten"),
)}
