"""Scale simulator: every rank's fragment map and manifest entries for 70B-405B layouts, without tensors.

For each scenario (a model, a layout, with and without the distributed optimizer) it compiles
the rank's fragment map from the shipped ``megatron-gpt`` UCL program
(:func:`ucp.ucl.bind.spec_for_save`), plans the fragments the writer would record
(:func:`ucp.save_plan.plan_save`, the writer's own plan: spreading over replicas, chunking, packing) and
serialises them as the manifest would; then it plans a reshard load into another layout
(``spec_for_load`` plus the reader's load plan, :func:`ucp.load_plan.plan_load`, against the saved fragments). It reports

* fragments in all and per rank (max over the ranks computed), and what the same layout cost
  with one fragment per contiguous run (the decomposition before ``ucp.ucl.flat`` made boxes);
* the manifest's bytes in format 1 (one ``manifest.json``, which every loading rank reads) and
  in format 2 (docs/FORMAT.md, section 9.1: a root plus one metadata shard per group of
  ``ceil(sqrt(W))`` ranks): the root's bytes, a shard's, and what one loading rank reads - the
  root and the shards of the tensors it loads (those of the groups of its pipeline stage);
* per-rank plan time for the save (compile + write plan) and for the reshard load (compile +
  overlap plan), the slowest rank computed, in CPU seconds of this process (wall time on a
  shared machine measures the neighbours).

Computing all 16,384 ranks of a layout takes hours on two cores, so ranks are sampled
(``--samples``: rank 0, the last rank and a seeded random choice) and totals are the sampled
mean times the world size; the output says so. A loading rank's overlap plan needs the
fragments of every source rank it may read: those of its pipeline stage, at its own
tensor-parallel rank and at tp rank 0, which saves the members flat buffers share
(:func:`load_sources`); the simulator checks that they cover every region the rank loads
exactly, except the few norms replicated over tp (each written by one rank anywhere in the
stage), which it counts as ``load_unplanned_pieces``. Where that is more than
``--max-load-sources`` ranks to compute (default 256: two tp ranks of a dp=128 stage), only
the loading rank's own compile is timed, marked ``(compile)``.

    python ucp/tools/bench/scale_sim.py                          # every scenario
    python ucp/tools/bench/scale_sim.py --scenarios llama70b-512 --samples 8 --json
"""

from __future__ import annotations

import argparse
import json
import math
import pickle
import random
import sys
import time
from dataclasses import dataclass, field

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from ucp import ucl
from ucp.ucl.bind import local_shapes, spec_for_load, spec_for_save
from ucp.ucl.declared import declared_logical
from ucp.ucl.flat import contiguous_count
from ucp.geometry import Box, FlatRange
from ucp.layout import Layout
from ucp.load_plan import LoadRequest, plan_load
from ucp.manifest import TensorEntry
from ucp.metadata_shards import GroupPlan, GroupSummary
from ucp.save_plan import plan_save
from ucp.spec import SPREAD_MIN_BYTES, LogicalTensor

LLAMA_70B = dict(num_layers=80, hidden_size=8192, ffn_hidden_size=28672, heads=64, kv_heads=8, vocab_size=128256)
# 126 layers over 16 stages: Llama 3's own pipeline put one layer fewer on the first and last stage.
LLAMA_405B = dict(num_layers=126, hidden_size=16384, ffn_hidden_size=53248, heads=128, kv_heads=8,
                  vocab_size=128256, stage_layers_list=(7,) + (8,) * 14 + (7,))
MIXTRAL_8X22B = dict(num_layers=56, hidden_size=6144, ffn_hidden_size=16384, heads=48, kv_heads=8, vocab_size=32768,
                     num_experts=8)


@dataclass(frozen=True)
class Scenario:
    """A model (preset parameters), the layout it saves under and the layout a reshard load uses."""

    name: str
    params: dict
    save: str
    load: str


SCENARIOS = {s.name: s for s in [
    Scenario("llama70b-512", LLAMA_70B, "tp=8,pp=8,dp=8", "tp=8,pp=8,dp=6"),
    Scenario("llama70b-16k", LLAMA_70B, "tp=8,pp=16,dp=128", "tp=8,pp=16,dp=96"),
    Scenario("llama405b-8k", LLAMA_405B, "tp=8,pp=16,dp=64", "tp=8,pp=16,dp=48"),
    Scenario("mixtral8x22b-ep8", MIXTRAL_8X22B, "tp=2,pp=4,dp=64,ep=8", "tp=2,pp=4,dp=48,ep=8"),
]}
ZERO = {"zero=0": 0, "zero=1": 1}


def with_dtypes(logical: dict[str, LogicalTensor]) -> dict[str, LogicalTensor]:
    """Megatron's dtypes: bf16 parameters, fp32 optimizer states (master copy, moments, step)."""
    states = ("/fp32", "/exp_avg", "/exp_avg_sq", "/step")
    return {n: LogicalTensor(n, t.shape, "float32" if n.endswith(states) or n == "optim/step" else "bfloat16")
            for n, t in logical.items()}


def sample_ranks(world: int, samples: int, seed: int = 0) -> list[int]:
    """Rank 0, the last rank and a seeded random choice: ``samples`` ranks (all when that is the world)."""
    if samples >= world:
        return list(range(world))
    chosen = {0, world - 1} | set(random.Random(seed).sample(range(1, world - 1), max(0, samples - 2)))
    return sorted(chosen)


@dataclass
class RankSave:
    rank: int
    fragments: int
    run_fragments: int  # what one fragment per contiguous run of the logical tensor would cost
    bytes: int  # the rank's fragment entries, as manifest JSON
    state_bytes: int
    seconds: float
    frags: dict = field(repr=False, default_factory=dict)
    replicas: dict = field(repr=False, default_factory=dict)  # logical name -> ranks holding its pieces


def _fragment_json_bytes(frags: dict) -> int:
    return sum(len(json.dumps(f.to_dict(), separators=(",", ":"))) + 1 for fl in frags.values() for f in fl)


def save_rank(prog, lay: Layout, rank: int, logical: dict) -> RankSave:
    """One rank's save: its map (compiled from local shapes, as the writer's caller does) and fragments."""
    local = {k: (lt.shape, lt.dtype) for k, lt in local_shapes(spec_for_load(prog, lay, rank, logical)).items()}
    start = time.process_time()
    fmap = spec_for_save(prog, lay, rank, local, shapes=logical)
    frags = plan_save(fmap, rank=rank).fragments()
    seconds = time.process_time() - start
    # before ucl.flat made boxes, a flat buffer's share of a box was one piece per contiguous run
    runs = sum(map(len, frags.values())) + sum(
        contiguous_count(p.target, logical[p.logical].shape) - 1
        for spec in fmap.tensors.values() for p in spec.pieces
        if isinstance(p.local, FlatRange) and isinstance(p.target, Box))
    # the rank's state tree refers to each local tensor once: {"key": {"$tensor": "key"}}
    state = len(json.dumps({k: {"$tensor": k} for k in local}, separators=(",", ":")))
    replicas = {p.logical: spec.replicas for spec in fmap.tensors.values() for p in spec.pieces}
    return RankSave(rank, sum(map(len, frags.values())), runs, _fragment_json_bytes(frags), state, seconds, frags,
                    replicas)


def load_sources(source: Layout, target: Layout, rank: int) -> list[int]:
    """The source ranks whose fragments a loading rank's plan is computed against.

    Its pipeline stage's ranks at its own tp rank and at tp rank 0 (which saves the members a
    flat buffer shares with other tp ranks): all of its stage when tp changes.
    """
    c = target.coords(rank)
    same_tp = source.tp == target.tp
    return [r for r in range(source.world_size)
            if source.coords(r).pp == c.pp and (not same_tp or source.coords(r).tp in (c.tp, 0))]


def load_rank(prog, source: Layout, target: Layout, rank: int, logical: dict, saved: dict[int, RankSave],
              progress=None, *, max_sources: int) -> dict:
    """A reshard load of ``rank`` of ``target``: plan time, and the metadata it overlaps.

    A tensor replicated over tp as well as dp (a norm) is written once, by a rank anywhere in the
    stage; when that rank is not among :func:`load_sources` its piece is counted in
    ``unplanned`` (one small copy each) instead of planned; any other gap is an error. With more
    than ``max_sources`` source ranks to compute, only the rank's own map is compiled and timed.
    """
    peers = load_sources(source, target, rank)
    if len(peers) > max_sources:
        start = time.process_time()
        fmap = spec_for_load(prog, target, rank, logical)
        return {"rank": rank, "seconds": time.process_time() - start, "overlaps": False,
                "tensors": {p.logical for spec in fmap.tensors.values() for p in spec.pieces}}
    for r in peers:
        if r not in saved:
            saved[r] = save_rank(prog, source, r, logical)
            if progress is not None:
                progress()
    by_tensor: dict[str, list] = {}
    for r in peers:
        for name, fl in saved[r].frags.items():
            by_tensor.setdefault(name, []).extend(fl)
    saved_entries = {name: TensorEntry(name, logical[name].dtype, logical[name].shape, tuple(fl))
                     for name, fl in by_tensor.items()}
    start = time.process_time()
    fmap = spec_for_load(prog, target, rank, logical)
    ops, touched, unplanned = 0, set(), 0
    beyond_dp = source.dp * source.cp  # a piece held by more ranks is replicated over tp too
    for spec in fmap.tensors.values():
        for piece in spec.pieces:
            if isinstance(piece.target, Box) and piece.target.ndim == 0:
                continue  # a scalar every rank holds (the step): one fragment, written by any stage
            found = plan_load(saved_entries, (LoadRequest(piece.logical, piece.target),)).items \
                if piece.logical in saved_entries else ()
            if not found and saved[peers[0]].replicas.get(piece.logical, 1) > beyond_dp:
                unplanned += 1
                continue
            if sum(op.overlap.numel for op in found) != piece.target.numel:
                raise SystemExit(f"rank {rank} of {target}: the source ranks of its pipeline stage do not cover "
                                 f"{piece.logical} {piece.target}: a reshard that changes pp is not simulated")
            ops += len(found)
            touched |= {item.fragment.rank for item in found}
    seconds = time.process_time() - start
    shard_bytes = sum(saved[r].bytes + saved[r].state_bytes for r in touched)
    return {"rank": rank, "seconds": seconds, "copy_ops": ops, "source_ranks": len(touched),
            "shard_bytes": shard_bytes, "unplanned": unplanned, "overlaps": True,
            "tensors": {p.logical for spec in fmap.tensors.values() for p in spec.pieces}}


def shard_holders(prog, source: Layout, logical: dict) -> dict[str, list[int]]:
    """Logical tensor -> the format-2 shards (groups of ranks) that may hold its fragments: an upper bound.

    A tensor's fragments are written by ranks of the pipeline stages that hold it; its shards
    are the groups those stages' ranks fall in (pp is the outermost rank dimension, so each
    stage is a run of consecutive ranks). Which stages hold a tensor comes from compiling one
    rank per stage and expert-parallel rank without the distributed optimizer (which only
    divides a stage's tensors among its data-parallel ranks). A tensor that several stages hold
    and that is smaller than one spread part (the step) is written by one rank: one shard,
    numbered -1 (it is not known which).
    """
    plan = GroupPlan(source.world_size)
    per_stage = source.world_size // source.pp
    whole = Layout.from_dict({**source.to_dict(), "zero": 0})
    held: dict[str, set[int]] = {}
    for stage in range(source.pp):
        for ep in range(source.ep):
            fmap = spec_for_load(prog, whole, whole.rank_of(pp=stage, dp=ep), logical)
            for spec in fmap.tensors.values():
                for piece in spec.pieces:
                    held.setdefault(piece.logical, set()).add(stage)
    holders = {}
    for name, stages in held.items():
        t = logical[name]
        if len(stages) > 1 and math.prod(t.shape) * (4 if t.dtype == "float32" else 2) < SPREAD_MIN_BYTES:
            holders[name] = [-1]
            continue
        holders[name] = sorted({g for st in stages for g in
                                range(plan.group_of(st * per_stage), plan.group_of((st + 1) * per_stage - 1) + 1)})
    return holders


def sharded_sizes(holders: dict[str, list[int]], logical: dict, source: Layout, sampled: list,
                  loading: list[set[str]]) -> dict:
    """Format 2's root bytes, mean shard bytes and the most one loading rank reads (root + its shards)."""
    plan = GroupPlan(source.world_size)
    ref = len(json.dumps({"key": "data/meta/g00000.json", "ranks": [0, plan.size], "nbytes": 1 << 20,
                          "xxh3_64": "0" * 16}, separators=(",", ":"))) + 1
    root = len(json.dumps({n: {"dtype": t.dtype, "shape": list(t.shape), "shards": [abs(g) for g in holders.get(n, [])]}
                           for n, t in logical.items()}, separators=(",", ":"))) + plan.count * ref + 300
    # A shard holds its ranks' fragments and their state trees, data-parallel replicas' equal trees
    # written once ({"$same_as": rank}): one per distinct (tp, cp, pp) coordinate among its ranks.
    distinct = max(len({(c.tp, c.cp, c.pp) for c in map(source.coords, plan.ranks(g))})
                   for g in {0, plan.count // 2, plan.count - 1})
    tree = sum(s.state_bytes for s in sampled) / len(sampled)
    shard = int(plan.size * sum(s.bytes for s in sampled) / len(sampled) + distinct * tree
                + (plan.size - distinct) * 24)
    reads = [len({g for n in names for g in holders.get(n, ())}) for names in loading]
    summary = summary_bytes(holders, logical, source, sampled)
    return {"groups": plan.count, "group_ranks": plan.size, "root_bytes": root, "shard_bytes_mean": shard,
            "shards_read_max": max(reads, default=None),
            "read_bytes_max": root + max(reads) * shard if reads else None,
            "summary_bytes_max": summary, "rank0_receives_bytes": summary * (plan.count - 1),
            "messages_per_rank_max": max(plan.size, plan.count) - 1}


def summary_bytes(holders: dict[str, list[int]], logical: dict, source: Layout, sampled: list) -> int:
    """The largest group summary a leader sends rank 0 (pickled, as the save sends it), estimated.

    It holds, per tensor with fragments in the group, its dtype, shape, element count and
    coverage weight, and one digest per distinct replicated piece (``check-equal``): as many as
    the sampled ranks' replicated pieces times the tensor-parallel ranks a group spans.
    """
    plan = GroupPlan(source.world_size)
    per_group: dict[int, list[str]] = {}
    for name, groups in holders.items():
        for g in groups:
            per_group.setdefault(g, []).append(name)
    names = max(per_group.values(), key=len)
    replicated = max(sum(1 for n in s.replicas if s.replicas[n] > 1) for s in sampled)
    example = max(names, key=len)
    out = GroupSummary(0)
    for name in names:
        t = logical[name]
        out.logical[name] = (t.dtype, tuple(t.shape), 0)
        out.cover[name] = (math.prod(t.shape), (1 << 61) - 2)
    for i in range(replicated * min(source.tp, plan.size)):
        out.replicas[(f"{example}#{i}", "[0:16384, 0:16384]")] = ("0123456789abcdef", source.world_size - 1)
    return len(pickle.dumps(out))


def run_scenario(scenario: Scenario, zero: int, *, samples: int, load_samples: int, max_sources: int = 256,
                 progress=None) -> dict:
    prog = ucl.load_program("megatron-gpt", **scenario.params)
    source = Layout.parse(f"{scenario.save},zero={zero}")
    target = Layout.parse(f"{scenario.load},zero={zero}")
    logical = with_dtypes(declared_logical(prog, source))
    ranks = sample_ranks(source.world_size, samples)
    saved: dict[int, RankSave] = {}
    for r in ranks:
        saved[r] = save_rank(prog, source, r, logical)
        if progress is not None:
            progress()
    load_ranks = [target.world_size - 1] if load_samples == 1 else sample_ranks(target.world_size, load_samples, seed=1)
    loads = [load_rank(prog, source, target, r, logical, saved, progress, max_sources=max_sources)
             for r in load_ranks] if load_samples else []
    planned = [ld for ld in loads if ld["overlaps"]]
    sampled = [saved[r] for r in ranks]
    scale = source.world_size / len(sampled)
    header = len(json.dumps({n: {"dtype": t.dtype, "shape": list(t.shape), "fragments": []}
                             for n, t in logical.items()}, separators=(",", ":")))
    # dp replicas save identical trees: one tree per distinct rank of the other dimensions
    trees = source.world_size // source.dp
    state = int(sum(s.state_bytes for s in sampled) / len(sampled) * trees + (source.world_size - trees) * 24)
    manifest = header + int(sum(s.bytes for s in sampled) * scale) + state
    root = header + source.world_size * 40  # a root over per-rank shards: the logical index, one reference per rank
    v2 = sharded_sizes(shard_holders(prog, source, logical), logical, source, sampled,
                       [ld["tensors"] for ld in loads])
    return {
        "scenario": scenario.name, "layout": str(source), "load_layout": str(target), "world": source.world_size,
        "sampled_ranks": len(sampled), "exact": len(sampled) == source.world_size,
        "logical_tensors": len(logical),
        "fragments_total": int(sum(s.fragments for s in sampled) * scale),
        "fragments_per_rank_max": max(s.fragments for s in sampled),
        "fragments_per_rank_mean": round(sum(s.fragments for s in sampled) / len(sampled), 1),
        "run_fragments_per_rank_max": max(s.run_fragments for s in sampled),
        "manifest_bytes": manifest,
        "save_plan_s_max": round(max(s.seconds for s in sampled), 3),
        "load_plan_s_max": round(max(ld["seconds"] for ld in loads), 3) if loads else None,
        "load_ranks": len(loads),
        "load_overlaps_planned": bool(planned),  # False: the loading rank's compile only (too many sources)
        "load_source_ranks_max": max((ld["source_ranks"] for ld in planned), default=None),
        "load_copy_ops_max": max((ld["copy_ops"] for ld in planned), default=None),
        "load_unplanned_pieces_max": max((ld["unplanned"] for ld in planned), default=None),
        "sharded_read_bytes_max": root + max(ld["shard_bytes"] for ld in planned) if planned else None,
        "format2": v2,
    }


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB" if n >= 1e5 else f"{n / 1e3:,.1f} kB"


def _cells(r: dict) -> list[str]:
    load = "-" if r["load_plan_s_max"] is None else f"{r['load_plan_s_max']:.2f}"
    load += "" if r["load_overlaps_planned"] or r["load_plan_s_max"] is None else " (compile)"
    v2 = r["format2"]
    read = "-" if v2["read_bytes_max"] is None else f"{_mb(v2['read_bytes_max'])} ({v2['shards_read_max']})"
    return [r["scenario"], r["layout"], f"{r['world']:,} ({r['sampled_ranks']})", f"{r['fragments_total']:,}",
            f"{r['fragments_per_rank_max']:,}", f"{r['run_fragments_per_rank_max']:,}", _mb(r["manifest_bytes"]),
            f"{v2['groups']} x {v2['group_ranks']}", _mb(v2["root_bytes"]), _mb(v2["shard_bytes_mean"]), read,
            _mb(v2["rank0_receives_bytes"]),
            f"{r['save_plan_s_max']:.2f}", r["load_layout"], load]


COLUMNS = ["scenario", "layout", "ranks (sampled)", "fragments", "per rank (max)", "per rank, one per run",
           "format 1 manifest (read by every loading rank)", "format 2 groups x ranks", "root", "shard (mean)",
           "format 2 read per loading rank (shards)", "rank 0 receives (summaries)", "save plan s", "reshard load to", "load plan s"]


def markdown(rows: list[dict]) -> str:
    """The table as GitHub markdown (docs/BENCHMARKS.md)."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    return "\n".join(lines + ["| " + " | ".join(_cells(r)) + " |" for r in rows])


def table(rows: list[dict]) -> Table:
    out = Table(title="ucp metadata at scale (megatron-gpt preset; sampled ranks, totals extrapolated)")
    for col in COLUMNS:
        out.add_column(col, justify="left" if col in ("scenario", "layout", "reshard load to") else "right")
    for r in rows:
        out.add_row(*_cells(r))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated: " + ", ".join(SCENARIOS))
    parser.add_argument("--zero", default="zero=0,zero=1", help="zero=0 (no distributed optimizer), zero=1, or both")
    parser.add_argument("--samples", type=int, default=8, help="source ranks sampled per scenario (default 8)")
    parser.add_argument("--load-samples", type=int, default=1,
                        help="loading ranks planned per scenario (default 1: the last rank; 0: no load)")
    parser.add_argument("--max-load-sources", type=int, default=256,
                        help="plan a loading rank's overlaps only when at most this many source ranks must be "
                             "computed for it (default 256); otherwise time its compile alone")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown (docs/BENCHMARKS.md)")
    args = parser.parse_args(argv)
    names = [n for n in args.scenarios.split(",") if n]
    zeros = [z for z in args.zero.split(",") if z]
    bad = [n for n in names if n not in SCENARIOS] + [z for z in zeros if z not in ZERO]
    if bad or args.samples < 1 or args.load_samples < 0:
        print(f"scale_sim: unknown scenario or zero {bad}; expected {list(SCENARIOS)} and {list(ZERO)}, "
              "--samples >= 1 and --load-samples >= 0", file=sys.stderr)
        return 2
    rows = []
    console = Console(stderr=True)
    with Progress(console=console, transient=True, disable=args.json or args.markdown) as bar:
        for name in names:
            for z in zeros:
                task = bar.add_task(f"{name} {z}", total=None)
                rows.append(run_scenario(SCENARIOS[name], ZERO[z], samples=args.samples,
                                         load_samples=args.load_samples, max_sources=args.max_load_sources,
                                         progress=lambda: bar.advance(task)))
                bar.remove_task(task)
    if args.json:
        print(json.dumps(rows, indent=1))
    elif args.markdown:
        print(markdown(rows))
    else:
        Console().print(table(rows))
        print("Ranks are sampled: totals are the sampled ranks' mean times the world size; per-rank maxima and save "
              "plan times are over the sampled ranks, load plan times over the loading ranks planned.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
