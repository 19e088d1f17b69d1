"""The save plan is what the writer records: keys, regions, chunk rows and packs, at any store options."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import ucp
import ucp.write_units
from ucp.geometry import Box, FlatRange, coverage_gaps
from ucp.save_plan import ClosePack, SaveCursor, SaveRules, WriteItem, close_pack, plan_save, plan_tensor
from ucp.sharding import split_fragment_map
from ucp.spec import FragmentMap, LogicalTensor, ShardPiece, TensorSpec
from ucp.stores import StoreOptions
from ucp.writer import CheckpointWriter

LOGICAL = {
    "big": LogicalTensor("big", (64, 40), "float32"),       # many chunks at chunk_bytes=1024
    "half": LogicalTensor("half", (24, 6), "bfloat16"),
    "tiny": LogicalTensor("tiny", (3, 5), "float32"),
    "ids": LogicalTensor("ids", (10, 2), "int64"),
    "bias": LogicalTensor("bias", (40,), "float32"),         # 1-d: replicated when split along dim 1
    "step": LogicalTensor("step", (), "int64"),
}
# Small chunks, small packs closing often, an unusual alignment: nothing here is a default.
OPTIONS = StoreOptions(chunk_bytes=1024, pack_max_bytes=300, pack_target_bytes=700, pack_align=16)


def _local(piece: ShardPiece, dtype: str) -> torch.Tensor:
    sizes = (piece.local.numel,) if isinstance(piece.local, FlatRange) else piece.local.sizes
    return torch.arange(math.prod(sizes)).reshape(sizes).to(getattr(torch, dtype))


def _facts(fragments) -> list[tuple]:
    return sorted((name, f.key, str(f.region), f.nbytes, f.chunk_rows, len(f.checksums), f.pack_offset)
                  for name, f in fragments)


@pytest.mark.parametrize("layout", ["dim1", "flat"])
def test_the_plan_is_what_the_writer_records_at_non_default_options(tmp_path, monkeypatch, layout):
    monkeypatch.setattr(ucp.write_units, "SPREAD_MIN_BYTES", 64)  # replicated tensors spread over both ranks
    path, world = str(tmp_path / "c"), 2
    fmaps = [split_fragment_map(LOGICAL, rank=r, world_size=world, dim=1, flat=layout == "flat") for r in range(world)]
    for rank, fmap in enumerate(fmaps):
        with CheckpointWriter(path, rank=rank, world_size=world, spec=fmap, store_options=OPTIONS) as w:
            for key, spec in fmap.tensors.items():
                w.add(key, _local(spec.pieces[0], LOGICAL[key].dtype))
    manifest = ucp.finalize(path, world_size=world).manifest
    rules = SaveRules.of(OPTIONS)
    packs = 0
    for rank, fmap in enumerate(fmaps):
        plan = plan_save(fmap, rank=rank, rules=rules)
        saved = [(n, f) for n, e in manifest.tensors.items() for f in e.fragments if f.rank == rank]
        assert _facts((n, f) for n, fl in plan.fragments().items() for f in fl) == _facts(saved), rank
        packs += len(plan.packs)
    assert packs >= 2 and any(len(f.checksums) > 1 for f in manifest.tensors["big"].fragments)
    assert ucp.verify(path).ok


def test_a_flush_keeps_the_open_pack_in_the_plan_as_in_the_writer(tmp_path):
    """A flush waits for the writes; the bytes are in the pack file already, so the pack stays open."""
    logical = {n: LOGICAL[n] for n in ("tiny", "ids")}
    fmap = split_fragment_map(logical, rank=0, world_size=1)
    with CheckpointWriter(str(tmp_path / "c"), spec=fmap, store_options=OPTIONS) as w:
        w.add("tiny", _local(fmap.tensors["tiny"].pieces[0], "float32"))
        w.flush()
        w.add("ids", _local(fmap.tensors["ids"].pieces[0], "int64"))
    saved = {n: e.fragments[0].key for n, e in ucp.CheckpointReader(str(tmp_path / "c")).manifest.tensors.items()}
    rules, cursor = SaveRules.of(OPTIONS), SaveCursor(0)
    first, cursor = plan_tensor(cursor, "tiny", fmap.tensors["tiny"], logical, rules)
    second, cursor = plan_tensor(cursor, "ids", fmap.tensors["ids"], logical, rules)
    closed, cursor = close_pack(cursor)
    assert [s.key for s in first + second if isinstance(s, WriteItem)] == [saved["tiny"], saved["ids"]]
    assert saved == {"tiny": "r0/pack-000000", "ids": "r0/pack-000000"} and isinstance(closed[0], ClosePack)


@st.composite
def _maps(draw):
    rows = draw(st.integers(1, 40))
    cols = draw(st.integers(1, 9))
    replicas = draw(st.integers(1, 4))
    dtype = draw(st.sampled_from(["float32", "bfloat16", "int64"]))
    policy = draw(st.sampled_from(["check-equal", "take-first"]))
    rules = SaveRules(chunk_bytes=draw(st.integers(8, 2048)), pack_max_bytes=draw(st.sampled_from([0, 64, 512])),
                      pack_target_bytes=draw(st.integers(1, 1024)), pack_align=draw(st.sampled_from([1, 8, 64])))
    return rows, cols, replicas, dtype, policy, rules


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_maps())
def test_plans_write_every_element_once_and_packs_never_overlap(drawn):
    rows, cols, replicas, dtype, policy, rules = drawn
    lt = LogicalTensor("w", (rows, cols), dtype)
    box = Box.full((rows, cols))
    regions, itemsize = [], torch.empty((), dtype=getattr(torch, dtype)).element_size()
    for replica in range(replicas):
        spec = TensorSpec("w", (ShardPiece("w", box, box),), replica=replica, replicas=replicas, policy=policy)
        plan = plan_save(FragmentMap(rank=replica, logical={"w": lt}, tensors={"w": spec}), rank=replica, rules=rules)
        ends: dict[str, int] = {}
        for step in plan.steps:
            if isinstance(step, ClosePack):
                assert step.nbytes == ends.pop(step.key)  # a pack's length: its members, padded
                continue
            regions.append(step.target)
            assert step.nbytes == step.target.numel * itemsize
            assert step.chunks == math.ceil(step.target.sizes[0] / step.chunk_rows)
            if step.pack_offset is not None:
                assert step.nbytes <= rules.pack_max_bytes  # of any number of chunks (format 3)
                assert step.pack_offset % rules.pack_align == 0 and step.pack_offset >= ends.get(step.key, 0)
                ends[step.key] = step.pack_offset + step.nbytes + (-step.nbytes % rules.pack_align)
        assert not ends  # the plan closes its last pack
    assert coverage_gaps(regions, (rows, cols)) == (0, [])
