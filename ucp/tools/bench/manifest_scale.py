"""Benchmark: reading a manifest of 10^4..10^6 fragments, and what its coverage check costs.

A manifest is the whole index of a checkpoint; at thousands of ranks it holds
10^5-10^6 fragments, and every load parses and checks all of them. This
program builds synthetic manifests (JSON text, as a save writes them) in three
arrangements and, in one run, times

* ``parse``: ``Manifest.from_json`` with every check (types, ranges, chunking,
  checksum counts, state trees, and the exact-coverage check);
* ``coverage``: the exact-coverage check alone (``ucp.geometry.tiles_exactly``);
* ``pairwise``: the pairwise sweep a coverage check did before (sorted along dim 0,
  stopping early; ``overlapping_regions``), run only while it fits ``--pairwise-budget``
  comparisons (beyond that it is estimated from its comparison count).

Arrangements: ``grid`` (one matrix per group cut into a square grid of boxes, TP x PP),
``columns`` (one matrix cut into column blocks: every box starts at row 0, the worst case
for a sweep along dim 0) and ``flat`` (ZeRO: many tensors, each cut into flat ranges).

    python ucp/tools/bench/manifest_scale.py                      # 10^4, 10^5, 10^6 fragments
    python ucp/tools/bench/manifest_scale.py --fragments 10000 --json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

from ucp.geometry import Box, FlatRange, overlapping_regions, region_to_dict, tiles_exactly
from ucp.manifest import FORMAT_VERSION, Manifest

ARRANGEMENTS = ("grid", "columns", "flat")
PER_TENSOR = 1000  # fragments per logical tensor (grid and flat); columns puts all in one tensor


def _tensor_regions(arrangement: str, n: int) -> list[tuple[tuple[int, ...], list]]:
    """[(shape, regions)] holding ``n`` fragments in all."""
    if arrangement == "columns":
        return [((64, 8 * n), [Box((0, 8 * j), (64, 8)) for j in range(n)])]
    side = int(math.isqrt(PER_TENSOR))
    out = []
    for _ in range(max(1, n // PER_TENSOR)):
        if arrangement == "grid":
            regions = [Box((16 * i, 16 * j), (16, 16)) for i in range(side) for j in range(side)]
            out.append(((16 * side, 16 * side), regions))
        else:
            total = 4096 * PER_TENSOR
            cuts = [total * k // PER_TENSOR for k in range(PER_TENSOR + 1)]
            out.append(((4096, PER_TENSOR), [FlatRange(a, b) for a, b in zip(cuts, cuts[1:])]))
    return out


def manifest_text(arrangement: str, n: int) -> tuple[str, list]:
    tensors, groups = {}, _tensor_regions(arrangement, n)
    for index, (shape, regions) in enumerate(groups):
        fragments = []
        for rank, region in enumerate(regions):
            rows = region.sizes[0] if isinstance(region, Box) else region.numel
            fragments.append({"key": f"r{rank}/{index:06d}-t", "rank": rank, "region": region_to_dict(region),
                              "nbytes": 2 * region.numel, "chunk_rows": rows, "checksums": ["0123456789abcdef"]})
        tensors[f"layers.{index}.weight"] = {"dtype": "bfloat16", "shape": list(shape), "fragments": fragments}
    world = max(len(regions) for _, regions in groups)
    manifest = {"format_version": FORMAT_VERSION, "producer": "bench", "created": None, "world_size": world,
                "checksum_algorithm": "xxh3_64", "layout": None, "program": None, "tensors": tensors,
                "states": {"0": {"step": 1}}, "extra": {}}
    return json.dumps(manifest, separators=(",", ":")), groups


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _pairwise(groups, budget: int) -> tuple[float | None, int]:
    """Seconds of the pairwise sweep over every tensor, and its comparisons (None: over budget)."""
    comparisons = 0
    for shape, regions in groups:
        if isinstance(regions[0], FlatRange) or len(shape) <= 1:
            comparisons += len(regions)  # sorted intervals: linear
            continue
        starts = sorted(r.offsets[0] for r in regions)
        stops = sorted(r.stops[0] for r in regions)
        # each box meets every later box that starts before it stops
        import bisect

        comparisons += sum(bisect.bisect_left(starts, stop) for stop in stops)
    if comparisons > budget:
        return None, comparisons
    return _seconds(lambda: [overlapping_regions(r, s, budget=budget) for s, r in groups]), comparisons


def run(sizes: list[int], budget: int) -> list[dict]:
    rows = []
    for n in sizes:
        for arrangement in ARRANGEMENTS:
            text, groups = manifest_text(arrangement, n)
            parse = _seconds(lambda t=text: Manifest.from_json(t))
            coverage = _seconds(lambda g=groups: [tiles_exactly(r, s) for s, r in g])
            pairwise, comparisons = _pairwise(groups, budget)
            rows.append({"fragments": sum(len(r) for _, r in groups), "arrangement": arrangement,
                         "manifest_mb": len(text) / 1e6, "parse_s": parse, "coverage_s": coverage,
                         "coverage_share": coverage / parse, "pairwise_s": pairwise,
                         "pairwise_comparisons": comparisons})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="manifest_scale", description=__doc__.split("\n\n")[0])
    parser.add_argument("--fragments", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--pairwise-budget", type=int, default=50_000_000,
                        help="run the pairwise sweep only up to this many comparisons (default 5e7)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = run(args.fragments, args.pairwise_budget)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Manifest read and coverage check (seconds)")
    for column in ("fragments", "layout", "MB", "parse", "coverage", "cov/parse", "pairwise", "pairs"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(str(r["fragments"]), r["arrangement"], f"{r['manifest_mb']:.1f}", f"{r['parse_s']:.2f}",
                      f"{r['coverage_s']:.3f}", f"{r['coverage_share']:.2f}",
                      "-" if r["pairwise_s"] is None else f"{r['pairwise_s']:.2f}", f"{r['pairwise_comparisons']:.1e}")
    console = Console()
    console.print(table)
    console.print("parse: Manifest.from_json with every check; coverage: tiles_exactly alone; pairwise: the "
                  "sweep along dim 0 (- where it exceeds --pairwise-budget pairs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
