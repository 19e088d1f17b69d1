"""``ucp demo``: train on 8 processes, SIGKILL one, resume on 6 under another layout, report and plot."""

from __future__ import annotations

import argparse
import sys
import time

from ucp.tools.output import add_json_option, json_on_stdout, write_json

MIN_STEPS = 12


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="train, kill a rank, resume under another layout (8 -> 6 processes); loss curves and ETTR",
        description=(
            "Train a Llama-style decoder Megatron style on 8 gloo processes (tp=2,pp=2,dp=2, distributed "
            "optimizer) with ucp checkpoints, SIGKILL one rank mid-run, resume from the last committed "
            "checkpoint on 6 processes (tp=2,dp=3), train on, and compare every step's loss with an "
            "uninterrupted single-process run; then recover the same failure hot (the survivors re-form "
            "in-process and reshard from peers' memory, no restart). Prints checkpoint size, save time, time lost, recovery time "
            "and ETTR, and writes the two loss curves to DIR/loss_curves.png."
        ),
    )
    parser.add_argument("--dir", default="ucp-demo-out", help="working directory (emptied first; default %(default)s)")
    parser.add_argument("--steps", type=int, default=40, help="training steps in all (default %(default)s)")
    add_json_option(parser, "the report")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ucp.tools.demo import DemoCheckFailed, run_demo

    if args.steps < MIN_STEPS:
        print(f"ucp demo: error: --steps must be at least {MIN_STEPS} (checkpoints every 5 steps before "
              "the failure, which comes after 55% of the steps)", file=sys.stderr)
        return 2
    began = time.perf_counter()
    say = (lambda *_: None) if json_on_stdout(args) else (lambda line: print(line, flush=True))
    save_every = 5
    kill_after = max(save_every + 2, int(args.steps * 0.55))
    try:
        report = run_demo(args.dir, say=say, steps=args.steps, save_every=save_every, kill_after_step=kill_after)
    except DemoCheckFailed as err:  # the resumed run's tensors are not the checkpoint's: a failed check
        print(f"ucp demo: {err}", file=sys.stderr)
        return 1
    if args.json:
        write_json(report.to_dict(), args.json, indent=2)
    if not json_on_stdout(args):
        print(f"done in {time.perf_counter() - began:.1f}s; checkpoints and the plot are in {report.directory}/")
    return 0 if report.verified else 1


def main(argv: list[str] | None = None) -> int:
    """Run ``ucp demo`` alone (the ``ucp`` dispatcher calls the subcommand's function)."""
    from ucp.tools.cli import main as ucp_main

    return ucp_main(["demo", *(sys.argv[1:] if argv is None else argv)])
