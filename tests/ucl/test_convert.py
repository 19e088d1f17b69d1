"""Renames between naming schemes, transposes and the rotary (RoPE) permutation."""

from __future__ import annotations

import pytest
import torch

from ucp.ucl.convert import convert_names, rope_half_to_interleaved, rope_interleaved_to_half


def reference_interleaved_to_half(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Explicit loops: within each head, rows (x0, y0, x1, y1, ...) become (x0, x1, ..., y0, y1, ...)."""
    head_dim = w.shape[0] // heads
    out = torch.empty_like(w)
    for h in range(heads):
        for j in range(head_dim // 2):
            out[h * head_dim + j] = w[h * head_dim + 2 * j]
            out[h * head_dim + head_dim // 2 + j] = w[h * head_dim + 2 * j + 1]
    return out


def reference_half_to_interleaved(w: torch.Tensor, heads: int) -> torch.Tensor:
    head_dim = w.shape[0] // heads
    out = torch.empty_like(w)
    for h in range(heads):
        for j in range(head_dim // 2):
            out[h * head_dim + 2 * j] = w[h * head_dim + j]
            out[h * head_dim + 2 * j + 1] = w[h * head_dim + head_dim // 2 + j]
    return out


@pytest.mark.parametrize("heads,head_dim,cols", [(1, 2, 3), (2, 4, 5), (4, 6, 1), (3, 8, 0)])
def test_rope_permutation_matches_the_reference_both_ways_and_inverts(heads, head_dim, cols):
    shape = (heads * head_dim, cols) if cols else (heads * head_dim,)
    w = torch.randn(shape)
    half = rope_interleaved_to_half(w, heads)
    assert torch.equal(half, reference_interleaved_to_half(w, heads))
    assert torch.equal(rope_half_to_interleaved(w, heads), reference_half_to_interleaved(w, heads))
    assert torch.equal(rope_half_to_interleaved(half, heads), w)
    assert torch.equal(rope_interleaved_to_half(rope_half_to_interleaved(w, heads), heads), w)
    if head_dim > 2:
        assert not torch.equal(half, w)


def test_rope_rejects_rows_that_do_not_split_into_heads():
    with pytest.raises(ValueError, match="rope permutation: 6 rows do not split into 2 heads of even size"):
        rope_interleaved_to_half(torch.zeros(6, 2), 2)


def _meta_tensors(heads=4, kv=2, hd=4, hidden=16):
    g = torch.Generator().manual_seed(0)
    shapes = {"tok_embeddings.weight": (10, hidden), "output.weight": (10, hidden), "norm.weight": (hidden,),
              "layers.0.attention.wq.weight": (heads * hd, hidden), "layers.0.attention.wk.weight": (kv * hd, hidden),
              "layers.0.attention.wv.weight": (kv * hd, hidden), "layers.0.attention.wo.weight": (hidden, heads * hd),
              "layers.0.feed_forward.w1.weight": (8, hidden), "layers.0.feed_forward.w2.weight": (hidden, 8),
              "layers.0.feed_forward.w3.weight": (8, hidden), "layers.0.attention_norm.weight": (hidden,),
              "layers.0.ffn_norm.weight": (hidden,)}
    out = {n: torch.randn(s, generator=g) for n, s in shapes.items()}
    out["layers.0.attention.wq.weight/exp_avg"] = torch.randn(heads * hd, hidden, generator=g)
    return out


def test_meta_to_hf_renames_and_permutes_rotary_rows_then_inverts():
    meta = _meta_tensors()
    hf = convert_names(meta, "meta-llama", "hf-llama", from_params={"heads": 4, "kv_heads": 2})
    assert sorted(hf) == sorted([
        "model.embed_tokens.weight", "lm_head.weight", "model.norm.weight",
        "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.self_attn.v_proj.weight", "model.layers.0.self_attn.o_proj.weight",
        "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.down_proj.weight",
        "model.layers.0.mlp.up_proj.weight", "model.layers.0.input_layernorm.weight",
        "model.layers.0.post_attention_layernorm.weight", "model.layers.0.self_attn.q_proj.weight/exp_avg"])
    q = meta["layers.0.attention.wq.weight"]
    assert torch.equal(hf["model.layers.0.self_attn.q_proj.weight"], reference_interleaved_to_half(q, 4))
    assert torch.equal(hf["model.layers.0.self_attn.k_proj.weight"],
                       reference_interleaved_to_half(meta["layers.0.attention.wk.weight"], 2))
    assert torch.equal(hf["model.layers.0.self_attn.q_proj.weight/exp_avg"],
                       reference_interleaved_to_half(meta["layers.0.attention.wq.weight/exp_avg"], 4))
    assert torch.equal(hf["model.layers.0.self_attn.v_proj.weight"], meta["layers.0.attention.wv.weight"])
    back = convert_names(hf, "hf-llama", "meta-llama", to_params={"heads": 4, "kv_heads": 2})
    assert back.keys() == meta.keys() and all(torch.equal(back[k], meta[k]) for k in meta)


def test_megatron_and_hf_names_map_both_ways(models):
    mega = models.megatron(layers=2, hidden=8, heads=4, kv_heads=2, vocab=10, ffn=12, states=("exp_avg",))
    hf = convert_names(mega, "megatron-gpt", "hf-llama")
    assert "model.layers.1.mlp.down_proj.weight/exp_avg" in hf and "lm_head.weight" in hf
    assert torch.equal(hf["model.layers.1.self_attn.o_proj.weight"], mega["decoder.layers.1.self_attention.linear_proj.weight"])
    back = convert_names(hf, "hf-llama", "megatron-gpt")
    assert back.keys() == mega.keys() and all(torch.equal(back[k], mega[k]) for k in mega)


def test_transpose_views_swap_the_two_dims():
    gpt2 = "ucl 1\nview h.{i}.mlp.c_fc.weight = model.layers.{i}.mlp.up_proj.weight transpose\n"
    w = torch.randn(4, 16)  # GPT-2 Conv1D stores [in, out]
    hf = convert_names({"h.0.mlp.c_fc.weight": w}, gpt2, "hf-llama")
    assert torch.equal(hf["model.layers.0.mlp.up_proj.weight"], w.T)
    back = convert_names(hf, "hf-llama", gpt2)
    assert torch.equal(back["h.0.mlp.c_fc.weight"], w)
