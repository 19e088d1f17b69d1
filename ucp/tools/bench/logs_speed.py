"""Throughput of `ucp logs analyze` against drain3 alone, same lines, same run.

Builds a benchmark log of >= 1,000,000 lines (the labeled accuracy log -
loghub samples plus injected faults - repeated with fresh random faults),
then times (a) our whole pipeline from the file (read, detect format, parse,
mask, mine templates, detect, classify, incidents, fits), in this process and
on a local Dask cluster of N workers (the file cut into the same byte ranges
for every worker count; cluster start-up included), and (b) drain3's
TemplateMiner.add_log_message with its usual IP/HEX/NUM masking on the same
lines already in memory (no I/O, no classification: a generous baseline).

By default each repeat of the loghub lines is *varied* (``--vary``): every
number in a message (pids, ports, addresses, ids, sizes) gets new digits,
host names get new numbers and the loghub epoch stamps move on by a day per
repeat, so almost no line recurs literally, as in a real cluster log. Only
the few numbers that decide a category (``status: 200``, ``Xid 79``) keep
their value, because real logs do not draw those at random either.
``--no-vary`` repeats the loghub lines verbatim (the older, flattering log).

``--systems Linux,HDFS,...`` races ours and drain3 on each loghub system alone as well: its 2k
lines repeated to ``--system-lines`` lines, the digits of each message's content (loghub's
``Content`` column) redrawn per repeat as above, the header left as the system writes it. Each
system's log has its own envelope, learned from its first lines (:mod:`ucp.reliability.logs.envelope`),
so this times the parts of the pipeline that the mixed log does not reach.

Run:  .venv/bin/python ucp/tools/bench/logs_speed.py [--lines 1000000] [--per-kind 40] [--no-vary] [--workers 1,2]
          [--systems Linux,HDFS,Android --system-lines 100000]
"""

from __future__ import annotations

import argparse
import os
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from drain3 import TemplateMiner  # noqa: E402
from drain3.masking import MaskingInstruction  # noqa: E402
from drain3.template_miner_config import TemplateMinerConfig  # noqa: E402

from ucp.reliability.logs.analyze import AnalysisOptions, _domain_model, _trained_model, analyze_logs  # noqa: E402
from ucp.reliability.logs.masking import mask  # noqa: E402
from ucp.reliability.logs.parallel import dask_runner  # noqa: E402
from ucp.reliability.logs.scan import DEFAULT_SPLIT_BYTES  # noqa: E402
from ucp.tools.bench.logs_accuracy import build_benchmark  # noqa: E402

# Envelope prefixes of the four loghub formats: (stamp and framing kept, host varied, message varied).
_HPC = re.compile(r"(\d+) (\S+) (\S+ \S+) (\d{9,10}) (-?\d+ )(.*)")
_TBIRD = re.compile(r"(\S+) (\d{9,10}) (\S+ )(\S+)( \w{3} +\d+ \d\d:\d\d:\d\d )(\S+)( .*)")
_LINUX = re.compile(r"(\w{3} +\d+ \d\d:\d\d:\d\d )(\S+)( .*)")
_OPENSTACK = re.compile(r"(\S+ \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ )(\d+)( .*)")
# Digit runs to redraw; numbers that decide a category (HTTP status, exit codes) keep theirs.
# Whole digit runs only ((?<!\d)): a run that starts mid-number ("status: 200" -> "00") would redraw
# the status it is meant to keep.
_VARIABLE_DIGITS = re.compile(r"(?<!status: )(?<!tatus=)(?<!Xid )(?<!xit )(?<!XITSTATUS )(?<!\d)\d+")


class _Varier:
    """Redraws the variable numbers of loghub lines (one digit permutation per line)."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        digits = list("0123456789")
        self.tables = []
        for _ in range(997):
            rng.shuffle(digits)
            self.tables.append(str.maketrans("0123456789", "".join(digits)))

    def digits(self, text: str) -> str:
        table = self.tables[self.rng.randrange(997)]
        return _VARIABLE_DIGITS.sub(lambda m: m.group().translate(table), text)

    def host(self, name: str) -> str:
        table = self.tables[self.rng.randrange(997)]
        return name.translate(table)

    def line(self, text: str, shift_s: int) -> str:
        m = _HPC.fullmatch(text)
        if m:
            return (f"{self.rng.randrange(10**7)} {self.host(m[2])} {m[3]} {int(m[4]) + shift_s} {m[5]}"
                    f"{self.digits(m[6])}")
        m = _TBIRD.fullmatch(text)
        if m:
            host = self.host(m[4])
            return f"{m[1]} {int(m[2]) + shift_s} {m[3]}{host}{m[5]}{m[6].replace(m[4], host)}{self.digits(m[7])}"
        m = _OPENSTACK.fullmatch(text)
        if m:
            return f"{m[1]}{self.rng.randrange(1000, 65536)}{self.digits(m[3])}"
        m = _LINUX.fullmatch(text)
        if m:
            return f"{m[1]}{self.host(m[2])}{self.digits(m[3])}"
        return text  # injected lines: already drawn afresh for each block


def drain3_config() -> TemplateMinerConfig:
    """drain3 as the previous version of this tool ran it, with drain3's usual IP/HEX/NUM masks."""
    config = TemplateMinerConfig()
    config.drain_sim_th = 0.4
    config.drain_depth = 4
    config.drain_max_children = 100
    config.parametrize_numeric_tokens = True
    config.profiling_enabled = False
    config.masking_instructions = [
        MaskingInstruction(r"((?<=[^A-Za-z0-9])|^)(\d+\.\d+\.\d+\.\d+)((?=[^A-Za-z0-9])|$)", "IP"),
        MaskingInstruction(r"((?<=[^A-Za-z0-9])|^)(0x[a-fA-F0-9]+)((?=[^A-Za-z0-9])|$)", "HEX"),
        MaskingInstruction(r"((?<=[^A-Za-z0-9])|^)([\-\+]?\d+)((?=[^A-Za-z0-9])|$)", "NUM"),
    ]
    return config


def benchmark_lines(*, lines: int, per_kind: int, vary: bool) -> list[str]:
    """``lines`` benchmark lines: accuracy-log blocks with fresh faults, loghub lines varied or verbatim."""
    out: list[str] = []
    seed = 0
    varier = _Varier(random.Random(12345))
    while len(out) < lines:
        for text, label, _ in build_benchmark(per_kind=per_kind, normals=3000, seed=seed):
            if vary and seed and label in ("normal", "loghub-failure") and not text.startswith("{"):
                text = varier.line(text, seed * 86400)
            out.append(text)
        seed += 1
    return out[:lines]


def system_lines(name: str, *, lines: int, seed: int = 12345) -> list[str]:
    """One loghub system's 2k lines repeated to ``lines``; every repeat but the first redraws content digits."""
    from ucp.tools.bench.logs_generalize import load_system

    raw, rows = load_system(name)
    varier = _Varier(random.Random(seed))
    out: list[str] = []
    repeat = 0
    while len(out) < lines:
        for text, row in zip(raw, rows):
            content = row["Content"]
            if repeat and content and text.endswith(content):  # the header stays as the system writes it
                text = text[:len(text) - len(content)] + varier.digits(content)
            out.append(text)
        repeat += 1
    return out[:lines]


def race(path: str, lines: list[str], *, repeat: int) -> tuple[list, list]:
    """``repeat`` alternating runs of ours (the CLI's default partitioning) and drain3: (wall, CPU) lists."""
    ours, alone = [], []
    for _ in range(repeat):
        _trained_model.cache_clear()
        _domain_model.cache_clear()
        _, wall, cpu = _timed(lambda: analyze_logs([path], options=AnalysisOptions(default_year=2024)))
        ours.append((wall, cpu))
        miner = TemplateMiner(config=drain3_config())
        _, wall, cpu = _timed(lambda m=miner: [m.add_log_message(text) for text in lines])
        alone.append((wall, cpu))
    return ours, alone


def _ratios(ours: list, alone: list, which: int) -> str:
    ratios = sorted(d[which] / o[which] for o, d in zip(ours, alone))
    return f"{statistics.median(ratios):.2f}x ({ratios[0]:.2f}-{ratios[-1]:.2f})"


def _load() -> str:
    try:
        return "load average {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())
    except OSError:
        return "load average unknown"


def race_systems(systems: list[str], *, lines: int, repeat: int) -> None:
    """Print, per loghub system, ours vs drain3: medians and ranges of the per-repeat ratios, wall and CPU."""
    print(f"\nper loghub system, {lines:,} lines each ({repeat} alternating runs; ours in this process, "
          f"the CLI's default partitioning; {_load()} before the first):\n")
    print("| system | ours CPU s (median) | drain3 CPU s (median) | drain3 / ours, CPU | drain3 / ours, wall |")
    print("| --- | ---: | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as tmp:
        for name in systems:
            text = system_lines(name, lines=lines)
            path = os.path.join(tmp, f"{name}.log")
            with open(path, "w", encoding="utf-8") as handle:
                handle.write("\n".join(text) + "\n")
            ours, alone = race(path, text, repeat=repeat)
            print(f"| {name} | {statistics.median(c for _, c in ours):.2f} | "
                  f"{statistics.median(c for _, c in alone):.2f} | {_ratios(ours, alone, 1)} | "
                  f"{_ratios(ours, alone, 0)} |", flush=True)
    print(f"\n{_load()} after the last")


def _timed(fn):
    t, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - t, time.process_time() - c


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--per-kind", type=int, default=40,
                    help="injected lines per fault variant per 12.8k-line block (40: ~15%% faults, 4: ~3%%)")
    ap.add_argument("--vary", action=argparse.BooleanOptionalAction, default=True,
                    help="redraw numbers, hosts and stamps of repeated loghub lines (default) or repeat them verbatim")
    ap.add_argument("--repeat", type=int, default=3,
                    help="alternate the pipelines this many times and keep each one's best time "
                         "(shared machines are noisy)")
    ap.add_argument("--workers", default="1,2",
                    help="comma-separated Dask worker counts to time ours with (1 = in this process)")
    ap.add_argument("--partitions", type=int, default=4,
                    help="byte ranges the log is cut into (the same for every worker count)")
    ap.add_argument("--systems", default="",
                    help="comma-separated loghub systems to race on alone as well (e.g. Linux,HDFS,Android)")
    ap.add_argument("--system-lines", type=int, default=100_000, help="lines per loghub system's log")
    ap.add_argument("--no-mixed", action="store_true", help="only the --systems races, not the mixed log")
    args = ap.parse_args(argv)
    if args.no_mixed:
        race_systems([s for s in args.systems.split(",") if s], lines=args.system_lines, repeat=args.repeat)
        return 0
    workers = [int(w) for w in args.workers.split(",")]
    # Besides the fixed byte ranges: this process with the CLI's own partitioning (one partition per file
    # under 256 MiB), which is what `ucp logs analyze FILE` does with this file on one machine.
    runs = [(w, args.partitions) for w in workers] + ([(1, None)] if 1 in workers else [])
    lines = benchmark_lines(lines=args.lines, per_kind=args.per_kind, vary=args.vary)
    distinct = len(set(lines))
    distinct_masked = len({mask(text) for text in lines})
    ours = {run: [] for run in runs}
    alone = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "speed.log")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write("\n".join(lines) + "\n")
        split = -(-os.path.getsize(path) // args.partitions)
        default_parts = -(-os.path.getsize(path) // DEFAULT_SPLIT_BYTES)
        for _ in range(args.repeat):
            for w, parts in runs:
                options = AnalysisOptions(default_year=2024) if parts is None else \
                    AnalysisOptions(default_year=2024, split_bytes=split)
                _trained_model.cache_clear()  # every run loads the taxonomy's models afresh, as a CLI run does
                _domain_model.cache_clear()
                result, wall, cpu = _timed(lambda o=options, w=w: analyze_logs([path], options=o, run=dask_runner(workers=w)))
                ours[(w, parts)].append((wall, cpu))
            miner = TemplateMiner(config=drain3_config())
            _, wall, cpu = _timed(lambda m=miner: [m.add_log_message(text) for text in lines])
            alone.append((wall, cpu))
    n = len(lines)
    load = _load()
    print(f"{n:,} lines ({'varied' if args.vary else 'verbatim'} loghub repeats; {distinct:,} distinct lines, "
          f"{distinct_masked:,} distinct masked lines; {len(result.events):,} failure events, "
          f"{len(result.incidents):,} incidents), {args.partitions} partitions, best of {args.repeat} alternating "
          f"runs, {load}, {os.cpu_count()} CPUs\n")
    print("all runs, wall seconds: " + "; ".join(f"ours x{w}/{p or 'default'} {', '.join(f'{t:.1f}' for t, _ in ours[(w, p)])}"
                                                  for w, p in runs)
          + f"; drain3 {', '.join(f'{t:.1f}' for t, _ in alone)}\n")
    # Wall time is what a user waits. CPU time is this process's only: with Dask workers the work happens
    # in other processes, so it is shown for the in-process runs alone.
    best_alone = min(t for t, _ in alone)
    cpu_alone = min(c for _, c in alone)
    print("| pipeline | wall s | lines/s (wall) | ratio to drain3 (wall) | CPU s (this process) | ratio to drain3 (CPU) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for w, parts in runs:
        wall = min(t for t, _ in ours[(w, parts)])
        cpu = min(c for _, c in ours[(w, parts)])
        where = f"{default_parts} partition(s) (the CLI's default for this file)" if parts is None \
            else f"{parts} partitions"
        label = f"in this process, {where}" if w == 1 else \
            f"{w} Dask workers, {where} (local cluster, start-up included)"
        cpu_cells = f"{cpu:.1f} | {cpu_alone / cpu:.1f}x" if w == 1 else f"{cpu:.1f} (client only) | -"
        print(f"| ucp logs analyze, {label} | {wall:.1f} | {n / wall:,.0f} | {best_alone / wall:.1f}x | {cpu_cells} |")
    print(f"| drain3 TemplateMiner alone (in memory, 1 process) | {best_alone:.1f} | {n / best_alone:,.0f} | 1.0x | "
          f"{cpu_alone:.1f} | 1.0x |")
    # Per repeat, the ratio of drain3's time to ours in the same repeat (runs alternate, so a noisy minute
    # hits both): median and range over the repeats, wall and CPU.
    print(f"\nper-repeat ratios drain3 / ours over {args.repeat} repeats, median (min-max):")
    for w, parts in runs:
        if w != 1:
            continue
        walls = sorted(d[0] / o[0] for o, d in zip(ours[(w, parts)], alone))
        cpus = sorted(d[1] / o[1] for o, d in zip(ours[(w, parts)], alone))
        print(f"- in this process, {parts or 'default'} partition(s): wall {statistics.median(walls):.2f}x "
              f"({walls[0]:.2f}-{walls[-1]:.2f}), CPU {statistics.median(cpus):.2f}x ({cpus[0]:.2f}-{cpus[-1]:.2f})")
    if args.systems:
        race_systems([s for s in args.systems.split(",") if s], lines=args.system_lines, repeat=args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
