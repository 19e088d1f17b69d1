"""A load that takes turns between several ranks' packs reads each pack once.

Whole tensors saved split over ranks come back piece by piece from every rank's pack
(rank 0's rows, rank 1's rows, then the next tensor's). With one pack kept, each turn
re-read a whole pack: 2 x 40 reads here, where 2 do; on a real resharding load that
was most of the load time (docs/RECOVERY.md).
"""

from __future__ import annotations

import torch

import ucp
import ucp.confined
import ucp.storage
from ucp.sharding import split_fragment_map
from ucp.spec import LogicalTensor

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
    real = ucp.confined.read_inside

    def counted(root, rel, **kw):
        reads.append(rel)
        return real(root, rel, **kw)

    monkeypatch.setattr(ucp.confined, "read_inside", counted)
    return reads


def test_a_load_alternating_between_packs_reads_each_pack_once(tmp_path, monkeypatch):
    _save_over_two_ranks(tmp_path / "ck")
    reads = _counting_reads(monkeypatch)
    out = ucp.load(tmp_path / "ck")
    assert all(torch.equal(out[n], t) for n, t in TENSORS.items())
    packs = [r for r in reads if "/pack-" in r]
    assert sorted(packs) == sorted(set(packs)) and len(packs) == 2, packs


def test_the_pack_cache_keeps_to_its_budget(tmp_path, monkeypatch):
    _save_over_two_ranks(tmp_path / "ck")
    monkeypatch.setattr(ucp.storage, "PACK_CACHE_BYTES", 1)  # room for the newest pack only
    reads = _counting_reads(monkeypatch)
    out = ucp.load(tmp_path / "ck")
    assert all(torch.equal(out[n], t) for n, t in TENSORS.items())
    assert len([r for r in reads if "/pack-" in r]) == 2 * len(TENSORS)  # every turn re-reads: the old behaviour
