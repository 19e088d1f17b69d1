"""``ucp diff A B``: compare two checkpoints of any readable formats, tensor by tensor.

A thin wrapper over :func:`ucp.diff`. Examples::

    ucp diff dcp/step_100 hf/
    ucp diff ckpt/ model.safetensors --atol 1e-6 --tensors-only --json -
    ucp diff ckpt/step_100 hf/ --only model     # a weights-only export against its checkpoint

Exit codes: 0 equal; 1 any difference (each is listed: missing, extra, shape,
dtype, values with the largest absolute difference, state); 2 unreadable input or usage.
"""

from __future__ import annotations

import argparse
import sys

from ucp.tools.output import add_json_option, console, fail, json_on_stdout, write_json

__all__ = ["register", "run", "main", "print_report"]


def register(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "diff",
        help="compare the logical tensors and training state of two checkpoints (any formats)",
        description="Compare two checkpoints, each in any readable format: every logical tensor (by name, "
        "shape, dtype and value, block by block) and the training state. Exit 0 equal, 1 different.",
    )
    parser.add_argument("a", metavar="A", help="first checkpoint")
    parser.add_argument("b", metavar="B", help="second checkpoint")
    parser.add_argument("--atol", type=float, default=0.0,
                        help="largest absolute difference allowed (default 0: bitwise equal)")
    parser.add_argument("--from-a", dest="a_format", metavar="F", help="format of A (default: detected)")
    parser.add_argument("--from-b", dest="b_format", metavar="F", help="format of B (default: detected)")
    parser.add_argument("--tensors-only", action="store_true", help="do not compare the training state")
    parser.add_argument("--only", metavar="PART",
                        help="compare one part of each side, as `ucp convert --only` writes it: 'model' or a root "
                             "such as 'ema' (prefix stripped); no training state")
    parser.add_argument("--memory-budget", default="2GiB", metavar="SIZE", help="bytes held at once (default 2GiB)")
    add_json_option(parser, "the report")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    import ucp
    from ucp.tools.progress_bar import byte_progress

    if not args.atol >= 0:
        return fail(args, "ucp diff", f"--atol must be >= 0, got {args.atol}")
    with byte_progress("comparing", enabled=True) as update:
        report = ucp.diff(args.a, args.b, a_format=args.a_format, b_format=args.b_format, atol=args.atol,
                          compare_state=not args.tensors_only, memory_budget=args.memory_budget, progress=update,
                          only=args.only)
    if args.json:
        write_json(report.to_dict(), args.json)
    if not json_on_stdout(args):
        print_report(report)
    return 0 if report.equal else 1


def print_report(report) -> None:
    """The report as a line (equal) or a table of differences."""
    from rich.table import Table

    out = console()
    if report.equal:
        out.print(f"EQUAL {report.a} ({report.a_format}) and {report.b} ({report.b_format}): "
                      f"{report.tensors_compared} tensors, {report.bytes_compared} bytes compared", highlight=False)
        return
    table = Table(title=f"DIFFERENT {report.a} ({report.a_format}) vs {report.b} ({report.b_format}): "
                  f"{len(report.differences)} difference(s)")
    for column in ("name", "kind", "detail"):
        table.add_column(column, overflow="fold")
    for d in report.differences:
        table.add_row(d.name, d.kind, d.detail)
    out.print(table)


def main(argv: list[str] | None = None) -> int:
    from ucp.tools.cli import main as ucp_main

    return ucp_main(["diff", *(sys.argv[1:] if argv is None else argv)])
