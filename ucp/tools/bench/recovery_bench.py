"""Benchmark: recovery after a SIGKILLed rank, hot (no restart) against the restart paths.

Two transitions, each run by every system in this one run, interleaved (every repeat runs
every system once, so drift on a shared machine hits all alike):

* ``shrink``: 4 ranks lose one and go on with a smaller layout;
* ``spare``: 4 ranks lose one and a waiting spare takes its place (same layout).

Systems:

* ``ucp-hot``: the survivors never restart (:func:`ucp.integrations.stacks.hot.run_hot`,
  Megatron-style stack ``tp=2,dp=2,zero=1``): detect, re-form in-process, plan the
  layout (shrink: ``tp=2,zero=1`` with one survivor idle), reshard the last
  checkpoint from peers' memory;
* ``ucp-restart``: every process is stopped and the job restarts under the new layout
  (shrink: ``tp=2,zero=1``; spare: the same layout) and loads the ucp checkpoint
  (:func:`ucp.integrations.stacks.recovery.run_with_failure`, same stack);
* ``dcp-restart``: the same restart with the torch-native stack (FSDP2 over TP,
  ``tp=2,dp=2`` -> ``dp=2``, or the same layout) and torch.distributed.checkpoint;
* ``deepspeed-universal`` (``--systems``; shrink only): DeepSpeed ZeRO-2 ``dp=4`` ->
  ``dp=2``: ``ds_to_universal``, then a universal load.

Recovery = SIGKILL to the *start* of the first step after it (the first step is reported on
its own, and the steps redone). The restart paths read the checkpoint with a cold page
cache: its files are flushed and dropped from the cache (``POSIX_FADV_DONTNEED``,
:mod:`ucp.integrations.page_cache`) just before the kill; the hot path gets the same
treatment (it reads storage only for what no survivor holds). ``bitwise``: every logical
tensor after the recovery equals the checkpoint's (ucp paths check it; ``null``: not
checked, DCP and DeepSpeed). Medians over ``--repeats``, with a distribution-free 95 %
interval for the median (order statistics; with 5 repeats the widest, min..max, covers
93.8 %, so 6 repeats are the default).

    python -m ucp.tools.bench.recovery_bench --json out.json          # the table, and the summary in out.json
    python -m ucp.tools.bench.recovery_bench --repeats 1 --scenarios spare --systems ucp-hot,dcp-restart
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from ucp.integrations.launch import PRELOAD, WITH_DEEPSPEED, start_fork_server
from ucp.integrations.stacks.common import TrainSettings
from ucp.tools.output import add_json_option, json_on_stdout, write_json

SYSTEMS = ("ucp-hot", "ucp-restart", "dcp-restart", "deepspeed-universal")
DEFAULT_SYSTEMS = SYSTEMS[:3]
STEPS, SAVE_EVERY, KILL_AFTER = 7, 3, 4  # the kill comes a step after a committed checkpoint


@dataclass(frozen=True)
class Scenario:
    name: str
    spare: bool
    after_megatron: str
    after_native: str


SCENARIOS = (
    Scenario("shrink", False, "tp=2,zero=1", "dp=2"),
    Scenario("spare", True, "tp=2,dp=2,zero=1", "tp=2,dp=2"),
)


def measure(scenario: Scenario, system: str, model: str, index: int, root: Path) -> dict:
    """One failure and recovery; returns recovery_s, first_step_s, lost_steps, bitwise and the parts."""
    directory = root / f"{scenario.name}-{system}-{index}"
    settings = TrainSettings()
    if system == "ucp-hot":
        from ucp.integrations.stacks.hot import HotPlan, run_hot

        plan = HotPlan(layout="tp=2,dp=2,zero=1", model=model, settings=settings, steps=STEPS,
                       save_every=SAVE_EVERY, kill_after_step=KILL_AFTER, kill_uid=1,
                       spares=1 if scenario.spare else 0, cold_cache=True)
        r = run_hot(plan, directory)
        return {"recovery_s": r.recovery_s, "first_step_s": r.first_step_s, "lost_steps": r.lost_steps,
                "bitwise": r.bitwise, "layout": r.layout_after,
                "parts": {"detect_s": r.detect_s, "reform_s": r.reform_s, "reshard_s": r.reshard_s},
                "elements": r.elements}
    from ucp.integrations.stacks.recovery import FailurePlan, run_with_failure

    stack, before, after, checkpointer = {
        "ucp-restart": ("megatron", "tp=2,dp=2,zero=1", scenario.after_megatron, "ucp"),
        "dcp-restart": ("native", "tp=2,dp=2", scenario.after_native, "dcp"),
        "deepspeed-universal": ("deepspeed", "dp=4,zero=2", "dp=2,zero=2" if not scenario.spare else "dp=4,zero=2",
                                "deepspeed"),
    }[system]
    plan = FailurePlan(stack=stack, before=before, after=after, model=model, settings=settings, steps=STEPS,
                       save_every=SAVE_EVERY, kill_after_step=KILL_AFTER, kill_rank=1, checkpointer=checkpointer,
                       track_ettr=False, verify_load=checkpointer == "ucp", cold_cache=True)
    r = run_with_failure(plan, directory)
    bitwise = (r.verified_tensors > 0 and not r.verify_mismatches) if checkpointer == "ucp" else None
    return {"recovery_s": r.recovery_s - r.first_step_s, "first_step_s": r.first_step_s,
            "lost_steps": r.killed_at_step - r.resumed_from, "bitwise": bitwise, "layout": after,
            "parts": {"detect_s": r.detect_s, "teardown_s": r.teardown_s, "convert_s": r.convert_s,
                      "restart_s": r.restart_s, "load_s": r.load_s}}


def median_ci95(values: list[float]) -> tuple[float, float]:
    """A distribution-free interval for the median from order statistics: the narrowest
    ``[x_(k), x_(n-k+1)]`` covering at least 95 %, or ``[min, max]`` when none does (n < 6).

    >>> median_ci95([5.0, 1.0, 4.0, 2.0, 3.0])
    (1.0, 5.0)
    """
    xs, n = sorted(values), len(values)
    k = 1
    while k + 1 <= n // 2 and 1 - 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n >= 0.95:
        k += 1
    return xs[k - 1], xs[n - k]


def summarize(results: dict) -> dict:
    """``{"scenarios": {name: {system: {recovery_s, ci95, first_step_s, lost_steps, bitwise, ...}}}}``."""
    out: dict = {}
    for name, systems in results.items():
        for system, runs in systems.items():
            rec = [r["recovery_s"] for r in runs]
            flags = [r["bitwise"] for r in runs]
            parts = {k: statistics.median(r["parts"][k] for r in runs) for k in runs[0]["parts"]}
            out.setdefault(name, {})[system] = {
                "recovery_s": statistics.median(rec), "ci95": list(median_ci95(rec)),
                "first_step_s": statistics.median(r["first_step_s"] for r in runs),
                "lost_steps": statistics.median(r["lost_steps"] for r in runs),
                "bitwise": None if any(f is None for f in flags) else all(flags),
                "runs": rec, "layout": runs[0]["layout"], "parts": parts}
        peer = out[name].get("dcp-restart")
        for row in out[name].values():
            row["vs_dcp_restart"] = row["recovery_s"] / peer["recovery_s"] if peer else None
    return {"scenarios": out}


def print_table(summary: dict, *, model: str, repeats: int) -> None:
    print(f"\nmodel: {model or 'default LlamaConfig (the demo model)'}; {repeats} run(s) per system, interleaved; "
          "recovery = SIGKILL -> start of the first step after it; cold page cache for storage reads\n")
    print("| transition | system | layout after | recovery s (median) | 95% CI | / dcp-restart | first step s | "
          "lost steps | bitwise | parts (medians, s) |")
    print("| --- " * 10 + "|")
    for name, systems in summary["scenarios"].items():
        for system, row in systems.items():
            ratio = "" if row["vs_dcp_restart"] is None else f"{row['vs_dcp_restart']:.2f}"
            parts = ", ".join(f"{k.removesuffix('_s')} {v:.2f}" for k, v in row["parts"].items())
            bitwise = "not checked" if row["bitwise"] is None else str(row["bitwise"]).lower()
            print(f"| {name} | {system} | {row['layout']} | {row['recovery_s']:.2f} | {row['ci95'][0]:.2f}-"
                  f"{row['ci95'][1]:.2f} | {ratio} | {row['first_step_s']:.2f} | {row['lost_steps']:g} | {bitwise} | "
                  f"{parts} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="", help="LlamaConfig string (default: the demo model)")
    parser.add_argument("--repeats", type=int, default=6, help="runs per system (default %(default)s)")
    parser.add_argument("--scenarios", default="shrink,spare", help="shrink, spare (default both)")
    parser.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS),
                        help=f"comma-separated, among {', '.join(SYSTEMS)} (default %(default)s)")
    parser.add_argument("--dir", default=None, help="working directory (default: a temporary one)")
    add_json_option(parser, "the summary")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    scenarios = [s for s in SCENARIOS if s.name in {n.strip() for n in args.scenarios.split(",")}]
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown or not scenarios:
        parser.error(f"unknown system(s) {unknown}" if unknown else f"no scenario among {args.scenarios!r}")
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="ucp-recovery-"))
    notes = sys.stderr if json_on_stdout(args) else sys.stdout
    start_fork_server(WITH_DEEPSPEED if "deepspeed-universal" in systems else PRELOAD)
    results: dict = {}
    for scenario in scenarios:
        for index in range(args.repeats):  # interleaved: drift on a shared machine hits every system alike
            for system in systems:
                run = measure(scenario, system, args.model, index, root)
                results.setdefault(scenario.name, {}).setdefault(system, []).append(run)
                print(f"  {scenario.name} | {system} | run {index + 1}: recovery {run['recovery_s']:.2f}s "
                      f"(load average {os.getloadavg()[0]:.1f})", flush=True, file=notes)
    summary = summarize(results)
    summary |= {"model": args.model, "repeats": args.repeats}
    if not json_on_stdout(args):
        print_table(summary, model=args.model, repeats=args.repeats)
    if args.json:
        write_json(summary, args.json, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
