"""A load that takes turns between several ranks' packs reads each pack once.

Whole tensors saved split over ranks come back piece by piece from every rank's pack
(rank 0's rows, rank 1's rows, then the next tensor's). Whole fragments are read in
coalesced runs straight into their destinations (ucp.read_batches): one read per pack
here. Parts of fragments go through windows of the packs, kept in a cache: with one
window kept, each turn re-read a window, 2 x 40 reads here where 2 do; on a real
resharding load that was most of the load time (docs/RECOVERY.md).
"""

from __future__ import annotations

import torch

import ucp
import ucp.confined
from ucp.sharding import split_fragment_map
from ucp.spec import LogicalTensor
from ucp.stores import StoreOptions

TENSORS = {f"layer{i}.norm": torch.arange(8, dtype=torch.float32) + i for i in range(40)}


def _save_over_two_ranks(path) -> None:
    logical = {n: LogicalTensor(n, (8,), "float32") for n in TENSORS}
    for rank in range(2):
        fmap = split_fragment_map(logical, rank=rank, world_size=2)
        ucp.save({n: t[rank * 4:(rank + 1) * 4].clone() for n, t in TENSORS.items()}, path, spec=fmap, rank=rank,
                 world_size=2)
    ucp.finalize(path, world_size=2)


def _counting_reads(monkeypatch) -> list[str]:
    reads: list[str] = []
    for name in ("read_inside", "read_range_into"):  # spies: count, change nothing
        real = getattr(ucp.confined, name)

        def counted(root, rel, *args, _real=real, **kw):
            reads.append(rel)
            return _real(root, rel, *args, **kw)

        monkeypatch.setattr(ucp.confined, name, counted)
    return reads


def _load_parts(path, options=None) -> dict:
    """Rows 1..6 of every tensor: parts of both ranks' fragments, read through pack windows."""
    from ucp.geometry import Box

    with ucp.CheckpointReader(str(path), store_options=options) as reader:
        return {n: reader.read_tensor(n, Box((1,), (6,))) for n in TENSORS}


def test_a_load_alternating_between_packs_reads_each_pack_once(tmp_path, monkeypatch):
    _save_over_two_ranks(tmp_path / "ck")
    reads = _counting_reads(monkeypatch)
    out = ucp.load(tmp_path / "ck")
    assert all(torch.equal(out[n], t) for n, t in TENSORS.items())
    packs = [r for r in reads if "/pack-" in r]
    assert sorted(packs) == sorted(set(packs)) and len(packs) == 2, packs


def test_parts_alternating_between_packs_read_each_pack_once(tmp_path, monkeypatch):
    _save_over_two_ranks(tmp_path / "ck")
    reads = _counting_reads(monkeypatch)
    out = _load_parts(tmp_path / "ck")
    assert all(torch.equal(out[n], t[1:7]) for n, t in TENSORS.items())
    packs = [r for r in reads if "/pack-" in r]
    assert sorted(packs) == sorted(set(packs)) and len(packs) == 2, packs


def test_the_pack_cache_keeps_to_its_budget(tmp_path, monkeypatch):
    _save_over_two_ranks(tmp_path / "ck")
    reads = _counting_reads(monkeypatch)
    out = _load_parts(tmp_path / "ck", StoreOptions(pack_cache_bytes=1))  # room for the newest window only
    assert all(torch.equal(out[n], t[1:7]) for n, t in TENSORS.items())
    assert len([r for r in reads if "/pack-" in r]) == 2 * len(TENSORS)  # every turn re-reads: the old behaviour
