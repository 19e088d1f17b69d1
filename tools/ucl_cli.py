"""``ucp ucl``: check a UCL program against a layout, compile it, list presets.

    ucp ucl check PROGRAM --layout tp=2,pp=2,dp=2 (--shapes FILE.json | --against CKPT) [--param k=v] [--json]
    ucp ucl compile PROGRAM --layout tp=2 --rank 1 (--shapes FILE.json | --against CKPT) [--param k=v]
    ucp ucl presets

PROGRAM is a .ucl file or a preset name. A shapes file is JSON
``{"name": {"shape": [..], "dtype": "float32"}}`` (or ``{"name": [..]}``).
Exit codes: 0 the program covers the layout, 1 findings, 2 usage, parse or input errors.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from ucp.spec import LogicalTensor


def register(subparsers) -> None:
    parser = subparsers.add_parser("ucl", help="check and compile UCL programs (the checkpoint language)",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="ucl_command", metavar="ACTION")

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("program", help="a .ucl file or a preset name (see `ucp ucl presets`)")
        p.add_argument("--layout", required=True, help="target layout, e.g. tp=2,pp=2,dp=2")
        src = p.add_mutually_exclusive_group(required=True)
        src.add_argument("--shapes", metavar="FILE.json", help="logical tensor shapes as JSON")
        src.add_argument("--against", metavar="CHECKPOINT", help="take logical shapes from a checkpoint's manifest")
        p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                       help="program parameter (repeatable; lists as a|b)")
        p.add_argument("--json", action="store_true", help="machine-readable output")

    check = sub.add_parser("check", help="check that a program covers every logical tensor exactly once")
    common(check)
    check.set_defaults(func=run)
    comp = sub.add_parser("compile", help="print one rank's fragment map as JSON")
    common(comp)
    comp.add_argument("--rank", type=int, default=0, help="the rank to compile for (default 0)")
    comp.set_defaults(func=run)
    presets = sub.add_parser("presets", help="list the shipped presets")
    presets.add_argument("--json", action="store_true", help="machine-readable output")
    presets.set_defaults(func=run)
    parser.set_defaults(func=lambda args: (parser.print_help(), 2)[1])


def read_shapes(path: str) -> dict[str, LogicalTensor]:
    """Logical tensors from a shapes JSON file."""
    from ucl.errors import UclError

    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except json.JSONDecodeError as err:
        raise UclError(f"{path} is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise UclError(f"{path}: expected an object of name -> shape")
    out = {}
    for name, value in data.items():
        if isinstance(value, dict):
            shape, dtype = value.get("shape"), value.get("dtype", "float32")
        else:
            shape, dtype = value, "float32"
        if not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape):
            raise UclError(f"{path}: tensor {name!r}: expected a shape like [4, 8], got {shape!r}")
        out[name] = LogicalTensor(name, tuple(shape), str(dtype))
    return out


def read_against(path: str) -> dict[str, LogicalTensor]:
    """Logical tensors of a checkpoint, through the engine's reader (or the manifest JSON)."""
    try:
        from ucp.reader import CheckpointReader
    except ImportError:  # engine not installed: the manifest is plain JSON
        with open(os.path.join(path, "manifest.json"), encoding="utf-8") as fh:
            tensors = json.load(fh)["tensors"]
        return {n: LogicalTensor(n, tuple(t["shape"]), t["dtype"]) for n, t in tensors.items()}
    return CheckpointReader(os.fspath(path), verify=False).logical()


def _params(items: list[str]) -> dict:
    from ucl.bind import _parse_params

    return _parse_params(",".join(items))


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from ucl import load_program, preset_names, spec_for_load
    from ucl.check import check_program
    from ucl.errors import UclError, UclSyntaxError
    from ucp.errors import UcpError
    from ucp.layout import Layout

    if args.ucl_command == "presets":
        names = preset_names()
        print(json.dumps(names) if args.json else "\n".join(names))
        return 0
    try:
        program = load_program(args.program, **_params(args.param))
        layout = Layout.parse(args.layout)
        logical = read_shapes(args.shapes) if args.shapes else read_against(args.against)
    except (UclSyntaxError, UclError, UcpError, OSError) as err:
        print(f"ucp ucl {args.ucl_command}: error: {err}", file=sys.stderr)
        return 2
    if args.ucl_command == "compile":
        try:
            fmap = spec_for_load(program, layout, args.rank, logical)
        except UcpError as err:
            print(f"ucp ucl compile: error: {err}", file=sys.stderr)
            return 2
        print(json.dumps(fmap_to_dict(fmap), indent=1))
        return 0
    report = _check_with_progress(check_program, program, layout, logical, quiet=args.json)
    if args.json:
        print(json.dumps(report.to_dict(), indent=1))
        return 0 if report.ok else 1
    console = Console()
    for w in report.warnings:
        console.print(f"[yellow]warning[/yellow] {w.message}", soft_wrap=True)
    if report.ok:
        console.print(f"[green]ok[/green] {report.program} covers every element of {report.logical_tensors} "
                      f"logical tensors exactly once on {report.layout} ({report.ranks} ranks, "
                      f"{report.local_tensors} local tensors)", soft_wrap=True)
        return 0
    table = Table(title=f"{report.program} on {report.layout}: {len(report.findings)} finding(s)")
    table.add_column("kind")
    table.add_column("finding", overflow="fold")
    for f in report.findings[:50]:
        table.add_row(f.kind, f.message)
    console.print(table)
    if len(report.findings) > 50:
        console.print(f"... and {len(report.findings) - 50} more (--json lists them all)")
    return 1


def fmap_to_dict(fmap) -> dict:
    """A FragmentMap (and its local shapes) as plain JSON data."""
    from ucp.geometry import region_to_dict

    local = getattr(fmap, "local", {})
    return {
        "rank": fmap.rank,
        "logical": {n: {"shape": list(t.shape), "dtype": t.dtype} for n, t in fmap.logical.items()},
        "tensors": {
            key: {
                "shape": list(local[key].shape) if key in local else None,
                "dtype": local[key].dtype if key in local else None,
                "replica": spec.replica, "replicas": spec.replicas, "policy": spec.policy,
                "pieces": [{"logical": p.logical, "local": region_to_dict(p.local), "target": region_to_dict(p.target)}
                           for p in spec.pieces],
            }
            for key, spec in fmap.tensors.items()
        },
    }


def _check_with_progress(check_program, program, layout, logical, *, quiet: bool):
    """Run the checker with a rich progress bar over the ranks (on stderr, never with --json)."""
    if quiet or layout.world_size < 64:
        return check_program(program, layout, logical)
    from rich.progress import Progress

    with Progress(transient=True, console=None) as bar:
        task = bar.add_task(f"checking {layout.world_size} ranks", total=layout.world_size)
        return check_program(program, layout, logical, progress=lambda done, total: bar.update(task, completed=done))
