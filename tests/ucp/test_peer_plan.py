"""The peer plan: every element of a rank's new state from exactly one place, own memory first."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ucp.geometry import Box, FlatRange, region_pieces
from ucp.peer_plan import HeldFragment, plan_sources, subtract
from ucp.spec import FragmentMap, LogicalTensor, ShardPiece, TensorSpec
from ucp.replication.hot_reshard import local_view

SHAPE = (6, 4)


def _target(rank: int, pieces) -> FragmentMap:
    lt = {"w": LogicalTensor("w", SHAPE, "float32")}
    return FragmentMap(rank=rank, logical=lt, tensors={"t": TensorSpec("t", tuple(pieces))})


def _execute(plan, fmap, logical: torch.Tensor, shape) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the plan against one logical tensor; count how often each local element is written."""
    out, count = torch.full(shape, float("nan")), torch.zeros(shape)
    for f in plan.fetches + plan.reads:
        local_view(out, fmap, f).copy_(logical[f.overlap.slices()])
        local_view(count, fmap, f).add_(1)
    return out, count


def test_own_memory_first_then_peers_then_storage():
    fmap = _target(0, [ShardPiece("w", Box((0, 0), (6, 4)), Box((0, 0), (6, 4)))])
    held = [HeldFragment(1, "r1/a", "w", Box((0, 0), (3, 4))),  # a peer's copy of rows 0-2
            HeldFragment(0, "r0/a", "w", Box((2, 0), (2, 4))),  # own rows 2-3
            HeldFragment(2, "r2/a", "w", FlatRange(16, 20))]    # a peer's flat run: row 4
    plan = plan_sources(fmap, held, {"w": SHAPE}, world=3)
    got = sorted((f.source.rank, str(f.overlap)) for f in plan.fetches)
    assert got == [(0, "[2:4, 0:4]"), (1, "[0:2, 0:4]"), (2, "[4:5, 0:4]")]
    assert [str(r.overlap) for r in plan.reads] == ["[5:6, 0:4]"]
    assert plan.elements() == {"own": 8, "peer": 12, "storage": 4}


def test_subtract_leaves_disjoint_boxes_covering_the_rest():
    box, cut = Box((0, 0), (5, 5)), Box((1, 2), (3, 9))
    parts = subtract(box, cut)
    assert sum(p.numel for p in parts) == box.numel - box.intersect(cut).numel
    assert all(p.intersect(cut) is None for p in parts)
    assert subtract(box, Box((7, 7), (1, 1))) == [box] and subtract(box, box) == []


regions = st.one_of(
    st.tuples(st.integers(0, 5), st.integers(1, 6), st.integers(0, 3), st.integers(1, 4)).map(
        lambda t: Box((t[0], t[2]), (min(t[1], 6 - t[0]), min(t[3], 4 - t[2])))),
    st.tuples(st.integers(0, 23), st.integers(1, 24)).map(lambda t: FlatRange(t[0], min(24, t[0] + t[1]))),
)


@settings(max_examples=60, deadline=None)
@given(held=st.lists(st.tuples(st.integers(0, 3), regions), max_size=6), target=regions, flat_local=st.booleans())
def test_every_element_is_planned_once_and_lands_where_the_reader_puts_it(held, target, flat_local):
    n = math.prod(target.sizes) if isinstance(target, Box) else target.numel
    local = FlatRange(0, n) if flat_local or isinstance(target, FlatRange) else Box((0,) * 2, target.sizes)
    fmap = _target(1, [ShardPiece("w", local, target)])
    sources = [HeldFragment(r, f"k{i}", "w", reg) for i, (r, reg) in enumerate(held)]
    plan = plan_sources(fmap, sources, {"w": SHAPE}, world=4)
    logical = torch.arange(24, dtype=torch.float32).view(SHAPE)
    out, count = _execute(plan, fmap, logical, (n,) if isinstance(local, FlatRange) else target.sizes)
    assert bool((count == 1).all())
    expected = logical[target.slices()] if isinstance(target, Box) else logical.view(-1)[target.start:target.stop]
    assert torch.equal(out.view(-1), expected.reshape(-1))
    for f in plan.fetches:  # a fetch never asks a holder for more than it holds
        assert any(p.box.contains(f.overlap) for p in region_pieces(f.source.region, SHAPE))
