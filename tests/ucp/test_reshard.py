"""N -> M resharding loads from fragment maps (ranks simulated in one process, parts + finalize)."""

from __future__ import annotations

import pytest
import torch

import ucp
from ucp.stores import StoreOptions
from ucp.geometry import Box
from ucp.sharding import local_shapes, split_fragment_map
from ucp.spec import FragmentMap, LogicalTensor, ShardPiece, TensorSpec

# Every test runs three times: small fragments packed (the default), and each fragment its own
# array with tiny chunks (so partial overlaps span several chunks and buffers), written and read
# directly as chunk files, or written and read through tensorstore.
_TINY = StoreOptions(pack_max_bytes=0, small_array_bytes=-1, chunk_bytes=20, slab_bytes=30)
IO = {
    "packed": StoreOptions(),
    "direct-chunks": _TINY,
    "tensorstore-chunks": _TINY.with_(direct_writes=False, direct_reads=False),
}


@pytest.fixture(params=list(IO))
def io_path(request):
    return request.param


LOGICAL = {
    "w": LogicalTensor("w", (10, 6), "float32"),
    "b": LogicalTensor("b", (7,), "bfloat16"),
    "e": LogicalTensor("e", (5, 3, 4), "int32"),
}


def _full() -> dict[str, torch.Tensor]:
    return {
        "w": torch.arange(60, dtype=torch.float32).view(10, 6),
        "b": torch.arange(7, dtype=torch.float32).to(torch.bfloat16),
        "e": torch.arange(60, dtype=torch.int32).view(5, 3, 4),
    }


def _local(full: torch.Tensor, spec: TensorSpec, shape) -> torch.Tensor:
    out = torch.zeros(shape, dtype=full.dtype)
    for p in spec.pieces:
        if isinstance(p.target, Box):
            out[p.local.slices()] = full[p.target.slices()]
        else:
            out.view(-1)[p.local.start : p.local.stop] = full.reshape(-1)[p.target.start : p.target.stop]
    return out


def _save_split(path, n: int, store_options: StoreOptions | None = None, **kw) -> None:
    full = _full()
    for rank in range(n):
        fmap = split_fragment_map(LOGICAL, rank=rank, world_size=n, **kw)
        shapes = local_shapes(fmap)
        state = {k: _local(full[k], fmap.tensors[k], shapes[k]) for k in LOGICAL}
        result = ucp.save({**state, "step": 5}, path, spec=fmap, rank=rank, world_size=n, store_options=store_options)
        assert result.committed == (n == 1)
    if n > 1:
        ucp.finalize(path, world_size=n)


TRANSITIONS = [
    # (save ranks, save split, load ranks, load split)
    (4, {"dim": 0}, 2, {"dim": 0}),
    (4, {"dim": 0}, 1, {"dim": 0}),
    (2, {"dim": 0}, 4, {"dim": 0}),
    (4, {"dim": 0}, 3, {"dim": 0}),  # uneven: 10 rows -> 4, 3, 3
    (4, {"dim": 0}, 3, {"dim": 1}),  # dim0 -> dim1
    (3, {"dim": 1}, 2, {"dim": 0}),
    (4, {"flat": True}, 3, {"dim": 0}),  # ZeRO flat -> boxes
    (2, {"dim": 1}, 4, {"flat": True}),  # boxes -> flat
    (3, {"flat": True}, 5, {"flat": True}),
]


@pytest.mark.parametrize("n,save_kw,m,load_kw", TRANSITIONS, ids=[f"{t[0]}{t[1]}->{t[2]}{t[3]}" for t in TRANSITIONS])
def test_n_to_m_reshard(io_path, tmp_path, n, save_kw, m, load_kw):
    path = tmp_path / "ckpt"
    _save_split(path, n, **save_kw, store_options=IO[io_path])
    full = _full()
    for rank in range(m):
        fmap = split_fragment_map(LOGICAL, rank=rank, world_size=m, **load_kw)
        out = ucp.load(path, spec=fmap, store_options=IO[io_path])
        assert out["step"] == 5
        shapes = local_shapes(fmap)
        for key in LOGICAL:
            expected = _local(full[key], fmap.tensors[key], shapes[key])
            assert torch.equal(out[key], expected), (rank, key)


def test_whole_model_load_assembles_logical_tensors(io_path, tmp_path):
    _save_split(tmp_path / "ckpt", 3, dim=1, store_options=IO[io_path])
    out = ucp.load(tmp_path / "ckpt", store_options=IO[io_path])
    for key, value in _full().items():
        assert torch.equal(out[key], value)


def test_callable_spec_and_in_place_reshard(io_path, tmp_path):
    _save_split(tmp_path / "ckpt", 4, store_options=IO[io_path])
    into = {"w": torch.zeros(5, 6), "b": torch.zeros(4, dtype=torch.bfloat16), "e": torch.zeros(3, 3, 4, dtype=torch.int32)}
    ptr = into["w"].data_ptr()
    out = ucp.load(tmp_path / "ckpt", into=into, spec=lambda logical: split_fragment_map(logical, rank=0, world_size=2), store_options=IO[io_path])
    assert out["w"].data_ptr() == ptr and torch.equal(into["w"], _full()["w"][:5])
    assert torch.equal(into["e"], _full()["e"][:3])


def test_fused_pieces_and_padding(io_path, tmp_path):
    # A local "qkv" tensor holds rows of two logical tensors plus 2 padding rows nobody saves.
    q, k = torch.randn(4, 3), torch.randn(2, 3)
    local = torch.cat([q, k, torch.full((2, 3), 99.0)])
    fmap = FragmentMap(
        rank=0,
        logical={"q": LogicalTensor("q", (4, 3), "float32"), "k": LogicalTensor("k", (2, 3), "float32")},
        tensors={"qkv": TensorSpec("qkv", (
            ShardPiece("q", Box((0, 0), (4, 3)), Box((0, 0), (4, 3))),
            ShardPiece("k", Box((4, 0), (2, 3)), Box((0, 0), (2, 3))),
        ))},
    )
    ucp.save({"qkv": local}, tmp_path / "c", spec=fmap, store_options=IO[io_path])
    out = ucp.load(tmp_path / "c", store_options=IO[io_path])
    assert torch.equal(out["q"], q) and torch.equal(out["k"], k)
    into = torch.full((8, 3), -1.0)
    ucp.load(tmp_path / "c", into={"qkv": into}, spec=fmap, store_options=IO[io_path])
    assert torch.equal(into[:6], local[:6]) and torch.equal(into[6:], torch.full((2, 3), -1.0))


def test_missing_logical_tensor_in_target_spec(io_path, tmp_path):
    _save_split(tmp_path / "ckpt", 1, store_options=IO[io_path])
    fmap = split_fragment_map({"nope": LogicalTensor("nope", (2,), "float32")}, rank=0, world_size=1)
    with pytest.raises(ucp.KeyMismatchError, match=r"missing from the checkpoint \(1\): nope"):
        ucp.load(tmp_path / "ckpt", spec=fmap, store_options=IO[io_path])


def test_finalize_names_missing_ranks(io_path, tmp_path):
    fmap = split_fragment_map(LOGICAL, rank=1, world_size=3)
    shapes = local_shapes(fmap)
    ucp.save({k: torch.zeros(shapes[k], dtype=getattr(torch, LOGICAL[k].dtype)) for k in LOGICAL},
             tmp_path / "ckpt", spec=fmap, rank=1, world_size=3, store_options=IO[io_path])
    with pytest.raises(ucp.IncompleteCheckpointError) as err:
        ucp.finalize(tmp_path / "ckpt", world_size=3)
    assert str(err.value) == (
        f"cannot finalize {tmp_path / 'ckpt'}: no part from rank(s) 0, 2 of 3 in "
        f"{tmp_path / '.ckpt.ucp-staging-shared' / 'parts'}; wait until every rank has closed its writer"
    )
    with pytest.raises(ucp.IncompleteCheckpointError, match="a save was started but never committed"):
        ucp.load(tmp_path / "ckpt", store_options=IO[io_path])


def test_coverage_gap_refuses_to_commit(io_path, tmp_path):
    fmap = FragmentMap(rank=0, logical={"w": LogicalTensor("w", (4,), "float32")},
                       tensors={"w": TensorSpec("w", (ShardPiece("w", Box((0,), (3,)), Box((0,), (3,))),))})
    with pytest.raises(ucp.CoverageError) as err:
        ucp.save({"w": torch.zeros(3)}, tmp_path / "c", spec=fmap, store_options=IO[io_path])
    assert str(err.value) == (
        "logical tensor 'w' [4] is not covered exactly once: 1 element(s) not written; check the fragment maps "
        "(every element must belong to exactly one piece or one replica group)"
    )
    assert list(tmp_path.iterdir()) == []  # staging removed, nothing committed
