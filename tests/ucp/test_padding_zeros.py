"""Elements of a local tensor that no piece covers (alignment padding) load as zeros."""

import torch

import ucp
from ucp.geometry import FlatRange
from ucp.spec import FragmentMap, LogicalTensor, ShardPiece, TensorSpec


def _flat_map() -> FragmentMap:
    # A ZeRO-style flat buffer: a[0:4] at 0..4, two elements of alignment padding, b[0:4] at 6..10.
    pieces = (
        ShardPiece("a", local=FlatRange(0, 4), target=FlatRange(0, 4)),
        ShardPiece("b", local=FlatRange(6, 10), target=FlatRange(0, 4)),
    )
    return FragmentMap(
        rank=0,
        logical={"a": LogicalTensor("a", (2, 2), "float32"), "b": LogicalTensor("b", (4,), "float32")},
        tensors={"flat": TensorSpec("flat", pieces)},
    )


def test_alignment_padding_loads_as_zeros(tmp_path):
    buffer = torch.arange(1.0, 11.0)
    buffer[4:6] = 99.0  # whatever the padding held when saved is not part of the checkpoint
    ucp.save({"flat": buffer}, tmp_path / "c", spec=_flat_map())
    assert torch.equal(ucp.load(tmp_path / "c")["a"], torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    loaded = ucp.load(tmp_path / "c", spec=_flat_map())["flat"]
    assert torch.equal(loaded, torch.tensor([1.0, 2, 3, 4, 0, 0, 7, 8, 9, 10]))
