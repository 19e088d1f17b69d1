"""The distributed-optimizer scenario of ``ucl_reshard.py``: a zero=1 state saved by ucp and by DCP, resharded.

S gloo processes of a Megatron ``tp x dp`` run with the distributed optimizer (the state of
:mod:`ucp.tools.bench.megatron_state`: bf16 parameters, fp32 masters and Adam moments in flat
dp partitions) save it with ucp (the shipped ``megatron-gpt`` UCL preset, zero=1) and with
DCP (Megatron-core's own form for it, see ``megatron_state``), one after the other in the
same processes; T processes of another layout then load it with each system, interleaved
(the order alternating every repeat, so drift in a busy machine hits both alike), and check that every tensor each system gave them is bitwise the expected one (so
both gave identical tensors; a digest comparison across the systems says the same).

Per system it reports fragments (ucp: the manifest's; DCP: the chunks in its ``.metadata``; and
how many of them hold optimizer states), metadata bytes (ucp: ``manifest.json`` plus any
metadata shards, ``data/[<token>/]meta/``; DCP: ``.metadata``), save and load time (slowest
rank; median and min-max over ``repeats`` saves and loads, each interleaved with the other
system's, the order alternating), and peak RSS per rank in each phase
(sampled every 5 ms with psutil, since both systems run in the same process).

    run_zero1("tp=2,dp=4,zero=1", "tp=2,dp=3,zero=1", 0.01, "/dev/shm/x", repeats=1)
"""

from __future__ import annotations

import functools
import gc
import hashlib
import json
import os
import shutil
import statistics
import threading
import time
import warnings

import psutil
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ucp.tools.bench.megatron_state import (
    STATES, check_layout, dcp_state, drop_replicas, flat_part, local_params, model_for, rank_state, state_bytes,
    zero_state,
)
from ucp.layout import Layout
from ucp.stores import StoreOptions

__all__ = ["run_zero1", "print_zero1", "metadata_summary", "init_gloo", "free_port", "PeakRss"]


class PeakRss:
    """Peak resident memory of this process while the block runs (sampled; bytes)."""

    def __enter__(self) -> "PeakRss":
        self._proc, self._stop = psutil.Process(), threading.Event()
        self.start = self.peak = self._proc.memory_info().rss
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self._proc.memory_info().rss)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)


def _program(cfg) -> str:
    return f"{cfg.megatron_program()},states={'|'.join(STATES)}"


def _mesh(layout: Layout):
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (layout.dp, layout.tp), mesh_dim_names=("dp", "tp"))


def init_gloo(rank: int, world: int, port: int) -> None:
    """This process as ``rank`` of a gloo process group on localhost."""
    # Megatron-core hands DCP ShardedTensors for the flat partitions; torch says they are deprecated
    warnings.filterwarnings("ignore", message="Please use DTensor instead", category=FutureWarning)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)


def _profiled(fn, label: str):
    """``fn`` under cProfile when ``UCP_BENCH_PROFILE`` names a folder (stats to ``<label>-r<rank>.prof``).

    For finding where a rank's time goes: ``python -m pstats`` or snakeviz open the files. Off by
    default, since the profiler itself slows the Python-heavy parts several-fold.
    """
    folder = os.environ.get("UCP_BENCH_PROFILE")
    if not folder:
        return fn

    def run():
        import cProfile

        os.makedirs(folder, exist_ok=True)
        with cProfile.Profile() as prof:
            fn()
        prof.dump_stats(os.path.join(folder, f"{label}-r{dist.get_rank() if dist.is_initialized() else 0}.prof"))

    return run


def _timed(fn) -> tuple[float, int, int]:
    """``(seconds, peak rss, rss at start)`` of ``fn()``, started together on every rank."""
    gc.collect()
    dist.barrier()
    with PeakRss() as rss:
        start = time.perf_counter()
        fn()
        seconds = time.perf_counter() - start
    return seconds, rss.peak, rss.start


def _ucp_tree(params: dict, flats: dict) -> dict:
    return {"model": dict(params), "optim": {s: {"dense": f} for s, f in flats.items()}}


def _save_worker(rank: int, world: int, port: int, cfg, layout: str, ucp_dir: str, dcp_dir: str, out: str,
                 repeats: int = 1, store_options: str = "") -> None:
    import torch.distributed.checkpoint as dcp

    import ucp
    import ucp.api  # ucp.save imports it lazily; imported here, as DCP is above, not inside the timing

    init_gloo(rank, world, port)
    try:
        lay = Layout.parse(layout)
        options = StoreOptions.parse(store_options)
        params, flats = rank_state(cfg, lay, rank)
        state = drop_replicas(dcp_state(cfg, lay, rank, params, flats, _mesh(lay)), lay, rank)
        saves = {
            "ucp": lambda path: ucp.save(_ucp_tree(params, flats), path, program=_program(cfg), layout=lay,
                                         process_group=dist.group.WORLD, store_options=options),
            "dcp": lambda path: dcp.save(state, checkpoint_id=path),
        }
        dirs = {"ucp": ucp_dir, "dcp": dcp_dir}
        report: dict[str, list] = {"ucp": [], "dcp": []}
        # Interleaved, the order alternating, as the loads; every repeat but the last is removed
        # (the loads read the last one), so only one copy of each checkpoint is kept at a time.
        for rep in range(repeats):
            for system in (("ucp", "dcp") if rep % 2 == 0 else ("dcp", "ucp")):
                path = dirs[system] if rep == repeats - 1 else f"{dirs[system]}-{rep}"
                report[system].append(_timed(_profiled(functools.partial(saves[system], path), f"save-{system}-{rep}")))
                dist.barrier()
                if rank == 0 and rep < repeats - 1:
                    shutil.rmtree(path)
        dist.barrier()
        with open(os.path.join(out, f"save-{rank}.json"), "w") as fh:
            json.dump(report, fh)
    finally:
        dist.destroy_process_group()


def _check(cfg, lay: Layout, rank: int, params: dict, flats: dict) -> tuple[bool, str]:
    """Bitwise against the expected values; and a digest of every tensor (to compare the systems)."""
    ok, digest = True, hashlib.blake2b(digest_size=16)
    expected_params = local_params(cfg, lay, rank)
    ok &= sorted(params) == sorted(expected_params)
    for key in sorted(params):
        ok &= torch.equal(params[key].view(torch.int16), expected_params[key].view(torch.int16))
        digest.update(params[key].view(torch.int16).numpy().tobytes())
    del expected_params
    for state in STATES:
        expected = flat_part(cfg, lay, rank, state)
        ok &= torch.equal(flats[state].view(torch.int32), expected.view(torch.int32))
        digest.update(flats[state].view(torch.int32).numpy().tobytes())
    return bool(ok), digest.hexdigest()


def _load_worker(rank: int, world: int, port: int, cfg, layout: str, ucp_dir: str, dcp_dir: str, out: str,
                 repeats: int, store_options: str = "") -> None:
    import torch.distributed.checkpoint as dcp

    from ucp import ucl
    import ucp

    init_gloo(rank, world, port)
    try:
        lay = Layout.parse(layout)
        report = {}
        # ucp: allocate what the program says this rank holds, then load (compile included) into it
        with ucp.CheckpointReader(ucp_dir) as reader:
            logical = reader.logical()
        into = {k: torch.zeros(t.shape, dtype=getattr(torch, t.dtype))
                for k, t in ucl.local_shapes(ucl.spec_for_load(_program(cfg), lay, rank, logical)).items()}
        # Loaded into the tree the save wrote (model/..., optim/<state>/dense): a flat dict of "a/b"
        # keys is filled too, but ucp.load then merges the saved tree's nested dicts into it.
        tree = _nested(into)
        # DCP: the same shapes, described as Megatron-core describes them (built inside the timing)
        dcp_params, dcp_flats = zero_state(cfg, lay, rank)
        mesh = _mesh(lay)
        options = StoreOptions.parse(store_options)
        loads = {"ucp": lambda: ucp.load(ucp_dir, into=tree, program=_program(cfg), layout=lay, rank=rank,
                                         store_options=options),
                 "dcp": lambda: dcp.load(dcp_state(cfg, lay, rank, dcp_params, dcp_flats, mesh), checkpoint_id=dcp_dir)}
        runs: dict[str, list] = {"ucp": [], "dcp": []}
        for rep in range(repeats):  # interleaved, the order alternating, so drift hits both systems alike
            for system in (("ucp", "dcp") if rep % 2 == 0 else ("dcp", "ucp")):
                runs[system].append(_timed(_profiled(loads[system], f"load-{system}-{rep}")))
        params = {k.removeprefix("model/"): t for k, t in into.items() if k.startswith("model/")}
        flats = {s: into[f"optim/{s}/dense"] for s in STATES}
        report["ucp"] = {"runs": runs["ucp"], "check": _check(cfg, lay, rank, params, flats)}
        report["dcp"] = {"runs": runs["dcp"], "check": _check(cfg, lay, rank, dcp_params, dcp_flats)}
        dist.barrier()
        with open(os.path.join(out, f"load-{rank}.json"), "w") as fh:
            json.dump(report, fh)
    finally:
        dist.destroy_process_group()


def _nested(flat: dict) -> dict:
    """``{"a/b": t}`` as ``{"a": {"b": t}}`` (the same tensors)."""
    tree: dict = {}
    for key, value in flat.items():
        *parents, leaf = key.split("/")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree


def free_port() -> int:
    """A TCP port free on localhost now (for a process group's rendezvous): see integrations.launch.free_port."""
    from ucp.integrations.launch import free_port as launcher_free_port

    return launcher_free_port()


def _dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def metadata_summary(ucp_dir: str, dcp_dir: str) -> dict:
    """Fragments and metadata bytes of each checkpoint (see the module doc)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    import ucp

    summary = ucp.describe(ucp_dir)
    # format 2 (saves of many ranks) adds metadata shards: data/[<token>/]meta/g<k>.json
    ucp_meta = os.path.getsize(os.path.join(ucp_dir, "manifest.json")) + sum(
        _dir_bytes(d) for d, _, _ in os.walk(ucp_dir) if os.path.basename(d) == "meta")
    metadata = FileSystemReader(dcp_dir).read_metadata()
    chunks = {k: len(m.chunks) for k, m in metadata.state_dict_metadata.items() if isinstance(m, TensorStorageMetadata)}
    optimizer = tuple(f"/{s}" for s in STATES)
    return {
        "ucp": {"fragments": sum(t.fragments for t in summary.tensors), "tensors": len(summary.tensors),
                "optimizer_fragments": sum(t.fragments for t in summary.tensors if t.name.endswith(optimizer)),
                "metadata_bytes": ucp_meta, "disk_bytes": _dir_bytes(ucp_dir)},
        "dcp": {"fragments": sum(chunks.values()), "storage_entries": len(metadata.storage_data),
                "optimizer_fragments": sum(n for k, n in chunks.items() if k.startswith("optimizer.")),
                "tensors": len(metadata.state_dict_metadata),
                "metadata_bytes": os.path.getsize(os.path.join(dcp_dir, ".metadata")),
                "disk_bytes": _dir_bytes(dcp_dir)},
    }


def _load_ranks(out: str, prefix: str, world: int) -> list[dict]:
    ranks = []
    for r in range(world):
        with open(os.path.join(out, f"{prefix}-{r}.json")) as fh:
            ranks.append(json.load(fh))
    return ranks


def run_zero1(source: str, target: str, gib: float, workdir: str, *, repeats: int = 1, store_options: str = "") -> dict:
    """Save ``source`` (a tp x dp zero=1 layout) with both systems, load into ``target``; the report dict.

    ``store_options``: ucp's :class:`~ucp.stores.StoreOptions` in their string form (e.g.
    ``"pack_max_bytes=0"`` for an array per fragment instead of packs), for saves and loads.
    """
    src, tgt = check_layout(Layout.parse(source)), check_layout(Layout.parse(target))
    cfg = model_for(gib, tp=max(src.tp, tgt.tp))
    ucp_dir, dcp_dir, out = (os.path.join(workdir, n) for n in ("ucp", "dcp", "reports"))
    os.makedirs(out, exist_ok=True)
    mp.spawn(_save_worker, args=(src.world_size, free_port(), cfg, str(src), ucp_dir, dcp_dir, out, repeats, store_options),
             nprocs=src.world_size, join=True)
    mp.spawn(_load_worker, args=(tgt.world_size, free_port(), cfg, str(tgt), ucp_dir, dcp_dir, out, repeats, store_options),
             nprocs=tgt.world_size, join=True)
    saves, loads = _load_ranks(out, "save", src.world_size), _load_ranks(out, "load", tgt.world_size)
    meta = metadata_summary(ucp_dir, dcp_dir)
    systems = {}
    for system in ("ucp", "dcp"):
        runs = [r[system]["runs"] for r in loads]
        # a save or load ends when its slowest rank does
        save_s = [max(r[system][i][0] for r in saves) for i in range(repeats)]
        load_s = [max(rk[i][0] for rk in runs) for i in range(repeats)]
        systems[system] = {
            **meta[system],
            "save_seconds": statistics.median(save_s),
            "save_seconds_min": min(save_s),
            "save_seconds_max": max(save_s),
            "load_seconds": statistics.median(load_s),
            "load_seconds_min": min(load_s),
            "load_seconds_max": max(load_s),
            "save_peak_rss_gib": max(run[1] for r in saves for run in r[system]) / 2**30,
            "save_rss_growth_gib": max(run[1] - run[2] for r in saves for run in r[system]) / 2**30,
            "load_peak_rss_gib": max(run[1] for rk in runs for run in rk) / 2**30,
            "load_rss_growth_gib": max(run[1] - run[2] for rk in runs for run in rk) / 2**30,
            "correct": all(r[system]["check"][0] for r in loads),
        }
    ratios = {k: systems["ucp"][k] / max(systems["dcp"][k], 1e-12)
              for k in ("fragments", "metadata_bytes", "save_seconds", "load_seconds", "save_peak_rss_gib",
                        "load_peak_rss_gib", "disk_bytes")}
    nbytes = state_bytes(cfg)
    return {"kind": "zero1", "source": str(src), "target": str(tgt), "model": str(cfg), "store_options": store_options,
            "state_gib": sum(nbytes.values()) / 2**30, "optimizer_gib": nbytes["optimizer"] / 2**30,
            "dir": workdir, "systems": systems, "ratios": ratios,
            "identical": all(r["ucp"]["check"][1] == r["dcp"]["check"][1] for r in loads)}


def _spread(system: dict, key: str) -> str:
    """``median (min-max)`` of one measure."""
    return f"{system[key]:.2f} ({system[key + '_min']:.2f}-{system[key + '_max']:.2f})"


def print_zero1(results: list[dict]) -> None:
    """The side-by-side table of :func:`run_zero1` results (rich)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Distributed optimizer (zero=1) resharding: ucp + UCL vs torch.distributed.checkpoint")
    for col in ("where", "system", "fragments (optimizer)", "metadata bytes", "save s (min-max)", "load s (min-max)",
                "save peak RSS/rank GiB", "load peak RSS/rank GiB", "disk GiB", "correct"):
        table.add_column(col)
    for r in results:
        label = f"{os.path.dirname(r['dir'])}\n{r['state_gib']:.2f} GiB {r['source']} -> {r['target']}"
        for system in ("ucp", "dcp"):
            s = r["systems"][system]
            table.add_row(label if system == "ucp" else "", system,
                          f"{s['fragments']:,} ({s['optimizer_fragments']:,})", f"{s['metadata_bytes']:,}",
                          _spread(s, "save_seconds"), _spread(s, "load_seconds"), f"{s['save_peak_rss_gib']:.2f}",
                          f"{s['load_peak_rss_gib']:.2f}", f"{s['disk_bytes'] / 2**30:.2f}",
                          str(s["correct"] and r["identical"]))
        q = r["ratios"]
        table.add_row("", "ucp/dcp", f"{q['fragments']:.2f}", f"{q['metadata_bytes']:.2f}", f"{q['save_seconds']:.2f}",
                      f"{q['load_seconds']:.2f}", f"{q['save_peak_rss_gib']:.2f}", f"{q['load_peak_rss_gib']:.2f}",
                      f"{q['disk_bytes']:.2f}", "")
    Console(width=170).print(table)
