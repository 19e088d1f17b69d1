"""``ucp place``: evaluate replica placement policies, retrain the RL placer, check forecasts.

A thin wrapper over :mod:`ucp.replication.evaluate`, :mod:`ucp.replication.rl_policy`
and :mod:`ucp.replication.forecast`. Examples::

    ucp place eval --intervals 2000 --json placement.json --plot placement.png
    ucp place eval --families correlated-rack --logs analysis.json --no-online
    ucp place train --timesteps 120000 --out my-policy.safetensors
    ucp place forecast --intervals 2000
    ucp place online --families hetero-x100 --seeds 20 --intervals 60 --tolerances 0,0.5,inf

Exit codes: 0 ok; 2 usage or input error.
"""

from __future__ import annotations

import sys

from ucp.tools.output import add_json_option, console, json_on_stdout, write_json

_EPILOG = """\
Scenario families: independent, correlated-rack, lemon (accelerated; the RL policy trains on
these), published, published-x100 (Meta's published rates, and 100x), log-replay (default input:
the shipped `ucp logs analyze --json` of loghub's HPC sample; --logs to replay your own),
log-thunderbird (loghub's Thunderbird sample); heterogeneous clusters (per-node speed and
capacity, shard sizes, churn): hetero-rack, hetero-lemon (trained on), hetero-x100,
hetero-thunderbird (held out). Policies:
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
    ev.add_argument("--io", choices=("measured", "constant"), default="measured",
                    help="read times from the measured I/O cost model (default) or the cluster spec's constants")
    add_json_option(ev, "{scenarios: {family: {policy: metrics}}}")
    ev.add_argument("--plot", metavar="FILE.png", help="write a bar chart of downtime and utilization")
    ev.set_defaults(func=run_eval)
    on = sub.add_parser("online", parents=[common], help="re-placing only when forecasts move: what it costs",
                        description="Replay identical seeded scenarios with the live path's rule (keep the "
                                    "placement until a node's forecast moves by more than the tolerance, or the "
                                    "cluster changes) at several tolerances; report ETTR, downtime + rollbacks "
                                    "(paired against the first tolerance), re-placements and bytes moved.")
    on.add_argument("--families", default="hetero-x100,hetero-thunderbird", metavar="A,B",
                    help="families to run (default: the held-out heterogeneous ones)")
    on.add_argument("--seeds", type=int, default=20, help="scenarios per family (default 20)")
    on.add_argument("--tolerances", default="0,0.5,inf", metavar="A,B",
                    help="relative forecast moves that trigger a new placement (default 0,0.5,inf)")
    on.add_argument("--policies", default="greedy,rl", metavar="A,B", help="policies (default greedy,rl)")
    add_json_option(on, "{family: {policy: {tolerance: metrics}}}")
    on.set_defaults(func=run_online)
    im = sub.add_parser("imitate", help="fine-tune the RL placer by DAgger from the exact optimum; compare gaps",
                        description="Fine-tune the shipped RL policy by imitating the exact optimum on small "
                                    "instances of the training cluster models (DAgger, with a KL leash to the PPO "
                                    "policy on 16-node training states) and report optimum gaps before and after.")
    im.add_argument("--instances", type=int, default=160, help="teacher instances (default 160)")
    im.add_argument("--rounds", type=int, default=4, help="DAgger rounds (default 4)")
    im.add_argument("--leash-weight", type=float, default=0.3, help="weight of the KL leash (default 0.3)")
    im.add_argument("--evaluate", type=int, default=20, help="small instances per gap (default 20)")
    im.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    im.add_argument("--out", metavar="FILE.safetensors", help="save the fine-tuned policy (default: not saved)")
    im.add_argument("--quiet", action="store_true", help="no progress or table")
    add_json_option(im, "training stats and gaps")
    im.set_defaults(func=run_imitate)
    tr = sub.add_parser("train", parents=[common], help="retrain the RL placer from scratch (MaskablePPO)",
                        description="Train the RL placement policy on simulated synthetic-family episodes "
                                    "(seeds disjoint from evaluation) and save it.")
    tr.add_argument("--timesteps", type=int, default=120_000, help="PPO environment steps (default 120000)")
    tr.add_argument("--out", metavar="FILE.safetensors", help="where to save (default: the shipped policy file)")
    tr.add_argument("--max-nodes", type=int, default=None, help="largest cluster the policy serves (default 32)")
    tr.add_argument("--io", choices=("measured", "constant"), default="measured",
                    help="read times of the training scenarios: the measured I/O cost model (default) or constants")
    tr.set_defaults(func=run_train)
    fc = sub.add_parser("forecast", parents=[common], help="failure forecast quality on held-out traces",
                        description="ROC-AUC, Brier score and calibration of the online failure forecaster "
                                    "on each family's evaluation trace.")
    fc.add_argument("--logs", metavar="FILE.json", help="`ucp logs analyze --json` report for log-replay")
    add_json_option(fc, "the metrics")
    fc.set_defaults(func=run_forecast)
    io = sub.add_parser("io-measure", help="time writes and restores on memory, local disk and S3",
                        description="Time ReplicaTier put/get of fragments of several sizes on a memory tier, a "
                                    "local-disk tier and an S3 bucket (a local moto S3 server unless --s3 is "
                                    "given) and write the table the I/O cost model is fitted to.")
    io.add_argument("--out", metavar="FILE.json", required=True, help="where to write the measurements")
    io.add_argument("--runs", type=int, default=3, help="repetitions of every (tier, size) (default 3)")
    io.add_argument("--max-mib", type=int, default=256, help="largest fragment in MiB (default 256)")
    io.add_argument("--disk-dir", metavar="DIR", help="local-disk tier folder (default: a new temp folder)")
    io.add_argument("--quiet", action="store_true", help="no progress")
    io.set_defaults(func=run_io_measure)
    fit = sub.add_parser("io-fit", help="fit the I/O cost model and report its held-out R2",
                         description="Fit the gradient-boosted I/O cost model to a measurement table (default: "
                                     "the shipped one) and report held-out R2 split by run and by size, and the "
                                     "predicted throughput per tier.")
    fit.add_argument("--table", metavar="FILE.json", help="measurements (default: the shipped table)")
    add_json_option(fit, "R2 per split and predicted throughputs")
    fit.set_defaults(func=run_io_fit)
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
                          seeds=args.seeds, optimum_instances=args.optimum, io=args.io)
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
    for key, kind in (("policies", "homogeneous"), ("hetero_policies", "heterogeneous, measured I/O")):
        if not report.optimum or key not in report.optimum:
            continue
        table = Table(title=f"gap to the exact optimum, {report.optimum['instances']} small {kind} instances "
                            f"({report.optimum['cluster']})")
        for col in ("policy", "mean gap", "95% interval", "worst"):
            table.add_column(col, justify="left" if col == "policy" else "right")
        for name, row in report.optimum[key].items():
            band = row["ci95"]
            table.add_row(name, f"{row['optimum_gap']:+.2%}", f"{band[0]:+.2%}..{band[1]:+.2%}" if band else "-",
                          f"{row['max']:+.2%}")
        out.print(table)
    for line in comparisons(report):
        out.print(line)


def run_online(args) -> int:
    from ucp.replication.errors import PlacementInputError
    from ucp.replication.evaluate import EvalOptions
    from ucp.replication.online_loop import evaluate_online

    try:
        tolerances = tuple(float(t) for t in args.tolerances.split(","))
    except ValueError:
        raise PlacementInputError(f"--tolerances {args.tolerances!r}: give numbers >= 0, e.g. 0,0.5,inf") from None
    if min(tolerances) < 0 or min(args.intervals, args.seeds) < 1:
        raise PlacementInputError("--tolerances must be >= 0, --intervals and --seeds >= 1")
    options = EvalOptions(intervals=args.intervals, seed=args.seed, families=tuple(args.families.split(",")),
                          spec=_spec(args), rl_online=False, pretrain_intervals=args.pretrain_intervals,
                          seeds=args.seeds)
    with _progress("online loop", "seeds", args.quiet) as update:
        out = evaluate_online(options, tolerances=tolerances, policy_names=tuple(args.policies.split(",")),
                              progress=lambda family, done, total: update(done, total, family))
    if args.json:
        write_json(out, args.json)
    if not args.quiet and not json_on_stdout(args):
        for family, rows in out.items():
            for name, by_tol in rows.items():
                for tol, m in by_tol.items():
                    band = m["lost_s_diff_ci95"]
                    print(f"{family:20s} {name:8s} tolerance {tol:>4s}: ETTR {m['ettr']:.5f}, downtime + rollbacks "
                          f"{m['lost_s']:.1f} s ({m['lost_s_diff']:+.1f} s vs tolerance {next(iter(by_tol))}"
                          + (f", 95% {band[0]:+.1f}..{band[1]:+.1f}" if band else "") + "), "
                          f"{m['replacements_per_interval']:.3f} placements and "
                          f"{m['moved_bytes_per_interval'] / 1e9:.1f} GB moved per interval")
    return 0


def run_imitate(args) -> int:
    from ucp.replication.errors import PlacementInputError
    from ucp.replication.imitation import imitation_study

    if min(args.instances, args.rounds, args.evaluate) < 1 or args.leash_weight < 0:
        raise PlacementInputError("--instances, --rounds and --evaluate must be >= 1, --leash-weight >= 0")
    with _progress("imitating", "rounds", args.quiet) as update:
        out = imitation_study(instances=args.instances, rounds=args.rounds, leash_weight=args.leash_weight,
                              evaluate=args.evaluate, seed=args.seed, out=args.out, progress=update)
    if args.json:
        write_json(out, args.json)
    if not args.quiet and not json_on_stdout(args):
        for key, rows in out["gaps"].items():
            print(f"{key}: " + ", ".join(f"{name} {r['optimum_gap']:+.2%} (worst {r['max']:+.1%})"
                                          for name, r in rows.items()))
    return 0


def run_train(args) -> int:
    from ucp.replication.errors import PlacementInputError
    from ucp.replication.io_cost import IoCostModel
    from ucp.replication.rl_env import MAX_NODES
    from ucp.replication.policy_file import save_policy
    from ucp.replication.rl_policy import shipped_policy_path, train_policy

    if args.timesteps < 1 or args.intervals < 1:
        raise PlacementInputError("--timesteps and --intervals must be >= 1")
    out = args.out or str(shipped_policy_path())
    with _progress("training", "PPO steps", args.quiet) as update:
        model = train_policy(timesteps=args.timesteps, seed=args.seed, intervals=args.intervals, spec=_spec(args),
                             max_nodes=args.max_nodes or MAX_NODES, pretrain_intervals=args.pretrain_intervals,
                             io=IoCostModel.shipped() if args.io == "measured" else None,
                             progress=lambda n: update(min(n, args.timesteps), args.timesteps))
    save_policy(model, out, trained={"timesteps": args.timesteps, "seed": args.seed, "intervals": args.intervals,
                                     "cluster": str(_spec(args)), "io": args.io})
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


def _local_s3():
    """A moto S3 server on 127.0.0.1 and a fresh bucket: ``(server, url, storage_options)``."""
    import os
    import uuid

    try:
        import boto3
        from moto.server import ThreadedMotoServer
    except ImportError:
        from ucp.replication.errors import PlacementInputError

        raise PlacementInputError("io-measure needs moto's S3 server and boto3: pip install 'moto[s3,server]' "
                                  "boto3 (the project's test extra)") from None
    from ucp.integrations.launch import free_port

    import logging

    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request otherwise
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint, bucket = f"http://127.0.0.1:{port}", f"ucp-io-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                 region_name="us-east-1").create_bucket(Bucket=bucket)
    options = {"key": "testing", "secret": "testing", "endpoint_url": endpoint,
               "client_kwargs": {"region_name": "us-east-1"}}
    return server, f"s3://{bucket}/replicas", options


def run_io_measure(args) -> int:
    import tempfile

    from ucp.replication.errors import PlacementInputError
    from ucp.replication.io_cost import DEFAULT_SIZES, held_out_r2, measure, save_measurements
    from ucp.replication.replica_tiers import DiskTier, MemoryTier, ReplicaTier
    from ucp.stores import open_store

    if args.runs < 2 or args.max_mib < 1:
        raise PlacementInputError("--runs must be >= 2 (the R2 holds one run out) and --max-mib >= 1")
    sizes = [n for n in DEFAULT_SIZES if n <= args.max_mib << 20]
    cap = 4 * max(sizes)
    server, url, options = _local_s3()
    try:
        with tempfile.TemporaryDirectory(dir=args.disk_dir) as disk:
            tiers = {"memory": MemoryTier(capacity_bytes=cap), "disk": DiskTier(disk, capacity_bytes=cap),
                     "remote": ReplicaTier(open_store(url, storage_options=options), tier="disk",
                                           capacity_bytes=cap)}
            with _progress("measuring", "transfers", args.quiet) as update:
                transfers = measure(tiers, sizes=sizes, runs=args.runs, progress=update)
    finally:
        server.stop()
    save_measurements(transfers, args.out, note=f"ucp place io-measure --runs {args.runs} --max-mib {args.max_mib}")
    if not args.quiet:
        for split in ("run", "size"):
            print(held_out_r2(transfers, split=split))
        print(f"wrote {args.out}")
    return 0


def run_io_fit(args) -> int:
    from ucp.replication.io_cost import IO_TIERS, OPS, IoCostModel, held_out_r2, load_measurements

    transfers = load_measurements(args.table)
    model = IoCostModel(transfers)
    sizes = (1 << 20, 64 << 20, 256 << 20, 64e9)
    out = {"r2": [held_out_r2(transfers, split=s) for s in ("run", "size")], "rows": len(transfers),
           "throughput_bps": {f"{op} {tier}": {f"{n:.0f}": model.throughput(op, tier, n) for n in sizes}
                              for tier in IO_TIERS for op in OPS}}
    if args.json:
        write_json(out, args.json)
    if not json_on_stdout(args):
        for r in out["r2"]:
            print(f"held out by {r['split']:4s}: R2 {r['r2_log_seconds']:.3f} (log seconds), "
                  f"{r['r2_seconds']:.3f} (seconds); {r['train']} train / {r['test']} test transfers")
        for key, row in out["throughput_bps"].items():
            print(f"{key:16s} " + "  ".join(f"{float(n) / 2**20:>8.0f} MiB: {v / 1e9:6.2f} GB/s"
                                              for n, v in row.items()))
    return 0


def main(argv=None) -> int:
    from ucp.tools.cli import main as ucp_main

    return ucp_main(["place", *(sys.argv[1:] if argv is None else argv)])
