"""The ``ucp`` command: a thin dispatcher over one module per subcommand.

Each subcommand lives in its own module under tools/ with a
``register(subparsers)`` function that adds its parser and sets
``func=run`` where ``run(args) -> int``. No logic lives only here.

Exit codes: 0 ok, 1 a check failed, 2 usage or input error. ``--json [PATH]``
means the same in every subcommand (:mod:`ucp.tools.output`).
"""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> module; imported lazily so `ucp logs` never pays for torch.
SUBCOMMANDS = {
    "demo": "ucp.tools.demo_cli",
    "verify": "ucp.tools.verify_cli",
    "inspect": "ucp.tools.inspect_cli",
    "convert": "ucp.tools.convert_cli",
    "diff": "ucp.tools.diff_cli",
    "bench": "ucp.tools.bench_cli",
    "ucl": "ucp.tools.ucl_cli",
    "logs": "ucp.tools.logs_cli",
    "ettr": "ucp.tools.ettr_cli",
    "place": "ucp.tools.place_cli",
}


DISTRIBUTION = "ucp-middleware"
# Library keyword arguments named in error messages -> the flag that sets them on the command line.
API_FLAGS = {"pass overwrite=True (--overwrite)": "pass --overwrite", "overwrite=True": "--overwrite"}


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ucp",
        description="Universal checkpoints, checkpoint language, reliability analysis.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = next((a for a in argv if not a.startswith("-")), None)
    for name, module_name in SUBCOMMANDS.items():
        # Import only the requested subcommand's module (all of them for --help).
        if wanted is not None and wanted in SUBCOMMANDS and name != wanted:
            sub.add_parser(name, help="(see ucp NAME --help)")
            continue
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name != module_name:
                raise
            continue  # subcommand not built yet
        module.register(sub)
    return parser


def _version() -> str:
    """The installed distribution's version, else the source tree's (pyproject.toml), else unknown."""
    from importlib import metadata

    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        pass
    import tomllib
    from pathlib import Path

    try:
        with open(Path(__file__).resolve().parents[2] / "pyproject.toml", "rb") as fh:
            return str(tomllib.load(fh)["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown"


def cli_wording(message: str) -> str:
    """A library message as the command line says it: keyword arguments become their flags.

    >>> cli_wording("out exists; pass overwrite=True to replace it")
    'out exists; pass --overwrite to replace it'
    """
    for keyword, flag in API_FLAGS.items():
        message = message.replace(keyword, flag)
    return message


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except Exception as err:  # the CLI turns known errors into exit 2
        from ucp.errors import UcpError

        if isinstance(err, (UcpError, OSError)):
            from ucp.tools.output import fail

            return fail(args, f"ucp {args.command}", cli_wording(str(err)), kind=type(err).__name__)
        raise


if __name__ == "__main__":
    sys.exit(main())
