"""The load plan: read items from the overlaps of saved fragments and target regions, and the reader executing it."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

import ucp
from ucp.errors import KeyMismatchError, ShapeMismatchError
from ucp.geometry import Box, FlatRange, coverage_gaps, region_pieces, split_evenly
from ucp.load_plan import LoadRequest, plan_load
from ucp.manifest import Fragment, TensorEntry
from ucp.sharding import split_fragment_map
from ucp.spec import LogicalTensor
from ucp.write_units import local_region


def _tiles(shape: tuple[int, ...], cuts: int, dim: int, flat: bool) -> tuple[Fragment, ...]:
    """A saved tensor cut ``cuts`` ways along ``dim`` (or along its flattening)."""
    out = []
    for i in range(cuts):
        if flat:
            offset, length = split_evenly(math.prod(shape), cuts, i)
            region = FlatRange(offset, offset + length)
        else:
            offset, length = split_evenly(shape[dim], cuts, i)
            region = Box(tuple(offset if d == dim else 0 for d in range(len(shape))),
                         tuple(length if d == dim else s for d, s in enumerate(shape)))
        out.append(Fragment(f"r{i}/w", i, region, region.numel * 4, 1))
    return tuple(out)


@st.composite
def _cases(draw):
    shape = (draw(st.integers(1, 12)), draw(st.integers(1, 6)))
    saved = _tiles(shape, draw(st.integers(1, 5)), draw(st.integers(0, 1)), draw(st.booleans()))
    if draw(st.booleans()):
        start = draw(st.integers(0, math.prod(shape) - 1))
        region = FlatRange(start, draw(st.integers(start + 1, math.prod(shape))))
    else:
        offsets = (draw(st.integers(0, shape[0] - 1)), draw(st.integers(0, shape[1] - 1)))
        sizes = tuple(draw(st.integers(1, s - o)) for s, o in zip(shape, offsets))
        region = Box(offsets, sizes)
    return shape, saved, region


@settings(max_examples=40, deadline=None)
@given(_cases())
def test_the_items_fill_every_element_of_the_request_once_from_fragments_holding_it(case):
    shape, saved, region = case
    plan = plan_load({"w": TensorEntry("w", "float32", shape, saved)}, [LoadRequest("w", region)])
    assert plan.gaps() == {}
    overlaps = [item.overlap for item in plan.items]
    assert sum(o.numel for o in overlaps) == region.numel and coverage_gaps(overlaps, shape)[1] == []
    for item in plan.items:
        assert any(p.box.intersect(item.overlap) == item.overlap for p in region_pieces(item.fragment.region, shape))
    assert set(plan.sources()) <= {f.key for f in saved}


def test_a_missing_fragment_is_a_gap_not_a_silent_zero():
    saved = _tiles((4, 2), 2, 0, False)[:1]
    plan = plan_load({"w": TensorEntry("w", "float32", (4, 2), saved)}, [LoadRequest("w", Box((0, 0), (4, 2)))])
    assert plan.gaps() == {0: 4}


def test_requests_outside_the_manifest_are_refused_by_name():
    entries = {"w": TensorEntry("w", "float32", (4, 2), _tiles((4, 2), 1, 0, False))}
    with pytest.raises(KeyMismatchError, match=r"^no logical tensor 'v' in the checkpoint \(a load asks for "
                       r"flat\[0:1\] of it\); `ucp inspect` lists the tensors it has$"):
        plan_load(entries, [LoadRequest("v", FlatRange(0, 1))])
    with pytest.raises(ShapeMismatchError,
                       match=r"^cannot read \[2:6, 0:2\] of tensor 'w': it does not fit its shape \[4, 2\]$"):
        plan_load(entries, [LoadRequest("w", Box((2, 0), (4, 2)))])


@pytest.mark.parametrize("flat", [False, True])
def test_the_reader_executes_a_reshard_plan_of_a_fragment_map(tmp_path, flat):
    logical = {"w": LogicalTensor("w", (10, 6), "float32"), "b": LogicalTensor("b", (7,), "float32")}
    whole = {"w": torch.arange(60.0).reshape(10, 6), "b": torch.arange(7.0)}
    path = str(tmp_path / "c")
    for rank in range(2):
        fmap = split_fragment_map(logical, rank=rank, world_size=2)
        local = {k: local_region(whole[k], s.pieces[0].target).clone() for k, s in fmap.tensors.items()}
        ucp.save(local, path, spec=fmap, rank=rank, world_size=2)
    ucp.finalize(path, world_size=2)
    with ucp.CheckpointReader(path) as reader:
        for rank in range(3):
            target = split_fragment_map(logical, rank=rank, world_size=3, flat=flat)
            plan = plan_load(reader.manifest, target)
            assert [r.dest for r in plan.requests] == ["w", "b"] and plan.gaps() == {}
            out = {k: torch.empty(s.pieces[0].local.numel if flat else s.pieces[0].local.sizes)
                   for k, s in target.tensors.items()}
            reader.execute(plan, [local_region(out[r.dest], target.tensors[r.dest].pieces[r.piece].local)
                                  for r in plan.requests])
            for key, spec in target.tensors.items():
                assert torch.equal(out[key].reshape(-1), local_region(whole[key], spec.pieces[0].target).reshape(-1))


def test_execute_refuses_a_destination_of_the_wrong_shape_before_reading(tmp_path):
    ucp.save({"w": torch.ones(4, 2)}, str(tmp_path / "c"))
    with ucp.CheckpointReader(str(tmp_path / "c")) as reader:
        plan = plan_load(reader.manifest, [LoadRequest("w", Box((0, 0), (4, 2)))])
        with pytest.raises(ShapeMismatchError, match=r"into a float32\[2, 2\] tensor; it needs float32\[4, 2\]$"):
            reader.execute(plan, [torch.empty(2, 2)])
        with pytest.raises(ShapeMismatchError, match=r"^a load plan of 1 requests needs as many destinations, got 0$"):
            reader.execute(plan, [])
