"""A small Llama-style decoder, written to be read: the logical (un-parallelised) model.

RMSNorm, rotary position embeddings (RoPE, half-split convention), grouped-query
attention, SwiGLU MLPs and, optionally, mixture-of-experts layers with top-k
routing. Parameter names are the logical names every checkpoint in this project
uses for it (the megatron-gpt UCL preset's unfused names)::

    embedding.word_embeddings.weight                       [vocab, hidden]
    decoder.layers.{i}.input_layernorm.weight              [hidden]
    decoder.layers.{i}.self_attention.linear_{q,k,v}.weight
    decoder.layers.{i}.self_attention.linear_proj.weight   [hidden, hidden]
    decoder.layers.{i}.pre_mlp_layernorm.weight            [hidden]
    decoder.layers.{i}.mlp.{gate,up,linear_fc2}.weight     (dense layers)
    decoder.layers.{i}.mlp.router.weight                   (MoE: [experts, hidden])
    decoder.layers.{i}.mlp.experts.{e}.{gate,up,linear_fc2}.weight
    decoder.final_layernorm.weight, output_layer.weight

The torch-native stack parallelises this very module (DTensor, FSDP2, pipeline
stages cut out of it with :func:`keep_stage`); the Megatron-style stack re-implements
the layers over shards and uses the functions below (``apply_rope``,
``causal_attention``, ``route``) for the arithmetic, so all stacks compute the same
function of the same logical weights.

Example::

    >>> cfg = LlamaConfig(layers=2)
    >>> model = LlamaModel(cfg)
    >>> tokens = torch.zeros(1, cfg.seq_len, dtype=torch.long)
    >>> model(tokens).shape
    torch.Size([1, 16, 100])
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ucp.integrations.llama.config import LlamaConfig
from ucp.geometry import split_evenly

__all__ = [
    "LlamaModel", "DecoderLayer", "Attention", "SwiGLU", "MoE", "RMSNorm", "rope_tables", "apply_rope",
    "causal_attention", "route", "token_loss_sum", "init_weights", "logical_shapes", "build_model", "keep_stage",
    "stage_layers",
]

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


# --------------------------------------------------------------------------- arithmetic shared by every stack


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, ``[len(positions), head_dim]``, for the half-split rotary convention."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[batch, seq, heads, head_dim]`` by the tables of its positions."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)  # bf16 activations stay bf16
    return x * cos[None, :, None, :] + rotated * sin[None, :, None, :]


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, q_offset: int = 0) -> torch.Tensor:
    """Softmax attention of ``q`` ``[b, sq, hq, d]`` over ``k, v`` ``[b, sk, hkv, d]``, causal.

    Query ``i`` sits at position ``q_offset + i`` of the key sequence (context
    parallelism gives a rank a chunk of the queries and all the keys). Grouped-query
    attention: query head ``h`` reads key/value head ``h // (hq // hkv)``.
    """
    rep = q.shape[2] // k.shape[2]
    if rep > 1:
        k = k.repeat_interleave(rep, dim=2)
        v = v.repeat_interleave(rep, dim=2)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [b, h, s, d]
    scores = (q @ k.transpose(-1, -2)) / (q.shape[-1] ** 0.5)
    q_pos = torch.arange(q.shape[2]) + q_offset
    k_pos = torch.arange(k.shape[2])
    scores = scores.masked_fill(k_pos[None, :] > q_pos[:, None], float("-inf"))
    return (scores.softmax(dim=-1) @ v).transpose(1, 2)


def route(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k routing: ``(weights, experts)``, both ``[tokens, top_k]``; weights renormalised to sum 1."""
    probs = logits.float().softmax(dim=-1)
    weights, experts = probs.topk(top_k, dim=-1)
    return (weights / weights.sum(dim=-1, keepdim=True)).to(logits.dtype), experts


def token_loss_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Summed next-token cross-entropy (callers divide by the global token count)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), reduction="sum")


# --------------------------------------------------------------------------- modules


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class Attention(nn.Module):
    """Grouped-query attention. Head counts come from the weights' shapes, so a tensor
    parallel shard (fewer rows of q/k/v) runs the same code on its own heads."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.head_dim = cfg.head_dim
        self.linear_q = nn.Linear(cfg.hidden, cfg.heads * cfg.head_dim, bias=False)
        self.linear_k = nn.Linear(cfg.hidden, cfg.kv_heads * cfg.head_dim, bias=False)
        self.linear_v = nn.Linear(cfg.hidden, cfg.kv_heads * cfg.head_dim, bias=False)
        self.linear_proj = nn.Linear(cfg.heads * cfg.head_dim, cfg.hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.linear_q(x).view(b, s, -1, self.head_dim)
        k = self.linear_k(x).view(b, s, -1, self.head_dim)
        v = self.linear_v(x).view(b, s, -1, self.head_dim)
        out = attend(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v)
        return self.linear_proj(out.reshape(b, s, -1))


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.gate = nn.Linear(hidden, ffn, bias=False)
        self.up = nn.Linear(hidden, ffn, bias=False)
        self.linear_fc2 = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.silu(self.gate(x)) * self.up(x))


class MoE(nn.Module):
    """Top-k mixture of SwiGLU experts, dropless (every routed token is computed).

    Every expert runs, even on no tokens, so each has a gradient every step (zeros
    when unused) and Adam advances all parameters together, in every layout.
    """

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.top_k = cfg.top_k
        self.router = nn.Linear(cfg.hidden, cfg.num_experts, bias=False)
        self.experts = nn.ModuleList(SwiGLU(cfg.hidden, cfg.ffn) for _ in range(cfg.num_experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        weights, chosen = route(self.router(tokens), self.top_k)
        out = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            token_idx, slot = (chosen == e).nonzero(as_tuple=True)
            contribution = expert(tokens[token_idx]) * weights[token_idx, slot, None]
            out = out.index_add(0, token_idx, contribution)
        return out.view_as(x)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.self_attention = Attention(cfg)
        self.pre_mlp_layernorm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.mlp = MoE(cfg) if cfg.moe else SwiGLU(cfg.hidden, cfg.ffn)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend) -> torch.Tensor:
        x = x + self.self_attention(self.input_layernorm(x), cos, sin, attend)
        return x + self.mlp(self.pre_mlp_layernorm(x))


class LlamaModel(nn.Module):
    """The decoder. ``forward`` takes token ids (first pipeline stage) or hidden states.

    ``position_offset`` is the position of this rank's first token (context
    parallelism); ``attend`` replaces the attention kernel (context-parallel ring or
    all-gather attention). After :func:`keep_stage` a module holds one pipeline
    stage: missing parts are ``None`` and the layer names stay global.
    """

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.position_offset = 0
        self.attend: Attend | None = None
        self.embedding = nn.Module()
        self.embedding.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.decoder = nn.Module()
        self.decoder.layers = nn.ModuleDict({str(i): DecoderLayer(cfg) for i in range(cfg.layers)})
        self.decoder.final_layernorm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.output_layer = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embedding.word_embeddings(x) if self.embedding is not None else x
        positions = torch.arange(h.shape[1]) + self.position_offset
        cos, sin = rope_tables(positions, self.cfg.head_dim, self.cfg.rope_theta)
        offset = self.position_offset
        attend = self.attend or (lambda q, k, v: causal_attention(q, k, v, q_offset=offset))
        for layer in self.decoder.layers.values():
            h = layer(h, cos, sin, attend)
        if self.output_layer is None:
            return h
        return self.output_layer(self.decoder.final_layernorm(h))


# --------------------------------------------------------------------------- initialisation and pipeline stages


def logical_shapes(cfg: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Logical parameter name -> shape (nothing is allocated)."""
    with torch.device("meta"):
        return {name: tuple(p.shape) for name, p in LlamaModel(cfg).named_parameters()}


def build_model(cfg: LlamaConfig, *, init: bool = True) -> LlamaModel:
    """The logical model with its initial weights, or (``init=False``) with zeros, cheaply, for a
    run that loads a checkpoint next: built on the meta device, then given memory, never drawn."""
    with torch.device("meta"):
        model = LlamaModel(cfg)
    model.to_empty(device="cpu")
    if init:
        return init_weights(model)
    with torch.no_grad():
        for param in model.parameters():
            param.zero_()
    return model


def init_weights(model: LlamaModel, *, seed: int | None = None) -> LlamaModel:
    """Deterministic initial weights: normal(0, init_std) matrices, ones for norms, drawn in name order.

    Every stack starts from these logical weights, whatever its layout.
    """
    gen = torch.Generator().manual_seed(model.cfg.seed if seed is None else seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if name.endswith("layernorm.weight"):
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=gen) * model.cfg.init_std)
    return model


def stage_layers(layers: int, stages: int, stage: int) -> range:
    """Global layer indices of pipeline stage ``stage``: as even as possible, earlier stages
    one larger (the megatron-gpt preset's ``stage_layers``)."""
    start, count = split_evenly(layers, stages, stage)
    return range(start, start + count)


def keep_stage(model: LlamaModel, stage: int, stages: int) -> LlamaModel:
    """Cut ``model`` down to pipeline stage ``stage`` of ``stages`` in place (torchtitan style)."""
    keep = {str(i) for i in stage_layers(model.cfg.layers, stages, stage)}
    for name in list(model.decoder.layers.keys()):
        if name not in keep:
            del model.decoder.layers[name]
    if stage > 0:
        model.embedding = None
    if stage < stages - 1:
        model.decoder.final_layernorm = None
        model.output_layer = None
    return model
