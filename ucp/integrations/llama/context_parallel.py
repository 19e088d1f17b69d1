"""Context parallelism (both stacks that run cp): all-gather attention over a sequence split.

Each context-parallel rank holds a contiguous chunk of every sequence. Attention
needs every earlier key: the rank all-gathers keys and values over its cp group
(the backward pass sums their gradients back to the owning rank) and attends
with its queries at their true positions. torch's own ``context_parallel`` has no
sharding rule for the CPU attention kernel, so this is the trainer's own: the
all-gather variant Llama 3 used, simpler than a ring and exact.

    attend = context_parallel_attention(group, q_offset=rank_in_cp * chunk)
    model.attend, model.position_offset = attend, rank_in_cp * chunk
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ucp.integrations.llama.model import causal_attention

__all__ = ["gather_sequence", "context_parallel_attention"]


class _GatherSequence(torch.autograd.Function):
    """All-gather along dim 1 (equal chunks); backward: sum the gradients, keep this rank's chunk."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        ctx.index = dist.get_rank(group)
        ctx.size = x.shape[1]
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        # float64 keeps the sum independent of the order ranks are added in
        total = grad.contiguous().double()
        dist.all_reduce(total, group=ctx.group)
        start = ctx.index * ctx.size
        return total[:, start : start + ctx.size].to(grad.dtype), None


def gather_sequence(x: torch.Tensor, group) -> torch.Tensor:
    return _GatherSequence.apply(x, group)


def context_parallel_attention(group, *, q_offset: int):
    """An ``attend(q, k, v)`` for :class:`~ucp.integrations.llama.model.LlamaModel` on one cp rank."""

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return causal_attention(q, gather_sequence(k, group), gather_sequence(v, group), q_offset=q_offset)

    return attend
