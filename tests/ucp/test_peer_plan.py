"""The peer plan: every element of a rank's new state from exactly one place, own memory first."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ucp.geometry import Box, FlatRange
from ucp.load_plan import plan_load
from ucp.manifest import Fragment, TensorEntry
from ucp.peer_plan import assign_holders
from ucp.replication.hot_reshard import local_view
from ucp.spec import FragmentMap, LogicalTensor, ShardPiece, TensorSpec

SHAPE = (6, 4)


def _target(rank: int, pieces) -> FragmentMap:
    lt = {"w": LogicalTensor("w", SHAPE, "float32")}
    return FragmentMap(rank=rank, logical=lt, tensors={"t": TensorSpec("t", tuple(pieces))})


def _saved(regions) -> dict[str, TensorEntry]:
    frags = tuple(Fragment(f"k{i}", i, r, 4 * (r.numel if isinstance(r, FlatRange) else math.prod(r.sizes)), 1)
                  for i, r in enumerate(regions))
    return {"w": TensorEntry("w", "float32", SHAPE, frags)}


def _execute(plan, fmap, logical: torch.Tensor, shape) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the plan against one logical tensor; count how often each local element is written."""
    out, count = torch.full(shape, float("nan")), torch.zeros(shape)
    for f in plan.fetches + plan.reads:
        local_view(out, fmap, f).copy_(logical[f.overlap.slices()])
        local_view(count, fmap, f).add_(1)
    return out, count


def test_own_memory_first_then_peers_then_storage():
    fmap = _target(0, [ShardPiece("w", Box((0, 0), (6, 4)), Box((0, 0), (6, 4)))])
    saved = _saved([Box((0, 0), (2, 4)), Box((2, 0), (2, 4)), FlatRange(16, 20), Box((5, 0), (1, 4))])
    holders = {"k0": [2, 1], "k1": [0, 1], "k2": [2]}  # k3: nobody survived with it
    plan = assign_holders(plan_load(saved, fmap), holders, rank=0, world=3)
    got = sorted((f.holder, f.item.fragment.key, str(f.overlap)) for f in plan.fetches)
    assert got == [(0, "k1", "[2:4, 0:4]"), (1, "k0", "[0:2, 0:4]"), (2, "k2", "[4:5, 0:4]")]
    assert [(r.holder, str(r.overlap)) for r in plan.reads] == [(None, "[5:6, 0:4]")]
    assert plan.elements() == {"own": 8, "peer": 12, "storage": 4}


def test_ranks_needing_the_same_array_ask_different_holders():
    fmap = _target(0, [ShardPiece("w", Box((0, 0), (6, 4)), Box((0, 0), (6, 4)))])
    plan = plan_load(_saved([Box((0, 0), (6, 4))]), fmap)
    chosen = {rank: assign_holders(plan, {"k0": [1, 3]}, rank=rank, world=4).fetches[0].holder for rank in (0, 2)}
    assert chosen == {0: 1, 2: 3}


def _partition(cuts: list[int], flat: bool) -> list:
    """Disjoint regions tiling the tensor (as a manifest's fragments do): row bands or flat runs."""
    n = SHAPE[0] if not flat else math.prod(SHAPE)
    bounds = sorted({0, n, *(c % n for c in cuts)})
    return [FlatRange(a, b) if flat else Box((a, 0), (b - a, SHAPE[1])) for a, b in zip(bounds, bounds[1:])]


regions = st.one_of(
    st.tuples(st.integers(0, 5), st.integers(1, 6), st.integers(0, 3), st.integers(1, 4)).map(
        lambda t: Box((t[0], t[2]), (min(t[1], 6 - t[0]), min(t[3], 4 - t[2])))),
    st.tuples(st.integers(0, 23), st.integers(1, 24)).map(lambda t: FlatRange(t[0], min(24, t[0] + t[1]))),
)


@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(0, 23), max_size=5), flat_saved=st.booleans(),
       held=st.lists(st.sets(st.integers(0, 3), max_size=3), min_size=6, max_size=6), target=regions,
       flat_local=st.booleans(), rank=st.integers(0, 3))
def test_every_element_is_planned_once_and_lands_where_the_reader_puts_it(cuts, flat_saved, held, target,
                                                                          flat_local, rank):
    n = math.prod(target.sizes) if isinstance(target, Box) else target.numel
    local = FlatRange(0, n) if flat_local or isinstance(target, FlatRange) else Box((0,) * 2, target.sizes)
    fmap = _target(rank, [ShardPiece("w", local, target)])
    saved = _saved(_partition(cuts, flat_saved))
    holders = {f"k{i}": ranks for i, ranks in enumerate(held)}
    plan = assign_holders(plan_load(saved, fmap), holders, rank=rank, world=4)
    logical = torch.arange(24, dtype=torch.float32).view(SHAPE)
    out, count = _execute(plan, fmap, logical, (n,) if isinstance(local, FlatRange) else target.sizes)
    assert bool((count == 1).all())
    expected = logical[target.slices()] if isinstance(target, Box) else logical.view(-1)[target.start:target.stop]
    assert torch.equal(out.view(-1), expected.reshape(-1))
    for f in plan.fetches:  # a fetch is asked only of a rank holding its array, its own first
        assert f.holder in holders[f.item.fragment.key]
        assert f.holder == rank or rank not in holders[f.item.fragment.key]
    assert all(not holders.get(r.item.fragment.key) for r in plan.reads)
