"""Benchmark: bringing back a lost rank's checkpoint arrays from peers' memory vs from the remote store.

W gloo processes save a checkpoint (``--mib`` MiB per rank, one sharded matrix) into a
node-local directory and replicate it with :class:`ucp.replication.replicas.ReplicaManager`
(memory tiers, ``--replicas`` peer copies, Gemini groups); a copy of the checkpoint
stands for the remote store, once on the temporary disk (its page cache dropped before
every read with ``posix_fadvise``, so reads hit the disk) and once on ``/dev/shm``.
Then the arrays of ``--lost`` ranks are deleted from the local checkpoint and brought
back, in the same processes, twice per repeat:

- **peers**: ``ReplicaManager.recover(path, rereplicate=False)``: every damaged array is
  sent over torch.distributed from the fastest surviving replica (a peer's memory; the lost
  rank's own memory copy is dropped first, as it would die with the rank) to its writer
  rank, checked against its xxh3 digest and written back (fsync);
- **remote**: each writer rank reads its lost arrays' files from the remote store copy,
  checks the same digests and writes them back the same way (what a job without replicas does).

Times are the slowest rank's, barrier to barrier, median of ``--repeats``; ratio = remote /
peers (above 1: peers are faster).

    python ucp/tools/bench/replica_recovery.py                     # 4 ranks, 64 MiB each, 1 lost
    python ucp/tools/bench/replica_recovery.py --local shm --lost 1,3    # write-back to /dev/shm, 2 ranks lost
    python ucp/tools/bench/replica_recovery.py --mib 16 --repeats 1 --json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ucp.integrations.launch import free_port


def _drop_cache(root: str) -> None:
    """Ask the kernel to forget the cached pages of every file under ``root`` (no root needed)."""
    for folder, _, names in os.walk(root):
        for name in names:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _timed(fn) -> float:
    """Slowest rank's time of a collective step, barrier to barrier."""
    dist.barrier()
    started = time.perf_counter()
    fn()
    dist.barrier()
    box = [time.perf_counter() - started]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, box[0])
    return max(out)


def _worker(rank: int, world: int, port: int, args: dict, stores: dict, out: str) -> None:
    from ucp.replication.replica_files import CheckpointFiles
    from ucp.replication.replica_tiers import MemoryTier
    from ucp.replication.replicas import ReplicaManager
    from ucp.checksum import digest
    from ucp.sharding import split_fragment_map
    from ucp.spec import LogicalTensor

    import ucp

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        cols = 1024
        rows = args["mib"] * (1 << 20) // (4 * cols) * world  # --mib per rank
        logical = {"w": LogicalTensor("w", (rows, cols), "float32")}
        spec = split_fragment_map(logical, rank=rank, world_size=world)
        torch.manual_seed(rank)
        state = {"w": torch.randn(rows // world, cols)}
        local = os.path.join(args["local_root"], "step")
        ucp.save(state, local, spec=spec, process_group=dist.group.WORLD)
        tier = MemoryTier(capacity_bytes=(args["replicas"] + 2) * rows * cols * 4 // world + (64 << 20))
        replicas = ReplicaManager(tiers=[tier], replicas=args["replicas"], node=f"n{rank}")
        rmap = replicas.replicate(local)
        lost = [k for k, r in rmap.arrays.items() if r.owner in args["lost"]]
        lost_bytes = sum(rmap.arrays[k].nbytes for k in lost)
        if rank == 0:
            for root in stores.values():
                shutil.copytree(local, os.path.join(root, "step"))
        dist.barrier()
        files = CheckpointFiles(local)

        def lose() -> None:
            if rank == 0:
                for key in lost:
                    shutil.rmtree(os.path.join(local, "data", key))
            for key in lost:  # a lost rank's own memory copies die with it: peers must send them
                if rmap.arrays[key].owner == rank:
                    tier.discard(rmap.checkpoint, key)
            dist.barrier()

        def from_remote(root: str) -> None:
            remote = CheckpointFiles(os.path.join(root, "step"))
            for key in lost:
                rec = rmap.arrays[key]
                if rec.owner == rank:
                    blob = remote.read_blob(rec)
                    assert digest(blob) == rec.digest, key
                    files.write_array(rec, blob)

        results: dict[str, list[float]] = {"peers": []}
        for name in stores:
            results[f"remote {name}"] = []
        for _ in range(args["repeats"]):
            lose()
            results["peers"].append(_timed(lambda: replicas.recover(local, rereplicate=False)))
            for name, root in stores.items():
                lose()
                if rank == 0 and name == "tmp disk":
                    _drop_cache(os.path.join(root, "step"))
                results[f"remote {name}"].append(_timed(lambda root=root: from_remote(root)))
        loaded = ucp.load(local, spec=spec)
        assert torch.equal(loaded["w"], state["w"])
        if rank == 0:
            with open(out, "w") as fh:
                json.dump({"lost_bytes": lost_bytes, "lost_arrays": len(lost),
                           "seconds": {k: statistics.median(v) for k, v in results.items()}}, fh)
    finally:
        dist.destroy_process_group()


def run(*, world: int = 4, mib: int = 64, lost: tuple[int, ...] = (1,), replicas: int = 1,
        repeats: int = 3, local: str = "disk") -> dict:
    """Run the benchmark; return ``{"lost_bytes", "seconds": {method: s}, "ratios": {...}}``.

    ``local``: where the node-local checkpoint lives (``disk``: the temporary directory;
    ``shm``: /dev/shm, so the write-back costs little and the sources show).
    """
    work = tempfile.mkdtemp(prefix="ucp-replica-bench-")
    stores = {"tmp disk": os.path.join(work, "remote")}
    if os.path.isdir("/dev/shm"):
        stores["/dev/shm"] = tempfile.mkdtemp(prefix="ucp-replica-bench-", dir="/dev/shm")
    local_root = tempfile.mkdtemp(prefix="ucp-replica-local-", dir="/dev/shm" if local == "shm" else work)
    out = os.path.join(work, "result.json")
    try:
        args = {"mib": mib, "lost": list(lost), "replicas": replicas, "repeats": repeats, "local_root": local_root}
        mp.start_processes(_worker, args=(world, free_port(), args, stores, out), nprocs=world,
                           start_method="spawn")
        with open(out) as fh:
            result = json.load(fh)
    finally:
        for root in (work, local_root, *stores.values()):
            shutil.rmtree(root, ignore_errors=True)
    peers = result["seconds"]["peers"]
    result["ratios"] = {k: v / peers for k, v in result["seconds"].items() if k != "peers"}
    result.update(world=world, mib_per_rank=mib, lost_ranks=list(lost), replicas=replicas, repeats=repeats,
                  local=local)
    return result


def render(result: dict) -> str:
    mib = result["lost_bytes"] / (1 << 20)
    lines = [f"{result['world']} ranks x {result['mib_per_rank']} MiB, lost ranks {result['lost_ranks']} "
             f"({result['lost_arrays']} arrays, {mib:.1f} MiB), {result['replicas']} peer replica(s), "
             f"median of {result['repeats']}, local checkpoint on {result['local']}",
             "", "| recovered from | seconds | MiB/s | remote / peers |", "| --- | ---: | ---: | ---: |"]
    for name, seconds in result["seconds"].items():
        ratio = "1.00" if name == "peers" else f"{result['ratios'][name]:.2f}"
        lines.append(f"| {name} | {seconds:.3f} | {mib / seconds:.0f} | {ratio} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", type=int, default=4, help="gloo processes (default 4)")
    parser.add_argument("--mib", type=int, default=64, help="checkpoint MiB per rank (default 64)")
    parser.add_argument("--lost", default="1", help="comma-separated ranks whose arrays are lost (default 1)")
    parser.add_argument("--replicas", type=int, default=1, help="peer copies per array (default 1)")
    parser.add_argument("--repeats", type=int, default=3, help="repeats, median reported (default 3)")
    parser.add_argument("--local", choices=("disk", "shm"), default="disk",
                        help="where the node-local checkpoint is written back (default: the temporary disk)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    try:
        lost = tuple(int(r) for r in args.lost.split(",") if r.strip())
    except ValueError:
        print(f"replica_recovery: error: --lost must list rank numbers, got {args.lost!r}", file=sys.stderr)
        return 2
    if args.world < 2 or args.mib < 1 or args.repeats < 1 or not lost or any(not 0 <= r < args.world for r in lost):
        print("replica_recovery: error: need --world >= 2, --mib >= 1, --repeats >= 1 and lost ranks below --world",
              file=sys.stderr)
        return 2
    result = run(world=args.world, mib=args.mib, lost=lost, replicas=args.replicas, repeats=args.repeats,
                 local=args.local)
    print(json.dumps(result, indent=1) if args.json else render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
