"""The fast path (big-block reading, line shapes, cached verdicts) must give the full parser's answers."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ucp.reliability.logs.inputs as inputs
from ucp.reliability.logs.inputs import iter_lines, shape_key
from ucp.reliability.logs.masking import mask
from ucp.reliability.logs.readers import LineReader
from ucp.reliability.logs.records import InputCounters
from ucp.reliability.logs.scan import Partition, judge_key, scan_partition
from ucp.reliability.logs.taxonomy import load_taxonomy

LOGHUB = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "loghub"

# One template per envelope and per tricky case; "#" becomes a random digit, "~" a literal "#".
TEMPLATES = [
    "Jun ## ##:##:## gpu-a### kernel: NVRM: Xid (PCI:0000:#b:00): ##, pid=####, name=python, GPU has fallen off the bus.",
    "Jun  # ##:##:## gpu-a### kernel: mlx5_core 0000:0c:00.0 ib#: Link up",
    "[2024-##-##T##:##:##.###] _job_complete: JobId=##### WEXITSTATUS #",
    "[2024-##-##T##:##:##.###] error: Nodes gpu-### not responding, setting DOWN",
    "[2024-06-##T##:##:##] sched: Allocate JobId=#### NodeList=gpu-b### #CPUs=### Partition=gpu",
    "2024-06-## ##:##:##.### gpu-###:#:# [#] [Rank ###] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=#, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600### milliseconds before timing out.",
    "2024-06-##T##:##:##+0#:00 gpu-# slurmd[##]: error: Nodes gpu-# not responding",
    "2024-06-## ##:##:##,### INFO trainer: step ### loss #.### exit code #",
    "nova-api.log.1.2017-05-16_13:53:08 2017-05-## ##:##:##.### ##### INFO nova.osapi_compute.wsgi.server "
    "[req-38101a0b] 10.11.10.# \"GET /v2/servers/detail HTTP/1.1\" status: ### len: #### time: 0.######",
    "- 11315#### 2005.11.09 dn### Nov 9 12:##:## dn###/dn### crond(pam_unix)[####]: session closed for user root",
    "###### node-### node status 10796#### 0 not responding",
    "[ ####.######] nfs: server nas0# not responding, still trying",
    "[Mon Jun ## 15:16:## 2024] blk_update_request: I/O error, dev nvme#n1, sector #### op 0x1:(WRITE)",
    "Nov 9 12:##:## eadmin# sendmail[####]: jA9J1UvC00####: from=root, size=###, relay=~#~@localhost, ctladdr=~#0#~",
    "gpu-a##:####:#### [#] NCCL INFO Channel ##/0 : ###[#] -> ###[#] via P2P/IPC/read",
    "  File \"/opt/train.py\", line ###, in step: RuntimeError: CUDA error: an illegal memory access was encountered",
    '{"kind": "Event", "reason": "NodeNotReady", "message": "Node gpu-### status is now: NodeNotReady", '
    '"involvedObject": {"kind": "Node", "name": "gpu-###"}, "lastTimestamp": "2024-06-##T##:##:##Z"}',
]


def _fill(template: str, rng: random.Random) -> str:
    return "".join(str(rng.randint(0, 9)) if ch == "#" else ch for ch in template).replace("~", "#")


def _reference(path: str, taxonomy):
    """The full parser and masker on every line, keys judged once by masked line (the slow pipeline)."""
    reader = LineReader(default_year=2024, counters=InputCounters())
    reader.start_file(path)
    reader.learn([text for _, _, text in iter_lines([path], counters=InputCounters())][:2000])
    keys, drafts, counts = {}, [], {}
    for file, lineno, text in iter_lines([path], counters=InputCounters()):
        ts, node, job, message, _ = reader.parse(file, lineno, text)
        masked = mask(message)
        if masked not in keys:
            keys[masked] = judge_key(masked, message, taxonomy=taxonomy, first_line=lineno,
                                     components=reader.components)
        counts[masked] = counts.get(masked, 0) + 1
        if keys[masked].candidate:
            drafts.append((file, lineno, ts, node, job, masked, message[:500]))
    return drafts, counts, reader.counters


def test_every_line_reads_as_the_full_parser_reads_it(tmp_path):
    rng = random.Random(7)
    lines = [_fill(rng.choice(TEMPLATES), rng) for _ in range(3000)]
    lines += (LOGHUB / "OpenStack_2k.log").read_text().splitlines()[:300]
    rng.shuffle(lines)
    # A raw NCCL line (no envelope) names its host; with a node already known the file's node wins.
    nccl = "gpu-b{}:{}:{} [0] NCCL WARN NET/IB : Got completion from peer 10.0.0.{} with status=12 opcode=0"
    lines = [nccl.format(11, 22, 33, 4)] + lines[:50] + [nccl.format(55, 66, 77, 8)] + lines[50:]
    path = tmp_path / "mixed.log"
    path.write_text("\n".join(lines) + "\n\n   \n")
    taxonomy = load_taxonomy()
    got = scan_partition(Partition(0, str(path)), taxonomy=taxonomy, default_year=2024)
    drafts, counts, counters = _reference(str(path), taxonomy)
    assert got.drafts == drafts
    assert {k: v.count for k, v in got.keys.items()} == counts
    assert (got.counters.bad_timestamp, got.counters.no_timestamp, got.counters.empty) == \
        (counters.bad_timestamp, counters.no_timestamp, 2)
    assert got.counters.bad_timestamp > 0 and len(drafts) > 500  # the case is exercised


def test_jobs_read_by_a_shapes_span_are_the_full_parsers(tmp_path):
    # A shape learns where its message names a job (or that it names none: the file's job then) once; ids of
    # every width, lines naming none in a file whose name holds one, and Step ids must read as the parser does.
    rng = random.Random(11)
    templates = ["[2024-06-0#T##:##:##.###] _job_complete: JobId={} WEXITSTATUS #",
                 "[2024-06-0#T##:##:##.###] error: step {}.0 failed: Nodes gpu-### not responding",
                 "Jun ## ##:##:## gpu-a### slurmstepd[####]: error: StepId={}.batch exceeded memory limit, killed",
                 "Jun ## ##:##:## gpu-a### kernel: Out of memory: Killed process {} (python) job {} died"]
    lines = []
    for _ in range(1500):
        ids = [str(rng.randint(1, 10 ** rng.randint(1, 7))) for _ in range(2)]
        lines.append(_fill(rng.choice(templates).format(*ids), rng))
    path = tmp_path / "slurm-4242.out"
    path.write_text("\n".join(lines) + "\n")
    taxonomy = load_taxonomy()
    got = scan_partition(Partition(0, str(path)), taxonomy=taxonomy, default_year=2024)
    drafts, _, _ = _reference(str(path), taxonomy)
    assert got.drafts == drafts
    jobs = {d[4] for d in drafts}
    assert "4242" in jobs and len(jobs) > 100  # both the file's job and the messages' own are exercised


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(TEMPLATES[:-1]), st.integers(0, 2**32), st.integers(0, 2**32))
def test_a_shape_learned_on_one_line_reads_its_siblings(template, seed_a, seed_b):
    a, b = _fill(template, random.Random(seed_a)), _fill(template, random.Random(seed_b))
    assert shape_key(a) == shape_key(b)
    reader = LineReader(default_year=2024)
    shape = reader.shape(a)
    if seed_a % 2:  # a file whose earlier lines named a node and a time
        reader.parse("x.log", 1, "Jun  3 10:00:01 gpu-z99 kernel: earlier line")
    before_ts, before_node = reader.last_ts, reader.last_node
    ts, node, _, message, source = reader.parse("x.log", 1, b)
    if shape is None:  # rare envelopes are parsed line by line
        assert source == "dmesg"
        return
    assert shape.source == source
    if shape.msg_start is not None:
        assert b[shape.msg_start:] == message
    if shape.node is None or (shape.prefers_last_node and before_node is not None):
        assert node == before_node
    else:
        assert b[shape.node[0]:shape.node[1]] == node
    if isinstance(shape.ts, tuple):
        convert, start, end = shape.ts
        want_ts = convert(b[start:end])
        assert (want_ts if want_ts is not None else before_ts) == ts


@pytest.mark.parametrize("block", [7, 64, 4096])
def test_lines_split_across_blocks_come_out_whole(tmp_path, monkeypatch, block):
    monkeypatch.setattr(inputs, "_BLOCK", block)
    text = "first line\r\nsecond \u00e9\n\n" + "x" * 100 + "\nJun  3 10:00:01 n1 kernel: ok\nno newline at end"
    path = tmp_path / "b.log"
    path.write_bytes(text.encode())
    counters = InputCounters()
    got = [(n, t) for _, n, t in iter_lines([str(path)], counters=counters)]
    assert got == [(1, "first line"), (2, "second \u00e9"), (4, "x" * 100), (5, "Jun  3 10:00:01 n1 kernel: ok"),
                   (6, "no newline at end")]
    assert (counters.lines, counters.empty) == (6, 1)
