"""``ucp ucl``: check a UCL program against a layout, compile it, list presets.

    ucp ucl check PROGRAM --layout tp=2,pp=2,dp=2 [--param k=v] [--json]
        [--shapes FILE.json | --against CKPT | --model MODULE:FACTORY | --hf-config config.json]
    ucp ucl check --against CKPT --layout tp=4,dp=3      # the program the checkpoint was saved with
    ucp ucl compile PROGRAM --layout tp=2 --rank 1 [--shapes FILE.json | --against CKPT] [--param k=v]
    ucp ucl presets

PROGRAM is a .ucl file or a preset name. Without a source of shapes, the program's own
declarations (``shape [...]`` clauses and the parameters) give the logical tensors. A shapes
file is JSON ``{"name": {"shape": [..], "dtype": "float32"}}`` (or ``{"name": [..]}``).
``--model`` builds a model on the meta device (no memory) from a factory in a module or a
``.py`` file; ``--hf-config`` builds a Hugging Face causal LM from its config (local files
only, no remote code) and fills the program's parameters named like config fields. Both
check every key of the model's state dict (``--key-prefix model/`` when it is saved as
``{"model": model.state_dict()}``) and the model's own tensor-parallel shards.
Exit codes: 0 the program covers the layout, 1 findings, 2 usage, parse or input errors.
"""

from __future__ import annotations

import argparse
import sys

from ucp.tools.output import add_json_option, console, fail, json_on_stdout, write_json


def register(subparsers) -> None:
    parser = subparsers.add_parser("ucl", help="check and compile UCL programs (the checkpoint language)",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="ucl_command", metavar="ACTION")

    def common(p: argparse.ArgumentParser, *, models: bool) -> None:
        p.add_argument("program", nargs="?", default=None,
                       help="a .ucl file or a preset name (see `ucp ucl presets`); with --against, default: the "
                            "program the checkpoint was saved with")
        p.add_argument("--layout", required=True, help="target layout, e.g. tp=2,pp=2,dp=2")
        src = p.add_mutually_exclusive_group()
        src.add_argument("--shapes", metavar="FILE.json", help="logical tensor shapes as JSON")
        src.add_argument("--against", metavar="CHECKPOINT", help="take logical shapes from a checkpoint's manifest")
        if models:
            src.add_argument("--model", metavar="MODULE:FACTORY",
                             help="check against a model built on the meta device (pkg.module:build or file.py:build)")
            src.add_argument("--hf-config", metavar="CONFIG", help="check against a Hugging Face model of this config")
            p.add_argument("--key-prefix", default="", metavar="PREFIX",
                           help="where the model's state dict sits in the saved state, e.g. model/")
        p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                       help="program parameter (repeatable; lists as a|b)")
        add_json_option(p, "the report")

    check = sub.add_parser("check", help="check that a program covers every logical tensor exactly once")
    common(check, models=True)
    check.set_defaults(func=run)
    comp = sub.add_parser("compile", help="print one rank's fragment map as JSON")
    common(comp, models=False)
    comp.add_argument("--rank", type=int, default=0, help="the rank to compile for (default 0)")
    comp.set_defaults(func=run)
    presets = sub.add_parser("presets", help="list the shipped presets")
    add_json_option(presets, "the preset names")
    presets.set_defaults(func=run)
    parser.set_defaults(func=lambda args: (parser.print_help(), 2)[1])


def run(args: argparse.Namespace) -> int:
    from ucp.ucl import load_program, preset_names, spec_for_load
    from ucp.ucl.bind import parse_params
    from ucp.errors import UcpError
    from ucp.layout import Layout

    if args.ucl_command == "presets":
        names = preset_names()
        if args.json:
            write_json(names, args.json, indent=None)
        if not json_on_stdout(args):
            print("\n".join(names))
        return 0
    try:
        program = _program(args, load_program, parse_params(",".join(args.param)))
        layout = Layout.parse(args.layout)
        model = _model(args)
        logical = None if model is not None else _logical(args, program, layout)
    except (UcpError, OSError) as err:
        return fail(args, f"ucp ucl {args.ucl_command}", str(err))
    if args.ucl_command == "compile":
        try:
            fmap = spec_for_load(program, layout, args.rank, logical)
        except UcpError as err:
            return fail(args, "ucp ucl compile", str(err))
        write_json(fmap.to_dict(), args.json or "-")  # the fragment map is the output, JSON either way
        return 0
    try:
        report = _check_with_progress(program, layout, logical, model, args)
    except UcpError as err:  # e.g. a parameter with no value, met while checking
        return fail(args, "ucp ucl check", str(err))
    return _print_report(report, args)


def _program(args: argparse.Namespace, load_program, params: dict):
    """The program named, or with --against the checkpoint's own; checked against (and completed by) its record."""
    from ucp.ucl.errors import UclError
    from ucp.programs import program_against

    if args.against:
        return program_against(args.program, args.against, params)
    if args.program is None:
        raise UclError("name the program to check (a .ucl file or a preset), or give --against CHECKPOINT")
    return load_program(args.program, **params)


def _model(args: argparse.Namespace):
    from ucp.ucl.model_check import hf_config, model_from_factory

    if getattr(args, "model", None):
        return model_from_factory(args.model)
    if getattr(args, "hf_config", None):
        return hf_config(args.hf_config)
    return None


def _logical(args: argparse.Namespace, program, layout):
    from ucp.ucl.declared import declared_logical
    from ucp.programs import read_against
    from ucp.ucl.sources import read_shapes

    if args.shapes:
        return read_shapes(args.shapes)
    if args.against:
        return read_against(args.against)
    return declared_logical(program, layout)


def _print_report(report, args: argparse.Namespace) -> int:
    from rich.table import Table

    if args.json:
        write_json(report.to_dict(), args.json)
    if json_on_stdout(args):
        return 0 if report.ok else 1
    out = console()
    for w in report.warnings:
        out.print(f"[yellow]warning[/yellow] {w.message}", soft_wrap=True)
    if report.ok:
        out.print(f"[green]ok[/green] {report.program} covers every element of {report.logical_tensors} "
                      f"logical tensors exactly once on {report.layout} ({report.ranks} ranks, "
                      f"{report.local_tensors} local tensors)", soft_wrap=True)
        return 0
    table = Table(title=f"{report.program} on {report.layout}: {len(report.findings)} finding(s)")
    table.add_column("kind")
    table.add_column("finding", overflow="fold")
    for f in report.findings[:50]:
        table.add_row(f.kind, f.message)
    out.print(table)
    if len(report.findings) > 50:
        out.print(f"... and {len(report.findings) - 50} more (--json lists them all)")
    return 1


def _check_with_progress(program, layout, logical, model, args):
    """Run the checker, with a rich progress bar over the ranks (on stderr, never with --json)."""
    from ucp.ucl.check import check_program
    from ucp.ucl.model_check import check_model

    if model is not None:
        return check_model(program, layout, model, prefix=args.key_prefix)
    if layout.world_size < 64:
        return check_program(program, layout, logical)
    from ucp.tools.progress_bar import count_progress

    with count_progress("checking", "ranks", enabled=True) as update:
        return check_program(program, layout, logical, progress=lambda done, total: update(done, total))


def main(argv: list[str] | None = None) -> int:
    """Run ``ucp ucl`` alone (the ``ucp`` dispatcher calls the subcommand's function)."""
    from ucp.tools.cli import main as ucp_main

    return ucp_main(["ucl", *(sys.argv[1:] if argv is None else argv)])
