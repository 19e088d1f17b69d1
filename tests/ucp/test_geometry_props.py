"""Property tests for the shard geometry (tilings, flat ranges, overlap plans, coverage), and of the
engine on top of it: any tiling saved, any region read back, through tiny chunks."""

from __future__ import annotations

import math

import tempfile

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ucp

from ucp.geometry import Box, FlatRange, coverage_gaps, flat_to_boxes, plan_overlaps, region_pieces, split_evenly
from ucp.reader import CheckpointReader
from ucp.spec import FragmentMap, LogicalTensor, ShardPiece, TensorSpec
from ucp.stores import StoreOptions

shapes = st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple)


@st.composite
def tilings(draw, shape):
    """Either a grid of boxes (uneven splits per dim) or a partition into flat ranges."""
    if draw(st.booleans()):
        cuts = []
        for size in shape:
            parts = draw(st.integers(1, size))
            cuts.append([split_evenly(size, parts, i) for i in range(parts)])
        regions = [Box((), ())]
        for dim_cuts in cuts:
            regions = [Box(b.offsets + (o,), b.sizes + (n,)) for b in regions for o, n in dim_cuts]
        return regions
    total = math.prod(shape)
    points = sorted(set(draw(st.lists(st.integers(1, max(1, total - 1)), max_size=4))) - {total})
    bounds = [0] + points + [total]
    return [FlatRange(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


@st.composite
def shape_tiling_target(draw):
    shape = draw(shapes)
    tiling = draw(tilings(shape))
    total = math.prod(shape)
    if draw(st.booleans()):
        offsets = tuple(draw(st.integers(0, s - 1)) for s in shape)
        sizes = tuple(draw(st.integers(1, s - o)) for s, o in zip(shape, offsets))
        target = Box(offsets, sizes)
    else:
        a = draw(st.integers(0, total - 1))
        target = FlatRange(a, draw(st.integers(a + 1, total)))
    return shape, tiling, target


def _storage(region, full):
    return full[region.slices()].copy() if isinstance(region, Box) else full.reshape(-1)[region.start : region.stop].copy()


@st.composite
def box_pairs(draw):
    """Two boxes of one small shape (0-d included), empty ones (a size 0) included."""
    shape = draw(st.lists(st.integers(1, 5), max_size=3).map(tuple))
    boxes = []
    for _ in range(2):
        offsets = tuple(draw(st.integers(0, s)) for s in shape)
        boxes.append(Box(offsets, tuple(draw(st.integers(0, s - o)) for s, o in zip(shape, offsets))))
    return shape, boxes


def _elements(box: Box) -> set:
    return {tuple(o + i for o, i in zip(box.offsets, idx)) for idx in np.ndindex(*box.sizes)}


@settings(max_examples=300, deadline=None)
@given(box_pairs())
def test_box_intersect_is_the_common_elements(case):
    _, (a, b) = case
    common = _elements(a) & _elements(b)
    got = a.intersect(b)
    assert got == b.intersect(a)
    if not common:
        assert got is None
    else:
        assert _elements(got) == common


@settings(max_examples=150, deadline=None)
@given(shape_tiling_target())
def test_plan_overlaps_reconstructs_any_region_from_any_tiling(case):
    shape, tiling, target = case
    full = np.arange(math.prod(shape)).reshape(shape)
    stored = [_storage(r, full) for r in tiling]
    out = np.full(target.sizes if isinstance(target, Box) else (target.numel,), -1)
    for op in plan_overlaps(tiling, target, shape):
        src_region = tiling[op.source]
        if isinstance(src_region, Box):
            src = stored[op.source][op.overlap.relative_to(src_region).slices()]
        else:
            span = op.src.span
            src = stored[op.source][span.start : span.stop].reshape(op.src.box.sizes)[op.overlap.relative_to(op.src.box).slices()]
        if isinstance(target, Box):
            out[op.overlap.relative_to(target).slices()] = src
        else:
            block = out[op.dst.span.start : op.dst.span.stop].reshape(op.dst.box.sizes)
            block[op.overlap.relative_to(op.dst.box).slices()] = src
    np.testing.assert_array_equal(out, _storage(target, full))


@settings(max_examples=150, deadline=None)
@given(shapes.flatmap(lambda s: st.tuples(st.just(s), st.integers(0, math.prod(s)), st.integers(0, math.prod(s)))))
def test_flat_to_boxes_is_an_exact_row_major_partition(case):
    shape, a, b = case
    rng = FlatRange(min(a, b), max(a, b))
    pairs = flat_to_boxes(rng, shape)
    assert len(pairs) <= 2 * len(shape) - 1 or rng.is_empty()
    full = np.arange(math.prod(shape)).reshape(shape)
    pos = rng.start
    for span, box in pairs:
        assert span.start == pos and span.numel == box.numel
        np.testing.assert_array_equal(full[box.slices()].reshape(-1), np.arange(span.start, span.stop))
        pos = span.stop
    assert pos == rng.stop or rng.is_empty()


@settings(max_examples=150, deadline=None)
@given(shapes.flatmap(lambda s: st.tuples(st.just(s), tilings(s), st.integers(0, 2))))
def test_coverage_gaps_sees_holes_and_double_cover(case):
    shape, tiling, mutation = case
    assert coverage_gaps(tiling, shape) == (0, [])
    if mutation == 1 and len(tiling) > 1:  # drop a region: a hole of exactly its size
        assert coverage_gaps(tiling[1:], shape) == (tiling[0].numel, [])
    if mutation == 2:  # duplicate a region: it overlaps its twin
        uncovered, pairs = coverage_gaps(tiling + [tiling[0]], shape)
        assert uncovered == 0 and (0, len(tiling)) in pairs


@given(shapes)
def test_region_pieces_of_full_flat_range_cover_everything(shape):
    total = math.prod(shape)
    assert sum(p.box.numel for p in region_pieces(FlatRange(0, total), shape)) == total


@pytest.fixture(params=["direct", "tensorstore"])
def tiny_chunks(request) -> StoreOptions:
    """A few elements per chunk, every fragment its own array, written and read directly or by tensorstore."""
    tiny = StoreOptions(pack_max_bytes=0, small_array_bytes=-1, chunk_bytes=24, slab_bytes=40)
    return tiny if request.param == "direct" else tiny.with_(direct_writes=False, direct_reads=False)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=shape_tiling_target())
def test_any_tiling_saved_any_region_read(tiny_chunks, case):
    shape, tiling, target = case
    full = torch.arange(math.prod(shape), dtype=torch.int32).view(shape)
    logical = {"t": LogicalTensor("t", shape, "int32")}
    with tempfile.TemporaryDirectory() as root:
        path = f"{root}/c"
        for rank, region in enumerate(tiling):  # each tile saved by its own "rank"
            if isinstance(region, Box):
                local, piece = full[region.slices()].clone(), ShardPiece("t", Box.full(region.sizes), region)
            else:
                local = full.reshape(-1)[region.start : region.stop].clone()
                piece = ShardPiece("t", FlatRange(0, region.numel), region)
            fmap = FragmentMap(rank=rank, logical=logical, tensors={"t": TensorSpec("t", (piece,))})
            ucp.save({"t": local}, path, spec=fmap, rank=rank, world_size=len(tiling), store_options=tiny_chunks)
        if len(tiling) > 1:
            ucp.finalize(path, world_size=len(tiling))
        expected = full[target.slices()] if isinstance(target, Box) else full.reshape(-1)[target.start : target.stop]
        with CheckpointReader(path, store_options=tiny_chunks) as reader:
            assert torch.equal(reader.read_tensor("t", target), expected)
        assert torch.equal(ucp.load(path, store_options=tiny_chunks)["t"], full)
