"""Hypothesis: any split of any dimension, any flat partition of the shards, tiles every tensor exactly once."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ucp.ucl.flat import flat_layout
from ucp.ucl.simulate import gather, place

shapes = st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    tensors=st.lists(st.tuples(shapes, st.integers(0, 2)), min_size=1, max_size=4),
    tp=st.integers(1, 3), dp=st.integers(1, 4), align=st.integers(1, 4), each=st.booleans(),
)
def test_split_then_flat_partition_round_trips(tensors, tp, dp, align, each):
    lines = ["ucl 1", "param states = [m]"]
    logical = {}
    g = torch.Generator().manual_seed(0)
    for i, (shape, dim) in enumerate(tensors):
        dim = min(dim, len(shape) - 1)
        shape = tuple(s * tp if d == dim else s for d, s in enumerate(shape))  # even splits: saves need no size
        lines += [f"tensor t{i} -> t{i}", f"  split dim {dim} over tp"]
        logical[f"t{i}"] = torch.randn(shape, generator=g)
        logical[f"t{i}/m"] = torch.randn(shape, generator=g)
    lines += ["flat opt/{s:states} -> {name}/{s}", "  members *", f"  partition {'each ' if each else ''}over dp",
              f"  align {align}"]
    fmaps, locals_ = place("\n".join(lines) + "\n", f"tp={tp},dp={dp},zero=1", logical)
    back = gather(fmaps, locals_)
    assert set(back) == set(logical)
    assert all(torch.equal(back[n], logical[n]) for n in logical)


@given(sizes=st.lists(st.integers(0, 40), min_size=1, max_size=6), parts=st.integers(1, 5),
       pad=st.integers(1, 4), align=st.integers(1, 4), each=st.booleans())
def test_flat_layout_partitions_cover_every_member_element_once(sizes, parts, pad, align, each):
    seen = [[0] * s for s in sizes]
    numels = set()
    for index in range(parts):
        numel, runs = flat_layout(sizes, parts=parts, index=index, each=each, pad_multiple=pad, align=align)
        numels.add(numel)
        used = [False] * numel
        for m, lo, hi, start in runs:
            for k in range(hi - lo):
                seen[m][lo + k] += 1
                assert not used[start + k]  # two members never share a buffer slot
                used[start + k] = True
    assert len(numels) == 1  # every rank's buffer has the same size
    assert all(c == 1 for member in seen for c in member)


@settings(max_examples=30, deadline=None)
@given(groups=st.integers(1, 6), weights=st.lists(st.integers(1, 3), min_size=1, max_size=3),
       unit=st.integers(1, 3), tp=st.integers(1, 4), cols=st.integers(1, 3), dp=st.integers(1, 2))
def test_fused_parts_in_groups_round_trip_on_any_tp(groups, weights, unit, tp, cols, dp):
    lines = ["ucl 1", "tensor fused", f"  fuse dim 0 groups {groups}"]
    logical = {}
    for i, w in enumerate(weights):
        lines.append(f"    part p{i} weight {w}")
        logical[f"p{i}"] = torch.randn(groups * w * unit, cols)
    lines.append("  split dim 0 over tp")
    layout = f"tp={tp},dp={dp}"
    assume(groups % tp == 0)  # else some rank holds no group: an empty local tensor cannot tell sizes on save
    fmaps, locals_ = place("\n".join(lines) + "\n", layout, logical)
    back = gather(fmaps, locals_)
    assert all(torch.equal(back[n], logical[n]) for n in logical)
    # ranks 0..tp-1 (dp rank 0) hold, for each of their groups, every part's slice of that group in order
    g0 = 0
    for rank in range(tp):
        per_rank = groups // tp
        expect = torch.cat([logical[f"p{i}"][g * w * unit : (g + 1) * w * unit]
                            for g in range(g0, g0 + per_rank) for i, w in enumerate(weights)])
        assert torch.equal(locals_[rank]["fused"], expect)
        g0 += per_rank
