"""Flat partitions as a few boxes: a contiguous range of an N-d box is at most 2N-1 boxes.

The decomposition (``ucp.ucl.flat``) tiles every range exactly, in buffer order; the
``FlatRange <-> Box`` piece kind it makes is validated, spread over replicas, written
(the fragment is the box) and loaded (the destination's run viewed as the box) by the
engine, through UCL programs, explicit maps and DTensors alike.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from hypothesis import given, settings
from hypothesis import strategies as st

from ucp.integrations.launch import free_port
import ucp
from ucp.ucl.flat import compose, contiguous_boxes, is_contiguous, range_pieces
from ucp.errors import LayoutError
from ucp.geometry import Box, FlatRange
from ucp.spec import FragmentMap, LogicalTensor, ShardPiece, TensorSpec
from ucp.write_units import write_plan


@st.composite
def member_and_box(draw, *, rows_only: bool):
    """A member shape, a box of it (whole trailing dims when ``rows_only``), and a range of the member."""
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=4)))
    offsets, sizes = [], []
    for d, n in enumerate(shape):
        if rows_only and d > 0:
            offsets.append(0)
            sizes.append(n)
            continue
        o = draw(st.integers(0, n - 1))
        offsets.append(o)
        sizes.append(draw(st.integers(1, n - o)))
    numel = math.prod(shape)
    a = draw(st.integers(0, numel - 1))
    b = draw(st.integers(a + 1, numel))
    return shape, Box(tuple(offsets), tuple(sizes)), (a, b)


def _check_tiling(shape, member, member_range, pieces, start):
    a, b = member_range
    coords = torch.arange(math.prod(shape)).view(shape)
    inside = torch.zeros(shape, dtype=torch.bool)
    inside[member.slices()] = True
    expected = [int(i) for i in coords.reshape(-1)[a:b] if inside.reshape(-1)[i]]
    # shift the target so that it differs from the member box (a logical tensor one larger in every dim)
    logical = torch.full(tuple(n + 1 for n in shape), -1)
    target_of = {}
    for piece in pieces:
        assert piece.local.numel == piece.target.numel
        run = torch.arange(piece.local.start, piece.local.stop) - start + a  # member flat indices of the run
        view = logical[piece.target.slices()]
        assert (view == -1).all(), "two pieces write the same element"
        view.copy_(run.view(piece.target.sizes))
        for i in run.tolist():
            assert i not in target_of, "two pieces hold the same buffer element"
            target_of[i] = True
    assert sorted(target_of) == expected  # exactly the range's elements inside the box, each once
    # every element landed at its own coordinates (+1 in every dim): the row-major orders agree
    for i in expected:
        c = tuple(int(x) for x in torch.nonzero(coords == i)[0])
        assert int(logical[tuple(x + 1 for x in c)]) == i


@settings(max_examples=200, deadline=None)
@given(case=member_and_box(rows_only=True), start=st.integers(0, 7))
def test_a_range_of_rows_is_at_most_2n_minus_1_boxes_and_tiles_exactly(case, start):
    shape, member, member_range = case
    target = member.shifted((1,) * len(shape))
    found = range_pieces("t", member, target, shape, member_range, start)
    pieces = [p for _, p in found]
    assert len(pieces) <= 2 * len(shape) - 1
    assert [pos for pos, _ in found] == sorted(pos for pos, _ in found)
    assert all(isinstance(p.local, FlatRange) and isinstance(p.target, Box) for p in pieces)
    _check_tiling(shape, member, member_range, pieces, start)


@settings(max_examples=200, deadline=None)
@given(case=member_and_box(rows_only=False), start=st.integers(0, 7))
def test_a_range_of_any_box_tiles_exactly_in_runs_of_the_buffer(case, start):
    shape, member, member_range = case
    found = range_pieces("t", member, member.shifted((1,) * len(shape)), shape, member_range, start)
    _check_tiling(shape, member, member_range, [p for _, p in found], start)


@settings(max_examples=100, deadline=None)
@given(case=member_and_box(rows_only=False))
def test_contiguous_boxes_are_runs_that_cover_the_box(case):
    shape, box, _ = case
    subs = contiguous_boxes(box, shape)
    assert all(is_contiguous(s, shape) and box.contains(s) for s in subs)
    assert sum(s.numel for s in subs) == box.numel
    mask = torch.zeros(shape, dtype=torch.int32)
    for s in subs:
        mask[s.slices()] += 1
    assert int(mask[box.slices()].min()) == 1 and int(mask.sum()) == box.numel


def test_a_row_parallel_shard_in_a_buffer_is_three_pieces_not_one_per_row():
    # rank 1 of tp=2 holds columns 6..11 of a 10x12 weight; its buffer share starts mid-row 2
    shard = ShardPiece("w", Box((0, 0), (10, 6)), Box((0, 6), (10, 6)))
    pieces = compose([shard], (10, 6), {"w": (10, 12)}, (15, 59), 100, lambda n: f"{n}/exp_avg")
    assert pieces == [
        ShardPiece("w/exp_avg", FlatRange(100, 103), FlatRange(2 * 12 + 9, 2 * 12 + 12)),  # rest of row 2
        ShardPiece("w/exp_avg", FlatRange(103, 139), Box((3, 6), (6, 6))),                # rows 3..8
        ShardPiece("w/exp_avg", FlatRange(139, 144), FlatRange(9 * 12 + 6, 9 * 12 + 11)),  # most of row 9
    ]
    # a column-parallel shard's share is contiguous in the logical tensor too: one piece
    col = ShardPiece("w", Box((0, 0), (5, 12)), Box((5, 0), (5, 12)))
    assert compose([col], (5, 12), {"w": (10, 12)}, (7, 50), 0, str) == [
        ShardPiece("w", FlatRange(0, 43), FlatRange(67, 110))]


def test_the_new_piece_kind_is_validated():
    ShardPiece("w", FlatRange(4, 10), Box((1, 0), (2, 3)))
    with pytest.raises(LayoutError, match=r"^piece of 'w': local flat\[4:10\] and target \[1:3, 0:2\] differ in "
                                          r"length$"):
        ShardPiece("w", FlatRange(4, 10), Box((1, 0), (2, 2)))
    with pytest.raises(LayoutError, match=r"^piece of 'w': a local box needs a target box of the same sizes, and a "
                                          r"local flat range a target flat range or box of the same length$"):
        ShardPiece("w", Box((0,), (6,)), FlatRange(0, 6))
    fmap = FragmentMap(rank=0, logical={"w": LogicalTensor("w", (4, 3), "float32")},
                       tensors={"b": TensorSpec("b", (ShardPiece("w", FlatRange(0, 6), Box((3, 0), (2, 3))),))})
    with pytest.raises(LayoutError, match=r"^tensor 'b' -> 'w': box \[3:5, 0:3\] does not fit in shape \(4, 3\)$"):
        fmap.validate()
    good = FragmentMap(rank=0, logical=fmap.logical,
                       tensors={"b": TensorSpec("b", (ShardPiece("w", FlatRange(0, 6), Box((2, 0), (2, 3))),))})
    assert FragmentMap.from_dict(json.loads(json.dumps(good.to_dict()))) == good


@pytest.mark.parametrize("replicas", [2, 3, 5])
def test_spreading_a_flat_to_box_piece_over_replicas_writes_every_row_once(replicas):
    piece = ShardPiece("w", FlatRange(40, 40 + 7 * 300), Box((2, 100), (7, 300)))
    covered = torch.zeros(7, 300, dtype=torch.int32)
    for replica in range(replicas):
        spec = TensorSpec("b", (piece,), replica=replica, replicas=replicas)
        for local, target in write_plan(piece, 64 << 20, spec):  # many times SPREAD_MIN_BYTES: split along dim 0
            assert isinstance(local, FlatRange) and local.numel == target.numel
            rows = target.offsets[0] - 2
            assert local.start == rows * 300  # the run of the piece's data holding exactly these rows
            covered[rows : rows + target.sizes[0]] += 1
    assert bool((covered == 1).all())


def _buffer_map(rank: int, order: list[str]) -> FragmentMap:
    """A hand-written map: rank r's buffer holds rows 1..6 of column half r of ``w``, then ``v``'s half r."""
    logical = {"w": LogicalTensor("w", (8, 10), "float32"), "v": LogicalTensor("v", (4, 6), "float32")}
    pieces = {"w": ShardPiece("w", FlatRange(0, 30), Box((1, 5 * rank), (6, 5))),
              "v": ShardPiece("v", FlatRange(0, 12), Box((0, 3 * rank), (4, 3)))}
    start, placed = 2, []
    for name in order:  # different buffer offsets on save and load
        p = pieces[name]
        placed.append(ShardPiece(name, FlatRange(start, start + p.local.numel), p.target))
        start += p.local.numel + 1
    rest = ShardPiece("w", Box((0, 0), (1, 10)), Box((0, 0), (1, 10))), ShardPiece("w", Box((0, 0), (1, 10)),
                                                                                   Box((7, 0), (1, 10)))
    return FragmentMap(rank=rank, logical=logical, tensors={
        "buf": TensorSpec("buf", tuple(placed)), "edge": TensorSpec("edge", (rest[rank],))})


def test_explicit_flat_to_box_maps_save_and_load_bitwise(tmp_path):
    g = torch.Generator().manual_seed(3)
    w, v = torch.randn(8, 10, generator=g), torch.randn(4, 6, generator=g)
    path = str(tmp_path / "c")
    for rank in range(2):
        fmap = _buffer_map(rank, ["w", "v"])
        buf = torch.zeros(46)
        for p in fmap.tensors["buf"].pieces:
            buf[p.local.start : p.local.stop] = {"w": w, "v": v}[p.logical][p.target.slices()].reshape(-1)
        edge = w[[0, 7][rank]].view(1, 10).clone()
        ucp.save({"buf": buf, "edge": edge}, path, spec=fmap, rank=rank, world_size=2)
    ucp.finalize(path, world_size=2)
    manifest = json.loads(Path(f"{path}/manifest.json").read_text())
    assert [f["region"] for f in manifest["tensors"]["v"]["fragments"]] == [
        {"box": {"offsets": [0, 0], "sizes": [4, 3]}}, {"box": {"offsets": [0, 3], "sizes": [4, 3]}}]
    whole = ucp.load(path)
    assert torch.equal(whole["w"], w) and torch.equal(whole["v"], v)
    for rank in range(2):  # another map (members swapped), into a buffer and into a non-contiguous one
        fmap = _buffer_map(rank, ["v", "w"])
        into = {"buf": torch.zeros(46), "edge": torch.zeros(1, 10)}
        ucp.load(path, into=into, spec=fmap)
        strided = {"buf": torch.zeros(46, 2)[:, 0], "edge": torch.zeros(1, 10)}
        ucp.load(path, into=strided, spec=fmap)
        for buf in (into["buf"], strided["buf"]):
            for p in fmap.tensors["buf"].pieces:
                want = {"w": w, "v": v}[p.logical][p.target.slices()].reshape(-1)
                assert torch.equal(buf[p.local.start : p.local.stop], want)


def _dtensor_worker(rank: int, port: int, path: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        g = torch.Generator().manual_seed(3)
        w, v = torch.randn(8, 10, generator=g), torch.randn(4, 6, generator=g)
        mesh = init_device_mesh("cpu", (2,))
        into = {"w": distribute_tensor(torch.zeros(8, 10), mesh, [Shard(0)]),
                "v": distribute_tensor(torch.zeros(4, 6), mesh, [Shard(1)])}
        ucp.load(path, into=into)
        assert torch.equal(into["w"].full_tensor(), w) and torch.equal(into["v"].full_tensor(), v)
    finally:
        dist.destroy_process_group()
    # Checked above; leave without the interpreter's teardown: in the full suite (never alone, 14 of
    # 14 runs) a worker aborted at exit with "terminate called without an active exception", a C++
    # thread still joinable at teardown. Not diagnosed yet; see the closing note.
    os._exit(0)


@pytest.mark.slow
def test_dtensors_load_what_flat_to_box_pieces_saved(tmp_path):
    test_explicit_flat_to_box_maps_save_and_load_bitwise(tmp_path)
    mp.spawn(_dtensor_worker, args=(free_port(), str(tmp_path / "c")), nprocs=2, join=True)


def _as_runs(fmap: FragmentMap) -> FragmentMap:
    """The map as the compiler made it before boxes: one ``FlatRange <-> FlatRange`` piece per run of a row."""
    tensors = {}
    for key, spec in fmap.tensors.items():
        pieces = []
        for p in spec.pieces:
            if not (isinstance(p.local, FlatRange) and isinstance(p.target, Box)):
                pieces.append(p)
                continue
            shape, start = fmap.logical[p.logical].shape, p.local.start
            for sub in contiguous_boxes(p.target, shape):
                flat = sum(o * math.prod(shape[d + 1:]) for d, o in enumerate(sub.offsets))
                pieces.append(ShardPiece(p.logical, FlatRange(start, start + sub.numel), FlatRange(flat, flat + sub.numel)))
                start += sub.numel
        tensors[key] = TensorSpec(key, tuple(pieces), spec.replica, spec.replicas, spec.policy)
    return FragmentMap(rank=fmap.rank, logical=fmap.logical, tensors=tensors)


def test_checkpoints_saved_with_one_fragment_per_run_still_load_into_box_pieces(tmp_path):
    g = torch.Generator().manual_seed(5)
    w, v = torch.randn(8, 10, generator=g), torch.randn(4, 6, generator=g)
    path = str(tmp_path / "old")
    for rank in range(2):
        fmap = _as_runs(_buffer_map(rank, ["w", "v"]))
        buf = torch.zeros(46)
        for p in fmap.tensors["buf"].pieces:
            buf[p.local.start : p.local.stop] = {"w": w, "v": v}[p.logical].reshape(-1)[p.target.start : p.target.stop]
        ucp.save({"buf": buf, "edge": w[[0, 7][rank]].view(1, 10).clone()}, path, spec=fmap, rank=rank, world_size=2)
    ucp.finalize(path, world_size=2)
    regions = [f["region"] for f in json.loads(Path(f"{path}/manifest.json").read_text())["tensors"]["w"]["fragments"]]
    assert sum("flat" in r for r in regions) == 12  # rows 1..6 of two column halves: the old layout
    for rank in range(2):
        fmap = _buffer_map(rank, ["v", "w"])
        into = {"buf": torch.zeros(46), "edge": torch.zeros(1, 10)}
        ucp.load(path, into=into, spec=fmap)
        for p in fmap.tensors["buf"].pieces:
            want = {"w": w, "v": v}[p.logical][p.target.slices()].reshape(-1)
            assert torch.equal(into["buf"][p.local.start : p.local.stop], want)
