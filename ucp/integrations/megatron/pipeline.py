"""A GPipe schedule over point-to-point sends: all micro-batches forward, then all backward.

Stage ``p`` receives activations from stage ``p-1`` and sends its outputs to
``p+1``; in the backward phase gradients flow the other way. Every stage knows
the shapes (micro-batch rows x sequence chunk x hidden), so nothing but the
tensors crosses. Simple and exact; 1F1B would only change the order (and the
memory held), not the result.

    loss_sum = run_gpipe(stage, groups, inputs, targets, loss_fn)   # last stage: the summed loss
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

from ucp.integrations.megatron.groups import ParallelGroups

__all__ = ["run_gpipe"]


def run_gpipe(stage: torch.nn.Module, groups: ParallelGroups, inputs: list[torch.Tensor], targets: list[torch.Tensor],
              loss_fn: Callable, *, hidden: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Forward and backward of every micro-batch; returns the summed loss (zero off the last stage).

    ``inputs``/``targets`` are the micro-batches' token ids (every stage gets them, for
    the shapes; only the first stage reads the inputs and the last the targets); ``dtype``: the
    activations' (the model's parameter dtype).
    """
    first, last = groups.prev_rank is None, groups.next_rank is None
    saved = []
    total = torch.zeros((), dtype=torch.float64)
    for tokens, target in zip(inputs, targets):
        if first:
            x = tokens
        else:
            x = torch.empty((*tokens.shape, hidden), dtype=dtype)
            dist.recv(x, src=groups.prev_rank)
            x.requires_grad_(True)
        y = stage(x)
        if last:
            y = loss_fn(y, target)
            total += y.detach().double()
        else:
            dist.send(y.detach().contiguous(), dst=groups.next_rank)
        saved.append((x, y))
    for x, y in reversed(saved):
        if last:
            y.backward()
        else:
            grad = torch.empty_like(y)
            dist.recv(grad, src=groups.next_rank)
            y.backward(grad)
        if not first:
            dist.send(x.grad.contiguous(), dst=groups.prev_rank)
    return total
