"""Tensors the format cannot store (or load into) are refused with a clear error before anything is written."""

from __future__ import annotations

import pytest
import torch

import ucp
from ucp.writer import CheckpointWriter


@pytest.mark.parametrize(("make", "message"), [
    (lambda: torch.eye(3).to_sparse(),
     "tensor 'm/w' is sparse (torch.sparse_coo), which the checkpoint format cannot store; save tensor.to_dense() "
     "(or its indices and values as separate tensors)"),
    (lambda: torch.eye(3).to_sparse_csr(),
     "tensor 'm/w' is sparse (torch.sparse_csr), which the checkpoint format cannot store; save tensor.to_dense() "
     "(or its indices and values as separate tensors)"),
    (lambda: torch.empty(3, device="meta"),
     "tensor 'm/w' is on the meta device and has no data; materialize it (e.g. module.to_empty(device='cpu'), "
     "then initialize or load it) before saving"),
    (lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]),
     "tensor 'm/w' is a nested (ragged) tensor, which the checkpoint format cannot store; save its components "
     "(tensor.unbind()) as separate tensors"),
])
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_tensor_without_plain_storage_is_refused_before_writing(tmp_path, make, message):
    with pytest.raises(ucp.UnsupportedTensorError) as err:
        ucp.save({"m": {"w": make()}, "ok": torch.ones(2)}, tmp_path / "c")
    assert str(err.value) == message
    assert isinstance(err.value, TypeError)
    assert list(tmp_path.iterdir()) == []  # not even a staging directory


def test_the_writer_refuses_them_too(tmp_path):
    writer = CheckpointWriter(str(tmp_path / "c"))
    with pytest.raises(ucp.UnsupportedTensorError, match="tensor 'w' is on the meta device and has no data"):
        writer.add("w", torch.empty(2, device="meta"))
    writer.abort()


def test_conjugate_and_negative_views_save_their_values(tmp_path):
    z = torch.randn(3, dtype=torch.complex64, generator=torch.Generator().manual_seed(0))
    state = {"conj": z.conj(), "neg": z.conj().imag}
    ucp.save(state, tmp_path / "c")
    out = ucp.load(tmp_path / "c")
    assert torch.equal(out["conj"], z.conj().resolve_conj())
    assert torch.equal(out["neg"], z.conj().imag.resolve_neg())


def test_loading_into_a_meta_tensor_is_refused(tmp_path):
    ucp.save({"w": torch.ones(2)}, tmp_path / "c")
    with pytest.raises(ucp.UnsupportedTensorError) as err:
        ucp.load(tmp_path / "c", into={"w": torch.empty(2, device="meta")})
    assert str(err.value) == (
        "cannot load 'w' into a tensor on the meta device (it has no memory); materialize it first "
        "(e.g. module.to_empty(device='cpu')) or load without into="
    )


def test_loading_into_a_sparse_tensor_is_refused(tmp_path):
    ucp.save({"w": torch.eye(2)}, tmp_path / "c")
    with pytest.raises(ucp.UnsupportedTensorError, match=r"cannot load 'w' into a sparse tensor \(torch.sparse_coo\)"):
        ucp.load(tmp_path / "c", into={"w": torch.eye(2).to_sparse()})


def test_misuse_of_the_writer_raises_ucp_errors(tmp_path):
    with pytest.raises(ucp.LayoutError, match=r"rank 3 must be in \[0, world_size=2\)"):
        CheckpointWriter(str(tmp_path / "a"), rank=3, world_size=2)
    with pytest.raises(ucp.InvalidArgumentError, match="spec must be a FragmentMap, got dict"):
        CheckpointWriter(str(tmp_path / "a"), spec={})
    with CheckpointWriter(str(tmp_path / "b")) as writer:
        writer.add("w", torch.ones(2))
        with pytest.raises(ucp.NameConflictError, match="tensor 'w' was already added to this checkpoint"):
            writer.add("w", torch.ones(2))
    assert ucp.load(tmp_path / "b")["w"].tolist() == [1.0, 1.0]
