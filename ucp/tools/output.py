"""What every ``ucp`` subcommand prints: strict JSON to a path or standard output, and whole tables.

One meaning for ``--json`` everywhere: ``--json PATH`` writes the report to PATH, ``--json -`` (or
a bare ``--json``, which keeps older scripts working; put it last, since before a positional
argument it takes that as its PATH) to standard output, and then nothing else goes to standard
output (tables and notes are left out; progress and errors go to standard error). The JSON is strict (RFC 8259):
a value JSON has no number for (``inf``, ``nan``) is written as ``null``, as docs/LOGS.md and
docs/ETTR.md promise, so ``json.loads(text, parse_constant=...)`` or ``jq`` read every report.
An input or usage error (exit 2) writes ``{"ok": false, "error": ..., "message": ...}`` there.

Tables are drawn by rich on a terminal; elsewhere (a pipe, a file, CI logs) they are as wide as
their longest cell, so names are never cut or folded onto two lines.

    add_json_option(parser, "the report")
    ...
    if args.json:
        write_json(report.to_dict(), args.json)
    if not json_on_stdout(args):
        console().print(table)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any

__all__ = ["add_json_option", "write_json", "strict_json", "json_on_stdout", "console", "fail", "STDOUT"]

STDOUT = "-"
_WIDE = 100_000  # "as wide as the content": rich caps a table at the console width


def add_json_option(parser: argparse.ArgumentParser, what: str, *, required: bool = False) -> None:
    """``--json [PATH]``: ``what`` as JSON to PATH, or to standard output for ``-`` or no PATH."""
    if required:
        parser.add_argument("--json", metavar="PATH", required=True,
                            help=f"write {what} as JSON to PATH ('-': standard output)")
    else:
        parser.add_argument("--json", metavar="PATH", nargs="?", const=STDOUT, default=None,
                            help=f"write {what} as JSON to PATH ('-' or no PATH: standard output, and "
                                 "nothing else there)")


def json_on_stdout(args: argparse.Namespace) -> bool:
    """True when ``--json`` writes to standard output (then tables and notes stay off it)."""
    return getattr(args, "json", None) == STDOUT


def strict_json(value: Any) -> Any:
    """``value`` with every non-finite float as None and tuples as lists: what strict JSON can hold.

    >>> strict_json({"mttf": float("inf"), "fit": (1.5, float("nan"))})
    {'mttf': None, 'fit': [1.5, None]}
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", None) == 0:
        return strict_json(value.item())  # a numpy or torch scalar
    return value


def write_json(value: Any, dest: str, *, indent: int | None = 1) -> None:
    """Write ``value`` as strict JSON to the file ``dest``, or to standard output for ``-``."""
    text = json.dumps(strict_json(value), indent=indent, allow_nan=False)
    if dest == STDOUT:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
        return
    with open(os.fspath(dest), "w", encoding="utf-8") as handle:
        handle.write(text + "\n")


def fail(args: argparse.Namespace, prog: str, message: str, *, kind: str = "usage") -> int:
    """Report an input or usage error: ``PROG: error: MESSAGE`` on standard error and, with ``--json``,
    ``{"ok": false, "error": KIND, "message": MESSAGE}`` where the report would have gone. Returns 2."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    if getattr(args, "json", None):
        try:
            write_json({"ok": False, "error": kind, "message": message}, args.json)
        except OSError:
            pass  # the error is on standard error already; a JSON path that cannot be written is not a second one
    return 2


def console(*, stderr: bool = False):
    """A rich Console: the terminal's width on a terminal, else wide enough that nothing is cut."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(stderr=stderr)
    return Console(file=stream, width=_WIDE, soft_wrap=True)


def size_text(n: float, *, largest: str = "GiB") -> str:
    """A byte count for a table or a progress line, in binary units up to ``largest``.

    >>> size_text(512), size_text(3 << 20), size_text(5 << 40), size_text(5 << 40, largest="TiB")
    ('512 B', '3.0 MiB', '5120.0 GiB', '5.0 TiB')
    """
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    for unit in units[:units.index(largest) + 1]:
        if n < 1024 or unit == largest:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
