"""Benchmark: recovery time after a rank dies, ucp against each peer's own resharding path.

For each scenario the same training job runs once per system, in this one run:
it checkpoints, one rank is SIGKILLed, the agent detects it and stops the rest,
and the job restarts under a layout with fewer ranks, loading the last committed
checkpoint with resharding (:func:`integrations.stacks.recovery.run_with_failure`).
Recovery time = SIGKILL to the end of the first step under the new layout.

* torch-native stack (FSDP2 x TP), ``tp=2,dp=2 -> dp=2``: ucp against
  torch.distributed.checkpoint (``get_state_dict`` + ``dcp.save``; ``dcp.load``
  reshards into the new layout's DTensors);
* DeepSpeed stack, ``dp=4,zero=2 -> dp=2,zero=2``: ucp against DeepSpeed's own
  path (``save_checkpoint``; ``ds_to_universal`` run as its own script; the new
  engine loads the universal checkpoint).

Every system uses the same launcher (a fork server that has imported torch, so a
restart costs the same for all), the same model, data and steps.

    python tools/bench/recovery_bench.py                    # default model, 3 repeats
    python tools/bench/recovery_bench.py --model hidden=64,layers=2 --repeats 1 --json

Runs are interleaved (every repeat runs every system once, so drift on a shared
machine hits all alike). Prints per scenario and system the median of ``--repeats``
runs: recovery time and its parts (detect, teardown, convert, restart, load, first
step), checkpoint size, recovery time as a fraction of the best peer's, and the best
(fastest) run of each, which interference from other jobs can only lengthen.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from integrations.launch import PRELOAD, WITH_DEEPSPEED, start_fork_server  # noqa: E402
from integrations.stacks.common import TrainSettings  # noqa: E402
from integrations.stacks.recovery import FailurePlan, run_with_failure  # noqa: E402
from ucp.layout import Layout  # noqa: E402

PARTS = ("detect_s", "teardown_s", "convert_s", "restart_s", "load_s", "first_step_s")
# A model whose checkpoint is large next to its compute: the embedding and output dominate.
DEFAULT_MODEL = "vocab_size=32768,hidden=256,layers=4,heads=8,kv_heads=4,ffn=768"


@dataclass(frozen=True)
class Scenario:
    name: str
    stack: str
    before: str
    after: str
    systems: tuple[str, ...]  # checkpointers; "ucp" first, then the peers


SCENARIOS = (
    Scenario("torch-native FSDP2 x TP, 4 -> 2 ranks", "native", "tp=2,dp=2", "dp=2", ("ucp", "dcp")),
    Scenario("DeepSpeed ZeRO-2, 4 -> 2 ranks", "deepspeed", "dp=4,zero=2", "dp=2,zero=2", ("ucp", "deepspeed")),
)
PEER_NAMES = {"ucp": "ucp", "dcp": "FSDP2 + DCP", "deepspeed": "DeepSpeed ds_to_universal + universal load"}


def measure(scenario: Scenario, system: str, model: str, index: int, root: Path, *, say=print) -> dict:
    """One failure and recovery of ``scenario`` with checkpointer ``system``."""
    plan = FailurePlan(stack=scenario.stack, before=scenario.before, after=scenario.after, model=model,
                       settings=TrainSettings(), steps=6, save_every=2, kill_after_step=3, kill_rank=1,
                       checkpointer=system, track_ettr=False)
    report = run_with_failure(plan, root / f"{scenario.stack}-{system}-{index}")
    say(f"  {scenario.name} | {PEER_NAMES[system]} | run {index + 1}: recovery {report.recovery_s:.2f}s "
        f"(load {report.load_s:.2f}s, convert {report.convert_s:.2f}s; load average {os.getloadavg()[0]:.1f})")
    return {k: getattr(report, k) for k in (*PARTS, "recovery_s", "checkpoint_bytes", "resumed_from")} | {
        "losses": report.losses}


def _load_phase(ctx, directory: str, model: str, after: str, repeats: int) -> dict:
    """Rank body: load the same checkpoint with ucp and with DCP, alternating, timed between barriers."""
    import time

    import torch.distributed as dist

    from integrations.llama.config import LlamaConfig
    from integrations.native.dcp import load_dcp
    from integrations.native.trainer import NativeTrainer

    trainer = NativeTrainer(LlamaConfig.parse(model), after, TrainSettings(), rank=ctx.rank, init=False)
    times: dict[str, list[float]] = {"ucp": [], "dcp": []}
    for _ in range(repeats):
        for system in ("ucp", "dcp"):
            dist.barrier()
            began = time.perf_counter()
            trainer.load(f"{directory}/ucp") if system == "ucp" else load_dcp(trainer, f"{directory}/dcp")
            dist.barrier()
            times[system].append(time.perf_counter() - began)
    return times


def _save_both(ctx, directory: str, model: str, before: str) -> None:
    from integrations.llama.config import LlamaConfig
    from integrations.native.dcp import save_dcp
    from integrations.native.trainer import NativeTrainer

    trainer = NativeTrainer(LlamaConfig.parse(model), before, TrainSettings(), rank=ctx.rank)
    trainer.train_step()
    trainer.save(f"{directory}/ucp")
    save_dcp(trainer, f"{directory}/dcp")


def load_phase(model: str, repeats: int, root: Path) -> dict:
    """The load with resharding alone (torch-native scenario): the same processes load the same
    training state saved by ucp and by DCP, alternately; slowest rank, between barriers."""
    from integrations.launch import run

    scenario = SCENARIOS[0]
    directory = str(root / "load-phase")
    run(_save_both, world=Layout.parse(scenario.before).world_size, args=(directory, model, scenario.before))
    times = run(_load_phase, world=Layout.parse(scenario.after).world_size,
                args=(directory, model, scenario.after, repeats))
    return {system: {"median_s": statistics.median(t), "best_s": min(t), "runs": t} for system, t in times.items()}


def summarize(results: dict) -> list[dict]:
    rows = []
    for scenario in SCENARIOS:
        per_system = results.get(scenario.name)
        if not per_system:
            continue
        keys = (*PARTS, "recovery_s", "checkpoint_bytes")
        medians = {system: {k: statistics.median(r[k] for r in runs) for k in keys}
                   for system, runs in per_system.items()}
        best = {system: min(r["recovery_s"] for r in runs) for system, runs in per_system.items()}
        peers = [s for s in per_system if s != "ucp"]
        best_peer = min(peers, key=lambda s: medians[s]["recovery_s"]) if peers else None
        for system, m in medians.items():
            ratio = m["recovery_s"] / medians[best_peer]["recovery_s"] if best_peer else None
            best_ratio = best[system] / best[best_peer] if best_peer else None
            rows.append({"scenario": scenario.name, "system": PEER_NAMES[system], **m, "best_recovery_s": best[system],
                         "vs_best_peer": ratio, "best_vs_best_peer": best_ratio, "runs": len(per_system[system])})
    return rows


def print_table(rows: list[dict], *, model: str, repeats: int) -> None:
    header = ("| scenario | system | recovery s (median) | detect | teardown | convert | restart | load | first step | "
              "checkpoint MiB | median / best peer's | best run s | best / best peer's |")
    print(f"\nmodel: {model}; {repeats} run(s) per system, interleaved; parts are medians; "
          "recovery = SIGKILL of rank 1 -> first step done\n")
    print(header)
    print("| --- " * 13 + "|")
    for r in rows:
        ratio = "" if r["vs_best_peer"] is None else f"{r['vs_best_peer']:.2f}"
        best_ratio = "" if r["best_vs_best_peer"] is None else f"{r['best_vs_best_peer']:.2f}"
        print(f"| {r['scenario']} | {r['system']} | {r['recovery_s']:.2f} | {r['detect_s']:.3f} | "
              f"{r['teardown_s']:.2f} | {r['convert_s']:.2f} | {r['restart_s']:.2f} | {r['load_s']:.2f} | "
              f"{r['first_step_s']:.2f} | {r['checkpoint_bytes'] / 2**20:.1f} | {ratio} | "
              f"{r['best_recovery_s']:.2f} | {best_ratio} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL, help="LlamaConfig string (default %(default)s)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per system (default %(default)s)")
    parser.add_argument("--scenarios", default="all",
                        help="comma-separated stacks to run: native,deepspeed (default all)")
    parser.add_argument("--dir", default=None, help="working directory (default: a temporary one)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    wanted = {s.strip() for s in args.scenarios.split(",")} if args.scenarios != "all" else {s.stack for s in SCENARIOS}
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="ucp-recovery-"))
    say = (lambda *_: None) if args.json else (lambda text: print(text, flush=True))
    # one fork server for every system, DeepSpeed imported once: restarts cost the same for all
    start_fork_server(WITH_DEEPSPEED if "deepspeed" in wanted else PRELOAD)
    results: dict = {}
    for scenario in SCENARIOS:
        if scenario.stack not in wanted:
            continue
        for index in range(args.repeats):  # interleaved: drift on a shared machine hits every system alike
            for system in scenario.systems:
                run = measure(scenario, system, args.model, index, root, say=say)
                results.setdefault(scenario.name, {}).setdefault(system, []).append(run)
    rows = summarize(results)
    loads = load_phase(args.model, args.repeats, root) if "native" in wanted else None
    if args.json:
        print(json.dumps({"model": args.model, "repeats": args.repeats, "rows": rows, "load_phase": loads}, indent=2))
        return 0
    print_table(rows, model=args.model, repeats=args.repeats)
    if loads:
        u, d = loads["ucp"], loads["dcp"]
        print(f"\nload phase alone ({SCENARIOS[0].before} -> {SCENARIOS[0].after}, same processes, alternating, "
              f"{args.repeats} each): ucp median {u['median_s']:.2f}s (best {u['best_s']:.2f}s), "
              f"DCP median {d['median_s']:.2f}s (best {d['best_s']:.2f}s); "
              f"ucp / DCP {u['median_s'] / d['median_s']:.2f} (median), {u['best_s'] / d['best_s']:.2f} (best)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
