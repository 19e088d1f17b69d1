"""Benchmark: recovery after a SIGKILLed rank, hot (no restart) against the restart paths.

Two sizes (:data:`SIZES`: the demo model, and one whose training state, fp32 parameters and two
Adam moments, is 1.06 GiB) and two transitions, each run by every system in this one run,
interleaved (every repeat runs every system once, so drift on a shared machine hits all alike):

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
* ``deepspeed-universal`` (``--systems``): DeepSpeed ZeRO-2 ``dp=4`` -> ``dp=2`` (or ``dp=4``):
  ``ds_to_universal``, then a universal load;
* ``torchft`` (spare only: it never changes the layout): data-parallel replicas under
  torchft's Manager, a spare heals from a healthy peer
  (:mod:`ucp.tools.bench.torchft_recovery`); where torchft cannot run, the summary's
  ``not_run`` says why.

Per size, the save costs (synchronous, and background: the snapshot the loop waits for, the
write behind it and the slowdown of the steps it overlaps) are measured on the ``ucp-hot``
stack and layout (:mod:`ucp.tools.bench.save_cost`). ``--update-costs`` also writes the summary
to ``ucp/reliability/data/recovery_costs.json``, which ``ucp ettr --measured`` reads.

Recovery = SIGKILL to the *start* of the first step after it (the first step is reported on
its own, and the steps redone). The restart paths read the checkpoint with a cold page
cache: its files are flushed and dropped from the cache (``POSIX_FADV_DONTNEED``,
:mod:`ucp.integrations.page_cache`) just before the kill; the hot path gets the same
treatment (it reads storage only for what no survivor holds). ``bitwise``: every logical
tensor after the recovery equals the checkpoint's (ucp paths check it; ``null``: not
checked, DCP and DeepSpeed). Medians over ``--repeats``, with a distribution-free 95 %
interval for the median (order statistics; with 5 repeats the widest, min..max, covers
93.8 %, so 6 repeats are the default).

    python -m ucp.tools.bench.recovery_bench --json out.json --update-costs   # the tables; summary in out.json
    python -m ucp.tools.bench.recovery_bench --repeats 1 --sizes demo --scenarios spare --systems ucp-hot,torchft
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from ucp.integrations.launch import PRELOAD, WITH_DEEPSPEED, start_fork_server
from ucp.errors import UcpError
from ucp.integrations.stacks.common import TrainSettings
from ucp.tools.output import add_json_option, json_on_stdout, write_json

SYSTEMS = ("ucp-hot", "ucp-restart", "dcp-restart", "deepspeed-universal", "torchft")
DEFAULT_SYSTEMS = ("ucp-hot", "ucp-restart", "dcp-restart", "torchft")
BEFORE = "tp=2,dp=2,zero=1"  # the layout every ucp run starts from (4 ranks)
COSTS_FILE = Path(__file__).resolve().parents[2] / "reliability" / "data" / "recovery_costs.json"


@dataclass(frozen=True)
class Size:
    """A model size: its config, data settings and where it saves and fails.

    The kill comes one step after a committed checkpoint (one step redone). The 1 GiB size
    saves at step 2 and is killed after step 3 (a step takes 15-20 s on this machine).
    """

    name: str
    model: str
    settings: TrainSettings
    steps: int
    save_every: int
    kill_after: int
    torchft_replicas: int  # torchft holds a full replica per process: fewer at 1 GiB to stay within memory
    verify_every_run: bool = True  # else only the first repeat compares every tensor (rank 0 holds two copies)

    def state_bytes(self) -> int:
        """Logical training state: fp32 parameters (the masters in fp32 training) + two Adam moments."""
        import math

        from ucp.integrations.llama.config import LlamaConfig
        from ucp.integrations.llama.model import logical_shapes

        return 12 * sum(math.prod(s) for s in logical_shapes(LlamaConfig.parse(self.model)).values())


SIZES = (
    Size("demo", "", TrainSettings(), 7, 3, 4, 4),
    Size("1gib", "hidden=1024,heads=8,kv_heads=4,ffn=2816,layers=8", TrainSettings(global_batch=4), 4, 2, 3, 2,
         verify_every_run=False),
)


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


RENDEZVOUS_TIMEOUT_S = 900.0  # a spare waits while a 1 GiB job builds (~60 s) and trains (~30 s a step)


def not_run_reason(scenario: Scenario, system: str) -> str | None:
    """Why ``system`` does not run in ``scenario`` (None: it runs)."""
    if system != "torchft":
        return None
    if not scenario.spare:
        return "torchft heals a replica in the same layout; it cannot change the layout (no shrink)"
    from ucp.tools.bench.torchft_recovery import torchft_unavailable

    reason = torchft_unavailable()
    return None if reason is None else f"torchft cannot run here: {reason}"


def measure(scenario: Scenario, system: str, size: Size, index: int, root: Path) -> dict:
    """One failure and recovery; returns recovery_s, first_step_s, lost_steps, bitwise and the parts."""
    directory = root / f"{size.name}-{scenario.name}-{system}-{index}"
    verify = size.verify_every_run or index == 0
    if system == "torchft":
        from ucp.tools.bench.torchft_recovery import measure_torchft

        return measure_torchft(model=size.model, settings=size.settings, replicas=size.torchft_replicas,
                               kill_after_step=size.kill_after)
    try:
        if system == "ucp-hot":
            return _measure_hot(scenario, size, directory, verify)
        return _measure_restart(scenario, system, size, directory, verify)
    finally:
        shutil.rmtree(directory, ignore_errors=True)  # a 1 GiB run leaves GiBs of checkpoints


def _measure_hot(scenario: Scenario, size: Size, directory: Path, verify: bool) -> dict:
    from ucp.integrations.stacks.hot import HotPlan, run_hot

    plan = HotPlan(layout=BEFORE, model=size.model, settings=size.settings, steps=size.steps,
                   save_every=size.save_every, kill_after_step=size.kill_after, kill_uid=1,
                   spares=1 if scenario.spare else 0, cold_cache=True, verify=verify, collective_timeout_s=120.0,
                   hang_timeout_s=120.0, rendezvous_timeout_s=RENDEZVOUS_TIMEOUT_S)
    r = run_hot(plan, directory)
    return {"recovery_s": r.recovery_s, "first_step_s": r.first_step_s, "lost_steps": r.lost_steps,
            "bitwise": r.bitwise if verify else None, "layout": r.layout_after,
            "parts": {"detect_s": r.detect_s, "reform_s": r.reform_s, "reshard_s": r.reshard_s},
            "elements": r.elements, "reshard_phases": r.phases}


def _measure_restart(scenario: Scenario, system: str, size: Size, directory: Path, verify: bool) -> dict:
    from ucp.integrations.stacks.recovery import FailurePlan, run_with_failure

    stack, before, after, checkpointer = {
        "ucp-restart": ("megatron", BEFORE, scenario.after_megatron, "ucp"),
        "dcp-restart": ("native", "tp=2,dp=2", scenario.after_native, "dcp"),
        "deepspeed-universal": ("deepspeed", "dp=4,zero=2", "dp=2,zero=2" if not scenario.spare else "dp=4,zero=2",
                                "deepspeed"),
    }[system]
    verify = verify and checkpointer == "ucp"  # DCP and DeepSpeed loads are not compared (null)
    plan = FailurePlan(stack=stack, before=before, after=after, model=size.model, settings=size.settings,
                       steps=size.steps, save_every=size.save_every, kill_after_step=size.kill_after, kill_rank=1,
                       checkpointer=checkpointer, track_ettr=False, verify_load=verify, cold_cache=True)
    r = run_with_failure(plan, directory)
    return {"recovery_s": r.recovery_s - r.first_step_s, "first_step_s": r.first_step_s,
            "lost_steps": r.killed_at_step - r.resumed_from,
            "bitwise": (r.verified_tensors > 0 and not r.verify_mismatches) if verify else None, "layout": after,
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
                # over the runs that compared every tensor (null: none did); how many did, next to it
                "bitwise": all(f for f in flags if f is not None) if any(f is not None for f in flags) else None,
                "bitwise_runs": sum(f is not None for f in flags),
                "runs": rec, "layout": runs[0]["layout"], "parts": parts}
            if all("reshard_phases" in r for r in runs):  # the hot reshard's own split (slowest rank's, medians)
                out[name][system]["reshard_phases"] = {k: statistics.median(r["reshard_phases"][k] for r in runs)
                                                       for k in runs[0]["reshard_phases"]}
        peer = out[name].get("dcp-restart")
        for row in out[name].values():
            row["vs_dcp_restart"] = row["recovery_s"] / peer["recovery_s"] if peer else None
    return {"scenarios": out}


def print_table(summary: dict) -> None:
    done = ", ".join(f"{size} {n}" for size, n in summary["repeats_done"].items())
    print(f"\nruns per system (of {summary['repeats']} asked): {done}; interleaved; recovery = SIGKILL -> start of the first step "
          "after it; cold page cache for storage reads\n")
    for size, info in summary["sizes"].items():
        print(f"- {size}: model {info['model'] or 'default LlamaConfig (the demo model)'}, "
              f"state {info['state_bytes'] / 2**30:.3f} GiB, global batch {info['global_batch']}")
    print("\n| scenario | system | layout after | recovery s (median) | 95% CI | / dcp-restart | first step s | "
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
    for name, systems in summary["scenarios"].items():
        for system, row in systems.items():
            if row.get("reshard_phases"):
                split = ", ".join(f"{k} {v:.2f}" for k, v in row["reshard_phases"].items())
                print(f"  {name} {system}: reshard phases (slowest rank, medians, s): {split}")
    for name, systems in summary["not_run"].items():
        for system, reason in systems.items():
            print(f"| {name} | {system} | not run: {reason} |" + " |" * 7)
    for name, systems in summary.get("failed", {}).items():
        for system, errors in systems.items():
            print(f"| {name} | {system} | {len(errors)} run(s) failed: {errors[-1]} |" + " |" * 7)
    if summary["save_costs"]:
        print("\n| size | step s | sync save s | background save: blocking s | background s | slowdown s |")
        print("| --- " * 6 + "|")
        for size, c in summary["save_costs"].items():
            print(f"| {size} | {c['step_s']:.2f} | {c['save_sync_s']:.2f} | {c['save_blocking_s']:.2f} | "
                  f"{c['save_background_s']:.2f} | {c['slowdown_s']:.2f} |")


def _names(text: str, known: tuple[str, ...], what: str, parser: argparse.ArgumentParser) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = sorted(set(names) - set(known))
    if unknown or not names:
        parser.error(f"unknown {what}(s) {unknown}; expected some of {', '.join(known)}" if unknown
                     else f"no {what} given")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="demo,1gib", help="demo, 1gib (default both)")
    parser.add_argument("--repeats", type=int, default=6, help="runs per system (default %(default)s)")
    parser.add_argument("--scenarios", default="shrink,spare", help="shrink, spare (default both)")
    parser.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS),
                        help=f"comma-separated, among {', '.join(SYSTEMS)} (default %(default)s)")
    parser.add_argument("--save-rounds", type=int, default=3,
                        help="rounds of the save-cost measurement per size (0: skip it; default %(default)s)")
    parser.add_argument("--update-costs", action="store_true",
                        help=f"also write the summary to the ETTR model's cost file ({COSTS_FILE.name})")
    parser.add_argument("--time-budget-min", type=float, default=0.0,
                        help="start no new repeat after this many minutes (0: no limit; the summary says how "
                        "many repeats ran)")
    parser.add_argument("--dir", default=None, help="working directory (default: a temporary one)")
    add_json_option(parser, "the summary")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.save_rounds < 0:
        parser.error("--save-rounds must be at least 0")
    systems = _names(args.systems, SYSTEMS, "system", parser)
    wanted = _names(args.scenarios, tuple(s.name for s in SCENARIOS), "scenario", parser)
    size_names = _names(args.sizes, tuple(s.name for s in SIZES), "size", parser)
    scenarios = [s for s in SCENARIOS if s.name in wanted]
    sizes = [s for s in SIZES if s.name in size_names]
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="ucp-recovery-"))
    notes = sys.stderr if json_on_stdout(args) else sys.stdout
    start_fork_server(WITH_DEEPSPEED if "deepspeed-universal" in systems else PRELOAD)
    results: dict = {}
    not_run: dict = {}
    failed: dict = {}  # scenario -> system -> the last line of each failure
    save_costs: dict = {}
    began = time.monotonic()
    repeats_done: dict[str, int] = {}
    for size in sizes:
        running = {}
        for scenario in scenarios:
            name = f"{size.name}-{scenario.name}"
            for system in systems:
                reason = not_run_reason(scenario, system)
                if reason:
                    not_run.setdefault(name, {})[system] = reason
                else:
                    running.setdefault(scenario, []).append(system)
        if args.save_rounds:  # first: a run cut short by its time budget still has them
            from ucp.tools.bench.save_cost import measure_save_costs

            save_costs[size.name] = measure_save_costs(model=size.model, layout=BEFORE, rounds=args.save_rounds,
                                                       settings=size.settings, directory=root / f"{size.name}-save")
            print(f"  {size.name} | save costs: {save_costs[size.name]}", flush=True, file=notes)
        # interleaved: every repeat runs every scenario and system once, so drift on a shared
        # machine hits all alike, and a time budget cut leaves every row with the same repeats
        for index in range(args.repeats):
            if index and args.time_budget_min and time.monotonic() - began > args.time_budget_min * 60:
                print(f"  {size.name}: time budget spent after {index} repeat(s)", flush=True, file=notes)
                break
            for scenario, names in running.items():
                for system in names:
                    try:
                        run = measure(scenario, system, size, index, root)
                    except UcpError as error:  # one system failing must not discard the others' runs
                        failed.setdefault(f"{size.name}-{scenario.name}", {}).setdefault(system, []).append(
                            str(error).splitlines()[-1])
                        print(f"  {size.name}-{scenario.name} | {system} | run {index + 1} FAILED: {error}",
                              flush=True, file=notes)
                        continue
                    results.setdefault(f"{size.name}-{scenario.name}", {}).setdefault(system, []).append(run)
                    print(f"  {size.name}-{scenario.name} | {system} | run {index + 1}: recovery "
                          f"{run['recovery_s']:.2f}s (load average {os.getloadavg()[0]:.1f})", flush=True, file=notes)
                    if args.json and args.json != "-":  # after every run: a run killed later keeps what it measured
                        write_json(_summary(results, not_run, save_costs, args, repeats_done, sizes) | {"failed": failed},
                                   args.json, indent=2)
            repeats_done[size.name] = index + 1
    summary = _summary(results, not_run, save_costs, args, repeats_done, sizes) | {"failed": failed}
    if not json_on_stdout(args):
        print_table(summary)
    if args.json:
        write_json(summary, args.json, indent=2)
    if args.update_costs:
        write_json(merge_costs(summary, COSTS_FILE), str(COSTS_FILE), indent=2)
    return 0


def _summary(results: dict, not_run: dict, save_costs: dict, args: argparse.Namespace, repeats_done: dict,
             sizes: list[Size]) -> dict:
    return summarize(results) | {
        "not_run": not_run, "save_costs": save_costs, "repeats": args.repeats, "repeats_done": repeats_done,
        "world": 4, "load_average": list(os.getloadavg()),
        "sizes": {s.name: {"model": s.model, "state_bytes": s.state_bytes(), "global_batch": s.settings.global_batch}
                  for s in sizes}}


def merge_costs(summary: dict, path: Path) -> dict:
    """The costs file with this run's scenarios, sizes and save costs replacing the same ones in it
    (so one size can be rerun alone); what the file has and this run did not measure stays.

    >>> merge_costs({"scenarios": {"a": 1}, "sizes": {"demo": 2}, "repeats": 5}, Path("/nonexistent"))["scenarios"]
    {'a': 1}
    """
    import json

    merged = json.loads(path.read_text()) if path.exists() else {}
    for key in ("scenarios", "not_run", "save_costs", "sizes"):
        merged[key] = {**merged.get(key, {}), **summary.get(key, {})}
    runs = {size: {"repeats": summary.get("repeats_done", {}).get(size), "load_average": summary.get("load_average")}
            for size in summary.get("sizes", {})}
    merged["runs"] = {**merged.get("runs", {}), **runs}
    merged["world"] = summary.get("world", merged.get("world"))
    return merged


if __name__ == "__main__":
    raise SystemExit(main())
