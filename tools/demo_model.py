"""The demo's tensor-parallel model: a tiny Megatron-style MLP language model.

One rank of a ``tp x dp`` layout holds

* ``embed.weight`` [V, H] and ``head.weight`` [V, H]: replicated on every rank;
* ``fc1.weight`` [F/tp, H], ``fc1.bias`` [F/tp]: column-parallel (rows split over tp);
* ``fc2.weight`` [H, F/tp]: row-parallel (columns split over tp); ``fc2.bias`` [H] replicated.

``tools/programs/demo-mlp.ucl`` says exactly that to the checkpoint engine, in
UCL, for the parameters and for every Adam state, so a checkpoint saved under
one ``tp``/``dp`` loads under any other. The model trains for real (forward,
backward, tensor-parallel all-reduces, data-parallel gradient averaging).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ucp.geometry import Box, split_evenly
from ucp.layout import Layout

VOCAB, HIDDEN, FFN = 61, 32, 100  # FFN=100 makes tp=3 or tp=8 splits uneven on purpose
PARAMS = ("embed.weight", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "head.weight")
LOGICAL_SHAPES = {
    "embed.weight": (VOCAB, HIDDEN),
    "fc1.weight": (FFN, HIDDEN),
    "fc1.bias": (FFN,),
    "fc2.weight": (HIDDEN, FFN),
    "fc2.bias": (HIDDEN,),
    "head.weight": (VOCAB, HIDDEN),
}
# parameter -> dimension split over tp (None: replicated)
SPLIT_DIM = {"embed.weight": None, "fc1.weight": 0, "fc1.bias": 0, "fc2.weight": 1, "fc2.bias": None,
             "head.weight": None}


def local_box(name: str, layout: Layout, rank: int) -> Box:
    """The block of logical parameter ``name`` held by ``rank``."""
    shape = LOGICAL_SHAPES[name]
    dim = SPLIT_DIM[name]
    if dim is None:
        return Box.full(shape)
    offset, size = split_evenly(shape[dim], layout.tp, layout.coords(rank).tp)
    offsets = [0] * len(shape)
    sizes = list(shape)
    offsets[dim], sizes[dim] = offset, size
    return Box(tuple(offsets), tuple(sizes))


class _CopyToTensorParallel(torch.autograd.Function):
    """Identity forward; all-reduce the gradient over tp (Megatron's ``f``)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTensorParallel(torch.autograd.Function):
    """All-reduce the partial outputs over tp; identity backward (Megatron's ``g``)."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class ParallelMLP(torch.nn.Module):
    """The local shard of the model on one rank."""

    def __init__(self, layout: Layout, rank: int, tp_group, *, seed: int = 0) -> None:
        super().__init__()
        self.tp_group = tp_group
        full = _initial_weights(seed)
        for name in PARAMS:
            block = full[name][local_box(name, layout, rank).slices()].clone()
            self.register_parameter(name.replace(".", "_"), torch.nn.Parameter(block))

    def param(self, name: str) -> torch.nn.Parameter:
        return getattr(self, name.replace(".", "_"))

    def ordered_parameters(self) -> list[torch.nn.Parameter]:
        return [self.param(n) for n in PARAMS]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.embedding(tokens, self.param("embed.weight"))
        x = _CopyToTensorParallel.apply(x, self.tp_group)
        h = torch.relu(x @ self.param("fc1.weight").T + self.param("fc1.bias"))
        y = _ReduceFromTensorParallel.apply(h @ self.param("fc2.weight").T, self.tp_group)
        y = y + self.param("fc2.bias") + x
        return y @ self.param("head.weight").T

    def state(self, optimizer: torch.optim.Optimizer, step: int, data_position: int) -> dict:
        """The training state handed to ``ucp.save`` (keys match tools/programs/demo-mlp.ucl)."""
        return {
            "model": {name: self.param(name).data for name in PARAMS},
            "optim": optimizer.state_dict(),
            "step": step,
            "data_position": data_position,
        }


def _initial_weights(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {name: torch.randn(shape, generator=gen) * 0.2 for name, shape in LOGICAL_SHAPES.items()}


def batch(step: int, dp_rank: int, *, size: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """A deterministic batch of the toy task "next token = 3 * token + 1 mod V"."""
    gen = torch.Generator().manual_seed(step * 1000 + dp_rank)
    tokens = torch.randint(0, VOCAB, (size,), generator=gen)
    return tokens, (3 * tokens + 1) % VOCAB
