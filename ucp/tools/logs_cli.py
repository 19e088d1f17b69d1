"""``ucp logs``: mine cluster logs into failures, incidents and MTTF; or just their templates.

A thin wrapper over :func:`ucp.reliability.logs.analyze.analyze_logs` and
:func:`ucp.reliability.logs.templates.parse_templates`. Exit codes: 0 done,
2 usage or input error (missing files, bad taxonomy or state file).

Example::

    ucp logs analyze /var/log/slurm kern.log.gz --json report.json --html report.html \\
        --state templates.json --taxonomy-out discovered.json --workers 8
    ucp logs templates HDFS.log --json templates.json
    ucp logs analyze kern.log --json - | jq .fits     # '-': the JSON on standard output, nothing else
"""

from __future__ import annotations

import sys

from ucp.tools.output import add_json_option, console, fail, json_on_stdout, write_json


def register(subparsers) -> None:
    parser = subparsers.add_parser("logs", help="cluster log analysis: failure taxonomy, incidents, MTTF",
                                   description="Cluster log analysis.")
    sub = parser.add_subparsers(dest="logs_command", metavar="ACTION")
    analyze = sub.add_parser(
        "analyze", help="classify failures, fold incidents, fit MTTF",
        description="Read logs (files, directories, globs, .gz, '-' for stdin), find failure lines (taxonomy "
                    "rules, severities, failure words, template rarity), name them with the taxonomy or with "
                    "categories mined from the logs, fold them into incidents and fit MTTF.")
    analyze.add_argument("paths", nargs="+", metavar="PATH", help="log file, directory, glob, or - for stdin")
    add_json_option(analyze, "the full report (docs/LOGS.md)")
    analyze.add_argument("--html", metavar="FILE", help="write a self-contained HTML report with plots")
    analyze.add_argument("--taxonomy", metavar="FILE", help="JSON taxonomy merged over the built-in one")
    analyze.add_argument("--taxonomy-out", metavar="FILE",
                         help="write the categories mined from these logs in the taxonomy file format")
    analyze.add_argument("--state", metavar="FILE",
                         help="template state (JSON): load it, keep its template ids, save the updated state")
    analyze.add_argument("--window", type=float, default=900.0, metavar="SECONDS",
                         help="fold events at most this far apart into one incident (default 900)")
    analyze.add_argument("--gpus-per-node", type=int, default=8, help="for the job MTTF projection (default 8)")
    analyze.add_argument("--year", type=int, default=None, help="year for syslog stamps without one")
    _parallel_options(analyze)
    analyze.add_argument("--quiet", action="store_true", help="no terminal summary and no progress bar")
    analyze.set_defaults(func=run_analyze)

    templates = sub.add_parser(
        "templates", help="the template of every line (log parsing)",
        description="Mine the templates of the given logs and the template id of every input line.")
    templates.add_argument("paths", nargs="+", metavar="LOG", help="log file, directory, glob, or - for stdin")
    add_json_option(templates, '{"templates": [{"id", "template", "count"}], "lines": [id, ...]}', required=True)
    templates.add_argument("--state", metavar="FILE", help="template state (JSON) to start from and update")
    templates.add_argument("--year", type=int, default=None, help="year for syslog stamps without one")
    templates.set_defaults(func=run_templates)
    parser.set_defaults(func=lambda args: (parser.print_help(), 2)[1])


def _parallel_options(parser) -> None:
    parser.add_argument("--workers", type=int, default=None, metavar="N",
                        help="Dask workers of a local cluster (default: one per CPU for inputs of several "
                             "partitions and 64 MiB or more, else this process); 1 runs in this process")
    parser.add_argument("--scheduler", metavar="ADDRESS",
                        help="run on an existing dask.distributed cluster (e.g. tcp://10.0.0.5:8786); the "
                             "log paths must be readable on its workers")


def run_analyze(args) -> int:
    from ucp.reliability.logs.analyze import AnalysisOptions, analyze_logs
    from ucp.reliability.logs.parallel import dask_runner
    from ucp.reliability.logs.taxonomy import load_taxonomy

    if args.window <= 0 or args.gpus_per_node <= 0:
        return fail(args, "ucp logs", "--window and --gpus-per-node must be positive")
    if args.workers is not None and args.workers < 1:
        return fail(args, "ucp logs", "--workers must be at least 1")
    from ucp.tools.progress_bar import count_progress

    taxonomy = load_taxonomy(extra=args.taxonomy)
    options = AnalysisOptions(window_s=args.window, gpus_per_node=args.gpus_per_node, default_year=args.year)
    run = dask_runner(workers=args.workers, scheduler=args.scheduler)
    with count_progress("reading logs", "partitions", enabled=not args.quiet) as update:
        result = analyze_logs(args.paths, taxonomy=taxonomy, state_path=args.state, options=options, run=run,
                              progress=lambda done, total: update(done, total))
    if args.json:
        write_json(result.to_dict(), args.json)
    if args.taxonomy_out:
        from ucp.reliability.logs.discover import write_taxonomy

        write_taxonomy(result.discovered, args.taxonomy_out)
    if args.html:
        from ucp.reliability.logs.report_html import write_html

        write_html(result, args.html)
    if not args.quiet and not json_on_stdout(args):
        from ucp.reliability.logs.report_terminal import render_summary

        render_summary(result, console=console())
    return 0


def run_templates(args) -> int:
    from ucp.reliability.logs.template_state import TemplateSet
    from ucp.reliability.logs.templates import parse_templates

    known = TemplateSet.load(args.state) if args.state else None
    report = parse_templates(args.paths, known=known, default_year=args.year)
    write_json(report.to_dict(), args.json, indent=None)
    if args.state:
        report.templates.save(args.state)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run ``ucp logs`` alone (the ``ucp`` dispatcher calls the subcommand's function)."""
    from ucp.tools.cli import main as ucp_main

    return ucp_main(["logs", *(sys.argv[1:] if argv is None else argv)])
