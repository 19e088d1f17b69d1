"""``ucp demo``: train on 4 processes, kill them, resume on 2 under another layout, report ETTR."""

from __future__ import annotations

import argparse
import json
import time


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="train, crash and resume under another layout (4 -> 2 processes)",
        description=(
            "Train a tensor-parallel model on 4 gloo processes (tp=2,dp=2) with ucp checkpoints, "
            "SIGKILL them mid-run, verify the last checkpoint, resume on 2 processes (tp=1,dp=2) "
            "and report the run's ETTR."
        ),
    )
    parser.add_argument("--dir", default="ucp-demo-out", help="working directory (emptied first; default %(default)s)")
    parser.add_argument("--steps", type=int, default=40, help="training steps in all (default %(default)s)")
    parser.add_argument("--json", action="store_true", help="print a JSON report instead of prose")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tools.demo import run_demo

    if args.steps < 26:
        print("ucp demo: error: --steps must be at least 26 (the failure is injected after step 25)")
        return 2
    began = time.perf_counter()
    say = (lambda *_: None) if args.json else print
    report = run_demo(args.dir, say=say, steps=args.steps)
    if args.json:
        print(json.dumps({
            "directory": report.directory,
            "killed_at_step": report.killed_at_step,
            "resumed_from_step": report.resumed_from_step,
            "final_step": report.final_step,
            "checkpoints": report.checkpoints,
            "verified_tensors": report.verified_tensors,
            "resharded_tensors": report.resharded_tensors,
            "ettr": report.ettr.to_dict(),
        }, indent=2))
    else:
        print(f"done in {time.perf_counter() - began:.1f}s; checkpoints are in {report.directory}/")
    return 0
