"""``ucp verify PATH``: check everything ``ucp.load`` relies on, and report every problem.

A thin wrapper over :func:`ucp.verify` (the manifest, each array's zarr.json,
every chunk against its size and checksum). Examples::

    ucp verify ckpt/step_100
    ucp verify memory://bucket/ckpt --json -

Exit codes: 0 clean; 1 problems found (each is listed: tensor, file, kind, message),
including a damaged manifest; 2 not a ucp checkpoint (nothing there, an uncommitted
save, another format, a plain file) or bad usage.
"""

from __future__ import annotations

import argparse
import sys

from ucp.tools.output import add_json_option, console, json_on_stdout, write_json

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
    add_json_option(parser, "the report")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from ucp.tools.format_views import foreign_format, verify_foreign

    if (fmt := foreign_format(args.path)) is not None:  # DCP, safetensors, torch.save...: read every tensor back
        return verify_foreign(args, fmt)
    from ucp.errors import CheckpointNotFoundError, IncompleteCheckpointError, UcpError
    from ucp.verification import verify

    try:
        report = _verify_with_progress(args.path, verify=verify)
    except (CheckpointNotFoundError, IncompleteCheckpointError) as err:
        _emit_failure(args, "not-a-checkpoint", err)
        return 2
    except (UcpError, OSError) as err:  # a path no backend opens, a directory that cannot be listed
        _emit_failure(args, type(err).__name__, err)
        return 2
    if args.json:
        write_json(report.to_dict(), args.json)
    if not json_on_stdout(args):
        _print_report(report)
    return 0 if report.ok else 1


def _verify_with_progress(path: str, *, verify):
    from ucp.tools.format_views import counter
    from ucp.tools.progress_bar import byte_progress

    with byte_progress("verifying", enabled=True) as update:
        return verify(path, progress=counter(update))


def _emit_failure(args, kind: str, err: Exception) -> None:
    if args.json:
        write_json({"path": args.path, "ok": False, "error": kind, "message": str(err)}, args.json)
    if not json_on_stdout(args):
        print(f"ucp verify: {err}", file=sys.stderr)


def _print_report(report) -> None:
    from rich.table import Table

    out = console()
    if report.ok:
        what = "checksums match" if report.checksums else "readable (saved without checksums)"
        out.print(f"OK {report.path}: {report.tensors} tensors, {report.fragments} fragments, "
                      f"{report.bytes_checked} bytes, {what}")
        return
    table = Table(title=f"DAMAGED {report.path}: {len(report.problems)} problem(s)")
    for column in ("tensor", "file", "problem"):
        table.add_column(column, overflow="fold")
    for p in report.problems:
        table.add_row(p.tensor or "(manifest)", p.file, p.kind)
    out.print(table)
    for p in report.problems:
        out.print(f"- {p.message}", markup=False, highlight=False)


def main(argv: list[str] | None = None) -> int:
    """Run ``ucp verify`` alone (the ``ucp`` dispatcher calls the subcommand's function)."""
    from ucp.tools.cli import main as ucp_main

    return ucp_main(["verify", *(sys.argv[1:] if argv is None else argv)])
