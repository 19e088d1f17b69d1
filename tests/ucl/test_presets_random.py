"""Every preset over seeded random layout pairs: save under A, load under B, and back to A.

The in-memory executor (ucl.simulate, via conftest.check_layout_pair) plays every
rank: placing logical tensors on the ranks of a layout and gathering them back is
exactly save + load minus the disk. Checks: the logical tensors come back bitwise under A and under B,
and A -> B -> A gives back A's local tensors bitwise (padding included).
"""

from __future__ import annotations

import random

import pytest
import torch

from ucp.layout import Layout


def _megatron_layout(rng: random.Random, *, zero: int | None = None, max_world=32) -> Layout:
    while True:
        tp, pp, dp, cp = rng.choice([1, 2, 4]), rng.choice([1, 2, 3]), rng.choice([1, 2, 3, 4]), rng.choice([1, 2])
        ep = rng.choice([e for e in (1, 2, 4) if dp % e == 0])
        vpp = rng.choice([1, 2]) if pp > 1 else 1
        z = rng.choice([0, 1, 2]) if zero is None else zero
        if tp * pp * dp * cp <= max_world:
            return Layout(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, vpp=vpp, zero=z)


def _megatron_cases(count: int) -> list[tuple]:
    rng = random.Random(2024)
    cases = []
    for _ in range(count):
        a, b = _megatron_layout(rng), _megatron_layout(rng)
        experts = 4 if (a.ep > 1 or b.ep > 1 or rng.random() < 0.3) else 0
        tie = int(rng.random() < 0.5)  # with any zero stage: tied copies are replicas, states included
        # key/value groups: any count both tp sizes divide (Megatron's rule; MQA and tp == kv_heads included)
        kv_heads = rng.choice([k for k in (1, 2, 4, 8) if k % a.tp == 0 and k % b.tp == 0])
        cases.append((a, b, experts, tie, kv_heads))
    return cases


MEGATRON_CASES = _megatron_cases(14)


@pytest.mark.parametrize("a,b,experts,tie,kv_heads", MEGATRON_CASES,
                         ids=[f"{a}->{b},kv{k}{',moe' if e else ''}{',tied' if t else ''}"
                              for a, b, e, t, k in MEGATRON_CASES])
def test_megatron_gpt_random_layout_pairs(a, b, experts, tie, kv_heads, models):
    params = dict(num_layers=6, hidden_size=16, ffn_hidden_size=16, heads=8, kv_heads=kv_heads, vocab_size=50,
                  vocab_multiple=4, num_experts=experts,
                  tie_embeddings=tie)
    tensors = models.megatron(layers=6, hidden=16, heads=8, kv_heads=kv_heads, vocab=50, ffn=16, experts=experts,
                              tie=tie)
    models.check_pair("megatron-gpt", a, b, tensors, params)


_DS_RNG = random.Random(100)
DEEPSPEED_CASES = [tuple(Layout(dp=_DS_RNG.choice([1, 2, 3, 4]), zero=_DS_RNG.choice([0, 1, 2, 3])) for _ in range(2))
                   for _ in range(5)]


@pytest.mark.parametrize("a,b", DEEPSPEED_CASES, ids=[f"{a}->{b}" for a, b in DEEPSPEED_CASES])
def test_deepspeed_zero_random_layout_pairs(a, b, models):
    models.check_pair("deepspeed-zero", a, b, models.deepspeed(), {})


_HF_RNG = random.Random(200)
HF_CASES = [tuple(Layout(tp=_HF_RNG.choice([1, 2, 4]), dp=_HF_RNG.choice([1, 2, 3]), cp=_HF_RNG.choice([1, 2]))
                  for _ in range(2)) for _ in range(3)]


@pytest.mark.parametrize("a,b", HF_CASES, ids=[f"{a}->{b}" for a, b in HF_CASES])
def test_hf_llama_random_layout_pairs(a, b, models):
    # 4 key/value heads: Hugging Face tensor parallelism needs them to divide over tp (1, 2, 4)
    models.check_pair("hf-llama", a, b, models.hf_llama(kv_heads=4), models.hf_llama_params(kv_heads=4))


@pytest.mark.parametrize("a,b", [("tp=1", "tp=4"), ("tp=2,dp=2", "tp=1")])
def test_meta_llama_layout_pairs(a, b, models):
    g = torch.Generator().manual_seed(0)
    shapes = {"tok_embeddings.weight": (50, 8), "output.weight": (48, 8), "norm.weight": (8,),
              "layers.0.attention_norm.weight": (8,), "layers.0.ffn_norm.weight": (8,),
              "layers.0.attention.wq.weight": (16, 8), "layers.0.attention.wk.weight": (8, 8),
              "layers.0.attention.wv.weight": (8, 8), "layers.0.attention.wo.weight": (8, 16),
              "layers.0.feed_forward.w1.weight": (12, 8), "layers.0.feed_forward.w3.weight": (12, 8),
              "layers.0.feed_forward.w2.weight": (8, 12)}
    tensors = {n: torch.randn(s, generator=g) for n, s in shapes.items()}
    # 8 heads of 2 rows, 4 key/value heads: both divide over tp=4 (fairscale's n_heads // mp)
    models.check_pair("meta-llama", Layout.parse(a), Layout.parse(b), tensors, {"heads": 8, "kv_heads": 4})


def test_megatron_every_feature_at_once_against_a_single_rank(models):
    """tp=2, pp=2 with vpp=2, dp=4 with ep=2, cp=2, distributed optimizer, experts -> one rank."""
    params = dict(num_layers=4, hidden_size=16, ffn_hidden_size=16, heads=8, kv_heads=4, vocab_size=50,
                  vocab_multiple=4, num_experts=4)
    tensors = models.megatron(layers=4, hidden=16, heads=8, kv_heads=4, vocab=50, ffn=16, experts=4)
    models.check_pair("megatron-gpt", Layout(tp=2, pp=2, vpp=2, dp=4, ep=2, cp=2, zero=1), Layout(), tensors, params)
