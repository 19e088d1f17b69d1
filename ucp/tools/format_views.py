"""``ucp inspect`` / ``ucp verify`` for checkpoints in a format other than ucp (DCP, safetensors, torch.save...).

The subcommands keep their ucp behaviour; for a path another registered format
recognises they hand over here. A thin layer over :mod:`ucp.formats.inspection`.
"""

from __future__ import annotations

import argparse
from typing import Any

from ucp.tools.output import console, json_on_stdout, size_text, write_json

__all__ = ["foreign_format", "inspect_foreign", "verify_foreign", "counter"]


def foreign_format(path: str) -> Any:
    """The registered format of ``path`` when it is not a ucp checkpoint (None: let ucp handle it)."""
    from ucp.errors import UcpError
    from ucp.formats import detect_format

    try:
        fmt = detect_format(path)
    except (UcpError, OSError):
        return None
    return None if fmt.name == "ucp" else fmt


def inspect_foreign(args: argparse.Namespace, fmt: Any) -> int:
    from rich.table import Table

    from ucp.formats.inspection import describe_format

    summary = describe_format(args.path, format=fmt.name)  # a damaged file raises: exit 2 in the dispatcher
    if args.json:
        write_json(summary.to_dict(), args.json)
    if json_on_stdout(args):
        return 0
    out = console()
    out.print(f"[bold]{summary.path}[/bold]  format {summary.format} ({fmt.description})\n"
                  f"step {summary.step if summary.step is not None else '-'}  param groups {summary.param_groups}\n"
                  f"{len(summary.tensors)} tensors, {size_text(summary.total_bytes)}", highlight=False)
    table = Table()
    for column, justify in (("tensor", "left"), ("dtype", "left"), ("shape", "left"), ("size", "right")):
        table.add_column(column, justify=justify, overflow="fold")
    for t in summary.tensors:
        table.add_row(t.name, t.dtype, str(list(t.shape)), size_text(t.nbytes))
    out.print(table)
    return 0


def verify_foreign(args: argparse.Namespace, fmt: Any) -> int:
    from ucp.formats.inspection import verify_format
    from ucp.tools.progress_bar import byte_progress

    with byte_progress("verifying", enabled=True) as update:
        report = verify_format(args.path, format=fmt.name, progress=counter(update))
    if args.json:
        write_json(report.to_dict(), args.json)
    if json_on_stdout(args):
        pass
    elif report.ok:
        print(f"OK {report.path} ({report.format}): {report.tensors} tensors, {report.bytes_checked} bytes read "
              "back; structure and every tensor readable")
    else:
        from rich.table import Table

        table = Table(title=f"DAMAGED {report.path} ({report.format}): {len(report.problems)} problem(s)")
        for column in ("tensor", "problem", "message"):
            table.add_column(column, overflow="fold")
        for p in report.problems:
            table.add_row(p.tensor or "(file)", p.kind, p.message)
        console().print(table)
    return 0 if report.ok else 1


def counter(update):
    """``step(nbytes)`` adding up to ``update(done, 0, "")`` (None when there is no progress to show)."""
    if update is None:
        return None
    done = [0]

    def step(nbytes: int) -> None:
        done[0] += nbytes
        update(done[0], 0, "")

    return step
