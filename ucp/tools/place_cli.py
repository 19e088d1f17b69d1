"""``ucp place``: evaluate replica placement policies, retrain the RL placer, check forecasts.

A thin wrapper over :mod:`ucp.replication.evaluate`, :mod:`ucp.replication.rl_policy`
and :mod:`ucp.replication.forecast`. Examples::

    ucp place eval --intervals 2000 --json placement.json --plot placement.png
    ucp place eval --families correlated-rack --logs analysis.json --no-online
    ucp place train --timesteps 120000 --out my-policy.safetensors
    ucp place forecast --intervals 2000

Exit codes: 0 ok; 2 usage or input error.
"""

from __future__ import annotations

import sys

from ucp.tools.output import add_json_option, console, json_on_stdout, write_json

_EPILOG = """\
Scenario families: independent, correlated-rack, lemon (accelerated; the RL policy trains on
these), published, published-x100 (Meta's published rates, and 100x), log-replay (default input:
the shipped `ucp logs analyze --json` of loghub's HPC sample; --logs to replay your own),
log-thunderbird (loghub's Thunderbird sample). Policies:
static-random, rack-aware, group, greedy, rl. Modelling assumptions: docs/REPLICATION.md.
"""


def register(subparsers) -> None:
    parser = subparsers.add_parser("place", help="replica placement: evaluate policies, train the RL placer",
                                   description="Replica placement policies for checkpoint fragments.",
                                   epilog=_EPILOG)
    sub = parser.add_subparsers(dest="place_command", metavar="ACTION")
    common = _common_parser()
    ev = sub.add_parser("eval", parents=[common], help="every policy on identical seeded scenarios",
                        description="Replay identical seeded scenarios for every policy and report mean "
                                    "recovery time, remote-store share, data-loss events, storage and "
                                    "storage utilization.", epilog=_EPILOG)
    ev.add_argument("--families", default=None, metavar="A,B", help="families to run (default: all)")
    ev.add_argument("--seeds", type=int, default=1, help="scenarios per family; 95%% intervals from 2 (default 1)")
    ev.add_argument("--optimum", type=int, default=0, metavar="N",
                    help="also solve N small instances exactly and report each policy's gap (default 0)")
    ev.add_argument("--replicas", type=int, default=2, help="replica budget per shard, on average (default 2)")
    ev.add_argument("--logs", metavar="FILE.json", help="`ucp logs analyze --json` report for log-replay")
    ev.add_argument("--policy-file", metavar="FILE.safetensors",
                    help="trained RL policy, as `ucp place train` writes it (default: the shipped one)")
    ev.add_argument("--no-online", action="store_true", help="do not retrain the RL policy during the run")
    add_json_option(ev, "{scenarios: {family: {policy: metrics}}}")
    ev.add_argument("--plot", metavar="FILE.png", help="write a bar chart of downtime and utilization")
    ev.set_defaults(func=run_eval)
    tr = sub.add_parser("train", parents=[common], help="retrain the RL placer from scratch (MaskablePPO)",
                        description="Train the RL placement policy on simulated synthetic-family episodes "
                                    "(seeds disjoint from evaluation) and save it.")
    tr.add_argument("--timesteps", type=int, default=120_000, help="PPO environment steps (default 120000)")
    tr.add_argument("--out", metavar="FILE.safetensors", help="where to save (default: the shipped policy file)")
    tr.add_argument("--max-nodes", type=int, default=None, help="largest cluster the policy serves (default 32)")
    tr.set_defaults(func=run_train)
    fc = sub.add_parser("forecast", parents=[common], help="failure forecast quality on held-out traces",
                        description="ROC-AUC, Brier score and calibration of the online failure forecaster "
                                    "on each family's evaluation trace.")
    fc.add_argument("--logs", metavar="FILE.json", help="`ucp logs analyze --json` report for log-replay")
    add_json_option(fc, "the metrics")
    fc.set_defaults(func=run_forecast)
    parser.set_defaults(func=lambda args: (parser.print_help(), 2)[1])


def _common_parser():
    import argparse

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--intervals", type=int, default=2000, help="checkpoint intervals per family (default 2000)")
    common.add_argument("--seed", type=int, default=0, help="scenario / training seed (default 0)")
    common.add_argument("--cluster", default="", metavar="SPEC",
                        help="cluster spec, e.g. nodes=16,rack_size=4,shard_gb=64 (default: docs/REPLICATION.md)")
    common.add_argument("--pretrain-intervals", type=int, default=3000, metavar="N",
                        help="intervals per synthetic family for the forecaster's pretraining (default 3000)")
    common.add_argument("--quiet", action="store_true", help="no progress or table")
    return common


def _spec(args):
    from ucp.replication.cluster import ClusterSpec

    return ClusterSpec.parse(args.cluster)


def _progress(label: str, unit: str, quiet: bool):
    from ucp.tools.progress_bar import count_progress

    return count_progress(label, unit, enabled=not quiet)


def run_eval(args) -> int:
    from ucp.replication.errors import PlacementInputError
    from ucp.replication.evaluate import EvalOptions, evaluate, plot
    from ucp.replication.scenarios import FAMILIES

    if min(args.intervals, args.replicas, args.pretrain_intervals, args.seeds) < 1 or args.optimum < 0:
        raise PlacementInputError("--intervals, --replicas, --pretrain-intervals and --seeds must be >= 1")
    families = tuple(f.strip() for f in args.families.split(",")) if args.families else FAMILIES
    options = EvalOptions(intervals=args.intervals, seed=args.seed, replicas=args.replicas, families=families,
                          spec=_spec(args), report_path=args.logs, policy_path=args.policy_file,
                          rl_online=not args.no_online, pretrain_intervals=args.pretrain_intervals,
                          seeds=args.seeds, optimum_instances=args.optimum)
    with _progress("evaluating", "intervals", args.quiet) as update:
        report = evaluate(options, progress=lambda family, policy, done, total: update(done, total,
                                                                                        f"{family} / {policy}"))
    if args.json:
        write_json(report.to_dict(), args.json)
    if args.plot:
        plot(report, args.plot)
    if not args.quiet and not json_on_stdout(args):
        _print_report(report)
    return 0


def _print_report(report) -> None:
    from rich.table import Table

    from ucp.replication.evaluate import POLICY_NAMES, comparisons

    out = console()
    for family, rows in report.scenarios.items():
        quality = report.forecasts[family]
        table = Table(title=f"{family}: {report.recoveries[family]} failures in {report.options.seeds} x "
                            f"{report.options.intervals} intervals; forecast ROC-AUC {quality['roc_auc']:.2f}")
        for col in ("policy", "ETTR", "95% interval", "downtime s", "rollback s", "lost work s", "mean recovery s",
                    "data-loss events", "storage TB", "utilization"):
            table.add_column(col, justify="left" if col == "policy" else "right")
        for name in POLICY_NAMES:
            row = rows[name]
            band = row["ci95"]["ettr"]
            table.add_row(name, f"{row['ettr']:.5f}", f"{band[0]:.5f}-{band[1]:.5f}" if band else "-",
                          f"{row['downtime_s']:.0f}", f"{row['rollback_s']:.0f}", f"{row['lost_work_s']:.0f}",
                          f"{row['mean_recovery_s']:.1f}", f"{row['data_loss_events']:.3g}",
                          f"{row['storage_bytes'] / 1e12:.2f}", f"{row['storage_utilization']:.4f}")
        out.print(table)
    if report.optimum:
        table = Table(title=f"gap to the exact optimum, {report.optimum['instances']} small instances "
                            f"({report.optimum['cluster']})")
        for col in ("policy", "mean gap", "95% interval", "worst"):
            table.add_column(col, justify="left" if col == "policy" else "right")
        for name, row in report.optimum["policies"].items():
            band = row["ci95"]
            table.add_row(name, f"{row['optimum_gap']:+.2%}", f"{band[0]:+.2%}..{band[1]:+.2%}" if band else "-",
                          f"{row['max']:+.2%}")
        out.print(table)
    for line in comparisons(report):
        out.print(line)


def run_train(args) -> int:
    from ucp.replication.errors import PlacementInputError
    from ucp.replication.rl_env import MAX_NODES
    from ucp.replication.policy_file import save_policy
    from ucp.replication.rl_policy import shipped_policy_path, train_policy

    if args.timesteps < 1 or args.intervals < 1:
        raise PlacementInputError("--timesteps and --intervals must be >= 1")
    out = args.out or str(shipped_policy_path())
    with _progress("training", "PPO steps", args.quiet) as update:
        model = train_policy(timesteps=args.timesteps, seed=args.seed, intervals=args.intervals, spec=_spec(args),
                             max_nodes=args.max_nodes or MAX_NODES, pretrain_intervals=args.pretrain_intervals,
                             progress=lambda n: update(min(n, args.timesteps), args.timesteps))
    save_policy(model, out, trained={"timesteps": args.timesteps, "seed": args.seed, "intervals": args.intervals,
                                     "cluster": str(_spec(args))})
    if not args.quiet:
        print(f"saved {out}")
    return 0


def run_forecast(args) -> int:
    from ucp.replication.forecast import evaluate_forecasts
    from ucp.replication.scenarios import FAMILIES, build_scenario, pretrained_forecaster

    spec = _spec(args)
    forecaster = pretrained_forecaster(spec=spec, intervals=args.pretrain_intervals)
    out = {}
    for i, family in enumerate(FAMILIES):
        scenario = build_scenario(family, intervals=args.intervals, seed=100 * args.seed + i, forecaster=forecaster,
                                  spec=spec, report_path=args.logs)
        out[family] = evaluate_forecasts(scenario.trace.failure_matrix(), scenario.forecasts)
    if args.json:
        write_json(out, args.json)
    if not args.quiet and not json_on_stdout(args):
        for family, m in out.items():
            print(f"{family:16s} ROC-AUC {m['roc_auc']:.3f}  Brier {m['brier']:.5f}  ECE {m['ece']:.5f}  "
                  f"base rate {m['base_rate']:.4f}  mean forecast {m['mean_forecast']:.4f}  "
                  f"({m['positives']} failures)")
    return 0


def main(argv=None) -> int:
    from ucp.tools.cli import main as ucp_main

    return ucp_main(["place", *(sys.argv[1:] if argv is None else argv)])
