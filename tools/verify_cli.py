"""``ucp verify PATH``: read every byte of a checkpoint and check its checksums.

A thin wrapper over :func:`ucp.verify`. Examples::

    ucp verify ckpt/step_100
    ucp verify memory://bucket/ckpt --json

Exit codes: 0 clean; 1 damage found (each bad tensor and file is listed), or the
manifest itself is damaged; 2 not a checkpoint (no committed manifest) or bad usage.
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
        description="Read every chunk of every fragment of a checkpoint and check it against the checksum "
        "recorded when it was written. Exit 0 clean, 1 damaged, 2 not a checkpoint.",
    )
    parser.add_argument("path", metavar="PATH", help="checkpoint directory or fsspec URL")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from tools.format_views import foreign_format, verify_foreign

    if (fmt := foreign_format(args.path)) is not None:  # DCP, safetensors, torch.save...: read every tensor back
        return verify_foreign(args, fmt)
    from ucp.errors import CheckpointNotFoundError, FormatVersionError, IncompleteCheckpointError, ManifestError
    from ucp.verification import verify

    try:
        report = _verify_with_progress(args.path, quiet=args.json, verify=verify)
    except (CheckpointNotFoundError, IncompleteCheckpointError) as err:
        _emit_failure(args, "not-a-checkpoint", err)
        return 2
    except (ManifestError, FormatVersionError) as err:
        _emit_failure(args, type(err).__name__, err)
        return 1
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
    table = Table(title=f"DAMAGED {report.path}: {len(report.problems)} bad fragment(s)")
    for column in ("tensor", "file", "problem"):
        table.add_column(column, overflow="fold")
    for p in report.problems:
        table.add_row(p.tensor, p.file, p.kind)
    console.print(table)
    for p in report.problems:
        console.print(f"- {p.message}", markup=False, highlight=False)
