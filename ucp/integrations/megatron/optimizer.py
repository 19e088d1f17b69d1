"""Megatron-style optimisers: Adam beside every parameter (zero=0), or the distributed optimizer.

The distributed optimizer (Megatron's ``--use-distributed-optimizer``, ZeRO-1/2)
lays a rank's local parameters end to end in one flat buffer (in the order the
megatron-gpt preset's ``flat`` rule uses: natural order of their keys), pads it to
a multiple of the partition group's size and cuts it into equal parts; each rank
keeps fp32 master weights and Adam moments for its part only. A step sums the
gradients over the reduction group, updates the part, and all-gathers the parts
back into the parameters. Dense parameters are partitioned over dp x cp (as
Megatron does); experts over the expert-data-parallel group.

Gradients are summed in float64: the result (rounded to fp32 once) does not depend
on how many ranks contributed or in what order, which keeps runs under different
layouts within rounding of each other.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ucp.integrations.stacks.common import TrainSettings, fresh_adam_state, make_adam

__all__ = ["ReplicatedAdam", "DistributedAdam"]


def _sum_grads(grad: torch.Tensor, group) -> torch.Tensor:
    total = grad.double()
    if group is not None:
        dist.all_reduce(total, group=group)
    return total.to(grad.dtype)


def _fresh_state(adam: torch.optim.Adam) -> None:
    for group in adam.param_groups:
        for p in group["params"]:
            adam.state[p] = fresh_adam_state(p)


class ReplicatedAdam:
    """zero=0: gradients summed over ``reduce_group``, Adam state beside each parameter.

    ``params``: local key -> parameter."""

    def __init__(self, params: dict[str, nn.Parameter], settings: TrainSettings, *, reduce_group) -> None:
        self.keys, self.params, self.group = list(params), list(params.values()), reduce_group
        self.adam = make_adam(self.params, settings)
        _fresh_state(self.adam)

    def step(self) -> None:
        for p in self.params:
            p.grad = _sum_grads(p.grad if p.grad is not None else torch.zeros_like(p), self.group)
        self.adam.step()
        self.adam.zero_grad()

    def state_of(self, param: nn.Parameter, name: str) -> torch.Tensor:
        return self.adam.state[param][name]

    def set_step(self, step: int) -> None:
        for state in self.adam.state.values():
            state["step"] = torch.tensor(float(step))


class DistributedAdam:
    """ZeRO-1/2 over ``partition_group`` for ``params`` (key -> parameter, in buffer order); see the module doc."""

    def __init__(self, params: dict[str, nn.Parameter], settings: TrainSettings, *, reduce_group,
                 partition_group) -> None:
        self.keys, self.params = list(params), list(params.values())
        self.reduce_group, self.partition_group = reduce_group, partition_group
        self.parts = 1 if partition_group is None else dist.get_world_size(partition_group)
        index = 0 if partition_group is None else dist.get_rank(partition_group)
        total = sum(p.numel() for p in self.params)
        self.padded = -(-total // self.parts) * self.parts
        self.chunk = self.padded // self.parts
        self.lo = index * self.chunk
        with torch.no_grad():
            flat = self._flat([p.detach().float() for p in self.params])
            self.master = nn.Parameter(flat[self.lo : self.lo + self.chunk].clone())
        self.adam = make_adam([self.master], settings)
        _fresh_state(self.adam)

    def _flat(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        flat = torch.cat([t.reshape(-1) for t in tensors]) if tensors else torch.zeros(0)
        return torch.cat([flat, flat.new_zeros(self.padded - flat.numel())])

    def step(self) -> None:
        grads = self._flat([p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params])
        self.master.grad = _sum_grads(grads, self.reduce_group)[self.lo : self.lo + self.chunk].float()
        self.adam.step()
        self.adam.zero_grad()
        for p in self.params:
            p.grad = None
        self.copy_to_params()

    def copy_to_params(self) -> None:
        """All-gather the updated parts and write them into the (local, tp-sharded) parameters."""
        parts = [torch.empty_like(self.master.data) for _ in range(self.parts)]
        if self.partition_group is None:
            parts = [self.master.data]
        else:
            dist.all_gather(parts, self.master.data.contiguous(), group=self.partition_group)
        flat = torch.cat(parts)
        offset = 0
        with torch.no_grad():
            for p in self.params:
                p.copy_(flat[offset : offset + p.numel()].view_as(p))
                offset += p.numel()

    def refresh_master(self) -> None:
        """Masters from the parameters (after loading parameters without separate masters)."""
        with torch.no_grad():
            self.master.copy_(self._flat([p.detach().float() for p in self.params])[self.lo : self.lo + self.chunk])

    def state(self, name: str) -> torch.Tensor:
        """This rank's part: ``fp32`` (masters), ``exp_avg`` or ``exp_avg_sq``."""
        return self.master.data if name == "fp32" else self.adam.state[self.master][name]

    def set_step(self, step: int) -> None:
        self.adam.state[self.master]["step"] = torch.tensor(float(step))
