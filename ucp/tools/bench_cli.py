"""``ucp bench``: save/load throughput of ucp against DCP, safetensors, torch.save, a raw write and a memory copy.

A thin wrapper over :func:`ucp.tools.bench.core_bench.run_benchmark`.

Example::

    ucp bench --size-gib 1.0 --dirs /tmp/ucp-bench,/dev/shm/ucp-bench
    ucp bench --size-gib 0.1 --repeats 1 --json -
"""

from __future__ import annotations

import argparse
import math
import sys
import warnings
from contextlib import contextmanager
from pathlib import Path

from ucp.tools.output import add_json_option, console, fail, json_on_stdout, write_json


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
        "--state",
        choices=("matrices", "adam"),
        default="matrices",
        help="the state: 8 large matrices + 512 vectors (default), or adam: bf16 parameters of a transformer "
        "with fp32 masters and both Adam moments",
    )
    parser.add_argument(
        "--stat",
        choices=("min", "median"),
        default="median",
        help="statistic of the repeats for tables and ratios: median (default) or min (best)",
    )
    parser.add_argument("--no-rss", action="store_true", help="skip the peak-RSS probes (fresh subprocesses)")
    parser.add_argument(
        "--methods",
        default=None,
        help="comma-separated methods to run (default: all; raw, torch.save, safetensors, dcp, ucp, ucp-nocrc, ucp-buffered); "
        "memcpy always runs",
    )
    parser.add_argument("--no-async", action="store_true", help="skip the async-save rows")
    parser.add_argument("--drop-caches", action="store_true",
                        help="also empty the whole page cache (/proc/sys/vm/drop_caches, root) before each load")
    parser.add_argument("--no-cold-start", action="store_true",
                        help="skip the first-save/load-in-a-fresh-process probes (fresh subprocesses)")
    add_json_option(parser, "the full report")
    parser.set_defaults(func=run)


def _default_dirs() -> list[Path]:
    import tempfile

    dirs = [Path(tempfile.gettempdir()) / "ucp-bench"]
    if Path("/dev/shm").is_dir():
        dirs.append(Path("/dev/shm/ucp-bench"))
    return dirs


@contextmanager
def _status(label: str):
    """``update(message)``: a spinner on a terminal; elsewhere (CI logs) each step as a line on stderr."""
    if not sys.stderr.isatty():
        yield lambda message: print(f"{label}: {message}", file=sys.stderr, flush=True)
        return
    from rich.console import Console

    with Console(stderr=True).status(label) as status:
        yield status.update


def run(args: argparse.Namespace) -> int:
    if not args.size_gib > 0 or math.isinf(args.size_gib):
        return fail(args, "ucp bench", "--size-gib must be a positive number")
    if args.repeats < 1:
        return fail(args, "ucp bench", "--repeats must be at least 1")
    from ucp.tools.bench.core_bench import METHODS

    unknown = sorted(set(args.methods.split(",")) - set(METHODS)) if args.methods else []
    if unknown:
        return fail(args, "ucp bench", f"unknown method(s) {', '.join(unknown)}; known: {', '.join(METHODS)}")
    dirs = [Path(d) for d in args.dirs.split(",") if d] if args.dirs else _default_dirs()
    if not dirs:
        return fail(args, "ucp bench", "--dirs names no directory")

    from ucp.tools.bench.core_bench import run_benchmark
    from ucp.tools.bench.core_report import render_tables

    out = console(stderr=json_on_stdout(args))
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    with _status("benchmarking") as update:
        report = run_benchmark(
            size_gib=args.size_gib,
            kind=args.state,
            methods=args.methods.split(",") if args.methods else None,
            async_save=not args.no_async,
            dirs=dirs,
            repeats=args.repeats,
            measure_rss=not args.no_rss,
            cold_start=not args.no_cold_start,
            drop_caches=args.drop_caches,
            statistic=args.stat,
            progress=update,
        )
    if args.json:
        write_json(report.to_dict(), args.json, indent=2)
    if not json_on_stdout(args):
        for table in render_tables(report):
            out.print(table)
        for note in report.notes:
            out.print(f"[dim]note: {note}[/dim]")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run ``ucp bench`` alone (the ``ucp`` dispatcher calls the subcommand's function)."""
    from ucp.tools.cli import main as ucp_main

    return ucp_main(["bench", *(sys.argv[1:] if argv is None else argv)])
