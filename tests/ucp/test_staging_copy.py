"""The staging copy (numpy, large tensors split over threads) is exact for every layout and dtype."""

import pytest
import torch

from ucp.staging_pool import StagingPool


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.randn(3 << 20),  # 12 MiB: split into pieces copied by several threads
        lambda: torch.randn(5 << 20).to(torch.bfloat16),  # split, stored as a bit pattern
        lambda: torch.randn(512, 1024).t(),  # non-contiguous: one numpy copy
        lambda: torch.tensor(7, dtype=torch.int64),  # 0-d
        lambda: torch.rand(1000) > 0.5,  # bool
        lambda: torch.zeros(0, 3),  # empty
    ],
    ids=["split-f32", "split-bf16", "transposed", "0-d", "bool", "empty"],
)
def test_staged_copy_is_exact(make):
    tensor = make()
    pool = StagingPool(budget_bytes=64 << 20)
    pool.reserve(64 << 20)
    block = pool.stage(tensor)
    assert block.tensor.shape == tensor.shape and block.tensor.dtype == tensor.dtype
    assert torch.equal(block.tensor, tensor)
    pool.release(block)
