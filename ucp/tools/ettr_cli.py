"""``ucp ettr``: expected ETTR over checkpoint intervals, and the best interval.

A thin wrapper over :mod:`ucp.reliability.ettr.report` (argument parsing and the table). Examples::

    ucp ettr --gpus 16000 --failures-per-1000-node-days 6.5 --restart-min 5 --save-min 1
    ucp ettr --nodes 128 --from-logs analysis.json --save-min 0.5 --interval-min 30 --json -
    ucp ettr --nodes 64 --mttf-hours 12 --save-min 2 --plot ettr.png --simulate
    ucp ettr --gpus 16384 --llama3 --measured          # restart vs hot recovery, costs from the recovery bench

Exit codes: 0 ok; 1 ``--require-ettr`` not met; 2 usage or input error, including a job that
cannot make progress (E[ETTR] 0 at every interval: failures come faster than restarts).
"""

from __future__ import annotations

import argparse
import math
import sys

from ucp.tools.output import add_json_option, console, fail, json_on_stdout, write_json

__all__ = ["register", "run", "main"]

_EPILOG = """\
Units: the failure rate is per node-day (as Kokolis et al. 2024 quote it, per 1000
node-days); every time is in minutes. --mttf-hours is the MTTF of the whole job.
--from-logs reads `ucp logs analyze --json` output (rates.failures_per_1000_node_days,
or fits.exponential.mttf_hours with rates.nodes). --llama3: Llama 3's published rate,
419 unexpected interruptions in 54 days on 16,384 GPUs (3.79 per 1000 node-days at 8 GPUs
per node). --measured compares the recovery systems with the restart and background-save
costs of the recovery bench's summary (default: the one shipped with ucp), recovery times
extrapolated to the job's GPU count as docs/ETTR.md ("Measured costs") says.
"""


def register(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "ettr",
        help="expected ETTR and the optimal checkpoint interval for a job",
        description="Expected effective training time ratio (ETTR) over checkpoint intervals, the "
        "ETTR-optimal interval, and Young's and Daly's intervals.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    size = parser.add_mutually_exclusive_group(required=True)
    size.add_argument("--nodes", type=int, help="nodes in the job")
    size.add_argument("--gpus", type=int, help="GPUs in the job (nodes = GPUs / --gpus-per-node, rounded up)")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default 8)")
    rate = parser.add_mutually_exclusive_group(required=True)
    rate.add_argument("--failures-per-1000-node-days", type=float, metavar="R", help="per-node failure rate")
    rate.add_argument("--mttf-hours", type=float, metavar="H", help="mean time to failure of the whole job")
    rate.add_argument("--from-logs", metavar="FILE.json", help="failure rate from `ucp logs analyze --json`")
    rate.add_argument("--llama3", action="store_true", help="Llama 3's rate (419 interruptions, 54 days, 16k GPUs)")
    parser.add_argument("--measured", nargs="?", const="", metavar="FILE.json",
                        help="compare recovery systems with costs from a recovery-bench summary "
                        "(no FILE: the shipped one); ignores --restart-min and --save-min")
    parser.add_argument("--size", default="1gib", help="--measured: the bench's model size (default %(default)s)")
    parser.add_argument("--scenario", default="spare", choices=("spare", "shrink"),
                        help="--measured: the bench's transition (default %(default)s)")
    parser.add_argument("--save-min", type=float, default=0.0, metavar="W", help="blocking save time (default 0)")
    parser.add_argument("--restart-min", type=float, default=5.0, metavar="U", help="restart cost (default 5)")
    parser.add_argument("--queue-min", type=float, default=0.0, metavar="Q", help="queue wait per restart (default 0)")
    parser.add_argument("--interval-min", type=float, metavar="T", help="also evaluate this checkpoint interval")
    parser.add_argument("--simulate", action="store_true", help="add a Monte-Carlo column (seeded, exponential)")
    parser.add_argument("--require-ettr", type=float, metavar="X",
                        help="exit 1 if ETTR at T (or at the optimum) is below X")
    parser.add_argument("--plot", metavar="FILE.png", help="write ETTR-vs-interval plot")
    add_json_option(parser, "the report")
    parser.set_defaults(func=run)
    return parser


def _print_table(report: dict) -> None:
    from rich.table import Table

    out = console()
    title = (
        f"{report['nodes']} nodes, {report['failures_per_1000_node_days']:.3g} failures/1000 node-days "
        f"(job MTTF {report['job_mttf_hours']:.2f} h), save {report['save_min']:.3g} min, "
        f"restart {report['restart_min']:.3g} min"
        + (f", queue {report['queue_min']:.3g} min" if report["queue_min"] else "")
    )
    table = Table(title=title)
    table.add_column("interval (min)", justify="right")
    table.add_column("E[ETTR] model", justify="right")
    simulated = "simulated_ettr" in report["intervals"][0]
    if simulated:
        table.add_column("ETTR simulated", justify="right")
    table.add_column("")
    for row in report["intervals"]:
        notes = []
        if math.isclose(row["interval_min"], report["optimal_interval_min"], rel_tol=1e-6):
            notes.append("optimal")
        if "interval_min" in report and math.isclose(row["interval_min"], report["interval_min"], rel_tol=1e-6):
            notes.append("your T")
        cells = [f"{row['interval_min']:.2f}", f"{row['ettr']:.4f}"]
        if simulated:
            cells.append(f"{row['simulated_ettr']:.4f} ± {2 * row['simulated_stderr']:.4f}")
        style = "bold green" if "optimal" in notes else ("bold" if notes else None)
        table.add_row(*cells, ", ".join(notes), style=style)
    out.print(table)
    out.print(
        f"ETTR-optimal interval: [bold]{report['optimal_interval_min']:.2f} min[/] "
        f"(E[ETTR] {report['ettr_at_optimal']:.4f})"
    )
    if report["save_min"] > 0:
        out.print(
            f"Young (1974): {report['young_interval_min']:.2f} min (E[ETTR] {report['ettr_at_young']:.4f}); "
            f"Daly (2006): {report['daly_interval_min']:.2f} min (E[ETTR] {report['ettr_at_daly']:.4f})"
        )
    else:
        out.print("No blocking save cost: shorter intervals are always better (Young/Daly give 0).")


def _print_measured(report: dict) -> None:
    from rich.table import Table

    out = console()
    table = Table(title=(
        f"{report['gpus']} GPUs ({report['nodes']} nodes), {report['failures_per_1000_node_days']:.3g} failures/1000 "
        f"node-days (job MTTF {report['job_mttf_hours']:.2f} h); costs: {report['size']} {report['scenario']} "
        f"measured on {report['measured_world']} ranks"))
    for column in ("system", "recovery s (measured)", f"recovery s at {report['gpus']} GPUs", "downtime s",
                   "save cost s", "optimal interval (min)", "E[ETTR] at optimal"):
        table.add_column(column, justify="left" if column == "system" else "right")
    if "interval_min" in report:
        table.add_column(f"E[ETTR] at {report['interval_min']:g} min", justify="right")
    for row in report["systems"]:
        cells = [row["system"], f"{row['recovery_measured_s']:.2f}", f"{row['recovery_at_gpus_s']:.2f}",
                 f"{row['downtime_s']:.2f}", f"{row['save_cost_s']:.2f}", f"{row['optimal_interval_s'] / 60:.2f}",
                 f"{row['ettr_at_optimal']:.5f}"]
        if "ettr_at_interval" in row:
            cells.append(f"{row['ettr_at_interval']:.5f}")
        table.add_row(*cells)
    out.print(table)
    out.print(f"costs from {report['costs_file']}; recovery extrapolated: coordination parts (re-form, restart) "
              f"x log2({report['gpus']})/log2({report['measured_world']}), the rest as measured (same state per "
              "rank); save cost = background snapshot + slowed steps")


def _run_measured(args: argparse.Namespace, job, interval_s: float | None) -> dict:
    from ucp.reliability.ettr.measured import MeasuredCosts, compare_systems

    costs = MeasuredCosts.load(args.measured or None, size=args.size, scenario=args.scenario)
    gpus = args.gpus if args.gpus is not None else job.nodes * args.gpus_per_node
    report = {"gpus": gpus, "nodes": job.nodes, "failures_per_1000_node_days": job.failures_per_node_day * 1000,
              "job_mttf_hours": job.mttf_s / 3600, "costs_file": costs.source, "size": costs.size,
              "scenario": costs.scenario, "measured_world": costs.world, "state_bytes": costs.state_bytes,
              "systems": compare_systems(costs, job, gpus=gpus, interval_s=interval_s)}
    if interval_s is not None:
        report["interval_min"] = interval_s / 60
    return report


def run(args: argparse.Namespace) -> int:
    from ucp.reliability.ettr.measured import llama3_failures_per_1000_node_days
    from ucp.reliability.ettr.model import ETTRInputError
    from ucp.reliability.ettr.report import compute_report, job_from_inputs, plot_report

    try:
        rate = args.failures_per_1000_node_days
        if args.llama3:
            rate = llama3_failures_per_1000_node_days(args.gpus_per_node)
        job = job_from_inputs(
            nodes=args.nodes, gpus=args.gpus, gpus_per_node=args.gpus_per_node,
            failures_per_1000_node_days=rate, mttf_hours=args.mttf_hours,
            logs_report=args.from_logs, save_min=args.save_min, restart_min=args.restart_min,
            queue_min=args.queue_min,
        )
        if args.measured is not None:
            report = _run_measured(args, job, None if args.interval_min is None else args.interval_min * 60.0)
            if args.json:
                write_json(report, args.json, indent=2)
            if not json_on_stdout(args):
                _print_measured(report)
            return 0
        interval_s = None if args.interval_min is None else args.interval_min * 60.0
        report = compute_report(job, interval_s=interval_s, simulate=args.simulate)
    except ETTRInputError as err:
        return fail(args, "ucp ettr", str(err))
    if args.plot:
        plot_report(job, report, args.plot)
        report["plot"] = str(args.plot)
    if args.json:
        write_json(report, args.json, indent=2)
    if not json_on_stdout(args):
        _print_table(report)
        if args.plot:
            print(f"plot written to {args.plot}")
    if args.require_ettr is not None:
        achieved = report.get("ettr_at_interval", report["ettr_at_optimal"])
        if achieved < args.require_ettr:
            print(f"ucp ettr: ETTR {achieved:.4f} is below the required {args.require_ettr}", file=sys.stderr)
            return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run ``ucp ettr`` alone (the ``ucp`` dispatcher calls :func:`run`)."""
    from ucp.tools.cli import main as ucp_main

    return ucp_main(["ettr", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
