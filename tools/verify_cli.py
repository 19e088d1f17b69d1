"""``ucp verify PATH``: check everything ``ucp.load`` relies on, and report every problem.

A thin wrapper over :func:`ucp.verify` (the manifest, each array's zarr.json,
every chunk against its size and checksum). Examples::

    ucp verify ckpt/step_100
    ucp verify memory://bucket/ckpt --json

Exit codes: 0 clean; 1 problems found (each is listed: tensor, file, kind, message),
including a damaged manifest; 2 not a ucp checkpoint (nothing there, an uncommitted
save, another format, a plain file) or bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["register", "run"]


def register(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "verify",
        help="check every fragment of a checkpoint against its checksums",
        description="Check everything a load relies on: the manifest, each array's zarr.json, and every chunk "
        "of every fragment (size and checksum). Every problem is reported. Exit 0 clean, 1 damaged, "
        "2 not a ucp checkpoint.",
    )
    parser.add_argument("path", metavar="PATH", help="checkpoint directory or fsspec URL")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from tools.format_views import foreign_format, verify_foreign

    if (fmt := foreign_format(args.path)) is not None:  # DCP, safetensors, torch.save...: read every tensor back
        return verify_foreign(args, fmt)
    from ucp.errors import CheckpointNotFoundError, IncompleteCheckpointError, UcpError
    from ucp.verification import verify

    try:
        report = _verify_with_progress(args.path, quiet=args.json, verify=verify)
    except (CheckpointNotFoundError, IncompleteCheckpointError) as err:
        _emit_failure(args, "not-a-checkpoint", err)
        return 2
    except (UcpError, OSError) as err:  # a path no backend opens, a directory that cannot be listed
        _emit_failure(args, type(err).__name__, err)
        return 2
    if args.json:
        print(json.dumps(report.to_dict(), indent=1))
    else:
        _print_report(report)
    return 0 if report.ok else 1


def _verify_with_progress(path: str, *, quiet: bool, verify):
    if quiet or not sys.stderr.isatty():
        return verify(path)
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

    with Progress(TextColumn("verifying"), BarColumn(), DownloadColumn(), transient=True) as bar:
        task = bar.add_task("verify", total=None)
        return verify(path, progress=lambda n: bar.advance(task, n))


def _emit_failure(args, kind: str, err: Exception) -> None:
    if args.json:
        print(json.dumps({"path": args.path, "ok": False, "error": kind, "message": str(err)}, indent=1))
    else:
        print(f"ucp verify: {err}", file=sys.stderr)


def _print_report(report) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if report.ok:
        what = "checksums match" if report.checksums else "readable (saved without checksums)"
        console.print(f"OK {report.path}: {report.tensors} tensors, {report.fragments} fragments, "
                      f"{report.bytes_checked} bytes, {what}")
        return
    table = Table(title=f"DAMAGED {report.path}: {len(report.problems)} problem(s)")
    for column in ("tensor", "file", "problem"):
        table.add_column(column, overflow="fold")
    for p in report.problems:
        table.add_row(p.tensor or "(manifest)", p.file, p.kind)
    console.print(table)
    for p in report.problems:
        console.print(f"- {p.message}", markup=False, highlight=False)
