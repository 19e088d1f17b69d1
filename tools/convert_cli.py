"""``ucp convert SRC DST``: convert a checkpoint between formats, streaming within a memory budget.

A thin wrapper over :func:`ucp.convert`. Examples::

    ucp convert dcp/step_100 hf/ --to safetensors
    ucp convert model.safetensors ckpt/ --memory-budget 4GiB
    ucp convert ckpt/ out.pt --check --json

Formats: ``ucp convert --list``. The input format is detected unless ``--from``
names it; the output format is ``--to``, else what DST's extension says
(``.safetensors``, ``.pt``/``.pth``/``.bin``/``.ckpt``), else ``ucp``.
Exit codes: 0 converted (and, with ``--check``, equal); 1 ``--check`` found a
difference; 2 bad input (unreadable, damaged or hostile source; DST exists) or usage.
"""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["register", "run", "main"]


def register(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "convert",
        help="convert a checkpoint between ucp, DCP, safetensors, torch.save and other formats",
        description="Convert a checkpoint from any readable format into any writable one, tensor by tensor "
        "(large tensors in blocks) within a memory budget. Nothing is written at DST unless the whole "
        "conversion succeeds.",
    )
    parser.add_argument("src", metavar="SRC", nargs="?", help="source checkpoint (file or folder)")
    parser.add_argument("dst", metavar="DST", nargs="?", help="destination (must not exist unless --overwrite)")
    parser.add_argument("--from", dest="src_format", metavar="F", help="source format (default: detected)")
    parser.add_argument("--to", dest="dst_format", metavar="F",
                        help="output format (default: from DST's extension, else ucp)")
    parser.add_argument("--program", metavar="P", help="UCL program for a ucp output (text, .ucl path or preset)")
    parser.add_argument("--layout", metavar="L", help="layout the ucp output is sharded for, e.g. tp=2,dp=4")
    parser.add_argument("--memory-budget", default="2GiB", metavar="SIZE",
                        help="bytes of tensor data held at once (default 2GiB)")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="a writer option, e.g. shard_size=2GB for safetensors (repeatable)")
    parser.add_argument("--overwrite", action="store_true", help="replace DST if it exists (only once DST is whole)")
    parser.add_argument("--check", action="store_true", help="read the result back and compare it with SRC")
    parser.add_argument("--list", action="store_true", help="list the formats and exit")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from ucp.formats import formats

    if args.list:
        table = {name: {"description": f.description, "write": f.open_writer is not None}
                 for name, f in formats().items()}
        print(json.dumps(table, indent=1) if args.json else
              "\n".join(f"{n:20} {'read/write' if v['write'] else 'read':11} {v['description']}" for n, v in table.items()))
        return 0
    if not args.src or not args.dst:
        print("ucp convert: error: SRC and DST are required (or --list)", file=sys.stderr)
        return 2
    options = {}
    for item in args.option:
        key, sep, value = item.partition("=")
        if not sep or not key:
            print(f"ucp convert: error: --option {item!r} is not KEY=VALUE", file=sys.stderr)
            return 2
        options[key] = value

    import ucp
    from tools.progress_bar import byte_progress

    try:
        with byte_progress("converting", enabled=not args.json) as update:
            result = ucp.convert(args.src, args.dst, src_format=args.src_format, dst_format=args.dst_format,
                                 program=args.program, layout=args.layout, memory_budget=args.memory_budget,
                                 overwrite=args.overwrite, options=options, progress=update)
    except (TypeError, ValueError) as err:  # bad options (UcpErrors reach the dispatcher: exit 2 too)
        from ucp.errors import UcpError

        if isinstance(err, UcpError):
            raise
        print(f"ucp convert: error: {err}", file=sys.stderr)
        return 2
    report = None
    if args.check:
        with byte_progress("checking", enabled=not args.json) as update:
            report = ucp.diff(args.src, args.dst, a_format=result.src_format, b_format=result.dst_format,
                              memory_budget=args.memory_budget, progress=update)
    if args.json:
        out = result.to_dict()
        if report is not None:
            out["check"] = report.to_dict()
        print(json.dumps(out, indent=1))
    else:
        print(f"converted {result.src} ({result.src_format}) -> {result.dst} ({result.dst_format}): "
              f"{result.tensors} tensors, {result.bytes / 2**20:.1f} MiB in {result.seconds:.1f} s")
        if report is not None:
            from tools.diff_cli import print_report

            print_report(report)
    return 1 if report is not None and not report.equal else 0


def main(argv: list[str] | None = None) -> int:
    from tools.cli import main as ucp_main

    return ucp_main(["convert", *(sys.argv[1:] if argv is None else argv)])
