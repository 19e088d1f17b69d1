"""``ucp bench``: save/load throughput of ucp against DCP, safetensors, torch.save, a raw write and a memory copy.

A thin wrapper over :func:`tools.bench.core_bench.run_benchmark`.

Example::

    ucp bench --size-gib 1.0 --dirs /tmp/ucp-bench,/dev/shm/ucp-bench
    ucp bench --size-gib 0.1 --repeats 1 --json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="benchmark checkpoint save/load against DCP, safetensors, torch.save and a raw write",
        description=(
            "Save and load one state dict (large matrices + hundreds of small vectors, float32/bf16) "
            "with ucp, torch.distributed.checkpoint (thread_count = cores), safetensors, torch.save and a raw "
            "numpy write, in one run, on each directory, interleaved with the order rotated every repeat; "
            "file pages are dropped from the cache before each load (posix_fadvise DONTNEED; with "
            "--drop-caches also /proc/sys/vm/drop_caches, as root); a fresh process's first save/load is compared with "
            "warm ones. Prints the median (min-max) of the repeats and ratios against the targets."
        ),
    )
    parser.add_argument("--size-gib", type=float, default=1.0, help="state size in GiB (default 1.0)")
    parser.add_argument(
        "--dirs",
        default=None,
        help="comma-separated directories to benchmark on (default: the system temp dir and /dev/shm)",
    )
    parser.add_argument("--repeats", type=int, default=5, help="repeats per method (default 5)")
    parser.add_argument(
        "--stat",
        choices=("min", "median"),
        default="median",
        help="statistic of the repeats for tables and ratios: median (default) or min (best)",
    )
    parser.add_argument("--no-rss", action="store_true", help="skip the peak-RSS probes (fresh subprocesses)")
    parser.add_argument("--drop-caches", action="store_true",
                        help="also empty the whole page cache (/proc/sys/vm/drop_caches, root) before each load")
    parser.add_argument("--no-cold-start", action="store_true",
                        help="skip the first-save/load-in-a-fresh-process probes (fresh subprocesses)")
    parser.add_argument("--json", action="store_true", help="print the full report as JSON")
    parser.set_defaults(func=run)


def _default_dirs() -> list[Path]:
    import tempfile

    dirs = [Path(tempfile.gettempdir()) / "ucp-bench"]
    if Path("/dev/shm").is_dir():
        dirs.append(Path("/dev/shm/ucp-bench"))
    return dirs


def run(args: argparse.Namespace) -> int:
    if not args.size_gib > 0 or math.isinf(args.size_gib):
        print("ucp bench: error: --size-gib must be a positive number", file=sys.stderr)
        return 2
    if args.repeats < 1:
        print("ucp bench: error: --repeats must be at least 1", file=sys.stderr)
        return 2
    dirs = [Path(d) for d in args.dirs.split(",") if d] if args.dirs else _default_dirs()
    if not dirs:
        print("ucp bench: error: --dirs names no directory", file=sys.stderr)
        return 2

    from rich.console import Console

    from tools.bench.core_bench import run_benchmark
    from tools.bench.core_report import render_tables

    console = Console(stderr=args.json)
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    with console.status("benchmarking") as status:
        report = run_benchmark(
            size_gib=args.size_gib,
            dirs=dirs,
            repeats=args.repeats,
            measure_rss=not args.no_rss,
            cold_start=not args.no_cold_start,
            drop_caches=args.drop_caches,
            statistic=args.stat,
            progress=lambda msg: status.update(msg),
        )
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        for table in render_tables(report):
            console.print(table)
        for note in report.notes:
            console.print(f"[dim]note: {note}[/dim]")
    return 0
