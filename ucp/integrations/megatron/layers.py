"""Megatron-style tensor-parallel building blocks, small enough to read in one sitting.

* :func:`copy_to_tp` / :func:`reduce_from_tp`: Megatron's ``f`` and ``g`` (identity
  one way, all-reduce over the tensor-parallel group the other way);
* :class:`ColumnParallelLinear`: this rank holds a block of output rows; the input
  is replicated, the output stays split;
* :class:`RowParallelLinear`: this rank holds a block of input columns; the partial
  outputs are summed over tp;
* :class:`VocabParallelEmbedding` and :func:`vocab_parallel_cross_entropy`: the
  vocabulary (padded to a multiple of ``tp * vocab_multiple``) split over tp; the
  loss never gathers the logits, and padded entries take no part in the softmax.

``group=None`` means tp=1 (no communication). Weights are allocated here and filled
by the trainer (from the logical model or a checkpoint).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

__all__ = ["copy_to_tp", "reduce_from_tp", "ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding",
           "vocab_parallel_cross_entropy", "padded_vocab"]


def padded_vocab(vocab_size: int, tp: int, multiple: int) -> int:
    """Megatron's padded vocabulary: a multiple of ``tp * multiple`` (each rank an equal slice)."""
    step = tp * multiple
    return -(-vocab_size // step) * step


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def copy_to_tp(x: torch.Tensor, group) -> torch.Tensor:
    """Identity forward; backward sums the input gradient over tp (the input was replicated)."""
    return x if group is None else _CopyToTP.apply(x, group)


def reduce_from_tp(x: torch.Tensor, group) -> torch.Tensor:
    """Sum partial results over tp; identity backward."""
    return x if group is None else _ReduceFromTP.apply(x, group)


class ColumnParallelLinear(nn.Module):
    """``y_r = x @ W_r.T``: W's output rows split over tp; ``weight`` is ``[out_local, in]``."""

    def __init__(self, in_features: int, out_local: int, group) -> None:
        super().__init__()
        self.group = group
        self.weight = nn.Parameter(torch.empty(out_local, in_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(copy_to_tp(x, self.group), self.weight)


class RowParallelLinear(nn.Module):
    """``y = sum_r x_r @ W_r.T``: W's input columns split over tp; ``weight`` is ``[out, in_local]``."""

    def __init__(self, in_local: int, out_features: int, group) -> None:
        super().__init__()
        self.group = group
        self.weight = nn.Parameter(torch.empty(out_features, in_local))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return reduce_from_tp(F.linear(x, self.weight), self.group)


class VocabParallelEmbedding(nn.Module):
    """This rank embeds token ids in ``[start, start + rows)``; other ranks contribute zeros."""

    def __init__(self, rows: int, hidden: int, start: int, group) -> None:
        super().__init__()
        self.group, self.start = group, start
        self.weight = nn.Parameter(torch.empty(rows, hidden))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        local = tokens - self.start
        outside = (local < 0) | (local >= self.weight.shape[0])
        out = F.embedding(local.clamp(0, self.weight.shape[0] - 1), self.weight)
        out = out.masked_fill(outside[..., None], 0.0)
        return reduce_from_tp(out, self.group)


def vocab_parallel_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, *, start: int, vocab_size: int,
                                 group) -> torch.Tensor:
    """Per-token cross-entropy from this rank's vocabulary slice of the logits ``[..., rows]``.

    Three all-reduces of per-token scalars (max, sum of exponentials, the target's
    logit) instead of gathering ``[tokens, vocab]``. Columns at or beyond
    ``vocab_size`` (padding) are masked out. Autograd through ``reduce_from_tp``
    gives each rank exactly its slice of ``softmax - onehot``.
    """
    logits = logits.float()
    columns = torch.arange(logits.shape[-1]) + start
    logits = logits.masked_fill(columns >= vocab_size, float("-inf"))
    peak = logits.detach().amax(dim=-1, keepdim=True)
    if group is not None:
        dist.all_reduce(peak, op=dist.ReduceOp.MAX, group=group)
    shifted = logits - peak
    local_target = targets - start
    mine = (local_target >= 0) & (local_target < logits.shape[-1])
    picked = shifted.gather(-1, local_target.clamp(0, logits.shape[-1] - 1)[..., None])[..., 0]
    target_logit = reduce_from_tp(picked.masked_fill(~mine, 0.0), group)
    sum_exp = reduce_from_tp(shifted.exp().sum(dim=-1), group)
    return sum_exp.log() - target_logit
