"""Parallel analysis on Dask: partitions, merging, and the same report on 1 and N workers."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from ucp.reliability.logs.analyze import AnalysisOptions, analyze_logs
from ucp.reliability.logs.parallel import choose_workers, dask_runner
from ucp.reliability.logs.scan import Partition, plan_partitions

LOGHUB = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "loghub"


def _logs(tmp_path) -> list[str]:
    rng = random.Random(3)
    lines = (LOGHUB / "Thunderbird_2k.log").read_text().splitlines() + \
        (LOGHUB / "HPC_2k.log").read_text().splitlines()
    cascade = [f"Jun  3 10:{m:02d}:00 gpu-a{m % 4} kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid={m}, GPU has fallen "
               "off the bus." for m in range(40)]
    paths = []
    for i in range(3):
        rng.shuffle(lines)
        path = tmp_path / f"node{i}.log"
        path.write_text("\n".join(lines[:1500] + cascade[i::3]) + "\n")
        paths.append(str(path))
    return paths


def test_partitions_cover_every_line_once(tmp_path):
    paths = _logs(tmp_path)
    parts = plan_partitions(paths, split_bytes=50_000)
    assert len(parts) > len(paths) and [p.index for p in parts] == list(range(len(parts)))
    whole = analyze_logs(paths, options=AnalysisOptions(default_year=2024))
    split = analyze_logs(paths, options=AnalysisOptions(default_year=2024, split_bytes=50_000))
    assert split.counters.lines == whole.counters.lines == 3 * 1500 + 40
    # Events keep their file line numbers across ranges; only context-dependent fields may differ at range heads.
    assert [(e.file, e.line, e.category) for e in split.events] == [(e.file, e.line, e.category) for e in whole.events]


@pytest.mark.slow
def test_one_and_two_workers_give_the_same_report(tmp_path):
    paths = _logs(tmp_path)
    options = AnalysisOptions(default_year=2024, split_bytes=60_000)
    seen = []
    one = analyze_logs(paths, options=options, run=dask_runner(workers=1),
                       state_path=str(tmp_path / "one.json"))
    two = analyze_logs(paths, options=options, run=dask_runner(workers=2),
                       progress=lambda done, total: seen.append((done, total)),
                       state_path=str(tmp_path / "two.json"))
    assert json.dumps(one.to_dict(), sort_keys=True) == json.dumps(two.to_dict(), sort_keys=True)
    assert (tmp_path / "one.json").read_text() == (tmp_path / "two.json").read_text()
    assert seen[-1][0] == seen[-1][1] == len(plan_partitions(paths, split_bytes=60_000)) and len(seen) > 3
    assert one.discovered and any(e.category == "hardware/gpu/xid-79" for e in one.events)


def test_worker_choice():
    small = [Partition(0, "a.log"), Partition(1, "b.log")]
    assert choose_workers(small, None) == 1  # small inputs: no cluster
    assert choose_workers(small, 3) == 3
    big = [Partition(i, "x.log", i << 27, (i + 1) << 27) for i in range(4)]
    assert choose_workers(big, None) >= 1


def test_unreachable_scheduler_is_a_clear_error(tmp_path):
    path = tmp_path / "a.log"
    path.write_text("Jun  3 10:00:00 n1 kernel: ok\n")
    from ucp.reliability.logs.errors import LogInputError

    with pytest.raises(LogInputError, match=r"cannot reach the Dask scheduler 'tcp://127.0.0.1:9'"):
        analyze_logs([str(path)], run=dask_runner(scheduler="tcp://127.0.0.1:9", connect_timeout_s=2))
