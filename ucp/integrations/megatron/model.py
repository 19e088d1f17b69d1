"""One pipeline stage of the Llama-style decoder, Megatron style, on one rank.

Local parameter names are Megatron-core's (``decoder.layers.{i}`` counts the
stage's own layers from 0), which is what the megatron-gpt UCL preset maps:

* ``self_attention.linear_qkv``: column-parallel, fused per key/value group:
  this rank's ``kv_heads / tp`` groups, each ``[its query heads; k; v]``;
* ``self_attention.linear_proj``: row-parallel;
* ``mlp.linear_fc1``: column-parallel, ``[gate_r; up_r]``; ``mlp.linear_fc2``: row-parallel;
* MoE: ``mlp.router`` replicated; ``mlp.experts.local_experts.{e}`` are this
  expert-parallel rank's experts (global index ``e + ep_rank * experts/ep``),
  each split over tp like the dense MLP. Tokens go to their experts' ranks and
  back with all-to-all over the ep group (dropless: no capacity limit);
* the embedding and the output layer split the padded vocabulary over tp.

The arithmetic is :mod:`ucp.integrations.llama.model`'s, so this computes the logical
model's function of the same logical weights.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ucp.integrations.llama.config import LlamaConfig
from ucp.integrations.llama.model import RMSNorm, apply_rope, causal_attention, rope_tables, route, stage_layers
from ucp.integrations.megatron.groups import ParallelGroups
from ucp.integrations.megatron.layers import (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding,
                                          copy_to_tp, padded_vocab, reduce_from_tp)
from ucp.geometry import split_evenly

__all__ = ["GPTStage"]


class ParallelAttention(nn.Module):
    def __init__(self, cfg: LlamaConfig, tp: int, group) -> None:
        super().__init__()
        self.groups = cfg.kv_heads // tp
        self.rep = cfg.heads // cfg.kv_heads
        self.head_dim = cfg.head_dim
        self.linear_qkv = ColumnParallelLinear(cfg.hidden, self.groups * (self.rep + 2) * cfg.head_dim, group)
        self.linear_proj = RowParallelLinear(self.groups * self.rep * cfg.head_dim, cfg.hidden, group)

    def forward(self, x, cos, sin, attend):
        b, s, _ = x.shape
        qkv = self.linear_qkv(x).view(b, s, self.groups, self.rep + 2, self.head_dim)
        q = qkv[:, :, :, : self.rep].reshape(b, s, self.groups * self.rep, self.head_dim)
        k, v = qkv[:, :, :, self.rep], qkv[:, :, :, self.rep + 1]
        out = attend(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v)
        return self.linear_proj(out.reshape(b, s, -1))


class ParallelMLP(nn.Module):
    """SwiGLU with ``linear_fc1 = [gate_r; up_r]`` (column-parallel) and a row-parallel ``linear_fc2``."""

    def __init__(self, hidden: int, ffn_local: int, group) -> None:
        super().__init__()
        self.linear_fc1 = ColumnParallelLinear(hidden, 2 * ffn_local, group)
        self.linear_fc2 = RowParallelLinear(ffn_local, hidden, group)

    def forward(self, x):
        gate, up = self.linear_fc1(x).chunk(2, dim=-1)
        return self.linear_fc2(F.silu(gate) * up)


class _Experts(nn.Module):
    """One expert's shard; its input is already replicated over tp and its output summed later."""

    def __init__(self, hidden: int, ffn_local: int) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(hidden, 2 * ffn_local, bias=False)
        self.linear_fc2 = nn.Linear(ffn_local, hidden, bias=False)

    def forward(self, x):
        gate, up = self.linear_fc1(x).chunk(2, dim=-1)
        return self.linear_fc2(F.silu(gate) * up)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, send_counts, recv_counts, group):
        ctx.counts, ctx.group = (send_counts, recv_counts), group
        out = x.new_empty((sum(recv_counts), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), recv_counts, send_counts, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        send_counts, recv_counts = ctx.counts
        out = grad.new_empty((sum(send_counts), *grad.shape[1:]))
        dist.all_to_all_single(out, grad.contiguous(), send_counts, recv_counts, group=ctx.group)
        return out, None, None, None


def all_to_all(x: torch.Tensor, send_counts: list[int], recv_counts: list[int], group) -> torch.Tensor:
    return x if group is None else _AllToAll.apply(x, send_counts, recv_counts, group)


class ParallelMoE(nn.Module):
    def __init__(self, cfg: LlamaConfig, ffn_local: int, groups: ParallelGroups) -> None:
        super().__init__()
        self.top_k, self.num_experts = cfg.top_k, cfg.num_experts
        self.ep = ParallelGroups.size(groups.ep)
        self.here = cfg.num_experts // self.ep
        self.ep_group, self.tp_group = groups.ep, groups.tp
        self.router = nn.Linear(cfg.hidden, cfg.num_experts, bias=False)
        self.experts = nn.Module()
        self.experts.local_experts = nn.ModuleList(_Experts(cfg.hidden, ffn_local) for _ in range(self.here))

    def forward(self, x):
        tokens = x.reshape(-1, x.shape[-1])
        weights, chosen = route(self.router(tokens), self.top_k)
        # one row per (token, slot), sorted by expert: experts of ep rank 0 first, then rank 1, ...
        flat_expert = chosen.reshape(-1)
        order = torch.argsort(flat_expert, stable=True)
        token_of = order // self.top_k
        send_counts = torch.bincount(flat_expert // self.here, minlength=self.ep).tolist()
        expert_counts = torch.bincount(flat_expert, minlength=self.num_experts)
        inputs = copy_to_tp(tokens, self.tp_group)[token_of]
        # exchange how many rows each rank gets, per local expert, then the rows themselves
        per_rank = expert_counts.view(self.ep, self.here)
        recv_table = per_rank.clone()
        if self.ep_group is not None:
            dist.all_to_all_single(recv_table, per_rank.contiguous(), group=self.ep_group)
        recv_counts = recv_table.sum(dim=1).tolist()
        received = all_to_all(inputs, send_counts, recv_counts, self.ep_group)
        # received rows: from source 0 [expert 0 rows, expert 1 rows, ...], from source 1 [...], ...
        outputs = torch.zeros_like(received)
        ends = recv_table.reshape(-1).cumsum(0)
        starts = torch.cat([torch.zeros(1, dtype=torch.long), ends[:-1]]).view_as(recv_table)
        for e, expert in enumerate(self.experts.local_experts):
            rows = torch.cat([torch.arange(int(starts[src, e]), int(starts[src, e] + recv_table[src, e]))
                              for src in range(self.ep)])
            outputs = outputs.index_add(0, rows, expert(received[rows]))
        # each tp rank returns partial sums (fc2 is split over tp): complete them before the router's
        # weights multiply, so the router's gradient is whole on every tp rank
        returned = reduce_from_tp(all_to_all(outputs, recv_counts, send_counts, self.ep_group), self.tp_group)
        scale = weights.reshape(-1)[order, None]
        return torch.zeros_like(tokens).index_add(0, token_of, returned * scale).view_as(x)


class ParallelLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig, groups: ParallelGroups) -> None:
        super().__init__()
        tp = ParallelGroups.size(groups.tp)
        ffn_local = split_evenly(cfg.ffn, tp, ParallelGroups.index(groups.tp))[1]
        self.input_layernorm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.self_attention = ParallelAttention(cfg, tp, groups.tp)
        self.pre_mlp_layernorm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.mlp = ParallelMoE(cfg, ffn_local, groups) if cfg.moe else ParallelMLP(cfg.hidden, ffn_local, groups.tp)

    def forward(self, x, cos, sin, attend):
        x = x + self.self_attention(self.input_layernorm(x), cos, sin, attend)
        return x + self.mlp(self.pre_mlp_layernorm(x))


class GPTStage(nn.Module):
    """Pipeline stage ``pp_rank`` of the decoder on one tp/ep rank; returns this rank's logits slice
    (last stage) or hidden states. ``position_offset``/``attend`` as in
    :class:`~ucp.integrations.llama.model.LlamaModel` (context parallelism)."""

    def __init__(self, cfg: LlamaConfig, groups: ParallelGroups) -> None:
        super().__init__()
        layout, coords = groups.layout, groups.layout.coords(groups.rank)
        self.cfg = cfg
        self.first, self.last = coords.pp == 0, coords.pp == layout.pp - 1
        self.layer_ids = stage_layers(cfg.layers, layout.pp, coords.pp)
        self.vocab_rows = padded_vocab(cfg.vocab_size, layout.tp, cfg.vocab_multiple) // layout.tp
        self.vocab_start = coords.tp * self.vocab_rows
        self.tp_group = groups.tp
        self.position_offset = 0
        self.attend = None
        if self.first:
            self.embedding = nn.Module()
            self.embedding.word_embeddings = VocabParallelEmbedding(self.vocab_rows, cfg.hidden, self.vocab_start,
                                                                    groups.tp)
        self.decoder = nn.Module()
        self.decoder.layers = nn.ModuleList(ParallelLayer(cfg, groups) for _ in self.layer_ids)
        if self.last:
            self.decoder.final_layernorm = RMSNorm(cfg.hidden, cfg.norm_eps)
            self.output_layer = ColumnParallelLinear(cfg.hidden, self.vocab_rows, groups.tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embedding.word_embeddings(x) if self.first else x
        positions = torch.arange(h.shape[1]) + self.position_offset
        cos, sin = rope_tables(positions, self.cfg.head_dim, self.cfg.rope_theta)
        offset = self.position_offset
        attend = self.attend or (lambda q, k, v: causal_attention(q, k, v, q_offset=offset))
        for layer in self.decoder.layers:
            h = layer(h, cos, sin, attend)
        if not self.last:
            return h
        return self.output_layer(self.decoder.final_layernorm(h))
