"""Reading a tensor that is not there, or a region that is not in it, is a UcpError naming both (issue 8,
item 21: bare KeyError/ValueError escaped from reader.py)."""

from __future__ import annotations

import pytest
import torch

import ucp
from ucp.reader import CheckpointReader


@pytest.fixture()
def checkpoint(tmp_path):
    path = tmp_path / "c"
    ucp.save({"w": torch.arange(12.0).view(3, 4), "b": torch.ones(2)}, path)
    return path


def test_an_unknown_tensor_is_a_key_mismatch_naming_the_known_ones(checkpoint):
    with pytest.raises(ucp.KeyMismatchError) as err:
        ucp.read_tensor(checkpoint, "nope")
    assert str(err.value) == f"no logical tensor 'nope' in {checkpoint}; it has 2: 'b', 'w'"
    assert isinstance(err.value, KeyError)
    with pytest.raises(ucp.KeyMismatchError):
        list(ucp.iter_tensors(checkpoint, ["w", "nope"]))


@pytest.mark.parametrize("region, shown", [
    (ucp.Box((2, 0), (2, 4)), "[2:4, 0:4]"),
    (ucp.Box((0,), (3,)), "[0:3]"),
    (ucp.FlatRange(10, 13), "flat[10:13]"),
])
def test_a_region_outside_the_tensor_is_a_shape_mismatch(checkpoint, region, shown):
    with pytest.raises(ucp.ShapeMismatchError) as err:
        ucp.read_tensor(checkpoint, "w", region)
    assert str(err.value) == f"cannot read {shown} of tensor 'w': it does not fit its shape [3, 4]"


def test_a_destination_of_the_wrong_shape_or_dtype_is_a_shape_mismatch(checkpoint):
    with CheckpointReader(str(checkpoint)) as reader:
        with pytest.raises(ucp.ShapeMismatchError) as err:
            reader.read_into("w", ucp.Box((0, 0), (2, 4)), torch.empty(4, 2))
        assert str(err.value) == ("cannot read [0:2, 0:4] of tensor 'w' into a float32[4, 2] tensor; it needs "
                                  "float32[2, 4]")
        with pytest.raises(ucp.ShapeMismatchError, match=r"into a float64\[2, 4\] tensor; it needs float32\[2, 4\]"):
            reader.read_into("w", ucp.Box((0, 0), (2, 4)), torch.empty(2, 4, dtype=torch.float64))
        out = torch.empty(2, 4)
        reader.read_into("w", ucp.Box((1, 0), (2, 4)), out)
        assert torch.equal(out, torch.arange(4.0, 12.0).view(2, 4))
