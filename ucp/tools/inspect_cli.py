"""``ucp inspect PATH``: what a checkpoint holds, from its manifest alone.

A thin wrapper over :func:`ucp.describe`. Examples::

    ucp inspect ckpt/step_100
    ucp inspect ckpt/step_100 --json -          # or --json summary.json

Exit codes: 0 ok; 2 not a checkpoint, damaged manifest, or bad usage.
"""

from __future__ import annotations

import argparse
import sys

from ucp.tools.output import add_json_option, console, json_on_stdout, size_text, write_json

__all__ = ["register", "run"]


def register(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "inspect",
        help="show a checkpoint's layout, step and tensors",
        description="Show a checkpoint's format version, source layout, step, and every logical tensor "
        "with its dtype, shape, fragments and size. Reads only the manifest.",
    )
    parser.add_argument("path", metavar="PATH", help="checkpoint directory or fsspec URL")
    add_json_option(parser, "the summary")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from ucp.tools.format_views import foreign_format, inspect_foreign

    if (fmt := foreign_format(args.path)) is not None:  # DCP, safetensors, torch.save...: from its reader
        return inspect_foreign(args, fmt)
    from ucp.summary import describe

    summary = describe(args.path)  # UcpError -> exit 2 in the dispatcher
    if args.json:
        write_json(summary.to_dict(), args.json)
    if json_on_stdout(args):
        return 0
    from rich.table import Table

    out = console()
    out.print(
        f"[bold]{summary.path}[/bold]  format {summary.format_version}  created {summary.created or '-'}\n"
        f"ranks {summary.world_size}  layout {summary.layout or '-'}  UCL program {'yes' if summary.has_program else 'no'}  "
        f"step {summary.step if summary.step is not None else '-'}  checksums {summary.checksum_algorithm or 'none'}\n"
        f"{len(summary.tensors)} tensors, {size_text(summary.total_bytes)}"
    )
    table = Table()
    for column, justify in (("tensor", "left"), ("dtype", "left"), ("shape", "left"), ("fragments", "right"),
                            ("size", "right"), ("writers", "left")):
        table.add_column(column, justify=justify, overflow="fold")
    for t in summary.tensors:
        writers = ",".join(map(str, t.writers[:8])) + ("..." if len(t.writers) > 8 else "")
        table.add_row(t.name, t.dtype, str(list(t.shape)), str(t.fragments), size_text(t.nbytes), writers)
    out.print(table)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run ``ucp inspect`` alone (the ``ucp`` dispatcher calls the subcommand's function)."""
    from ucp.tools.cli import main as ucp_main

    return ucp_main(["inspect", *(sys.argv[1:] if argv is None else argv)])
