"""The Megatron-style stack's own sharding agrees with the megatron-gpt UCL preset, rank by rank."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ucp import ucl
from ucp.integrations.llama.config import LlamaConfig
from ucp.integrations.llama.model import LlamaModel, init_weights
from ucp.integrations.megatron.layers import padded_vocab, vocab_parallel_cross_entropy
from ucp.integrations.megatron.sharding import local_shards, shards_from_logical
from ucp.layout import Layout

CASES = [
    ("", "tp=2,pp=2,dp=2,zero=1"),
    ("", "tp=4"),
    ("layers=5", "tp=2,pp=3"),                      # uneven stages
    ("vocab_size=61,ffn=48", "tp=4,dp=3"),          # vocabulary padding
    ("num_experts=4", "tp=2,dp=4,ep=2,zero=1"),
    ("num_experts=4", "dp=4,ep=4,cp=2"),
]


@pytest.mark.parametrize("model,layout", CASES)
def test_trainer_shards_equal_the_presets_pieces(model, layout):
    cfg, lay = LlamaConfig.parse(model), Layout.parse(layout)
    program = f"{cfg.megatron_program()},states=exp_avg|exp_avg_sq"
    for rank in range(lay.world_size):
        shards = local_shards(cfg, lay, rank)
        local = {f"model/{k}": (s.shape, "float32") for k, s in shards.items()}
        fmap = ucl.spec_for_save(program, lay, rank, local)
        for key, shard in shards.items():
            ours = sorted((p.logical, p.target.offsets, p.target.sizes, p.local.offsets) for p in shard.pieces)
            theirs = sorted((p.logical, p.target.offsets, p.target.sizes, p.local.offsets)
                            for p in fmap.tensors[f"model/{key}"].pieces)
            assert ours == theirs, (layout, rank, key)
            assert fmap.local[f"model/{key}"].shape == shard.shape


def test_shards_cut_from_the_logical_model_reassemble_it():
    cfg, lay = LlamaConfig(vocab_size=61), Layout.parse("tp=4,pp=2")
    logical = init_weights(LlamaModel(cfg)).state_dict()
    rebuilt = {k: torch.full_like(v, float("nan")) for k, v in logical.items()}
    for rank in range(lay.world_size):
        shards = local_shards(cfg, lay, rank)
        for key, tensor in shards_from_logical(shards, logical).items():
            covered = torch.zeros(tensor.shape, dtype=torch.bool)
            for p in shards[key].pieces:
                rebuilt[p.logical][p.target.slices()] = tensor[p.local.slices()]
                covered[p.local.slices()] = True
            assert not tensor[~covered].any()  # vocabulary padding is zero
    assert all(torch.equal(rebuilt[k], logical[k]) for k in logical)


def test_vocab_parallel_cross_entropy_ignores_padding_and_matches_torch():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, padded_vocab(61, 1, 8), generator=g, requires_grad=True)
    targets = torch.randint(0, 61, (6,), generator=g)
    ours = vocab_parallel_cross_entropy(logits, targets, start=0, vocab_size=61, group=None)
    theirs = F.cross_entropy(logits[:, :61], targets, reduction="none")
    torch.testing.assert_close(ours, theirs)
    ours.sum().backward()
    assert not logits.grad[:, 61:].any()

