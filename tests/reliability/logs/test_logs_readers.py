"""Readers and input: real loghub lines, synthetic real-format lines per source, bad input."""

from __future__ import annotations

import calendar
import gzip
import io
import sys
from pathlib import Path

import pytest

from ucp.reliability.logs.errors import LogInputError
from ucp.reliability.logs.inputs import MAX_LINE_BYTES, iter_lines
from ucp.reliability.logs.readers import LineReader, parse_lines
from ucp.reliability.logs.records import InputCounters

LOGHUB = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "loghub"


@pytest.mark.parametrize("name, source, node, ts, message_start", [
    ("HPC_2k.log", "hpc", "node-246", 1077804742.0, "[unix.hw state_change.unavailable] Component State Change"),
    ("Thunderbird_2k.log", "thunderbird", "dn228", 1131566461.0, "crond(pam_unix)[2915]: session closed"),
    ("Linux_2k.log", "syslog", "combo", 1118762161.0, "sshd(pam_unix)[19939]: authentication failure"),
    ("OpenStack_2k.log", "openstack", None, 1494892800.008, "INFO nova.osapi_compute.wsgi.server"),
])
def test_loghub_first_line(name, source, node, ts, message_start):
    path = str(LOGHUB / name)
    counters = InputCounters()
    rec = next(parse_lines(iter_lines([path], counters=counters), default_year=2005))
    assert (rec.source, rec.node, rec.line) == (source, node, 1)
    assert rec.timestamp == pytest.approx(ts)
    assert rec.message.startswith(message_start)


@pytest.mark.parametrize("name", ["HPC_2k.log", "Thunderbird_2k.log", "Linux_2k.log", "OpenStack_2k.log"])
def test_loghub_every_line_parses_with_a_timestamp(name):
    counters = InputCounters()
    recs = list(parse_lines(iter_lines([str(LOGHUB / name)], counters=counters), default_year=2005))
    assert len(recs) == 2000 and counters.lines == 2000
    assert all(r.timestamp is not None for r in recs)
    assert counters.bad_timestamp == 0 and counters.binary_skipped == 0


SYNTHETIC = [
    # (line, source, node, job, timestamp)
    ("Jun  3 10:00:01 gpu-a07 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, GPU has fallen off the bus.",
     "syslog", "gpu-a07", None, 1717408801.0),
    ("2024-06-03T10:00:01.500+00:00 gpu-a08 kernel: mlx5_core 0000:0c:00.0 ib2: Link down",
     "iso", "gpu-a08", None, 1717408801.5),
    ("[2024-06-03T10:00:02.000] error: Nodes gpu-b11 not responding, setting DOWN",
     "slurm", "gpu-b11", None, 1717408802.0),
    ("[2024-06-03T10:00:03] _job_complete: JobId=81234 WTERMSIG 9", "slurm", None, "81234", 1717408803.0),
    ("gpu-c02:5511:5600 [3] NCCL WARN NET/IB : Got completion from peer 10.0.0.3<4242> with status=12",
     "generic", "gpu-c02", None, None),
    ("2024-06-03 10:00:04,250 torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: 1) local_rank: 0",
     "iso", None, None, 1717408804.25),
    ('{"kind":"Event","reason":"OOMKilling","message":"Memory cgroup out of memory: Killed process 7 (python)",'
     '"involvedObject":{"kind":"Node","name":"gpu-d09"},"source":{"host":"gpu-d09"},"lastTimestamp":"2024-06-03T10:00:05Z"}',
     "kubernetes", "gpu-d09", None, 1717408805.0),
    ("[Mon Jun  3 10:00:06 2024] pcieport 0000:00:03.1: AER: Multiple Uncorrected (Fatal) error received",
     "dmesg", None, None, 1717408806.0),
    ("[  812.123456] EDAC MC0: 1 CE memory read error on DIMM_A1", "dmesg-relative", None, None, None),
]


@pytest.mark.parametrize("line, source, node, job, ts", SYNTHETIC)
def test_synthetic_sources(line, source, node, job, ts):
    reader = LineReader(default_year=2024)
    got_ts, got_node, got_job, message, got_source = reader.parse("x.log", 1, line)
    assert (got_source, got_node, got_job) == (source, node, job)
    assert got_ts == (pytest.approx(ts) if ts is not None else None)
    assert message


def test_traceback_lines_inherit_time_and_node_and_job_comes_from_path():
    reader = LineReader(default_year=2024)
    lines = ["2024-06-03T10:00:00 gpu-e01 python[12]: Traceback (most recent call last):",
             '  File "train.py", line 88, in <module>',
             "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."]
    out = [reader.parse("logs/slurm-7731.out", i + 1, t) for i, t in enumerate(lines)]
    assert [o[0] for o in out] == [1717408800.0] * 3
    assert [o[1] for o in out] == ["gpu-e01"] * 3
    assert [o[2] for o in out] == ["7731"] * 3


def _write(tmp_path, name, data: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def test_binary_garbage_is_skipped_and_counted(tmp_path):
    garbage = bytes(b for b in range(256) if b != 10) * 4 + b"\n" + b"\x00\x01\x02\xff\xfe\n"
    path = _write(tmp_path, "core.log", b"Jun  3 10:00:01 n1 kernel: ok line\n" + garbage)
    counters = InputCounters()
    got = list(iter_lines([path], counters=counters))
    assert [t for _, _, t in got] == ["Jun  3 10:00:01 n1 kernel: ok line"]
    assert counters.binary_skipped == 2 and counters.lines == 3


def test_megabyte_line_is_truncated_and_the_next_line_survives(tmp_path):
    path = _write(tmp_path, "long.log", b"A" * (3 * 1024 * 1024) + b"\nnext line\n")
    counters = InputCounters()
    got = list(iter_lines([path], counters=counters))
    assert [(n, len(t)) for _, n, t in got] == [(1, MAX_LINE_BYTES), (2, 9)]
    assert counters.truncated == 1


def test_mixed_encodings_fall_back_to_latin1(tmp_path):
    path = _write(tmp_path, "mixed.log", "caf\u00e9 utf8\n".encode() + "caf\u00e9 latin1\n".encode("latin-1"))
    counters = InputCounters()
    got = [t for _, _, t in iter_lines([path], counters=counters)]
    assert got == ["caf\u00e9 utf8", "caf\u00e9 latin1"]
    assert counters.encoding_fallback == 1


def test_unparsable_timestamp_is_counted_not_fatal():
    counters = InputCounters()
    recs = list(parse_lines([("s.log", 1, "[2024-13-45T99:99:99] error: Nodes gpu-1 not responding")],
                            counters=counters))
    assert recs[0].timestamp is None and recs[0].source == "slurm"
    assert counters.bad_timestamp == 1


def test_gz_directory_glob_and_stdin(tmp_path, monkeypatch):
    (tmp_path / "d").mkdir()
    with gzip.open(tmp_path / "d" / "a.log.gz", "wb") as handle:
        handle.write(b"line a1\nline a2\n")
    (tmp_path / "d" / "b.log").write_text("line b1\n")
    counters = InputCounters()
    assert [t for _, _, t in iter_lines([str(tmp_path / "d")], counters=counters)] == ["line a1", "line a2", "line b1"]
    assert [t for _, _, t in iter_lines([str(tmp_path / "d" / "*.log")], counters=counters)] == ["line b1"]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"from stdin\n")))
    assert [(f, t) for f, _, t in iter_lines(["-"], counters=counters)] == [("-", "from stdin")]


def test_missing_path_names_it():
    with pytest.raises(LogInputError, match=r"^no log files match '/nonexistent/\*\.log': not a file, directory or glob$"):
        list(iter_lines(["/nonexistent/*.log"], counters=InputCounters()))


def test_cached_stamps_are_the_full_parsers_bit_for_bit():
    # The fast path's per-hour cache (minute and second by slicing, the fraction added last) must give the
    # full parser's floats exactly, in any order of hours, and refuse what the full parser refuses.
    import random

    rng = random.Random(3)
    reader = LineReader(default_year=2024)
    stamps = reader._stamp
    for _ in range(3000):
        y, mo, d = rng.choice((2016, 2024, 2025)), rng.randint(1, 12), rng.randint(1, 31)
        h, mi, s = rng.choice((rng.randint(0, 23), 24)), rng.choice((rng.randint(0, 59), 60)), rng.randint(0, 61)
        frac = rng.choice(("", ".5", ",123", ".123456", ".0001"))
        iso = f"{y:04d}-{mo:02d}-{d:02d}{rng.choice('T ')}{h:02d}:{mi:02d}:{s:02d}{frac}"
        want = reader._iso(iso)
        got = stamps.iso(iso)
        assert got == want and (got is None or got.hex() == want.hex()), iso
        mon = calendar.month_abbr[mo]
        syslog = f"{mon} {d:2d} {h:02d}:{mi:02d}:{s:02d}"
        want = reader._month_day(mon, str(d), f"{h:02d}:{mi:02d}:{s:02d}", 2024)
        assert stamps.syslog(syslog) == want, syslog
