"""``ucp logs analyze``: mine cluster logs into failures, incidents and MTTF.

A thin wrapper over :func:`reliability.logs.analyze.analyze_logs`. Exit codes:
0 analysed, 2 usage or input error (missing files, bad taxonomy or state).

Example::

    ucp logs analyze /var/log/slurm kern.log.gz --json report.json --html report.html \\
        --state templates.drain3
"""

from __future__ import annotations

import json
import sys


def register(subparsers) -> None:
    parser = subparsers.add_parser("logs", help="cluster log analysis: failure taxonomy, incidents, MTTF",
                                   description="Cluster log analysis.")
    sub = parser.add_subparsers(dest="logs_command", metavar="ACTION")
    analyze = sub.add_parser(
        "analyze", help="classify failures, fold incidents, fit MTTF",
        description="Read logs (files, directories, globs, .gz, '-' for stdin), classify failure lines "
                    "with the taxonomy, fold them into incidents and fit MTTF.")
    analyze.add_argument("paths", nargs="+", metavar="PATH", help="log file, directory, glob, or - for stdin")
    analyze.add_argument("--json", metavar="FILE", help="write the full report as JSON (docs/LOGS.md)")
    analyze.add_argument("--html", metavar="FILE", help="write a self-contained HTML report with plots")
    analyze.add_argument("--taxonomy", metavar="FILE", help="JSON taxonomy merged over the built-in one")
    analyze.add_argument("--state", metavar="FILE", help="drain3 state file: load, update and save templates")
    analyze.add_argument("--window", type=float, default=900.0, metavar="SECONDS",
                         help="fold events at most this far apart into one incident (default 900)")
    analyze.add_argument("--gpus-per-node", type=int, default=8, help="for the job MTTF projection (default 8)")
    analyze.add_argument("--year", type=int, default=None, help="year for syslog stamps without one")
    analyze.add_argument("--quiet", action="store_true", help="no terminal summary")
    analyze.set_defaults(func=run)
    parser.set_defaults(func=lambda args: (parser.print_help(), 2)[1])


def run(args) -> int:
    from rich.console import Console

    from reliability.logs.analyze import AnalysisOptions, analyze_logs
    from reliability.logs.taxonomy import load_taxonomy

    if args.window <= 0 or args.gpus_per_node <= 0:
        print("ucp logs: error: --window and --gpus-per-node must be positive", file=sys.stderr)
        return 2
    console = Console(stderr=False)
    taxonomy = load_taxonomy(extra=args.taxonomy)
    options = AnalysisOptions(window_s=args.window, gpus_per_node=args.gpus_per_node, default_year=args.year)
    with console.status("reading logs...") as status:
        result = analyze_logs(args.paths, taxonomy=taxonomy, state_path=args.state, options=options,
                              progress=lambda n: status.update(f"reading logs... {n:,} lines"))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(result.to_dict(), handle, indent=1)
    if args.html:
        from reliability.logs.report_html import write_html

        write_html(result, args.html)
    if not args.quiet:
        from reliability.logs.report_terminal import render_summary

        render_summary(result, console=console)
    return 0
