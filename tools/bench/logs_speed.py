"""Throughput of `ucp logs analyze` against drain3 alone, same lines, same run.

Builds a benchmark log of >= 1,000,000 lines (the labeled accuracy log -
loghub samples plus injected faults - repeated with fresh random faults),
then times (a) our whole pipeline from the file (read, detect format, parse,
mask, template cache, classify, incidents, fits) and (b) drain3's
TemplateMiner.add_log_message with its usual IP/HEX/NUM masking on the same
lines already in memory (no I/O, no classification: a generous baseline).

Run:  .venv/bin/python tools/bench/logs_speed.py [--lines 1000000]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from drain3 import TemplateMiner  # noqa: E402

from reliability.logs.analyze import AnalysisOptions, analyze_logs  # noqa: E402
from reliability.logs.templates import miner_config  # noqa: E402
from tools.bench.logs_accuracy import build_benchmark  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--per-kind", type=int, default=40,
                    help="injected lines per fault variant per 12.8k-line block (40: ~14%% faults, 4: ~1.6%%)")
    ap.add_argument("--repeat", type=int, default=3,
                    help="alternate the two pipelines this many times and keep each one's best time "
                         "(shared machines are noisy)")
    args = ap.parse_args(argv)
    lines: list[str] = []
    seed = 0
    while len(lines) < args.lines:
        lines.extend(text for text, _, _ in build_benchmark(per_kind=args.per_kind, normals=3000, seed=seed))
        seed += 1
    lines = lines[:args.lines]
    ours = alone = float("inf")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "speed.log")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write("\n".join(lines) + "\n")
        for _ in range(args.repeat):
            t = time.perf_counter()
            result = analyze_logs([path], options=AnalysisOptions(default_year=2024))
            ours = min(ours, time.perf_counter() - t)
            miner = TemplateMiner(config=miner_config(masking=True))
            t = time.perf_counter()
            for text in lines:
                miner.add_log_message(text)
            alone = min(alone, time.perf_counter() - t)
    n = len(lines)
    print(f"{n:,} lines ({len(result.events):,} failure events, {len(result.incidents):,} incidents), "
          f"best of {args.repeat}\n")
    print("| pipeline | seconds | lines/s | ratio |")
    print("| --- | ---: | ---: | ---: |")
    print(f"| ucp logs analyze (full pipeline, from file) | {ours:.1f} | {n / ours:,.0f} | {alone / ours:.1f}x |")
    print(f"| drain3 TemplateMiner alone (in memory) | {alone:.1f} | {n / alone:,.0f} | 1.0x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
