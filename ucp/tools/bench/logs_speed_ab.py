"""CPU time of `ucp logs analyze` (or its scan alone) in two source trees, alternating in one process.

On a loaded machine a run's CPU time moves by +-30% from one minute to the next, more
than most single changes save. Both trees are imported side by side in this process
(``ucp`` is dropped from ``sys.modules`` between the two imports, each keeps its own
module objects) and run in turn on the same file, so a noisy minute hits both; the
ratio old/new is given per pair (median and range) and of the minimum times.

Run:  git archive <commit> ucp | tar -x -C /tmp/old
      .venv/bin/python ucp/tools/bench/logs_speed_ab.py /tmp/old . FILE [--scan] [--pairs 8]
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import time


def _load(root: str, path: str, scan_only: bool):
    for name in [n for n in sys.modules if n == "ucp" or n.startswith("ucp.")]:
        del sys.modules[name]
    sys.path.insert(0, os.path.abspath(root))
    try:
        analyze = importlib.import_module("ucp.reliability.logs.analyze")
        scan = importlib.import_module("ucp.reliability.logs.scan")
        taxonomy = importlib.import_module("ucp.reliability.logs.taxonomy").load_taxonomy()
    finally:
        sys.path.pop(0)

    def run() -> None:
        if scan_only:
            scan.scan_partition(scan.Partition(0, path), taxonomy=taxonomy, default_year=2024)
        else:  # as logs_speed.py: every run loads the taxonomy's models afresh
            analyze._trained_model.cache_clear()
            analyze._domain_model.cache_clear()
            analyze.analyze_logs([path], options=analyze.AnalysisOptions(default_year=2024))

    run()  # warm: imports, compiled regexes
    return run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", help="source tree holding the old ucp/")
    ap.add_argument("new", help="source tree holding the new ucp/")
    ap.add_argument("file", help="log file to analyze")
    ap.add_argument("--scan", action="store_true", help="time the scan of the file alone")
    ap.add_argument("--pairs", type=int, default=8)
    args = ap.parse_args(argv)
    runs = {"old": _load(args.old, args.file, args.scan), "new": _load(args.new, args.file, args.scan)}
    times: dict[str, list[float]] = {"old": [], "new": []}
    for i in range(args.pairs):
        for name in ("old", "new") if i % 2 == 0 else ("new", "old"):
            start = time.process_time()
            runs[name]()
            times[name].append(time.process_time() - start)
    ratios = sorted(o / n for o, n in zip(times["old"], times["new"]))
    load = "load average {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())
    print(f"{'scan' if args.scan else 'analyze'} {args.file}, {args.pairs} pairs, {load}: CPU s old min "
          f"{min(times['old']):.3f} median {statistics.median(times['old']):.3f}; new min {min(times['new']):.3f} "
          f"median {statistics.median(times['new']):.3f}; old/new per pair {statistics.median(ratios):.3f} "
          f"({ratios[0]:.3f}-{ratios[-1]:.3f}), of the minima {min(times['old']) / min(times['new']):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
