"""Shared builders for UCL tests: logical tensors of small models, filled with random values."""

from __future__ import annotations

import pytest
import torch


def megatron_logical(*, layers=4, hidden=8, heads=4, kv_heads=2, vocab=50, ffn=12, experts=0, tie=0,
                     states=("fp32", "exp_avg", "exp_avg_sq"), seed=0) -> dict[str, torch.Tensor]:
    """Logical tensors (unfused names) of a tiny Megatron-style GPT and its optimizer states."""
    g = torch.Generator().manual_seed(seed)
    hd = hidden // heads
    shapes = {"embedding.word_embeddings.weight": (vocab, hidden), "decoder.final_layernorm.weight": (hidden,)}
    if not tie:
        shapes["output_layer.weight"] = (vocab, hidden)
    for layer in range(layers):
        p = f"decoder.layers.{layer}."
        shapes[p + "input_layernorm.weight"] = (hidden,)
        shapes[p + "self_attention.linear_q.weight"] = (heads * hd, hidden)
        shapes[p + "self_attention.linear_k.weight"] = (kv_heads * hd, hidden)
        shapes[p + "self_attention.linear_v.weight"] = (kv_heads * hd, hidden)
        shapes[p + "self_attention.linear_proj.weight"] = (hidden, heads * hd)
        shapes[p + "pre_mlp_layernorm.weight"] = (hidden,)
        if experts:
            shapes[p + "mlp.router.weight"] = (experts, hidden)
            for e in range(experts):
                shapes[p + f"mlp.experts.{e}.gate.weight"] = (ffn, hidden)
                shapes[p + f"mlp.experts.{e}.up.weight"] = (ffn, hidden)
                shapes[p + f"mlp.experts.{e}.linear_fc2.weight"] = (hidden, ffn)
        else:
            shapes[p + "mlp.gate.weight"] = (ffn, hidden)
            shapes[p + "mlp.up.weight"] = (ffn, hidden)
            shapes[p + "mlp.linear_fc2.weight"] = (hidden, ffn)
    out = {n: torch.randn(s, generator=g) for n, s in shapes.items()}
    for n, s in shapes.items():
        for st in states:
            out[f"{n}/{st}"] = torch.randn(s, generator=g)
    return out


def hf_llama_logical(*, layers=2, hidden=8, heads=4, kv_heads=2, vocab=50, ffn=12, seed=0,
                     states=("exp_avg", "exp_avg_sq")) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    hd = hidden // heads
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "lm_head.weight": (vocab, hidden),
              "model.norm.weight": (hidden,)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (hidden,), p + "post_attention_layernorm.weight": (hidden,),
            p + "self_attn.q_proj.weight": (heads * hd, hidden), p + "self_attn.k_proj.weight": (kv_heads * hd, hidden),
            p + "self_attn.v_proj.weight": (kv_heads * hd, hidden), p + "self_attn.o_proj.weight": (hidden, heads * hd),
            p + "mlp.gate_proj.weight": (ffn, hidden), p + "mlp.up_proj.weight": (ffn, hidden),
            p + "mlp.down_proj.weight": (hidden, ffn),
        })
    out = {n: torch.randn(s, generator=g) for n, s in shapes.items()}
    for n, s in shapes.items():
        for st in states:
            out[f"{n}/{st}"] = torch.randn(s, generator=g)
    return out


def hf_llama_params(*, layers=2, hidden=8, heads=4, kv_heads=2, vocab=50, ffn=12) -> dict:
    """The hf-llama preset's parameters for :func:`hf_llama_logical` with the same arguments."""
    return dict(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=kv_heads,
                vocab_size=vocab, intermediate_size=ffn)


def deepspeed_logical(*, seed=0, states=("fp32", "exp_avg", "exp_avg_sq")) -> dict[str, torch.Tensor]:
    """The fixtures' tiny model: embedding 101x32, one block, final norm, head."""
    g = torch.Generator().manual_seed(seed)
    shapes = {"emb.weight": (101, 32), "blocks.0.norm.weight": (32,), "blocks.0.norm.bias": (32,),
              "blocks.0.fc1.weight": (64, 32), "blocks.0.fc1.bias": (64,), "blocks.0.fc2.weight": (32, 64),
              "blocks.0.fc2.bias": (32,), "ln.weight": (32,), "ln.bias": (32,), "head.weight": (101, 32)}
    out = {n: torch.randn(s, generator=g) for n, s in shapes.items()}
    for n, s in shapes.items():
        for st in states:
            out[f"{n}/{st}"] = torch.randn(s, generator=g)
    out["optim/step"] = torch.tensor(3.0)
    return out


def check_layout_pair(program, a, b, tensors, params) -> None:
    """Save under A, load under B, and back: logical tensors bitwise under A and B, A -> B -> A locals bitwise.

    The in-memory executor (ucl.simulate) plays every rank: placing logical tensors on the ranks of a
    layout and gathering them back is exactly save + load minus the disk.
    """
    from ucp.ucl.simulate import gather, place

    fm_a, loc_a = place(program, a, tensors, params=params)
    saved = gather(fm_a, loc_a)
    assert set(saved) == set(tensors)
    assert all(torch.equal(saved[n], tensors[n]) for n in tensors)
    fm_b, loc_b = place(program, b, saved, params=params)
    loaded = gather(fm_b, loc_b)
    assert set(loaded) == set(tensors)
    assert all(torch.equal(loaded[n], tensors[n]) for n in tensors)
    _, loc_a2 = place(program, a, loaded, params=params)
    for rank, (one, two) in enumerate(zip(loc_a, loc_a2)):
        assert one.keys() == two.keys()
        for key in one:
            assert torch.equal(one[key], two[key]), (rank, key)


@pytest.fixture
def models():
    class Models:
        megatron = staticmethod(megatron_logical)
        hf_llama = staticmethod(hf_llama_logical)
        hf_llama_params = staticmethod(hf_llama_params)
        deepspeed = staticmethod(deepspeed_logical)
        check_pair = staticmethod(check_layout_pair)

    return Models
