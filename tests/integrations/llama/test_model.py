"""The Llama-style decoder, its config and its data: single process, pure."""

from __future__ import annotations

import pytest
import torch

from ucp.integrations.llama.config import ConfigError, LlamaConfig
from ucp.integrations.llama.data import SyntheticCorpus, chunk_of, local_batch, rows_of
from ucp.integrations.llama.model import (LlamaModel, causal_attention, init_weights, keep_stage, logical_shapes, route,
                                      stage_layers)


def test_config_string_form_round_trips_and_names_bad_fields():
    cfg = LlamaConfig.parse("layers=2,heads=4,kv_heads=2,num_experts=4,rope_theta=500000.0")
    assert LlamaConfig.parse(str(cfg)) == cfg and cfg.head_dim == 8 and cfg.moe
    assert LlamaConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match=r"^bad model config item 'depth=2': expected NAME=VALUE with NAME one of"):
        LlamaConfig.parse("depth=2")
    with pytest.raises(ConfigError, match=r"^model config heads \(8\) must be a multiple of kv_heads \(3\)$"):
        LlamaConfig(kv_heads=3)
    with pytest.raises(ConfigError, match=r"^model config top_k \(5\) must be between 1 and num_experts \(4\)$"):
        LlamaConfig(num_experts=4, top_k=5)
    with pytest.raises(ConfigError, match=r"^bad value 'x' for model config layers: expected a number$"):
        LlamaConfig.parse("layers=x")


def test_megatron_program_binds_the_preset_to_the_model():
    cfg = LlamaConfig(layers=3, num_experts=2)
    assert cfg.megatron_program() == ("megatron-gpt:num_layers=3,hidden_size=32,ffn_hidden_size=64,heads=8,"
                                      "kv_heads=4,vocab_size=100,vocab_multiple=8,num_experts=2")


def test_data_is_a_pure_function_of_the_sample_index():
    corpus = SyntheticCorpus(vocab_size=50, seq_len=8, seed=3)
    whole = corpus.batch(position=10, size=5)
    assert torch.equal(whole[2], corpus.sample(12))
    assert [len(rows_of(whole, 3, r)) for r in range(3)] == [2, 2, 1]  # uneven dp
    chunk, start = chunk_of(whole[:, :-1], 2, 1)
    assert start == 4 and torch.equal(chunk, whole[:, 4:8])
    inputs, targets = local_batch(corpus, position=10, global_batch=5, dp=(3, 2), cp=(2, 0))
    assert torch.equal(inputs, whole[4:, :4]) and torch.equal(targets, whole[4:, 1:5])


def test_attention_of_a_query_chunk_equals_that_chunk_of_full_attention():
    """What context parallelism relies on: queries at an offset, all keys."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 8, h, 4, generator=g) for h in (4, 2, 2))
    full = causal_attention(q, k, v)
    torch.testing.assert_close(causal_attention(q[:, 4:], k, v, q_offset=4), full[:, 4:])


def test_moe_output_is_the_weighted_sum_of_the_chosen_experts():
    model = init_weights(LlamaModel(LlamaConfig(layers=1, num_experts=4, top_k=2)))
    moe = model.decoder.layers["0"].mlp
    x = torch.randn(3, 5, 32, generator=torch.Generator().manual_seed(1))
    weights, chosen = route(moe.router(x.reshape(-1, 32)), 2)
    expected = torch.stack([sum(w * moe.experts[int(e)](t) for w, e in zip(ws, es))
                            for t, ws, es in zip(x.reshape(-1, 32), weights, chosen)])
    torch.testing.assert_close(moe(x).reshape(-1, 32), expected)
    assert torch.allclose(weights.sum(-1), torch.ones(15))


def test_pipeline_stages_keep_global_names_and_split_layers_like_the_preset():
    cfg = LlamaConfig(layers=5)
    assert [list(stage_layers(5, 3, s)) for s in range(3)] == [[0, 1], [2, 3], [4]]
    names = set()
    for stage in range(3):
        part = keep_stage(init_weights(LlamaModel(cfg)), stage, 3)
        names |= {n for n, _ in part.named_parameters()}
    assert names == set(logical_shapes(cfg))
    last = keep_stage(LlamaModel(cfg), 2, 3)
    assert last.embedding is None and last.output_layer is not None and list(last.decoder.layers) == ["4"]


def test_initial_weights_do_not_depend_on_anything_but_the_seed():
    a = init_weights(LlamaModel(LlamaConfig(layers=2))).state_dict()
    b = init_weights(LlamaModel(LlamaConfig(layers=2))).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert torch.equal(a["decoder.layers.0.input_layernorm.weight"], torch.ones(32))
