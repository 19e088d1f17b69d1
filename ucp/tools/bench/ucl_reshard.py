"""Benchmark: load-time resharding with ucp + UCL against torch.distributed.checkpoint (DCP).

A >= 1 GiB state (matrices, half split along rows, half along columns) is
saved by S processes and loaded into T processes, by both systems, in one run,
with real gloo process groups. ucp saves each rank's shards with a UCL program
and loads each target rank's shards with ``spec_for_load``; DCP saves DTensors
and reshards them at load time with its default planner. Every target rank
checks that both systems gave it identical tensors.

    python ucp/tools/bench/ucl_reshard.py                   # 8 -> 4 and 4 -> 6, 1 GiB
    python ucp/tools/bench/ucl_reshard.py --gib 0.25 --scenarios 4:2 --json

Prints, per scenario and system: load time (slowest rank; median and min-max of
``--repeats`` loads), peak RSS of the largest rank and its growth during the loads
(sampled while each system's load runs), and ucp / DCP ratios. Both systems load
in the same processes, interleaved, the order alternating every repeat, so drift
in a busy machine hits both alike.

``--zero1`` runs the distributed-optimizer scenario instead (ucp/tools/bench/zero1_reshard.py):
a Megatron zero=1 state (bf16 parameters, fp32 masters and Adam moments in flat dp
partitions) of ``--gib`` GiB of optimizer state, saved under ``--source`` and loaded under
``--target`` by both systems, with fragments, metadata bytes, save and load time and
peak RSS per system. ``--dir`` may be given more than once (e.g. /dev/shm and a disk):

    python ucp/tools/bench/ucl_reshard.py --zero1 --gib 2 --dir /dev/shm --dir /work/tmp
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
import zlib

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ucp.tools.bench.megatron_state import check_layout
from ucp.tools.bench.zero1_reshard import PeakRss, free_port as _free_port, init_gloo as _init, print_zero1, run_zero1
from ucp.layout import Layout
from ucp.stores import StoreOptions

ROWS, COLS = 6144, 3072  # divisible by 4, 6 and 8, so DCP (chunk) and UCL (split_evenly) agree on shards


def program_text() -> str:
    return ("ucl 1\n"
            "tensor rows{i} -> rows{i}\n  split dim 0 over tp\n"
            "tensor cols{i} -> cols{i}\n  split dim 1 over tp\n")


def tensor_names(gib: float) -> list[str]:
    count = max(2, math.ceil(gib * 2**30 / (ROWS * COLS * 4)))
    return [f"{'rows' if i % 2 == 0 else 'cols'}{i}" for i in range(count)]


def full_tensor(name: str) -> torch.Tensor:
    # deterministic values per tensor; generated once per rank and sliced (cheap, no disk)
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    return torch.randn(ROWS, COLS, generator=g)


def shard(name: str, world: int, rank: int, source: torch.Tensor | None = None) -> torch.Tensor:
    t = full_tensor(name) if source is None else source
    dim = 0 if name.startswith("rows") else 1
    return t.chunk(world, dim=dim)[rank].contiguous()


def _rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _save_worker(rank: int, world: int, port: int, names: list[str], ucp_dir: str, dcp_dir: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    import ucp

    _init(rank, world, port)
    try:
        local = {n: shard(n, world, rank) for n in names}
        ucp.save(local, ucp_dir, program=program_text(), layout=f"tp={world}", rank=rank, world_size=world,
                 checksums=True)
        dist.barrier()
        if rank == 0:
            ucp.finalize(ucp_dir, world_size=world)
        mesh = init_device_mesh("cpu", (world,))
        state = {n: DTensor.from_local(t, mesh, [Shard(0 if n.startswith("rows") else 1)], run_check=False)
                 for n, t in local.items()}
        dcp.save(state, checkpoint_id=dcp_dir)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _peak_during(fn) -> tuple[float, int]:
    """(seconds ``fn()`` took, the highest RSS sampled while it ran): per system, though both load in one process."""
    with PeakRss() as rss:
        start = time.perf_counter()
        fn()
        seconds = time.perf_counter() - start
    return seconds, rss.peak


def _loaders(world: int, rank: int, names: list[str], paths: dict[str, str]) -> dict:
    """system -> (load(), the loaded local tensors): each fills tensors allocated once, here."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    from ucp import ucl
    import ucp

    logical = ucp.CheckpointReader(paths["ucp"]).logical()
    fmap = ucl.spec_for_load(program_text(), f"tp={world}", rank, logical)
    into = {k: torch.empty(lt.shape, dtype=getattr(torch, lt.dtype)) for k, lt in ucl.local_shapes(fmap).items()}
    mesh = init_device_mesh("cpu", (world,))
    state = {}
    for n in names:
        dim = 0 if n.startswith("rows") else 1
        local_shape = (ROWS // world, COLS) if dim == 0 else (ROWS, COLS // world)
        state[n] = DTensor.from_local(torch.empty(local_shape), mesh, [Shard(dim)], run_check=False,
                                      shape=torch.Size((ROWS, COLS)), stride=(COLS, 1))
    return {
        "ucp": (lambda: ucp.load(paths["ucp"], into=into, program=program_text(), layout=f"tp={world}", rank=rank),
                into),
        "dcp": (lambda: dcp.load(state, checkpoint_id=paths["dcp"]), {n: t.to_local() for n, t in state.items()}),
    }


def _load_worker(rank: int, world: int, port: int, names: list[str], paths: dict[str, str], out: str,
                 repeats: int) -> None:
    """Both systems load in the same processes, interleaved, the order rotating every repeat."""
    _init(rank, world, port)
    try:
        loaders = _loaders(world, rank, names, paths)
        before = _rss()
        seconds: dict[str, list[float]] = {s: [] for s in loaders}
        peaks: dict[str, int] = {s: 0 for s in loaders}
        systems = list(loaders)
        for rep in range(repeats):
            for system in systems[rep % 2:] + systems[: rep % 2]:
                dist.barrier()
                took, peak = _peak_during(loaders[system][0])
                seconds[system].append(took)
                peaks[system] = max(peaks[system], peak)
        spot = names[rank % len(names)]  # correctness: compare with the expected shard of a spot-checked tensor
        for system, (_, result) in loaders.items():
            ok = torch.equal(result[spot], shard(spot, world, rank))
            torch.save({spot: result[spot]}, os.path.join(out, f"{system}-{rank}.pt"))
            with open(os.path.join(out, f"{system}-{rank}.json"), "w") as fh:
                json.dump({"seconds": seconds[system], "before": before, "peak": peaks[system], "ok": ok,
                           "bytes": sum(t.numel() * t.element_size() for t in result.values())}, fh)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _read_json(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def run_scenario(source: int, target: int, gib: float, workdir: str, repeats: int = 3) -> dict:
    names = tensor_names(gib)
    paths = {"ucp": os.path.join(workdir, "ucp"), "dcp": os.path.join(workdir, "dcp")}
    t0 = time.perf_counter()
    mp.spawn(_save_worker, args=(source, _free_port(), names, paths["ucp"], paths["dcp"]), nprocs=source, join=True)
    save_seconds = time.perf_counter() - t0
    out = os.path.join(workdir, "out")
    os.makedirs(out, exist_ok=True)
    mp.spawn(_load_worker, args=(target, _free_port(), names, paths, out, repeats), nprocs=target, join=True)
    rows = {}
    for system in paths:
        ranks = [_read_json(os.path.join(out, f"{system}-{r}.json")) for r in range(target)]
        per_repeat = [max(r["seconds"][i] for r in ranks) for i in range(repeats)]  # a load ends with its slowest rank
        rows[system] = {
            "seconds": statistics.median(per_repeat),
            "seconds_min": min(per_repeat),
            "seconds_max": max(per_repeat),
            "peak_rss_gib": max(r["peak"] for r in ranks) / 2**30,
            "growth_gib": max(r["peak"] - r["before"] for r in ranks) / 2**30,
            "shard_gib": max(r["bytes"] for r in ranks) / 2**30,
            "ok": all(r["ok"] for r in ranks),
        }
    same = all(
        torch.equal(torch.load(os.path.join(out, f"ucp-{r}.pt"))[names[r % len(names)]],
                    torch.load(os.path.join(out, f"dcp-{r}.pt"))[names[r % len(names)]])
        for r in range(target))
    sizes = {s: sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(p) for f in fs) / 2**30
             for s, p in paths.items()}
    return {"source": source, "target": target, "tensors": len(names),
            "state_gib": len(names) * ROWS * COLS * 4 / 2**30, "save_both_seconds": save_seconds,
            "disk_gib": sizes, "systems": rows, "identical": same}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=1.0, help="state size in GiB (default 1.0)")
    parser.add_argument("--scenarios", default="8:4,4:6", help="SOURCE:TARGET process counts (default 8:4,4:6)")
    parser.add_argument("--repeats", type=int, default=3, help="loads per system, median reported (default 3)")
    parser.add_argument("--dir", action="append", default=None,
                        help="parent of the work directories (a temporary one each, removed); repeat it to run "
                             "every scenario in each (default: the system's temporary directory)")
    parser.add_argument("--zero1", action="store_true",
                        help="the distributed-optimizer scenario (--source -> --target) instead of --scenarios")
    parser.add_argument("--source", default="tp=2,dp=4,zero=1", help="zero1: saving layout (default tp=2,dp=4,zero=1)")
    parser.add_argument("--target", default="tp=2,dp=3,zero=1", help="zero1: loading layout (default tp=2,dp=3,zero=1)")
    parser.add_argument("--store-options", default="",
                        help="zero1: ucp's store options for its saves and loads, e.g. pack_max_bytes=0 (an array per "
                             "fragment, no packs); default: none")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    if args.zero1:
        try:
            for text in (args.source, args.target):
                check_layout(Layout.parse(text))
            StoreOptions.parse(args.store_options)
        except ValueError as exc:  # LayoutError and InvalidArgumentError are ValueErrors too
            print(f"ucl_reshard: {exc}", file=sys.stderr)
            return 2
    results = []
    for parent in args.dir or [None]:
        for item in ["zero1"] if args.zero1 else args.scenarios.split(","):
            workdir = tempfile.mkdtemp(prefix="ucl-reshard-", dir=parent)
            try:
                if args.zero1:
                    results.append(run_zero1(args.source, args.target, args.gib, workdir, repeats=args.repeats,
                                             store_options=args.store_options))
                else:
                    s, t = (int(x) for x in item.split(":"))
                    results.append(run_scenario(s, t, args.gib, workdir, args.repeats))
            finally:
                shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    if args.zero1:
        print_zero1(results)
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Load-time resharding: ucp + UCL vs torch.distributed.checkpoint (gloo, CPU)")
    for col in ("scenario", "system", "load s (min-max)", "peak RSS/rank GiB", "RSS growth GiB", "shard GiB", "correct",
                "load ucp/dcp", "growth ucp/dcp"):
        table.add_column(col)
    for r in results:
        u, d = r["systems"]["ucp"], r["systems"]["dcp"]
        label = f"{r['state_gib']:.2f} GiB {r['source']}->{r['target']}"
        table.add_row(label, "ucp", f"{u['seconds']:.2f} ({u['seconds_min']:.2f}-{u['seconds_max']:.2f})", f"{u['peak_rss_gib']:.2f}", f"{u['growth_gib']:.2f}",
                      f"{u['shard_gib']:.2f}", str(u["ok"] and r["identical"]), f"{u['seconds'] / d['seconds']:.2f}",
                      f"{u['growth_gib'] / max(d['growth_gib'], 1e-9):.2f}")
        table.add_row("", "dcp", f"{d['seconds']:.2f} ({d['seconds_min']:.2f}-{d['seconds_max']:.2f})", f"{d['peak_rss_gib']:.2f}", f"{d['growth_gib']:.2f}",
                      f"{d['shard_gib']:.2f}", str(d["ok"]), "", "")
    Console(width=150).print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
