"""``ucp convert SRC DST``: convert a checkpoint between formats, streaming within a memory budget.

A thin wrapper over :func:`ucp.convert`. Examples::

    ucp convert dcp/step_100 hf/ --to safetensors
    ucp convert model.safetensors ckpt/ --memory-budget 4GiB
    ucp convert ckpt/ out.pt --check --json -
    ucp convert ckpt/step_100 hf/ --to safetensors --only model --hf-files base-model/   # from_pretrained(hf/)

Formats: ``ucp convert --list``. The input format is detected unless ``--from``
names it; the output format is ``--to``, else what DST's extension says
(``.safetensors``, ``.pt``/``.pth``/``.bin``/``.ckpt``), else ``ucp``.
Exit codes: 0 converted (and, with ``--check``, equal); 1 ``--check`` found a
difference; 2 bad input (unreadable, damaged or hostile source; DST exists) or usage.
"""

from __future__ import annotations

import argparse
import sys

from ucp.tools.output import add_json_option, fail, json_on_stdout, write_json

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
    parser.add_argument("--only", metavar="PART",
                        help="write one part, weights only: 'model' (the model's tensors, no optimizer state) or a "
                             "root such as 'ema' (its tensors, prefix stripped); what is left out is reported")
    parser.add_argument("--hf-files", metavar="DIR",
                        help="copy config.json, generation config and tokenizer files from DIR into a safetensors "
                             "folder output (default: from SRC when it is a Hugging Face folder)")
    parser.add_argument("--program", metavar="P", help="UCL program for a ucp output (text, .ucl path or preset)")
    parser.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                        help="a value for a program parameter (repeatable; lists as a|b); parameters not given "
                             "come from a config.json beside SRC")
    parser.add_argument("--layout", metavar="L", help="layout the ucp output is sharded for, e.g. tp=2,dp=4")
    parser.add_argument("--memory-budget", default="2GiB", metavar="SIZE",
                        help="bytes of tensor data held at once (default 2GiB)")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="a writer option, e.g. shard_size=2GB for safetensors (repeatable)")
    parser.add_argument("--overwrite", action="store_true", help="replace DST if it exists (only once DST is whole)")
    parser.add_argument("--check", action="store_true", help="read the result back and compare it with SRC")
    parser.add_argument("--list", action="store_true", help="list the formats and exit")
    add_json_option(parser, "the result")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from ucp.formats import formats

    if args.list:
        table = {name: {"description": f.description, "write": f.open_writer is not None}
                 for name, f in formats().items()}
        if args.json:
            write_json(table, args.json)
        if not json_on_stdout(args):
            print("\n".join(f"{n:20} {'read/write' if v['write'] else 'read':11} {v['description']}"
                            for n, v in table.items()))
        return 0
    if not args.src or not args.dst:
        return fail(args, "ucp convert", "SRC and DST are required (or --list)")
    options = {}
    for item in args.option:
        key, sep, value = item.partition("=")
        if not sep or not key:
            return fail(args, "ucp convert", f"--option {item!r} is not KEY=VALUE")
        options[key] = value

    import ucp
    from ucp.tools.progress_bar import byte_progress
    from ucp.ucl.bind import parse_params

    try:
        params = parse_params(",".join(args.param))
        with byte_progress("converting", enabled=True) as update:
            result = ucp.convert(args.src, args.dst, src_format=args.src_format, dst_format=args.dst_format,
                                 program=args.program, layout=args.layout, memory_budget=args.memory_budget,
                                 overwrite=args.overwrite, options=options, progress=update, only=args.only,
                                 hf_files=args.hf_files, params=params)
    except (TypeError, ValueError) as err:  # bad options (UcpErrors reach the dispatcher: exit 2 too)
        from ucp.errors import UcpError

        if isinstance(err, UcpError):
            raise
        return fail(args, "ucp convert", str(err))
    report = None
    if args.check:
        with byte_progress("checking", enabled=True) as update:
            report = ucp.diff(args.src, args.dst, a_format=result.src_format, b_format=result.dst_format,
                              memory_budget=args.memory_budget, progress=update, only=args.only,
                              b_whole=True)
    if args.json:
        out = result.to_dict()
        if report is not None:
            out["check"] = report.to_dict()
        write_json(out, args.json)
    if not json_on_stdout(args):
        print(f"converted {result.src} ({result.src_format}) -> {result.dst} ({result.dst_format}): "
              f"{result.tensors} tensors, {result.bytes / 2**20:.1f} MiB in {result.seconds:.1f} s")
        for line in _notes(result):
            print(line)
        if report is not None:
            from ucp.tools.diff_cli import print_report

            print_report(report)
    return 1 if report is not None and not report.equal else 0


def _notes(result) -> list[str]:
    """What the user should know beyond the count: what was left out, copied, or is missing for from_pretrained."""
    notes = []
    if result.left_out:
        shown = ", ".join(result.left_out[:3]) + (", ..." if len(result.left_out) > 3 else "")
        notes.append(f"left out (--only {result.only}): {len(result.left_out)} tensors ({shown}) and the training state")
    if result.files:
        notes.append(f"copied {', '.join(result.files)}")
    if result.files_left_out:
        notes.append(f"not copied ({result.dst_format} output has no room for them): {', '.join(result.files_left_out)}")
    if result.dst_format == "safetensors" and result.only is None and result.non_model_tensors:
        notes.append(f"{result.non_model_tensors} of the tensors written are not the model's (optimizer state, other "
                     "roots): from_pretrained reports them as unexpected; --only model writes the weights alone")
    if result.program:
        notes.append(f"program {result.program}")
    if result.dst_format == "safetensors" and not result.dst.endswith(".safetensors") \
            and "config.json" not in result.files:
        notes.append("no config.json: from_pretrained needs one (--hf-files DIR copies it from the base model)")
    return notes


def main(argv: list[str] | None = None) -> int:
    from ucp.tools.cli import main as ucp_main

    return ucp_main(["convert", *(sys.argv[1:] if argv is None else argv)])
